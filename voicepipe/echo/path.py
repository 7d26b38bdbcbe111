"""One call's echo cancelling: the caller's audio, cleaned of the agent's echo, in whole frames.

The transport keeps what the agent played in a `FarEndReference` on the call's input timeline; `EchoPath` takes
the caller's audio as it comes, advances the reference's "now" by it, estimates the echo's delay against the
reference (`DelayEstimator`), and runs the canceller on each frame with the reference read that far back
(`reference_lag`), at the pace of the caller's loudspeaker where its clock runs off the microphone's (`skew.py`).
Until the first delay reading the audio passes the canceller by, at once (a call without echo never waits for whole
frames). Last, `EchoLevelGate` silences what is no louder than the echo could be.
"""

from __future__ import annotations

import math

import numpy as np

from voicepipe.audio.l16 import float32_to_int16, int16_to_float32, require_dtype
from voicepipe.echo.canceller import EchoCanceller, held_lag
from voicepipe.echo.delay import MIN_REFERENCE_RMS, DelayEstimator
from voicepipe.echo.level_gate import EchoLevelGate
from voicepipe.echo.reference import FarEndReference
from voicepipe.echo.skew import ClockSkew, drifted_window


class EchoPath:
    """Cancels the echo of `reference` in the caller's audio (int16 at the reference's rate)."""

    def __init__(self, reference: FarEndReference, filter_ms: float = 200.0, min_delay_ms: float = 0.0,
                 max_delay_ms: float = 500.0, follow_clock: bool = True) -> None:
        self.reference = reference
        self.rate = reference.rate
        self.canceller = EchoCanceller(self.rate, filter_ms=filter_ms)
        self.delay = DelayEstimator(self.rate, min_delay_ms, max_delay_ms)
        self.gate = EchoLevelGate(reference, self.delay.min_lag, self.delay.max_lag, self.canceller.frame)
        self.skew = ClockSkew(self.rate)
        self._follow_clock = follow_clock  # off: the reference is read at the microphone's pace (for comparison)
        self._pending = np.zeros(0, np.int16)  # the caller's audio short of a whole frame
        self._position = 0  # input position of the first pending sample
        self._lag: int | None = None  # how far back the canceller reads the reference (`held_lag`)
        self._echo_in = 0.0  # the input's and the output's energy over the frames the echo's reference sounded in
        self._echo_out = 0.0

    @property
    def erle_db(self) -> float | None:
        """Echo return loss enhancement: input over output energy in the frames with the agent's audio at the
        echo's delay (the caller talking over it counts too, so it understates the canceller). None before any."""
        if self._echo_in <= 0.0:
            return None
        return round(10 * math.log10(self._echo_in / max(self._echo_out, 1e-12)), 1)

    def process(self, samples: np.ndarray) -> np.ndarray:
        """The caller's next audio in; the cleaned audio of the whole frames it completes out (the rest waits)."""
        samples = require_dtype(samples, np.int16)
        ref = self.reference
        self.delay.push(ref.window(ref.received, len(samples)), int16_to_float32(samples))
        ref.received += len(samples)
        self._take_readings()
        if self.delay.delay is None and not len(self._pending):  # nothing to cancel yet: no wait for whole frames
            at, self._position = self._position, self._position + len(samples)
            return self.gate.process(samples, at, None)
        pending = np.concatenate([self._pending, samples])
        frame = self.canceller.frame
        whole = len(pending) - len(pending) % frame
        out = [self._frame(pending[i:i + frame]) for i in range(0, whole, frame)]
        self._pending = pending[whole:]
        return np.concatenate(out) if out else np.zeros(0, np.int16)

    def _take_readings(self) -> None:
        """The delay readings since the last call, to the clock skew: each with the stretch of the agent's audio its
        window heard, placed at the middle of what it heard of it (a window over two stretches says nothing of
        either's drift, and one that heard a stretch for less than half its length too little)."""
        half = self.delay.window // 2
        while self.delay.taken:
            position, lag = self.delay.taken.popleft()
            heard = self.reference.stretches(position - lag - half, 2 * half)
            if len(heard) != 1:
                continue
            first, end = heard[0]
            lo, hi = max(first, position - lag - half), min(end, position - lag + half)
            if hi - lo >= half:
                self.skew.add(first, (lo + hi) // 2 + lag, lag)

    def _frame(self, near: np.ndarray) -> np.ndarray:
        """One whole frame through the canceller (there is a delay estimate: frames wait for none before it)."""
        at, self._position = self._position, self._position + len(near)
        self._lag = held_lag(self._lag, self.delay.delay, self.rate)
        skew = self.skew.compensated if self._follow_clock else 0.0
        far = drifted_window(self.reference, at - self._lag, len(near), skew)
        out = self.canceller.process(near, float32_to_int16(far))
        if np.sqrt(np.mean(np.square(far))) >= MIN_REFERENCE_RMS:
            self._echo_in += float(np.sum(np.square(near, dtype=np.float64)))
            self._echo_out += float(np.sum(np.square(out, dtype=np.float64)))
        return self.gate.process(out, at, self.delay.span, near)
