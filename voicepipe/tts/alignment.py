"""Word boundaries in samples, from Piper's per-phoneme sample counts. Pure.

Piper reports how many samples each phoneme (with its padding) produced. espeak does not keep word
boundaries reliably ("from the" can come out as one phonetic word, "9:40" as two), so text words are matched
to the phoneme stream by their expected phoneme counts: each word is phonemized alone, and the clause's
phonemes are shared out in proportion. When the counts agree (the common case), the mapping is exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

SKIP = frozenset("^$_ ,.;:!?¡¿—–-…\"'«»“”()[]ˈˌː")
_WORD = re.compile(r"\S+")


def speech_phonemes(phonemes: Sequence[str]) -> int:
    return sum(1 for p in phonemes if p not in SKIP)


def word_spans(text: str, alignments: Sequence[tuple[str, int]], count_phonemes: Callable[[str], int],
               ) -> list[tuple[str, int, int, int, int]]:
    """(word, char_start, char_end, sample_start, sample_end) for each word of `text`.

    `alignments` is the clause's (phoneme, num_samples) sequence in order (all sentences); samples are
    relative to the clause's first sample. `count_phonemes(word)` is the number of speech phonemes of the
    word spoken alone.
    """
    spans: list[tuple[int, int]] = []  # sample span of each speech phoneme
    pos = 0
    for phoneme, n in alignments:
        if phoneme not in SKIP:
            spans.append((pos, pos + int(n)))
        pos += int(n)
    total_samples = pos
    words = [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]
    words = [w for w in words if any(ch.isalnum() for ch in w[0])]
    if not words:
        return []
    if not spans:
        return [(w, a, b, 0, total_samples) for w, a, b in words]
    counts = [max(count_phonemes(w), 0) for w, _, _ in words]
    expected = sum(counts) or len(words)
    if not sum(counts):
        counts = [1] * len(words)
    scale = len(spans) / expected
    out = []
    cum = 0
    for (word, a, b), c in zip(words, counts, strict=True):
        first = min(round(cum * scale), len(spans) - 1)
        cum += c
        last = max(first, min(round(cum * scale), len(spans)) - 1)
        out.append((word, a, b, spans[first][0], spans[last][1]))
    # The first word starts at the clause start's speech; stretch word ends to the next word's start so
    # the spans tile the speech without gaps (pauses count toward the word before them).
    tiled = []
    for i, (word, a, b, s, e) in enumerate(out):
        end = out[i + 1][3] if i + 1 < len(out) else max(e, spans[-1][1])
        tiled.append((word, a, b, s, max(end, s)))
    return tiled
