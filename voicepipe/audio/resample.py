"""Sample-rate conversion with libswresample (PyAV): a stateful per-stream resampler and a one-shot helper.

libswresample releases output as input arrives, a few samples behind. (soxr's stream resampler works in
blocks and held 8 kHz telephone audio back in ~100 ms bursts, which delayed every VAD decision on a call:
the end of a turn, a barge-in.) Work is done in float32 (no dither); int16 input is scaled to [-1, 1) and the
output is rounded and clipped back to int16, so both dtypes go through the same filter.
"""

from __future__ import annotations

import av
import numpy as np
from numpy.typing import DTypeLike

from voicepipe.audio.l16 import float32_to_int16, int16_to_float32, require_dtype

_SAMPLE_DTYPES = (np.int16, np.float32)
_LAYOUTS = {1: "mono", 2: "stereo"}  # libswresample's names; other counts as "<n>c"


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
        self._layout = _LAYOUTS.get(channels, f"{channels}c")
        self._stream = None if in_rate == out_rate else self._new_stream()

    def _new_stream(self) -> av.AudioResampler:
        return av.AudioResampler(format="flt", layout=self._layout, rate=self.out_rate)

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
        self._stream = self._new_stream()
        return tail

    def _run(self, chunk: np.ndarray, last: bool) -> np.ndarray:
        frames = []
        if len(chunk):
            frame = av.AudioFrame.from_ndarray(_to_float32(chunk).reshape(1, -1), format="flt", layout=self._layout)
            frame.sample_rate = self.in_rate
            frames += self._stream.resample(frame)
        if last:
            frames += self._stream.resample(None)
        out = (np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames
               else np.zeros(0, np.float32))
        if self.channels > 1:
            out = out.reshape(-1, self.channels)
        return _from_float32(out, self.dtype)


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Resample a whole signal at once; 1-D mono or 2-D (frames, channels), int16 or float32. The same filter
    as `StreamResampler`, so a stream and the whole signal give the same samples."""
    samples = require_dtype(samples, *_SAMPLE_DTYPES)
    if samples.ndim not in (1, 2):
        raise ValueError(f"expected a 1-D or 2-D array, got shape {samples.shape}")
    if in_rate <= 0 or out_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
    if in_rate == out_rate or len(samples) == 0:
        return samples.copy()
    channels = 1 if samples.ndim == 1 else samples.shape[1]
    stream = StreamResampler(in_rate, out_rate, channels, samples.dtype)
    return np.concatenate([stream.process(samples), stream.flush()])


def _to_float32(samples: np.ndarray) -> np.ndarray:
    if samples.dtype == np.int16:
        return int16_to_float32(samples)
    return np.ascontiguousarray(samples)


def _from_float32(samples: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return float32_to_int16(samples) if dtype == np.int16 else samples
