"""The caller simulator's speakerphone: the agent's audio as it played comes back in the microphone, delayed and
quieter, on the microphone's own sample clock, and stops where a clear stopped the playout."""

from __future__ import annotations

import numpy as np

from voicepipe.caller.echo import SpeakerEcho

RATE = 8000
FRAME = 160


def test_what_played_comes_back_delayed_at_its_level_and_stops_at_a_clear() -> None:
    echo = SpeakerEcho(RATE, delay_ms=100, level_db=-10)
    silence = np.zeros(FRAME, np.int16)
    mic = [echo.mix(silence, 0.02)]  # the microphone's first frame: its clock starts 20 ms before it went out
    agent = (5000 * np.random.default_rng(0).standard_normal(RATE)).astype(np.int16)  # a second, from 20 ms on
    echo.played(agent, 0.02)
    echo.cleared(0.52)  # a barge-in half a second into it
    mic += [echo.mix(silence, 0.02 * (n + 2)) for n in range(59)]
    heard = np.concatenate(mic).astype(float)
    start = int(0.12 * RATE)  # 20 ms + 100 ms
    assert not heard[:start].any() and heard[start] != 0
    steady = heard[start + 300:start + 3000]  # past the reflections' onsets: every path adds
    level = 10 * np.log10(np.mean(steady**2) / np.mean(agent.astype(float) ** 2))
    assert -11 < level < -9, level
    assert not heard[int(0.62 * RATE) + int(0.03 * RATE):].any()  # nothing after the clear's echo tail
