"""The acoustic end of speech that the turn timeline uses instead of the VAD's padded end."""

from __future__ import annotations

import numpy as np

from voicepipe.vad.boundary import audible_end

RATE = 16000


def tone(ms: int, amplitude: int) -> np.ndarray:
    t = np.arange(RATE * ms // 1000) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.int16)


def silence(ms: int, noise: int = 0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-noise, noise + 1, RATE * ms // 1000).astype(np.int16) if noise else np.zeros(
        RATE * ms // 1000, np.int16)


def test_the_end_is_pulled_back_to_the_last_audible_frame() -> None:
    audio = np.concatenate([silence(200), tone(300, 8000), silence(100)])  # speech ends at 500 ms
    vad_end = RATE * 580 // 1000  # the VAD's end: 80 ms late (window, hysteresis, padding)
    assert audible_end(audio, vad_end, RATE) == RATE * 500 // 1000


def test_line_noise_above_the_floor_is_not_mistaken_for_speech() -> None:
    audio = np.concatenate([silence(200, noise=600), tone(300, 8000), silence(100, noise=600, seed=1)])
    assert audible_end(audio, RATE * 580 // 1000, RATE) == RATE * 500 // 1000


def test_nothing_moves_when_the_speech_runs_to_the_end_or_is_all_quiet() -> None:
    speech = np.concatenate([silence(200), tone(500, 8000)])
    assert audible_end(speech, len(speech), RATE) == len(speech)
    quiet = silence(700)
    assert audible_end(quiet, 600 * RATE // 1000, RATE) == 600 * RATE // 1000
    assert audible_end(speech[:1000], 1000, RATE) == 1000  # not enough audio to look back


def test_a_soft_ending_the_vad_cut_short_is_followed_to_its_end() -> None:
    audio = np.concatenate([silence(200), tone(300, 8000), tone(60, 600), silence(200)])  # a faint "s" to 560 ms
    vad_end = RATE * 520 // 1000  # the VAD stopped inside the fricative
    assert audible_end(audio, vad_end, RATE) == RATE * 560 // 1000
