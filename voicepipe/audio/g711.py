"""ITU-T G.711 companding: PCMU (mu-law) and PCMA (A-law), int16 samples <-> 8-bit codes.

Quantization follows the standard's tables as implemented by the classic reference code:
- mu-law: magnitude |x| clipped to 32635, plus bias 0x84, segment/mantissa, all bits inverted
  (symmetric: x and -x get the same level with opposite sign).
- A-law: 13-bit magnitude (one's complement for negative values, as in ITU-T G.191), segment/
  mantissa, sign bit set for x >= 0, even bits toggled (XOR 0x55).
Encoding is one lookup in a 65,536-entry table; decoding is one lookup in a 256-entry table.
"""

from __future__ import annotations

import numpy as np

from voicepipe.audio.l16 import require_dtype

_ULAW_BIAS = 0x84
_ULAW_CLIP = 32635
_SEGMENT_ENDS = np.array([0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF, 0x3FFF, 0x7FFF])


def _all_int16() -> np.ndarray:
    """Every int16 value, ordered by its uint16 bit pattern (the encode tables' index)."""
    return np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32)


def _ulaw_encode_table() -> np.ndarray:
    x = _all_int16()
    biased = np.minimum(np.abs(x), _ULAW_CLIP) + _ULAW_BIAS  # 0x84 .. 0x7FFF
    segment = np.searchsorted(_SEGMENT_ENDS, biased)  # first end >= biased: 0 .. 7
    mantissa = (biased >> (segment + 3)) & 0xF
    sign = np.where(x < 0, 0x80, 0x00)
    return (~(sign | (segment << 4) | mantissa) & 0xFF).astype(np.uint8)


def _alaw_encode_table() -> np.ndarray:
    x = _all_int16()
    magnitude = np.where(x >= 0, x, ~x) >> 3  # 13-bit magnitude: 0 .. 4095
    segment = np.searchsorted(_SEGMENT_ENDS >> 3, magnitude)  # 0 .. 7
    mantissa = (magnitude >> np.maximum(segment, 1)) & 0xF
    mask = np.where(x >= 0, 0xD5, 0x55)
    return (((segment << 4) | mantissa) ^ mask).astype(np.uint8)


def _ulaw_decode_table() -> np.ndarray:
    code = ~np.arange(256) & 0xFF
    segment = (code >> 4) & 0x7
    mantissa = code & 0xF
    magnitude = (((2 * mantissa + 33) << segment) - 33) * 4
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    code = np.arange(256) ^ 0x55
    segment = (code >> 4) & 0x7
    mantissa = code & 0xF
    shift = np.maximum(segment - 1, 0)
    magnitude = np.where(segment == 0, 2 * mantissa + 1, (2 * mantissa + 33) << shift) * 8
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


_ULAW_ENCODE = _ulaw_encode_table()
_ALAW_ENCODE = _alaw_encode_table()
_ULAW_DECODE = _ulaw_decode_table()
_ALAW_DECODE = _alaw_decode_table()


def encode_pcmu(samples: np.ndarray) -> bytes:
    """Encode int16 samples (C order) to mu-law bytes, one byte per sample."""
    return _encode(samples, _ULAW_ENCODE)


def decode_pcmu(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Decode mu-law bytes to a new int16 array."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def encode_pcma(samples: np.ndarray) -> bytes:
    """Encode int16 samples (C order) to A-law bytes, one byte per sample."""
    return _encode(samples, _ALAW_ENCODE)


def decode_pcma(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Decode A-law bytes to a new int16 array."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def _encode(samples: np.ndarray, table: np.ndarray) -> bytes:
    samples = require_dtype(samples, np.int16)
    return table[samples.view(np.uint16)].tobytes()
