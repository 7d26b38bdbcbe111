"""A synthetic echo path, for the echo benchmark and the tests: the agent's audio as a caller's line returns it.

The far end is coded to mu-law (what a telephony link carries), delayed and spread by a decaying room-like tail
of reflections, scaled to an echo return level, mixed with the caller's own voice and a quiet noise floor, mildly
clipped as a hot microphone clips, and coded to mu-law again on the way back. `spoken` makes test speech with
espeak-ng (a Debian package the test suite needs anyway: scripts/install-system-deps.sh).
"""

from __future__ import annotations

import io
import subprocess
import wave

import numpy as np

from voicepipe.audio import resample
from voicepipe.audio.g711 import decode_pcmu, encode_pcmu
from voicepipe.audio.l16 import float32_to_int16, int16_to_float32

CLIP_LEVEL = 0.5  # the microphone path saturates here: only the loudest echo-plus-voice peaks reach it
NOISE_RMS = 3e-4  # about -70 dBFS, a quiet line


def spoken(
    text: str, rate: int, voice: str = "en-us", wpm: int = 160, pitch: int = 50, speed: float = 1.0
) -> np.ndarray:
    """`text` spoken by espeak-ng (`pitch` 0-99), played `speed` times faster, float32 at `rate`, peak-normalised
    to 0.7. espeak-ng's fricatives come from the same noise sequence in every utterance, so two of its voices
    correlate sample for sample; a caller's voice at another `speed` does not correlate with the agent's."""
    wav = subprocess.run(
        ["espeak-ng", "--stdout", "-v", voice, "-s", str(wpm), "-p", str(pitch), text], check=True, capture_output=True
    ).stdout
    with wave.open(io.BytesIO(wav)) as w:
        audio = int16_to_float32(np.frombuffer(w.readframes(w.getnframes()), np.int16))
        audio = resample(audio, round(w.getframerate() * speed), rate)
    return 0.7 * audio / np.max(np.abs(audio))


def mulaw(audio: np.ndarray) -> np.ndarray:
    """`audio` (float32) through a G.711 mu-law encode and decode."""
    return int16_to_float32(decode_pcmu(encode_pcmu(float32_to_int16(audio))))


def impulse_response(rate: int, delay_ms: float, seed: int = 0, tail_ms: float = 120.0) -> np.ndarray:
    """A direct path at `delay_ms`, four discrete reflections 3-40 ms after it, and an exponentially decaying
    diffuse tail of `tail_ms` (-60 dB at its end). The direct path is the strongest arrival."""
    rng = np.random.default_rng(seed)
    start = int(rate * delay_ms / 1000)
    tail = int(rate * tail_ms / 1000)
    ir = np.zeros(start + tail, np.float32)
    ir[start] = 1.0
    for offset_ms, gain in zip(rng.uniform(3, 40, 4), (-0.5, 0.35, -0.25, 0.15), strict=True):
        ir[start + int(rate * offset_ms / 1000)] += gain
    decay = np.exp(-6.9 * np.arange(tail) / tail)  # -60 dB over the tail
    ir[start:] += 0.05 * rng.standard_normal(tail) * decay
    return ir


def echo_of(far: np.ndarray, rate: int, delay_ms: float, level_db: float, seed: int = 0) -> np.ndarray:
    """The echo of `far` (what the agent sent, already as the line carries it): through the impulse response,
    scaled so that its power is `level_db` below the far end's."""
    echo = np.convolve(far, impulse_response(rate, delay_ms, seed))[: len(far)].astype(np.float32)
    gain = 10 ** (level_db / 20) * np.sqrt(np.mean(far**2) / max(np.mean(echo**2), 1e-20))
    return gain * echo


def fast_playout(audio: np.ndarray, skew: float) -> np.ndarray:
    """`audio` as a loudspeaker whose clock runs `skew` fast plays it (0.001: 0.1 %), sampled on the microphone's
    clock: it ends sooner, and its echo drifts against what was sent."""
    return np.interp(np.arange(len(audio)) * (1.0 + skew), np.arange(len(audio)), audio).astype(np.float32)


def microphone(echo: np.ndarray, near: np.ndarray, seed: int = 0) -> np.ndarray:
    """What the caller's line sends back: echo plus the caller's voice plus a noise floor, clipped at
    `CLIP_LEVEL` and coded to mu-law."""
    noise = NOISE_RMS * np.random.default_rng(seed).standard_normal(len(echo)).astype(np.float32)
    return mulaw(np.clip(echo + near + noise, -CLIP_LEVEL, CLIP_LEVEL))
