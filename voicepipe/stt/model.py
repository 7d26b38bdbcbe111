"""Load the faster-whisper model."""

from __future__ import annotations

import os
from pathlib import Path


def load_whisper(path: Path, device: str, compute_type: str, cpu_threads: int = 0):
    from faster_whisper import WhisperModel

    threads = cpu_threads or auto_cpu_threads(os.cpu_count() or 1)
    return WhisperModel(str(path), device=device, compute_type=compute_type, cpu_threads=threads)


def auto_cpu_threads(cores: int) -> int:
    """`stt.cpu_threads = 0`: half the cores, 1 to 4. CTranslate2's own default is 4 whatever the machine; on the
    2 cores here a pause decode of a 2.7 s sentence took 100 ms p50 with it, 103 ms with 2 threads and 79 ms with
    1, and one thread leaves the other core to the LLM's prefill, which waits for that decode."""
    return max(1, min(4, cores // 2))


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
