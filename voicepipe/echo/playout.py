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

# A mark comes back as late as the far end's loop sends it: in the caller simulator neighbouring chunks' marks came
# up to 60 ms apart from what they played. Moving the reference by that much at every reply's first marks made
# the canceller's filter learn the echo path again each time; a mark moves it only when it disagrees by more (a far
# end that buffers, a drifting clock), and the delay estimate follows smaller changes.
MARK_TOLERANCE_MS = 100.0
MARKS_KEPT = 1000  # unacknowledged marks remembered (20 s of 20 ms chunks): a provider that never echoes them
PACE_ARRIVALS = 150  # the recent arrivals of the caller's audio (3 s of 20 ms frames) that set its pace


class PlayedAudio:
    """One call's outbound audio (int16 at `send_rate`) kept in `reference` (at its own rate, the call's)."""

    def __init__(self, reference: FarEndReference, send_rate: int, clears: bool = True) -> None:
        self.reference = reference
        self.clears = clears  # False: the far end cannot drop audio already sent (AudioSocket), it still plays
        self._resampler = StreamResampler(send_rate, reference.rate) if send_rate != reference.rate else None
        self._tolerance = int(reference.rate * MARK_TOLERANCE_MS / 1000)
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
        """The far end says the audio up to `mark` has played by now: its chunk, and what follows it, moves to end
        there (a mark it has said before moves nothing)."""
        if mark not in self._marks:
            return
        while (oldest := self._marks.popitem(last=False))[0] != mark:
            pass
        start, end = oldest[1]
        if end > start:
            ref = self.reference
            ref.mark(start, self.position(now) - (end - start), self._tolerance)

    def cleared(self, now: float) -> None:
        """A barge-in at `now`: what had not played is dropped, where the far end drops it."""
        self._marks.clear()
        if self.clears:
            self.reference.clear(self.position(now))
