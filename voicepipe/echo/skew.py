"""The loudspeaker's clock against the microphone's: how much faster the caller's end plays the agent's audio than
it samples its own, and the reference read at that pace.

A speakerphone, a Bluetooth speaker or a browser with its output on another device than its microphone plays the
agent on one clock and records on another. Then the echo of a stretch of the agent's audio drifts against the
reference: 0.1 % fast, its delay shrinks by 1 ms each second. Speex's filter cannot follow a path that moves a
sample every 62 ms: offline, read as sent, it took 3.6-5.7 dB of echo out of a sixth reply at 0.1 % where it took
28-41 with one clock, and 0.02 % already cost three quarters (`scripts/bench_echo_skew.py`, docs/benchmarks.md).

`ClockSkew` reads the skew off the delay estimate's readings: within one stretch of the agent's audio (segments of
the reference that follow each other, `FarEndReference.stretch_start`; the caller's end starts each anew when it
comes) the readings fall on a line whose slope is minus the skew. The slope is pooled over the stretches (each
stretch's own mean taken out: each starts where the reference placed it), readings far from their stretch's median
are left out, and none is given before the readings spread enough to pin it (`MIN_SPREAD_S`) or while it is within
the readings' noise of none (`SIGNIFICANCE`). `drifted_window` then reads the reference at that pace from the
stretch's start, so the canceller sees a path that holds still.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from voicepipe.echo.reference import FarEndReference

MAX_SKEW = 0.005  # a clock 0.5 % off is a broken device, not drift: no compensation beyond it
# Under this the drift over a few seconds' reply is a few samples, which the filter follows: the reference is read as
# it is (and a call without skew never has its reference resampled).
MIN_SKEW = 5e-5
# The readings' spread within their stretches (the root of their pooled sum of squares about each stretch's mean, in
# seconds) before a skew is given: with readings a sample apart in noise, 0.6 s pins the skew to about 1e-4.
MIN_SPREAD_S = 0.6
# ... and the fitted skew must stand this many standard errors clear of none (the readings' scatter about their
# lines, at least a sample: GCC-PHAT reads whole samples), so that a call whose clocks agree is read as it is.
SIGNIFICANCE = 4.0
OUTLIER_MS = 10.0  # a reading this far from its stretch's median is another path or a spoiled window
STRETCHES = 16  # the last stretches whose readings count


class ClockSkew:
    """The skew of the caller's loudspeaker against its microphone (0.001: it plays 0.1 % fast), from delay readings."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._stretches: OrderedDict[int, list[tuple[int, int]]] = OrderedDict()  # stretch start -> (position, lag)
        self.skew = 0.0  # as measured; `compensated` is what the reference is read with

    @property
    def compensated(self) -> float:
        return self.skew if abs(self.skew) >= MIN_SKEW else 0.0

    def add(self, stretch: int, position: int, lag: int) -> None:
        """A delay reading `lag` (samples) of the window centred on input `position`, in the stretch of the agent's
        audio that began at input position `stretch` (`FarEndReference.stretch_start`)."""
        self._stretches.setdefault(stretch, []).append((position, lag))
        self._stretches.move_to_end(stretch)
        while len(self._stretches) > STRETCHES:
            self._stretches.popitem(last=False)
        self.skew = self._fit()

    def _fit(self) -> float:
        outlier = self.rate * OUTLIER_MS / 1000
        centred = []
        for readings in self._stretches.values():
            x, y = np.array(readings, np.float64).T
            keep = np.abs(y - np.median(y)) <= outlier
            if keep.any():  # (two readings further apart than twice the bound are both off their median)
                centred.append((x[keep] - x[keep].mean(), y[keep] - y[keep].mean()))
        sxx = sum(float(x @ x) for x, _ in centred)
        if sxx < (MIN_SPREAD_S * self.rate) ** 2:
            return 0.0
        slope = sum(float(x @ y) for x, y in centred) / sxx
        residuals = np.concatenate([y - slope * x for x, y in centred])
        dof = len(residuals) - len(centred) - 1
        scatter = max(1.0, float(np.sqrt(residuals @ residuals / dof))) if dof > 0 else 1.0
        if abs(slope) < SIGNIFICANCE * scatter / np.sqrt(sxx):
            return 0.0
        return float(np.clip(-slope, -MAX_SKEW, MAX_SKEW))


def drifted_window(reference: FarEndReference, start: int, count: int, skew: float) -> np.ndarray:
    """`reference.window(start, count)` as a loudspeaker `skew` fast played it: from the start of the stretch that
    `start` falls in, reference sample s0 + t(1 + skew) plays at s0 + t (cubic interpolation between samples)."""
    stretch = reference.stretch_start(start) if skew else None
    if stretch is None:
        return reference.window(start, count)
    at = start + skew * (start - stretch) + np.arange(count) * (1.0 + skew)
    first = int(np.floor(at[0])) - 1
    samples = reference.window(first, int(np.ceil(at[-1])) + 3 - first).astype(np.float64)
    i = np.floor(at).astype(np.int64) - first
    t = at - np.floor(at)
    p0, p1, p2, p3 = samples[i - 1], samples[i], samples[i + 1], samples[i + 2]  # Catmull-Rom through p1 .. p2
    out = p1 + 0.5 * t * (p2 - p0 + t * (2 * p0 - 5 * p1 + 4 * p2 - p3 + t * (3 * (p1 - p2) + p3 - p0)))
    return out.astype(np.float32)
