"""Word boundaries in samples, from Piper's per-phoneme sample counts. Pure.

Piper reports how many samples each phoneme (with its padding) produced. espeak marks word gaps with a
space phoneme, but its phonetic words do not always match the text's words: it merges function words
("for the" -> one phonetic word) and expands numbers ("9:40" -> two, "1,200" -> three). So the phonetic
words are aligned to the text words by dynamic programming on their phoneme counts (each text word is
phonemized alone for its expected count): one phonetic word may hold several text words, or one text word
several phonetic words. Inside a merged phonetic word, the samples are shared out by expected counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

SKIP = frozenset("^$_ ,.;:!?¡¿—–-…\"'«»“”()[]ˈˌːʲ")
_WORD = re.compile(r"\S+")
MAX_SPAN = 4  # at most this many text words in one phonetic word, or phonetic words in one text word


def speech_phonemes(phonemes: Sequence[str]) -> int:
    return sum(1 for p in phonemes if p not in SKIP)


def _phonetic_words(alignments: Sequence[tuple[str, int]]) -> tuple[list[list[tuple[int, int]]], int]:
    """Speech-phoneme sample spans, grouped into phonetic words at spaces and punctuation."""
    groups: list[list[tuple[int, int]]] = [[]]
    pos = 0
    for phoneme, n in alignments:
        n = int(n)
        if phoneme not in SKIP:
            groups[-1].append((pos, pos + n))
        elif phoneme in " ,.;:!?—…" and groups[-1]:
            groups.append([])
        pos += n
    return [g for g in groups if g], pos


def word_spans(text: str, alignments: Sequence[tuple[str, int]], count_phonemes: Callable[[str], int],
               ) -> list[tuple[str, int, int, int, int]]:
    """(word, char_start, char_end, sample_start, sample_end) for each word of `text`.

    `alignments` is the clause's (phoneme, num_samples) sequence in order (all sentences); samples are
    relative to the clause's first sample. `count_phonemes(word)` is the number of speech phonemes of the
    word spoken alone. Word spans tile the speech: a pause belongs to the word before it.
    """
    words = [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]
    words = [w for w in words if any(ch.isalnum() for ch in w[0])]
    if not words:
        return []
    groups, total = _phonetic_words(alignments)
    if not groups:
        return [(w, a, b, 0, total) for w, a, b in words]
    counts = [max(count_phonemes(w), 1) for w, _, _ in words]
    starts: list[int] = [0] * len(words)
    for (g0, g1), (w0, w1) in _align([len(g) for g in groups], counts):
        phones = [span for g in groups[g0:g1] for span in g]
        expected = sum(counts[w0:w1])
        cum = 0
        for j in range(w0, w1):
            k = min(round(cum * len(phones) / expected), len(phones) - 1)
            starts[j] = phones[k][0]
            cum += counts[j]
    ends = [*starts[1:], max(total_speech_end(groups), starts[-1])]
    return [(w, a, b, s, max(e, s)) for (w, a, b), s, e in zip(words, starts, ends, strict=True)]


def total_speech_end(groups: list[list[tuple[int, int]]]) -> int:
    return groups[-1][-1][1]


def _align(group_counts: list[int], word_counts: list[int]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Monotonic alignment of phonetic words to text words: a list of ((g0, g1), (w0, w1)) blocks, where
    either g1 - g0 == 1 or w1 - w0 == 1, minimizing the phoneme-count mismatch (plus a small cost for
    every merge or split)."""
    n, m = len(group_counts), len(word_counts)
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            if cost[i][j] == inf:
                continue
            for di, dj in [(1, k) for k in range(1, MAX_SPAN + 1)] + [(k, 1) for k in range(2, MAX_SPAN + 1)]:
                if i + di > n or j + dj > m:
                    continue
                c = abs(sum(group_counts[i:i + di]) - sum(word_counts[j:j + dj])) + 0.5 * (di + dj - 2)
                if cost[i][j] + c < cost[i + di][j + dj]:
                    cost[i + di][j + dj] = cost[i][j] + c
                    back[i + di][j + dj] = (di, dj)
    if cost[n][m] == inf:  # more words than the spans allow: one block, shared out by counts
        return [((0, n), (0, m))]
    blocks = []
    i, j = n, m
    while i or j:
        di, dj = back[i][j]
        blocks.append(((i - di, i), (j - dj, j)))
        i, j = i - di, j - dj
    return blocks[::-1]
