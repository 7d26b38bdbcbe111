"""The playback controller: paces agent audio out at real time and tracks what the caller has heard.

Pure: the caller passes the time in (`now`, seconds on any monotonic clock) and does the I/O. It:
- cuts queued audio into chunks by the provider's `ChunkPolicy` (the tail padded with silence),
- releases a chunk from `poll(now)` only while the audio sent but not yet played (the lead) stays
  within `max_lead_ms` (one chunk may always go when nothing is playing),
- names a mark per chunk where the provider echoes marks (`<prefix>:<generation>:<index>`),
- counts generations: `clear()` starts a new one, so a mark echoed after a clear is DISCARDED,
- keeps the playout cursor: samples confirmed played, from marks, or from the local clock where the
  provider has none; `heard()` maps the cursor onto the callers' `origin` objects.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

import numpy as np

from voicepipe.audio.l16 import require_dtype
from voicepipe.transports.serializers.base import ChunkPolicy

_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Chunk:
    """One piece of audio to send now: `audio` at the wire rate, then the `mark` (if any)."""

    audio: np.ndarray
    generation: int
    index: int
    start: int  # sample offset in this generation's output
    origins: tuple[object, ...]
    mark: str | None

    @property
    def end(self) -> int:
        return self.start + len(self.audio)


class MarkStatus(Enum):
    PLAYED = "played"  # the audio up to this mark was heard
    DISCARDED = "discarded"  # echoed for audio dropped by a clear (an older generation)
    UNKNOWN = "unknown"  # not one of ours, or never sent


@dataclass(frozen=True)
class Heard:
    """How much of one enqueued piece (its `origin`) the caller heard, in samples."""

    origin: object
    heard: int
    total: int

    @property
    def complete(self) -> bool:
        return self.heard >= self.total

    @property
    def fraction(self) -> float:
        return self.heard / self.total if self.total else 1.0


@dataclass(frozen=True)
class ClearResult:
    """What a clear cut short: the heard pieces of the old generation and how much was never heard."""

    generation: int  # the new generation
    heard: list[Heard]
    dropped_samples: int


@dataclass
class _Segment:
    origin: object
    start: int
    length: int


class PlaybackController:
    """Paces one call's outbound audio; one instance per call, built once the stream has started."""

    def __init__(
        self,
        sample_rate: int,
        policy: ChunkPolicy | None = None,
        max_lead_ms: float = 200.0,
        uses_marks: bool = True,
        provider_clears: bool = True,
        mark_prefix: str = "vp",
    ) -> None:
        if sample_rate <= 0 or max_lead_ms <= 0:
            raise ValueError(f"sample_rate and max_lead_ms must be positive, got {sample_rate}, {max_lead_ms}")
        if ":" in mark_prefix:
            raise ValueError("mark_prefix must not contain ':'")
        self.sample_rate = sample_rate
        self.policy = policy or ChunkPolicy.millis(sample_rate, 20)
        self.max_lead = max_lead_ms / 1000.0
        self.uses_marks = uses_marks
        self.provider_clears = provider_clears
        self.mark_prefix = mark_prefix
        self.generation = 0
        self._play_end = float("-inf")  # when everything sent so far will have finished playing
        self._reset_generation()

    # -- input ------------------------------------------------------------------------------------
    def enqueue(self, audio: np.ndarray, origin: object = None) -> None:
        """Queue agent audio (int16 mono at the wire rate); `origin` is reported back by `heard()`."""
        audio = require_dtype(audio, np.int16)
        if audio.ndim != 1:
            raise ValueError(f"expected 1-D audio, got shape {audio.shape}")
        if not len(audio):
            return
        self._segments.append(_Segment(origin, self._written, len(audio)))
        self._written += len(audio)
        self._tail.append(audio)
        self._tail_len += len(audio)
        while self._tail_len >= self.policy.chunk:
            self._cut(self.policy.chunk)

    def end_of_audio(self) -> None:
        """The utterance is complete: send the held tail too, padded with silence to a valid size."""
        if not self._tail_len:
            return
        size = self.policy.padded_size(self._tail_len)
        pad = size - self._tail_len
        if pad:
            self._tail.append(np.zeros(pad, dtype=np.int16))
            self._tail_len += pad
            self._written += pad
        self._cut(size)

    # -- pacing -----------------------------------------------------------------------------------
    def poll(self, now: float) -> list[Chunk]:
        """The chunks that may be sent at `now`, in order (send each chunk's audio, then its mark)."""
        out: list[Chunk] = []
        while self._queue:
            chunk = self._queue[0]
            duration = len(chunk.audio) / self.sample_rate
            lead = self._play_end - now
            if lead > _EPS and lead + duration > self.max_lead + _EPS:
                break
            self._queue.popleft()
            play_start = max(self._play_end, now)
            self._play_end = play_start + duration
            self._timeline.append((play_start, chunk.start, len(chunk.audio)))
            self._sent_end = chunk.end
            if chunk.mark is not None:
                self._marks[chunk.index] = chunk.end
            out.append(chunk)
        return out

    def next_send_time(self, now: float) -> float | None:
        """When `poll` will next release a chunk (None when nothing is queued)."""
        if not self._queue:
            return None
        duration = len(self._queue[0].audio) / self.sample_rate
        due = self._play_end - max(0.0, self.max_lead - duration) if duration <= self.max_lead else self._play_end
        return max(now, due)

    def lead(self, now: float) -> float:
        """Seconds of audio sent but (by the clock) not yet played."""
        return max(0.0, self._play_end - now)

    # -- feedback ---------------------------------------------------------------------------------
    def on_mark(self, name: str) -> MarkStatus:
        """A mark came back. Only a mark of the current generation moves the cursor."""
        parts = name.split(":")
        if len(parts) != 3 or parts[0] != self.mark_prefix or not (parts[1].isdigit() and parts[2].isdigit()):
            return MarkStatus.UNKNOWN
        generation, index = int(parts[1]), int(parts[2])
        if generation < self.generation:
            return MarkStatus.DISCARDED
        if generation > self.generation or index not in self._marks:
            # an index already acknowledged (a repeat, or covered by a later mark) is a no-op
            acknowledged = generation == self.generation and index < self._next_index and index not in self._queued
            return MarkStatus.PLAYED if acknowledged else MarkStatus.UNKNOWN
        end = self._marks[index]
        for i in [i for i in self._marks if i <= index]:
            del self._marks[i]
        self._confirmed = max(self._confirmed, end)
        return MarkStatus.PLAYED

    def played_samples(self, now: float) -> int:
        """The playout cursor: samples of this generation heard (marks) or played by the clock."""
        if self.uses_marks:
            return self._confirmed
        while self._timeline:
            play_start, start, length = self._timeline[0]
            if now + _EPS < play_start + length / self.sample_rate:
                partial = int((now - play_start) * self.sample_rate + _EPS) if now > play_start else 0
                return max(self._clock_cursor, start + max(0, min(partial, length)))
            self._timeline.popleft()
            self._clock_cursor = start + length
        return self._clock_cursor

    def heard(self, now: float) -> list[Heard]:
        """Each enqueued piece of this generation with the samples of it heard so far."""
        return self._heard_at(self.played_samples(now))

    def release_heard(self, now: float) -> list[Heard]:
        """Remove and return the pieces heard completely (keeps memory flat over a long call)."""
        cursor = self.played_samples(now)
        done: list[Heard] = []
        while self._segments and self._segments[0].start + self._segments[0].length <= cursor:
            seg = self._segments.popleft()
            done.append(Heard(seg.origin, seg.length, seg.length))
        return done

    def is_playing(self, now: float) -> bool:
        """True while audio is queued, or sent and not yet (confirmed) played."""
        return bool(self._queue or self._tail_len) or self.played_samples(now) < self._sent_end

    # -- barge-in ---------------------------------------------------------------------------------
    def clear(self, now: float) -> ClearResult:
        """Drop everything not yet heard and start a new generation (send the provider's clear too).

        Where the provider cannot clear (`provider_clears=False`, e.g. AudioSocket), audio already sent
        will still play, so it counts as heard and the next audio is paced after it.
        """
        cursor = self.played_samples(now)
        if not self.provider_clears:
            cursor = max(cursor, self._sent_end)
        else:
            self._play_end = now
        heard = self._heard_at(cursor)
        dropped = self._written - cursor
        self.generation += 1
        self._reset_generation()
        return ClearResult(self.generation, heard, dropped)

    # -- internals --------------------------------------------------------------------------------
    def _reset_generation(self) -> None:
        self._segments: deque[_Segment] = deque()
        self._tail: list[np.ndarray] = []
        self._tail_len = 0
        self._written = 0  # samples enqueued (and padding) in this generation
        self._cut_pos = 0  # samples cut into chunks
        self._sent_end = 0
        self._queue: deque[Chunk] = deque()
        self._marks: dict[int, int] = {}  # index of a sent, unacknowledged mark -> its chunk's end
        self._next_index = 0
        self._confirmed = 0
        self._clock_cursor = 0
        self._timeline: deque[tuple[float, int, int]] = deque()

    @property
    def _queued(self) -> set[int]:
        return {c.index for c in self._queue}

    def _cut(self, size: int) -> None:
        data = np.concatenate(self._tail) if len(self._tail) > 1 else self._tail[0]
        audio, rest = data[:size].copy(), data[size:]
        self._tail = [rest] if len(rest) else []
        self._tail_len = len(rest)
        start, index = self._cut_pos, self._next_index
        self._cut_pos += size
        self._next_index += 1
        mark = f"{self.mark_prefix}:{self.generation}:{index}" if self.uses_marks else None
        origins: list[object] = []
        for seg in reversed(self._segments):  # the chunk is at the end: stop at the first segment before it
            if seg.start + seg.length <= start:
                break
            if seg.start < start + size:
                origins.append(seg.origin)
        origins.reverse()
        self._queue.append(Chunk(audio, self.generation, index, start, tuple(origins), mark))

    def _heard_at(self, cursor: int) -> list[Heard]:
        return [Heard(s.origin, max(0, min(cursor - s.start, s.length)), s.length) for s in self._segments]
