"""Split a mono stream of arbitrary-size chunks into fixed-duration frames (20 ms by default)."""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from voicepipe.audio.l16 import require_dtype


class Framer:
    """Cut 1-D chunks into frames of exactly `frame_ms`; the partial remainder waits for the next chunk."""

    def __init__(self, sample_rate: int, frame_ms: int = 20, dtype: DTypeLike = np.int16) -> None:
        if sample_rate <= 0 or frame_ms <= 0:
            raise ValueError(f"sample_rate and frame_ms must be positive, got {sample_rate}, {frame_ms}")
        if (sample_rate * frame_ms) % 1000:
            raise ValueError(f"{frame_ms} ms at {sample_rate} Hz is not a whole number of samples")
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self.frame_size = sample_rate * frame_ms // 1000
        self.dtype = np.dtype(dtype)
        self._rest = np.zeros(0, dtype=self.dtype)

    @property
    def pending(self) -> int:
        """Samples held back, waiting to complete a frame (always < frame_size)."""
        return len(self._rest)

    def push(self, chunk: np.ndarray) -> list[np.ndarray]:
        """Add a chunk; return the frames it completes (each a new array of frame_size samples)."""
        chunk = require_dtype(chunk, self.dtype)
        if chunk.ndim != 1:
            raise ValueError(f"expected a 1-D chunk, got shape {chunk.shape}")
        if len(chunk) == 0:
            return []
        data = np.concatenate([self._rest, chunk])
        n_frames = len(data) // self.frame_size
        cut = n_frames * self.frame_size
        self._rest = data[cut:].copy()
        return list(data[:cut].reshape(n_frames, self.frame_size))

    def flush(self, pad: bool = True) -> list[np.ndarray]:
        """Return the remainder as a last frame (zero-padded to frame_size if `pad`), or [] if none."""
        if not len(self._rest):
            return []
        rest, self._rest = self._rest, np.zeros(0, dtype=self.dtype)
        if pad:
            rest = np.concatenate([rest, np.zeros(self.frame_size - len(rest), dtype=self.dtype)])
        return [rest]
