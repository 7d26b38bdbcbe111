"""What a transport feeds a call's far-end reference as it paces the agent's audio out: each chunk it sends, where it
will play, the marks that say where it did, and clears.

The transport knows its own clock (seconds) and its marks; the reference knows input positions. `PlayedAudio`
turns one into the other: a chunk sent `lead_s` before it plays sits `lead_s` of input after the input position of
now. That position is read from the caller's pace, not from the samples taken so far: the caller's audio comes
in 20 ms frames, late by whatever its link and the event loop add, and a reply placed by the count would sit up
to a frame or more off from the one before; the canceller's filter would then learn the echo path again for each
reply. So the position of now is counted from the least delayed recent arrival: its count, plus the time since
it came at the input's rate (as `CallSession._judged_up_to_now` reads the caller's pace).
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from voicepipe.audio import StreamResampler
from voicepipe.audio.l16 import int16_to_float32
from voicepipe.echo.reference import FarEndReference

# A mark says its chunk had played by the time it came, so one that comes over MARK_TOLERANCE_MS before the reference
# has the chunk end proves the placement late: the chunk moves back to end there. A late mark proves nothing alone:
# it comes back as late as the far end's loop and then the server's let it, and under load (bench echo, three calls
# at once) single marks came 100-290 ms late; moving the reference by each put the rest of a reply that far off its
# echo until a mark moved it back, and holds followed. So the reference moves later only when MARKS_AGREE marks in
# a row say it is over MARK_TOLERANCE_MS late (a far end that buffers, a drifting clock), by the least of them.
# Smaller disagreements are left to the delay estimate: WebRTC's marks say when the server's track sent a frame, and
# the far end's jitter buffer plays it later by as much as its load makes it.
MARK_TOLERANCE_MS = 100.0
MARKS_AGREE = 10
MARKS_KEPT = 1000  # unacknowledged marks remembered (20 s of 20 ms chunks): a provider that never echoes them
PACE_ARRIVALS = 150  # the recent arrivals of the caller's audio (3 s of 20 ms frames) that set its pace


class PlayedAudio:
    """One call's outbound audio (int16 at `send_rate`) kept in `reference` (at its own rate, the call's)."""

    def __init__(self, reference: FarEndReference, send_rate: int, clears: bool = True) -> None:
        self.reference = reference
        self.clears = clears  # False: the far end cannot drop audio already sent (AudioSocket), it still plays
        self._resampler = StreamResampler(send_rate, reference.rate) if send_rate != reference.rate else None
        self._tolerance = int(reference.rate * MARK_TOLERANCE_MS / 1000)
        self._late: list[tuple[int, int]] = []  # the last marks in a row over tolerance: (chunk offset, how late)
        self._marks: OrderedDict[str, tuple[int, int]] = OrderedDict()  # mark -> its chunk's offsets in the reference
        self._arrivals: deque[float] = deque(maxlen=PACE_ARRIVALS)  # when input position 0 was due, by each arrival

    def arrived(self, now: float) -> None:
        """The caller's audio the call has just taken arrived at `now` (seconds, the clock `sent` is given)."""
        self._arrivals.append(now - self.reference.received / self.reference.rate)

    def position(self, now: float) -> int:
        """The input position of `now`: at the pace of the least delayed recent arrival, never behind what came."""
        ref = self.reference
        if not self._arrivals:
            return ref.received
        return max(ref.received, round((now - min(self._arrivals)) * ref.rate))

    def sent(self, audio: np.ndarray, now: float, lead_s: float, mark: str | None = None) -> None:
        """`audio` went out at `now` and starts to play `lead_s` later (after what was sent before it)."""
        ref = self.reference
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        start = ref.sent
        ref.append(int16_to_float32(audio), self.position(now + lead_s))
        if mark is not None:
            self._marks[mark] = (start, ref.sent)
            if len(self._marks) > MARKS_KEPT:
                self._marks.popitem(last=False)

    def played(self, mark: str, now: float) -> None:
        """The far end says the audio up to `mark` has played by now: where that disagrees with the reference, its
        chunk and what follows move (see `MARK_TOLERANCE_MS`; a mark it has said before moves nothing)."""
        if mark not in self._marks:
            return
        while (oldest := self._marks.popitem(last=False))[0] != mark:
            pass
        start, end = oldest[1]
        placed = self.reference.placed(start) if end > start else None
        if placed is None:
            return
        late = self.position(now) - (placed + end - start)  # input samples the mark came after the chunk ended
        if late < -self._tolerance:
            self._move(start, placed + late)
        elif late <= self._tolerance:
            self._late.clear()
        else:
            self._late.append((start, late))
            if len(self._late) == MARKS_AGREE:  # the run moves from its first chunk still held, by the least it said
                shift = min(said for _, said in self._late)
                first, at = next((o, p) for o, _ in self._late if (p := self.reference.placed(o)) is not None)
                self._move(first, at + shift)

    def _move(self, offset: int, at: int) -> None:
        self.reference.mark(offset, at)
        self._late.clear()

    def cleared(self, now: float) -> None:
        """A barge-in at `now`: what had not played is dropped, where the far end drops it."""
        self._marks.clear()
        self._late.clear()
        if self.clears:
            self.reference.clear(self.position(now))
