"""Where the caller is in the agent's speech. Pure: maps "N samples were played" to words and characters.

Each synthesized clause is described by a `SpeechOrigin`: its text span in the turn's text, its samples in
the stream's output, and the sample span of every word (from Piper's phoneme alignments). The
`PlayoutCursor` collects them, and on barge-in tells what the caller heard, to the word.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class WordTiming:
    text: str
    char_start: int  # span in the turn's whole text
    char_end: int
    sample_start: int  # span in the stream's output samples
    sample_end: int


@dataclass(frozen=True)
class SpeechOrigin:
    """Where one chunk of audio came from."""

    turn: int
    chunk_index: int
    text: str
    char_start: int
    char_end: int
    sample_start: int
    sample_end: int
    sample_rate: int
    words: tuple[WordTiming, ...] = ()


@dataclass(frozen=True)
class Heard:
    samples: int
    words: tuple[WordTiming, ...]  # words played to their end
    current: WordTiming | None  # the word being played at that sample, if any
    char_end: int  # end of the last word played to its end (0 if none)
    text: str  # the turn's text up to char_end


class PlayoutCursor:
    def __init__(self) -> None:
        self.origins: list[SpeechOrigin] = []
        self._words: list[WordTiming] = []
        self._ends: list[int] = []
        self._text: dict[int, str] = {}

    def add(self, origin: SpeechOrigin) -> None:
        if self.origins and origin.sample_start < self.origins[-1].sample_start:
            raise ValueError("origins must be added in playout order")
        self.origins.append(origin)
        for w in origin.words:
            self._words.append(w)
            self._ends.append(w.sample_end)
        self._text[origin.char_start] = origin.text

    @property
    def total_samples(self) -> int:
        return self.origins[-1].sample_end if self.origins else 0

    def origin_at(self, sample: int) -> SpeechOrigin | None:
        starts = [o.sample_start for o in self.origins]
        i = bisect.bisect_right(starts, sample) - 1
        if i < 0 or sample >= self.origins[i].sample_end:
            return None
        return self.origins[i]

    def heard(self, samples_played: int) -> Heard:
        """What the caller has heard after `samples_played` output samples."""
        n = bisect.bisect_right(self._ends, samples_played)
        done = tuple(self._words[:n])
        current = None
        if n < len(self._words) and self._words[n].sample_start <= samples_played:
            current = self._words[n]
        char_end = done[-1].char_end if done else 0
        return Heard(samples_played, done, current, char_end, self._text_upto(char_end))

    def _text_upto(self, char_end: int) -> str:
        parts = []
        for o in self.origins:
            if o.char_start >= char_end:
                break
            parts.append(o.text[: max(0, char_end - o.char_start)])
        return " ".join(parts)
