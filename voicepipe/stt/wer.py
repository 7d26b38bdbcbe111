"""Word error rate, shared by the tests, the benchmark and replay's golden comparisons."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "fifteen": "15", "twenty": "20",
    "thirty": "30", "forty": "40", "fifty": "50",
}
_ABBREVIATIONS = {"dr": "doctor", "mr": "mister", "mrs": "missus", "st": "street"}


def normalize_words(text: str) -> list[str]:
    """Lowercase words without punctuation; hyphens and slashes split words; small number words become digits;
    1,200 -> 1200, 9:40 -> 940, dr -> doctor."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("’", "'")
    text = re.sub(r"[-/]", " ", text)
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,200 -> 1200
    text = re.sub(r"(?<=\d):(?=\d\d)", "", text)  # 9:40 -> 940 (whisper writes either)
    text = re.sub(r"[^\w\s'.:]", " ", text)
    text = re.sub(r"(?<!\d)[.:]|[.:](?!\d)", " ", text)  # keep 3.5 and 9:40, drop other . and :
    words = [w.strip("'") for w in text.split()]
    words = [_ABBREVIATIONS.get(w, w) for w in words]
    return [_NUMBER_WORDS.get(w, w) for w in words if w]


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word lists (substitutions, insertions, deletions all cost 1)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one hypothesis against one reference, after `normalize_words`."""
    ref, hyp = normalize_words(reference), normalize_words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(ref, hyp) / len(ref)


def corpus_wer(pairs: Iterable[tuple[str, str]]) -> float:
    """WER over a set of (reference, hypothesis) pairs: total edits over total reference words."""
    edits = words = 0
    for reference, hypothesis in pairs:
        ref, hyp = normalize_words(reference), normalize_words(hypothesis)
        edits += edit_distance(ref, hyp)
        words += len(ref)
    return edits / words if words else 0.0
