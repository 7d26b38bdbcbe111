"""16-bit linear PCM (L16): int16 samples to and from bytes, and float32 <-> int16 conversion."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import DTypeLike

ByteOrder = Literal["little", "big"]

_ORDER_CHAR = {"little": "<", "big": ">"}
_INT16_SCALE = 32768.0


def require_dtype(samples: object, *dtypes: DTypeLike) -> np.ndarray:
    """Return `samples` unchanged if it is an ndarray of one of `dtypes`; raise TypeError otherwise."""
    allowed = [np.dtype(d) for d in dtypes]
    if not isinstance(samples, np.ndarray):
        raise TypeError(f"expected a numpy array of {_names(allowed)}, got {type(samples).__name__}")
    if samples.dtype not in allowed:
        raise TypeError(f"expected a numpy array of {_names(allowed)}, got dtype {samples.dtype}")
    return samples


def encode_l16(samples: np.ndarray, byteorder: ByteOrder = "little") -> bytes:
    """Serialize int16 samples (C order) to bytes in the given byte order."""
    samples = require_dtype(samples, np.int16)
    return samples.astype(_l16_dtype(byteorder), copy=False).tobytes()


def decode_l16(data: bytes | bytearray | memoryview, byteorder: ByteOrder = "little") -> np.ndarray:
    """Parse bytes in the given byte order into a new, writable, native int16 array."""
    dtype = _l16_dtype(byteorder)
    n_bytes = memoryview(data).nbytes
    if n_bytes % 2:
        raise ValueError(f"L16 data must have an even number of bytes, got {n_bytes}")
    return np.frombuffer(data, dtype=dtype).astype(np.int16)


def int16_to_float32(samples: np.ndarray) -> np.ndarray:
    """Scale int16 samples to float32 in [-1, 1) (divides by 32768)."""
    samples = require_dtype(samples, np.int16)
    return samples.astype(np.float32) / np.float32(_INT16_SCALE)


def float32_to_int16(samples: np.ndarray) -> np.ndarray:
    """Scale float samples in [-1, 1] to int16: multiply by 32768, round, clip; NaN becomes 0."""
    samples = require_dtype(samples, np.float32, np.float64)
    clean = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
    scaled = np.rint(clean * _INT16_SCALE)
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def _l16_dtype(byteorder: str) -> np.dtype:
    try:
        return np.dtype(_ORDER_CHAR[byteorder] + "i2")
    except KeyError:
        raise ValueError(f"byteorder must be 'little' or 'big', got {byteorder!r}") from None


def _names(dtypes: list[np.dtype]) -> str:
    return " or ".join(str(d) for d in dtypes)
