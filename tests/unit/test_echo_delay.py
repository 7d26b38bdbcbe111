"""The echo delay estimate on a synthetic telephone echo (mu-law, reflections, clipping, a noise floor).

The bound is 1 ms: GCC-PHAT lands on the direct path's sample, and 1 ms is a tenth of the margin the canceller
leaves for a late estimate (`canceller.ALIGN_MARGIN_MS`), so a regression shows here long before it costs ERLE.
"""

from __future__ import annotations

import numpy as np
import pytest

from voicepipe.echo import simulate
from voicepipe.echo.delay import DelayEstimator

RATE = 8000
FRAME = RATE // 50


@pytest.fixture(scope="module")
def agent() -> np.ndarray:
    lines = ["Thank you for calling, how can I help you today?", "I can book a table for you at seven tonight."]
    return simulate.mulaw(0.5 * np.concatenate([simulate.spoken(line, RATE) for line in lines]))


@pytest.fixture(scope="module")
def caller() -> np.ndarray:
    return 0.5 * simulate.spoken("My daughter has three cats and two small dogs.", RATE, "en-gb+f3", 150, 80, 1.05)


def estimate(far: np.ndarray, mic: np.ndarray) -> DelayEstimator:
    estimator = DelayEstimator(RATE)
    for start in range(0, len(far), FRAME):
        estimator.push(far[start : start + FRAME], mic[start : start + FRAME])
    return estimator


def talking_from(caller: np.ndarray, length: int, start_s: float) -> np.ndarray:
    near = np.zeros(length, np.float32)
    start = int(start_s * RATE)
    near[start : start + len(caller)] = caller[: length - start]
    return near


@pytest.mark.parametrize("delay_ms", [20, 150, 400])
@pytest.mark.parametrize("level_db", [-6, -20, -35])
def test_delay_found_within_1ms(agent, caller, delay_ms, level_db):
    mic = simulate.microphone(simulate.echo_of(agent, RATE, delay_ms, level_db), talking_from(caller, len(agent), 3))
    assert estimate(agent, mic).delay_ms == pytest.approx(delay_ms, abs=1.0)


def test_a_jittering_echo_path_is_still_found(agent):
    """The echo path's delay wanders by up to 3 ms every half second (a jitter buffer at work): windows that
    straddle two delays still give readings, and the estimate stays within the wander of the path's centre."""
    rng = np.random.default_rng(1)
    block = RATE // 2
    echo = simulate.echo_of(agent, RATE, 150, -10)
    jittered = np.concatenate(
        [np.roll(echo, int(rng.integers(-24, 25)))[i : i + block] for i in range(0, len(echo), block)]
    )
    assert estimate(agent, simulate.microphone(jittered, np.zeros_like(agent))).delay_ms == pytest.approx(150, abs=3)


def test_a_caller_talking_alone_gives_no_delay(agent, caller):
    """The agent plays but nothing of it comes back: no window may claim an echo, whatever the caller says."""
    silent_line = np.zeros_like(agent)
    mic = simulate.microphone(silent_line, talking_from(caller, len(agent), 0.5))
    assert estimate(agent, mic).delay is None


def test_silent_reference_gives_no_delay(caller):
    mic = simulate.microphone(np.zeros(4 * RATE, np.float32), talking_from(caller, 4 * RATE, 0))
    assert estimate(np.zeros(4 * RATE, np.float32), mic).delay is None


def test_chunks_of_unequal_length_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        DelayEstimator(RATE).push(np.zeros(160, np.float32), np.zeros(80, np.float32))


@pytest.mark.parametrize("delay_ms", [0, 500])
def test_a_peak_at_an_end_of_the_searched_lags_is_no_reading(agent, delay_ms):
    """Echo exactly at the shortest or the longest lag searched (0 and 500 ms) cannot be told from the edge of a
    wider peak beyond it; in calls such readings were spurious, so none is taken."""
    shift = int(RATE * delay_ms / 1000)
    mic = np.concatenate([np.zeros(shift, np.float32), 0.3 * agent])[: len(agent)]
    assert estimate(agent, mic).delay is None
