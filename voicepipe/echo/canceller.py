"""One call's echo canceller: SpeexDSP's MDF adaptive filter and its residual echo suppressor, through ctypes.

The library is Debian's `libspeexdsp1` (scripts/install-system-deps.sh, the Dockerfile), loaded by its soname:
nothing to compile. Why Speex and not WebRTC's AEC3: docs/echo.md (the higher ERLE in 17 of 18 measured calls,
the caller's voice kept far better during double talk, less CPU). Speex does not find the echo path's
delay: the filter covers `filter_ms` after the reference it is handed, so the call hands it the reference read
`reference_lag` samples back, with the delay from `delay.DelayEstimator`.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from voicepipe.audio.l16 import require_dtype
from voicepipe.errors import VoicepipeError

LIBRARY = "libspeexdsp.so.1"
PACKAGE = "libspeexdsp1"
# The reference is read this much later than the estimated delay says, so that an estimate a few ms late still
# leaves the echo's direct path inside the filter (which starts at the reference's first sample).
ALIGN_MARGIN_MS = 10.0
# The residual suppressor's gains are applied by Speex's denoiser: it stays on, but may take at most this much
# of the line's own noise, so that the canceller removes echo and leaves the noise the VAD and the STT are used
# to nearly as it was.
NOISE_SUPPRESS_DB = -3

_ECHO_SET_SAMPLING_RATE = 24  # speex/speex_echo.h
_PREPROCESS_SET_NOISE_SUPPRESS = 18  # speex/speex_preprocess.h
_PREPROCESS_SET_ECHO_STATE = 24


# The filter learns the echo path against the reference as it is handed: reading it from 1 ms (16 samples) further
# back misplaces all it has learned (an echo at 150 ms, -10 dB: ERLE 35 dB with the read position fixed, 6 dB with it
# moved by 1 ms and back each second). The delay estimate moves by a sample or a few ms from reading to reading, so
# the read position stays put while the estimate stays in [lag, lag + HOLD_MS]: the echo's direct path still falls
# in the filter's first part, and its room tail inside the filter's span.
HOLD_MS = 60.0


def reference_lag(delay: int, rate: int) -> int:
    """How many samples before a frame to read its reference, for an echo that arrives `delay` samples late."""
    return max(0, delay - int(rate * ALIGN_MARGIN_MS / 1000))


def held_lag(lag: int | None, delay: int, rate: int) -> int:
    """The read position `reference_lag` for a canceller that has been reading `lag` back (None: not yet): kept
    while the estimated `delay` stays within the part of the filter it allows (`HOLD_MS`), else moved to it."""
    if lag is not None and lag <= delay <= lag + int(rate * HOLD_MS / 1000):
        return lag
    return reference_lag(delay, rate)


class EchoUnavailable(VoicepipeError):
    """The echo canceller's library cannot be loaded."""


def load_speexdsp() -> ctypes.CDLL:
    name = LIBRARY
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        raise EchoUnavailable(
            f"the echo canceller needs SpeexDSP ({name}), which did not load: {e}.",
            f"apt-get install {PACKAGE} (scripts/install-system-deps.sh installs it).",
        ) from e
    lib.speex_echo_state_init.restype = ctypes.c_void_p
    lib.speex_echo_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_echo_state_destroy.argtypes = [ctypes.c_void_p]
    lib.speex_echo_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p] * 4
    lib.speex_preprocess_state_init.restype = ctypes.c_void_p
    lib.speex_preprocess_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_preprocess_state_destroy.argtypes = [ctypes.c_void_p]
    lib.speex_preprocess_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.speex_preprocess_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


class EchoCanceller:
    """Removes the far end's echo from the caller's input, one `frame_ms` frame at a time, at the input's `rate`.

    `process(near, far)`: `near` is a frame of the caller's input (int16), `far` the reference for the same
    frame, read `reference_lag` samples back on the input timeline (`FarEndReference.window`); returns the
    cleaned frame. The filter learns the echo path across frames: one instance per call, one thread at a time
    (ctypes releases the GIL while Speex runs); Speex's states are freed with the instance. With
    `suppress_residual`, Speex's residual echo suppressor runs after the filter (20 ms more latency, some
    10 dB more ERLE).
    """

    def __init__(self, rate: int, frame_ms: int = 20, filter_ms: float = 200.0, suppress_residual: bool = True):
        lib = load_speexdsp()
        self.rate = rate
        self.frame = rate * frame_ms // 1000
        self._lib = lib
        self._echo = lib.speex_echo_state_init(self.frame, int(rate * filter_ms / 1000))
        lib.speex_echo_ctl(self._echo, _ECHO_SET_SAMPLING_RATE, ctypes.byref(ctypes.c_int(rate)))
        self._residual = None
        if suppress_residual:
            self._residual = lib.speex_preprocess_state_init(self.frame, rate)
            lib.speex_preprocess_ctl(self._residual, _PREPROCESS_SET_ECHO_STATE, ctypes.c_void_p(self._echo))
            cap = ctypes.c_int(NOISE_SUPPRESS_DB)
            lib.speex_preprocess_ctl(self._residual, _PREPROCESS_SET_NOISE_SUPPRESS, ctypes.byref(cap))
        weakref.finalize(self, _destroy, lib, self._echo, self._residual)

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        near = np.ascontiguousarray(require_dtype(near, np.int16))
        far = np.ascontiguousarray(require_dtype(far, np.int16))
        if len(near) != self.frame or len(far) != self.frame:
            raise ValueError(f"frames must be {self.frame} samples, got near {len(near)} and far {len(far)}")
        out = np.empty_like(near)
        self._lib.speex_echo_cancellation(self._echo, near.ctypes.data, far.ctypes.data, out.ctypes.data)
        if self._residual is not None:
            self._lib.speex_preprocess_run(self._residual, out.ctypes.data)
        return out


def _destroy(lib: ctypes.CDLL, echo: int, residual: int | None) -> None:
    if residual is not None:
        lib.speex_preprocess_state_destroy(residual)
    lib.speex_echo_state_destroy(echo)
