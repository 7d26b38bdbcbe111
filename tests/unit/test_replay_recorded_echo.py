"""A recording whose caller channel carries the recorded run's echo: found (its delay after the agent's channel and
its level), and `replay init` says so in the case and a warning, since a replay cannot cancel that echo."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from tests.replay_fixtures import RATE, write_recording, write_wav
from voicepipe.replay.case import load_case
from voicepipe.replay.init_case import init_case
from voicepipe.replay.recorded_echo import recorded_echo

SECONDS = 10


def bursts(seed: int, starts_s: tuple[float, ...], length_s: float = 1.5, amplitude: float = 6000) -> np.ndarray:
    """Noise bursts (speech-like on and off) at `starts_s` in SECONDS of silence."""
    rng = np.random.default_rng(seed)
    out = np.zeros(SECONDS * RATE)
    for start in starts_s:
        at = int(start * RATE)
        out[at:at + int(length_s * RATE)] = amplitude * rng.standard_normal(int(length_s * RATE))
    return out


def echoed(agent: np.ndarray, delay_ms: float, level_db: float) -> np.ndarray:
    """The agent's channel back `delay_ms` later at `level_db`, with a weaker reflection 11 ms after it."""
    out, lag, gain = np.zeros_like(agent), int(delay_ms * RATE / 1000), 10 ** (level_db / 20)
    out[lag:] += gain * agent[: len(agent) - lag]
    out[lag + 176:] -= 0.4 * gain * agent[: len(agent) - lag - 176]
    return out


def line(audio: np.ndarray, seed: int = 9) -> np.ndarray:
    """On a phone line: a noise floor at about -50 dBFS, as int16."""
    noise = 100 * np.random.default_rng(seed).standard_normal(len(audio))
    return np.clip(np.rint(audio + noise), -32768, 32767).astype(np.int16)


AGENT = bursts(1, (0.5, 5.0))
CALLER = bursts(2, (3.0, 5.5))  # the second time over the agent (double talk)


def test_the_recorded_echo_is_found_at_its_delay_and_level() -> None:
    found = recorded_echo(line(CALLER + echoed(AGENT, 180, -12)), line(AGENT, 3), RATE)
    assert found is not None and found.delay_ms == 180 and -13 < found.level_db < -11, found


def test_no_echo_is_found_where_there_is_none() -> None:
    assert recorded_echo(line(CALLER), line(AGENT, 3), RATE) is None
    assert recorded_echo(line(CALLER), np.zeros(len(AGENT), np.int16), RATE) is None  # an agent who never spoke
    assert recorded_echo(line(CALLER + echoed(AGENT, 1500, -6)), line(AGENT, 3), RATE) is None  # past the lags


def test_init_notes_the_recorded_echo_in_the_case_and_warns(tmp_path: Path, caplog) -> None:
    directory = write_recording(tmp_path / "CA1")
    write_wav(directory / "call.wav", [line(CALLER + echoed(AGENT, 180, -12)), line(AGENT, 3)])
    with caplog.at_level(logging.WARNING, logger="voicepipe.replay.init_case"):
        out = init_case(directory, tmp_path / "case")
    assert "carries the recorded run's echo (180 ms after the agent's audio was sent" in caplog.text
    text = (out / "case.toml").read_text()
    assert "# caller.wav carries the recorded run's echo" in text and "\n# [echo]\n" in text
    assert load_case(out).echo is None  # a note, not a declaration: the channel already holds an echo


def test_init_adds_no_note_without_an_echo(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="voicepipe.replay.init_case"):
        out = init_case(write_recording(tmp_path / "CA1"), tmp_path / "case")
    assert "echo" not in (out / "case.toml").read_text() and not caplog.text
