"""What the agent played, on the caller's input timeline: the far-end reference an echo canceller needs.

Positions are input samples: sample n is the n-th sample of the caller's audio the call has received, and the
reference answers "what was playing when input sample n arrived". A transport appends each chunk it sends with
the input position at which it starts to play (its pacing's guess); a mark from the provider moves the rest of
the stream to where the mark says it played; a clear (barge-in) drops what had not played. Everything is at the
input's rate; the ring keeps the last `capacity` samples of audio and forgets older ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class _Segment:
    at: int  # input position of its first sample
    offset: int  # its first sample's place in everything sent (the count marks refer to)
    audio: np.ndarray  # float32
    origin: int  # input position where its stretch began: the run of segments that follow each other with no gap

    @property
    def end(self) -> int:
        return self.at + len(self.audio)


class FarEndReference:
    """One call's played audio, aligned to its input. Not thread-safe: the call's loop owns it."""

    def __init__(self, rate: int, capacity_s: float = 10.0) -> None:
        self.rate = rate
        self.capacity = int(rate * capacity_s)
        self.sent = 0  # samples appended so far, cleared ones included: the offsets marks refer to
        self.received = 0  # input samples the call has taken so far: the input position of "now"
        self._segments: list[_Segment] = []

    @property
    def end(self) -> int:
        """The input position at which the last appended audio stops playing (0 before any)."""
        return self._segments[-1].end if self._segments else 0

    def append(self, audio: np.ndarray, at: int | None = None) -> int:
        """`audio` (float32) starts to play at input position `at`, or right after what was appended before,
        whichever is later (playout is a queue: a chunk never starts before the previous one ends). Returns the
        position it was placed at."""
        start = self.end if at is None else max(at, self.end)
        if len(audio):
            last = self._segments[-1] if self._segments else None
            origin = last.origin if last is not None and last.end == start else start
            self._segments.append(_Segment(start, self.sent, np.asarray(audio, np.float32), origin))
            self.sent += len(audio)
            self._forget()
        return start

    def clear(self, at: int) -> int:
        """Barge-in at input position `at`: what would have played from there on is dropped. Returns how many
        samples were dropped."""
        dropped = 0
        kept = []
        for seg in self._segments:
            if seg.at >= at:
                dropped += len(seg.audio)
            else:
                if seg.end > at:
                    dropped += seg.end - at
                    seg.audio = seg.audio[: at - seg.at]
                kept.append(seg)
        self._segments = kept
        return dropped

    def mark(self, offset: int, at: int) -> bool:
        """The provider says sent sample `offset` played at input position `at`: that sample and everything
        after it move there (a later playout than the pacing guessed leaves a gap of silence; an earlier one
        cuts the tail of what came before, which cannot still be playing). False when `offset` is not held
        (cleared, forgotten, or not sent yet)."""
        index = self._holding(offset)
        if index is None:
            return False
        seg = self._segments[index]
        split = offset - seg.offset
        if seg.at + split == at:
            return True
        if split:
            head = _Segment(seg.at, seg.offset, seg.audio[:split], seg.origin)
            seg = _Segment(seg.at + split, offset, seg.audio[split:], seg.origin)
            self._segments[index : index + 1] = [head, seg]
            index += 1
        shift = at - seg.at
        for moved in self._segments[index:]:
            moved.at += shift
            moved.origin += shift
        for before in self._segments[:index]:
            if before.end > at:
                before.audio = before.audio[: max(0, at - before.at)]
        self._segments = [s for s in self._segments if len(s.audio)]
        for before, after in zip(self._segments, self._segments[1:], strict=False):  # the stretches anew
            after.origin = before.origin if before.end == after.at else after.at
        return True

    def placed(self, offset: int) -> int | None:
        """The input position where sent sample `offset` plays (None: cleared, forgotten, or not sent yet)."""
        index = self._holding(offset)
        if index is None:
            return None
        seg = self._segments[index]
        return seg.at + offset - seg.offset

    def _holding(self, offset: int) -> int | None:
        """The index of the segment that holds sent sample `offset`."""
        return next((i for i, s in enumerate(self._segments) if s.offset <= offset < s.offset + len(s.audio)), None)

    def stretch_start(self, position: int) -> int | None:
        """Where the stretch of audio playing at input `position` began (None: nothing plays there). A stretch is a
        run of segments that follow each other with no gap; it keeps its start when the ring forgets its head."""
        for seg in reversed(self._segments):
            if seg.at <= position < seg.end:
                return seg.origin
            if seg.end <= position:
                return None
        return None

    def stretches(self, start: int, count: int) -> list[tuple[int, int]]:
        """The stretches (where each began, and the input position where it ends) that play within
        [start, start + count), in order."""
        ends: dict[int, int] = {}
        for seg in self._segments:
            if seg.origin in ends or (seg.at < start + count and seg.end > start):  # its stretch runs to its end
                ends[seg.origin] = seg.end
        return list(ends.items())

    def window(self, start: int, count: int) -> np.ndarray:
        """What was playing at input positions [start, start + count): float32, silence where nothing was."""
        out = np.zeros(count, np.float32)
        stop = start + count
        for seg in reversed(self._segments):  # in order and apart: newest first, until one ends before `start`
            if seg.end <= start:
                break
            lo, hi = max(seg.at, start), min(seg.end, stop)
            if lo < hi:
                out[lo - start : hi - start] = seg.audio[lo - seg.at : hi - seg.at]
        return out

    def _forget(self) -> None:
        held = sum(len(s.audio) for s in self._segments)
        while held > self.capacity:
            oldest = self._segments[0]
            excess = held - self.capacity
            if len(oldest.audio) <= excess:
                self._segments.pop(0)
                held -= len(oldest.audio)
            else:
                self._segments[0] = _Segment(oldest.at + excess, oldest.offset + excess, oldest.audio[excess:],
                                             oldest.origin)
                held -= excess
