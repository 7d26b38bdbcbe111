"""Load the faster-whisper model."""

from __future__ import annotations

from pathlib import Path


def load_whisper(path: Path, device: str, compute_type: str, cpu_threads: int = 0):
    from faster_whisper import WhisperModel

    return WhisperModel(str(path), device=device, compute_type=compute_type, cpu_threads=cpu_threads)
