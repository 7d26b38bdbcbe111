"""The echo path's delay: how far behind the far-end reference its echo arrives in the caller's input.

GCC-PHAT over a sliding window: the cross-spectrum of the input and the reference is whitened (phase only), so
the correlation peak is sharp for speech, whatever its spectrum, and the strongest path wins over later
reflections. One window gives one reading; a reading counts only when the reference carried sound and its peak
stands clear of the rest of the correlation (double talk and silence give flat ones), and the estimate is the
median of the last few readings, so one window spoiled by jitter or a talking caller moves nothing.

The input's window is tapered (Hann) before the transform. PHAT weighs every frequency alike, those where neither
signal carries anything included: a call estimates at 16 kHz what an 8 kHz phone line carried, and in its 4-8 kHz
the caller's audio and the reference hold only the resampling's residue, some 55 dB under the speech, against which
the square ends of the windows stood out. They were all that correlated there: the input window's ends met the
reference window's at lags of 1 sample and 499.94 ms, and the pair of ends 16000 samples apart, once divided out by
PHAT, repeats at 32000 samples, which the 32768-point transform wraps to 452 ms. Replayed over captured calls (what
`EchoPath` took, in `bench echo` and tests/e2e/test_call_echo.py), that gave the five calls without echo 5 to 15
readings each (peaks up to 150 times the mean), and of the six echo calls' readings 89 of 211 were more than 60 ms
off the echo, one call's median for 22 of its 25 s. Tapered, the input has no ends: no reading in the calls without
echo (276 windows), 7 of 193 readings off in the echo calls, and the first reading as early. Those 7 are stretches
of a reply that the reference placed 105-140 ms later than they played: the estimate follows the reference.
"""

from __future__ import annotations

from collections import deque

import numpy as np

# Peak over the mean absolute correlation of the searched lags: an echo gives 35-300 (at -6 dB under double talk
# the least), a window with no echo in it (the caller alone, or echo 30 dB under the caller) 5-12. In calls over a
# phone line (`bench echo`, tests/e2e/test_call_echo.py) the readings stood 20-183, windows without echo at most 11.
MIN_PEAK_RATIO = 20.0
# The reference must carry sound in the window; below this RMS (about -60 dBFS) its phase is noise.
MIN_REFERENCE_RMS = 1e-3


def whitened_correlation(near: np.ndarray, far: np.ndarray, size: int) -> np.ndarray:
    """GCC-PHAT over `size`-point transforms: at index m, `near[j]` against `far[j + m]`, the cross-spectrum whitened
    (phase only) so that the peak is sharp for speech whatever its spectrum. `near` comes tapered (module doc)."""
    cross = np.conj(np.fft.rfft(near, size)) * np.fft.rfft(far, size)
    return np.fft.irfft(cross / (np.abs(cross) + 1e-12), size)


class DelayEstimator:
    """Streaming delay estimate between a far-end reference and the caller's input, both at `rate`.

    `push(far, near)` takes equal-length chunks of the two, aligned on the input timeline (the reference
    sample that was playing when each input sample arrived). Every `hop_ms` of audio it reads one window of
    `window_ms`, searching lags from `min_ms` to `max_ms`. `delay` is the median of the last `readings`
    accepted readings, in samples, or None before the first one.
    """

    def __init__(
        self,
        rate: int,
        min_ms: float = 0.0,
        max_ms: float = 500.0,
        window_ms: float = 1000.0,
        hop_ms: float = 250.0,
        readings: int = 5,
    ) -> None:
        if not 0 <= min_ms < max_ms:
            raise ValueError(f"need 0 <= min_ms < max_ms, got {min_ms}, {max_ms}")
        self.rate = rate
        self.min_lag = int(rate * min_ms / 1000)
        self.max_lag = int(rate * max_ms / 1000)
        self.window = int(rate * window_ms / 1000)
        self.hop = int(rate * hop_ms / 1000)
        span = self.window + self.max_lag
        self._n_fft = 1 << (span - 1).bit_length()
        self._taper = np.hanning(self.window).astype(np.float32)
        self._far = np.zeros(span, np.float32)
        self._near = np.zeros(self.window, np.float32)
        self._seen = 0
        self._since_reading = 0
        self._readings: deque[int] = deque(maxlen=readings)
        # Each accepted reading as (input position of its window's centre, lag), until its reader takes them
        # (`EchoPath`, for the clock skew): a bounded queue, so that an estimator no one reads stays small.
        self.taken: deque[tuple[int, int]] = deque(maxlen=readings)

    @property
    def delay(self) -> int | None:
        return int(np.median(self._readings)) if self._readings else None

    @property
    def span(self) -> tuple[int, int] | None:
        """The shortest and the longest of the last readings, in samples (None before the first): where the echo may
        be. One spurious reading moves the median little, but the echo may still be where it says."""
        return (min(self._readings), max(self._readings)) if self._readings else None

    @property
    def delay_ms(self) -> float | None:
        delay = self.delay
        return None if delay is None else 1000 * delay / self.rate

    def push(self, far: np.ndarray, near: np.ndarray) -> None:
        if len(far) != len(near):
            raise ValueError(f"far and near chunks differ in length: {len(far)} != {len(near)}")
        for start in range(0, len(far), self.hop):
            self._push_part(far[start : start + self.hop], near[start : start + self.hop])

    def _push_part(self, far: np.ndarray, near: np.ndarray) -> None:
        n = len(far)
        self._far = np.concatenate([self._far[n:], far.astype(np.float32, copy=False)])
        self._near = np.concatenate([self._near[n:], near.astype(np.float32, copy=False)])
        self._seen += n
        self._since_reading += n
        if self._since_reading >= self.hop and self._seen >= len(self._far):
            self._since_reading = 0
            lag = self._reading()
            if lag is not None:
                self._readings.append(lag)
                self.taken.append((self._seen - self.window // 2, lag))

    def _reading(self) -> int | None:
        if np.sqrt(np.mean(self._far**2)) < MIN_REFERENCE_RMS:
            return None
        corr = whitened_correlation(self._near * self._taper, self._far, self._n_fft)
        # near[j] = far[j + max_lag - d]: the correlation at m = max_lag - d holds the echo of delay d.
        searched = corr[self.max_lag - np.arange(self.min_lag, self.max_lag + 1)]
        best = int(np.argmax(searched))
        if searched[best] < MIN_PEAK_RATIO * np.mean(np.abs(searched)):
            return None
        if best in (0, len(searched) - 1):  # a peak at an end of the searched lags was not located: seen in calls
            return None
        return self.min_lag + best
