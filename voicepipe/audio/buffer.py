"""A bounded mono audio buffer: a ring of samples that drops the oldest ones when full."""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from voicepipe.audio.l16 import require_dtype


class AudioBuffer:
    """FIFO of at most `max_seconds` of samples; appending past the limit drops the oldest samples.

    `dropped` counts every sample discarded that way since creation.
    """

    def __init__(self, sample_rate: int, max_seconds: float, dtype: DTypeLike = np.int16) -> None:
        capacity = round(sample_rate * max_seconds)
        if sample_rate <= 0 or capacity < 1:
            raise ValueError(f"buffer must hold at least one sample, got {sample_rate} Hz x {max_seconds} s")
        self.sample_rate = sample_rate
        self.capacity = capacity
        self.dtype = np.dtype(dtype)
        self.dropped = 0
        self._ring = np.zeros(capacity, dtype=self.dtype)
        self._start = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, samples: np.ndarray) -> None:
        """Add 1-D samples at the end, dropping the oldest samples beyond capacity."""
        samples = require_dtype(samples, self.dtype)
        if samples.ndim != 1:
            raise ValueError(f"expected 1-D samples, got shape {samples.shape}")
        overflow = self._size + len(samples) - self.capacity
        if overflow > 0:
            self.dropped += overflow
            drop_buffered = min(overflow, self._size)
            self._start = (self._start + drop_buffered) % self.capacity
            self._size -= drop_buffered
            samples = samples[overflow - drop_buffered :]
        end = (self._start + self._size) % self.capacity
        first = min(len(samples), self.capacity - end)
        self._ring[end : end + first] = samples[:first]
        self._ring[: len(samples) - first] = samples[first:]
        self._size += len(samples)

    def read(self, n: int) -> np.ndarray:
        """Remove and return up to `n` of the oldest samples (fewer if fewer are buffered)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        n = min(n, self._size)
        idx = (self._start + np.arange(n)) % self.capacity
        out = self._ring[idx]
        self._start = (self._start + n) % self.capacity
        self._size -= n
        return out

    def latest(self, n: int) -> np.ndarray:
        """A copy of the newest `n` samples (fewer if fewer are buffered), oldest first; nothing is removed."""
        n = max(0, min(n, self._size))
        idx = (self._start + self._size - n + np.arange(n)) % self.capacity
        return self._ring[idx]

    def clear(self) -> None:
        """Discard all buffered samples (not counted as dropped)."""
        self._start = 0
        self._size = 0
