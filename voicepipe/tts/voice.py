"""Load a Piper voice (``*.onnx`` with its ``*.onnx.json`` config) from a file or a directory."""

from __future__ import annotations

from pathlib import Path

from voicepipe.errors import ModelError


def find_voice_file(path: Path) -> Path:
    if path.is_file():
        return path
    voices = sorted(path.glob("*.onnx"))
    if not voices:
        raise ModelError(f"no Piper voice (*.onnx) in {path}.", "point models.tts at a Piper voice directory.")
    return voices[0]


def load_voice(path: Path, use_cuda: bool = False):
    from piper import PiperVoice

    return PiperVoice.load(find_voice_file(path), use_cuda=use_cuda)
