"""What the caller says: utterances (audio with its voiced span), cut from a recording at its silences, key presses
(a keypad "utterance": silence with its keys), and WAV files in and out."""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Utterance:
    audio: np.ndarray  # int16 mono at `rate`
    rate: int
    voiced_start: int  # first voiced sample (a keypad utterance: its first key)
    voiced_end: int  # end of the last voiced sample (a keypad utterance: just after its last key)
    keys: tuple[tuple[int, str], ...] = ()  # (sample, key): DTMF keys pressed at these points of `audio`

    @property
    def keypad_only(self) -> bool:
        """Keys and no speech: the utterance's voiced span is its keys' (`keypad`)."""
        return bool(self.keys) and self.voiced_end == self.keys[-1][0] + 1


def keypad(digits: str, rate: int = 8000, gap_s: float = 0.2, lead_s: float = 0.1, tail_s: float = 0.3) -> Utterance:
    """Keys pressed `gap_s` apart on a silent line (`lead_s` of silence before the first, `tail_s` after the last)."""
    if not digits:
        raise ValueError("no keys to press")
    offsets = [int((lead_s + i * gap_s) * rate) for i in range(len(digits))]
    audio = np.zeros(offsets[-1] + int(tail_s * rate), np.int16)
    return Utterance(audio, rate, offsets[0], offsets[-1] + 1, tuple(zip(offsets, digits, strict=True)))


def voiced_span(audio: np.ndarray, rate: int, threshold: float = 300.0) -> tuple[int, int]:
    """First and last+1 sample of 10 ms windows whose RMS is over `threshold` (int16 units)."""
    win = max(1, rate // 100)
    n = len(audio) // win
    if n == 0:
        return 0, len(audio)
    rms = np.sqrt(np.mean(audio[: n * win].astype(np.float64).reshape(n, win) ** 2, axis=1))
    loud = np.flatnonzero(rms > threshold)
    if not len(loud):
        return 0, 0
    return int(loud[0] * win), int((loud[-1] + 1) * win)


def split_utterances(audio: np.ndarray, rate: int, min_gap_s: float = 0.5, pad_s: float = 0.1) -> list[Utterance]:
    """Cut a recording into utterances separated by at least `min_gap_s` of silence."""
    win = max(1, rate // 100)
    n = len(audio) // win
    rms = np.sqrt(np.mean(audio[: n * win].astype(np.float64).reshape(n, win) ** 2, axis=1)) if n else []
    loud = np.flatnonzero(np.asarray(rms) > 300.0)
    spans: list[list[int]] = []
    for i in loud:
        if spans and i - spans[-1][1] <= min_gap_s * 100:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    out = []
    pad = int(pad_s * rate)
    for a, b in spans:
        start, end = max(0, a * win - pad), min(len(audio), (b + 1) * win + pad)
        piece = audio[start:end]
        vs, ve = voiced_span(piece, rate)
        out.append(Utterance(piece, rate, vs, ve))
    return out


def utterance(audio: np.ndarray, rate: int) -> Utterance:
    """`audio` as one utterance."""
    vs, ve = voiced_span(audio, rate)
    return Utterance(audio, rate, vs, ve)


def with_keys(audio: np.ndarray, rate: int, keys: list[tuple[float, str]], tail_s: float = 0.5) -> Utterance:
    """A whole caller channel with key presses at their times (seconds); the channel is made long enough to hold
    the last one."""
    offsets = [(int(at * rate), key) for at, key in sorted(keys)]
    if offsets and offsets[-1][0] >= len(audio):
        audio = np.concatenate([audio, np.zeros(offsets[-1][0] + int(tail_s * rate) - len(audio), np.int16)])
    vs, ve = voiced_span(audio, rate)
    return Utterance(audio, rate, vs, ve, tuple(offsets))


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A 16-bit WAV as int16 mono (channels averaged) and its rate."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV files are supported")
        rate, channels = w.getframerate(), w.getnchannels()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1).astype(np.int16)
    return data.astype(np.int16), rate


def write_wav(path: Path, audio: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(audio, dtype="<i2").tobytes())
