"""Sample-rate conversion with soxr: a stateful per-stream resampler and a one-shot helper.

Work is done in float32 inside soxr (no dither); int16 input is scaled to [-1, 1) and the output
is rounded and clipped back to int16, so both dtypes go through the same filter.
"""

from __future__ import annotations

import numpy as np
import soxr
from numpy.typing import DTypeLike

from voicepipe.audio.l16 import float32_to_int16, int16_to_float32, require_dtype

_SAMPLE_DTYPES = (np.int16, np.float32)


class StreamResampler:
    """Resample one continuous stream chunk by chunk, keeping filter state across chunks.

    Mono streams are 1-D arrays; multichannel streams are 2-D arrays of shape (frames, channels).
    Every chunk must have the dtype given here (int16 or float32); outputs have the same dtype.
    """

    def __init__(self, in_rate: int, out_rate: int, channels: int = 1, dtype: DTypeLike = np.int16) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in _SAMPLE_DTYPES:
            raise TypeError(f"dtype must be int16 or float32, got {self.dtype}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.channels = channels
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, channels)

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Resample the next chunk; returns whatever output is ready (possibly empty).

        When the rates match, the chunk itself is returned.
        """
        chunk = require_dtype(chunk, self.dtype)
        expected_ndim = 1 if self.channels == 1 else 2
        if chunk.ndim != expected_ndim or (expected_ndim == 2 and chunk.shape[1] != self.channels):
            shape = "(frames,)" if self.channels == 1 else f"(frames, {self.channels})"
            raise ValueError(f"expected a chunk of shape {shape}, got {chunk.shape}")
        if self._stream is None:
            return chunk
        if len(chunk) == 0:
            return chunk.copy()
        return self._run(chunk, last=False)

    def flush(self) -> np.ndarray:
        """Return the samples still held in the filter and reset, ready for a new stream."""
        empty_shape = (0,) if self.channels == 1 else (0, self.channels)
        if self._stream is None:
            return np.zeros(empty_shape, dtype=self.dtype)
        tail = self._run(np.zeros(empty_shape, dtype=self.dtype), last=True)
        self._stream.clear()
        return tail

    def _run(self, chunk: np.ndarray, last: bool) -> np.ndarray:
        out = self._stream.resample_chunk(_to_float32(chunk), last=last)
        return _from_float32(out, self.dtype)


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Resample a whole signal at once; 1-D mono or 2-D (frames, channels), int16 or float32."""
    samples = require_dtype(samples, *_SAMPLE_DTYPES)
    if samples.ndim not in (1, 2):
        raise ValueError(f"expected a 1-D or 2-D array, got shape {samples.shape}")
    if in_rate <= 0 or out_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
    if in_rate == out_rate or len(samples) == 0:
        return samples.copy()
    out = soxr.resample(_to_float32(samples), in_rate, out_rate)
    return _from_float32(out, samples.dtype)


def _to_float32(samples: np.ndarray) -> np.ndarray:
    if samples.dtype == np.int16:
        return int16_to_float32(samples)
    return np.ascontiguousarray(samples)


def _from_float32(samples: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return float32_to_int16(samples) if dtype == np.int16 else samples
