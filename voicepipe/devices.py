"""Pick the device and numeric types from the settings and what the machine has."""

from __future__ import annotations

from voicepipe.config import DeviceSettings


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(settings: DeviceSettings) -> str:
    if settings.device == "auto":
        return "cuda" if cuda_available() else "cpu"
    return settings.device


def llm_dtype_name(settings: DeviceSettings) -> str:
    """float32 on CPU (fast SDPA kernels, exact greedy parity), bfloat16 on CUDA, unless set."""
    if settings.dtype != "auto":
        return settings.dtype
    return "bfloat16" if resolve_device(settings) == "cuda" else "float32"


def stt_compute_type(settings: DeviceSettings) -> str:
    """CTranslate2 compute type: int8 on CPU, float16 on CUDA, unless a dtype is set."""
    if settings.dtype != "auto":
        return settings.dtype
    return "float16" if resolve_device(settings) == "cuda" else "int8"
