"""Validate caller audio before it reaches a model: one clear error for bad input, never a crash."""

from __future__ import annotations

import numpy as np

from voicepipe.audio import int16_to_float32

SUPPORTED_VAD_RATES = (8000, 16000)


class AudioInputError(ValueError):
    """Audio that a model cannot take: wrong type, shape or sample rate, or non-finite samples."""


def to_float32(samples: object, what: str = "audio") -> np.ndarray:
    """Return 1-D float32 samples in [-1, 1] from int16 or float samples; raise AudioInputError if unusable.

    NaN or infinite samples are rejected (they would poison the model's recurrent state), not repaired.
    """
    if not isinstance(samples, np.ndarray):
        raise AudioInputError(f"{what}: expected a numpy array, got {type(samples).__name__}")
    if samples.ndim != 1:
        raise AudioInputError(f"{what}: expected 1-D mono samples, got shape {samples.shape}")
    if samples.dtype == np.int16:
        return int16_to_float32(samples)
    if samples.dtype not in (np.float32, np.float64):
        raise AudioInputError(f"{what}: expected int16 or float32 samples, got dtype {samples.dtype}")
    out = samples.astype(np.float32, copy=False)
    if out.size and not np.isfinite(out).all():
        raise AudioInputError(f"{what}: {int(np.count_nonzero(~np.isfinite(out)))} samples are NaN or infinite")
    return out


def check_rate(sample_rate: int, allowed: tuple[int, ...] | None = None, what: str = "audio") -> int:
    if not isinstance(sample_rate, int | np.integer) or sample_rate <= 0:
        raise AudioInputError(f"{what}: sample rate must be a positive integer, got {sample_rate!r}")
    if allowed is not None and sample_rate not in allowed:
        raise AudioInputError(f"{what}: sample rate {sample_rate} Hz is not supported (use one of {allowed})")
    return int(sample_rate)
