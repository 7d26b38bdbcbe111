"""What a transport feeds a call's far-end reference as it paces the agent's audio out: each chunk it sends, where it
will play, the marks that say where it did, and clears.

The transport knows its own clock (seconds) and its marks; the reference knows input positions. `PlayedAudio`
turns one into the other: a chunk sent `lead_s` before it plays sits `lead_s` of input after the input position of
now (`FarEndReference.received`, which the call advances as it takes the caller's audio).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from voicepipe.audio import StreamResampler
from voicepipe.audio.l16 import int16_to_float32
from voicepipe.echo.reference import FarEndReference

# A mark arrives with the caller's 20 ms frames, so where it says a sample played is only good to a frame or so;
# moving the reference at every mark by that much would make the canceller's filter learn the path again and again.
MARK_TOLERANCE_MS = 40.0
MARKS_KEPT = 1000  # unacknowledged marks remembered (20 s of 20 ms chunks): a provider that never echoes them


class PlayedAudio:
    """One call's outbound audio (int16 at `send_rate`) kept in `reference` (at its own rate, the call's)."""

    def __init__(self, reference: FarEndReference, send_rate: int, clears: bool = True) -> None:
        self.reference = reference
        self.clears = clears  # False: the far end cannot drop audio already sent (AudioSocket), it still plays
        self._resampler = StreamResampler(send_rate, reference.rate) if send_rate != reference.rate else None
        self._tolerance = int(reference.rate * MARK_TOLERANCE_MS / 1000)
        self._marks: OrderedDict[str, tuple[int, int]] = OrderedDict()  # mark -> its chunk's offsets in the reference

    def sent(self, audio: np.ndarray, lead_s: float, mark: str | None = None) -> None:
        """`audio` went out now and starts to play `lead_s` from now (after what was sent before it)."""
        ref = self.reference
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        start = ref.sent
        ref.append(int16_to_float32(audio), ref.received + round(lead_s * ref.rate))
        if mark is not None:
            self._marks[mark] = (start, ref.sent)
            if len(self._marks) > MARKS_KEPT:
                self._marks.popitem(last=False)

    def played(self, mark: str) -> None:
        """The far end says the audio up to `mark` has played by now: its chunk, and what follows it, moves to end
        there (a mark it has said before moves nothing)."""
        if mark not in self._marks:
            return
        while (oldest := self._marks.popitem(last=False))[0] != mark:
            pass
        start, end = oldest[1]
        if end > start:
            ref = self.reference
            ref.mark(start, ref.received - (end - start), self._tolerance)

    def cleared(self) -> None:
        """A barge-in now: what had not played is dropped, where the far end drops it."""
        self._marks.clear()
        if self.clears:
            self.reference.clear(self.reference.received)
