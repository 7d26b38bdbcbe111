"""Load the faster-whisper model."""

from __future__ import annotations

from pathlib import Path


def load_whisper(path: Path, device: str, compute_type: str, cpu_threads: int = 0):
    from faster_whisper import WhisperModel

    return WhisperModel(str(path), device=device, compute_type=compute_type, cpu_threads=cpu_threads)


def stt_placement(settings) -> tuple[str, str, int]:
    """(device, compute_type, cpu_threads) for the STT model: settings.stt overrides, else the device defaults
    (CUDA with float16 when a GPU is present, otherwise CPU with int8)."""
    from voicepipe.devices import resolve_device

    stt = settings.stt
    device = resolve_device(settings.device) if stt.device == "auto" else stt.device
    if stt.compute_type != "auto":
        compute = stt.compute_type
    elif settings.device.dtype != "auto":
        compute = settings.device.dtype
    else:
        compute = "float16" if device == "cuda" else "int8"
    return device, compute, stt.cpu_threads
