"""Caller audio of a case or a recording: a WAV at any rate; of several channels the first (left) is the caller
(and in a voicepipe recording the second, right, is the agent)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


class AudioFileError(ValueError):
    """The file is missing, is not a WAV file, or holds no audio."""


def read_caller_channel(path: Path) -> tuple[np.ndarray, int]:
    """The first channel of a PCM WAV file (8, 16, 24 or 32 bit) as int16, and its sample rate."""
    channels, rate = read_channels(path)
    return channels[0], rate


def read_channels(path: Path) -> tuple[list[np.ndarray], int]:
    """Every channel of a PCM WAV file (8, 16, 24 or 32 bit) as int16, and its sample rate."""
    try:
        if not path.is_file():
            raise AudioFileError("the file does not exist")
        with wave.open(str(path), "rb") as w:
            rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
            raw = w.readframes(w.getnframes())
    except OSError as exc:  # a name too long, no permission, ...
        raise AudioFileError(f"cannot be read ({exc.strerror or exc})") from None
    except (wave.Error, EOFError) as exc:
        raise AudioFileError(f"not a PCM WAV file ({exc})") from None
    if rate <= 0 or channels <= 0:
        raise AudioFileError("not a valid WAV file (no rate or channels)")
    frames = len(raw) // (width * channels)
    if frames == 0:
        raise AudioFileError("the WAV file holds no audio")
    data = np.frombuffer(raw[: frames * width * channels], dtype=np.uint8).reshape(frames, channels, width)
    return [_to_int16(data[:, c, :], width) for c in range(channels)], rate


def _to_int16(data: np.ndarray, width: int) -> np.ndarray:
    """Little-endian PCM samples of `width` bytes ([n, width] uint8) as int16 (the top 16 bits)."""
    if width == 1:  # 8-bit WAV is unsigned
        return ((data[:, 0].astype(np.int16) - 128) << 8).astype(np.int16)
    top = data[:, width - 2:]  # the two most significant bytes, little-endian
    return np.ascontiguousarray(top).view("<i2").reshape(-1).astype(np.int16)

