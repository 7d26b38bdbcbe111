"""The echo delay estimate on a synthetic telephone echo (mu-law, reflections, clipping, a noise floor).

The bound is 1 ms: GCC-PHAT lands on the direct path's sample, and 1 ms is a tenth of the margin the canceller
leaves for a late estimate (`canceller.ALIGN_MARGIN_MS`), so a regression shows here long before it costs ERLE.

A call estimates at 16 kHz what an 8 kHz phone line carried (both the caller's audio and the reference are
resampled up), so half of the band holds nothing but the resampling's residue: the tests at `PIPELINE_RATE` run
the line's audio through the same resampling, where readings without echo came from (issue 36).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np
import pytest

from voicepipe.audio import float32_to_int16, int16_to_float32, resample
from voicepipe.echo import simulate
from voicepipe.echo.delay import DelayEstimator

RATE = 8000  # the line's
PIPELINE_RATE = 16000  # the call's, where the echo path runs


@pytest.fixture(scope="module")
def agent() -> np.ndarray:
    lines = ["Thank you for calling, how can I help you today?", "I can book a table for you at seven tonight."]
    return simulate.mulaw(0.5 * np.concatenate([simulate.spoken(line, RATE) for line in lines]))


@pytest.fixture(scope="module")
def caller() -> np.ndarray:
    return 0.5 * simulate.spoken("My daughter has three cats and two small dogs.", RATE, "en-gb+f3", 150, 80, 1.05)


def pushed(far: np.ndarray, mic: np.ndarray, rate: int = RATE) -> Iterator[DelayEstimator]:
    """The estimator after each 20 ms frame of `far` and `mic` pushed."""
    estimator = DelayEstimator(rate)
    frame = rate // 50
    for start in range(0, len(far), frame):
        estimator.push(far[start : start + frame], mic[start : start + frame])
        yield estimator


def estimate(far: np.ndarray, mic: np.ndarray, rate: int = RATE) -> DelayEstimator:
    return deque(pushed(far, mic, rate), maxlen=1)[0]


def in_the_call(line: np.ndarray) -> np.ndarray:
    """The line's audio as the call takes it: int16, resampled to `PIPELINE_RATE`."""
    return int16_to_float32(resample(float32_to_int16(line), RATE, PIPELINE_RATE))


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


@pytest.mark.parametrize("talking", [False, True])
def test_a_phone_line_without_echo_gives_no_delay_at_the_calls_rate(agent, caller, talking):
    """The line's noise floor (and the caller) over the agent's audio, both resampled up from 8 kHz: no reading. The
    4-8 kHz then hold only the resampling's residue, where the square ends of the windows were all that correlated
    (readings at 499.9 ms here, and 5-11 in each clean call of `bench echo`)."""
    near = talking_from(caller, len(agent), 0.5) if talking else np.zeros_like(agent)
    mic = simulate.microphone(np.zeros_like(agent), near)
    assert estimate(in_the_call(agent), in_the_call(mic), PIPELINE_RATE).span is None


@pytest.mark.parametrize("delay_ms", [20, 150, 400])
@pytest.mark.parametrize("level_db", [-10, -35])
def test_over_a_phone_line_every_reading_is_the_echo_and_the_first_comes_at_once(agent, delay_ms, level_db):
    """At the call's rate, echo over an 8 kHz line: every reading within 1 ms (the level gate looks for the echo over
    the span of the last ones), the first one from the first full window (the window and the longest lag)."""
    echo = simulate.echo_of(agent, RATE, delay_ms, level_db)
    far, mic = in_the_call(agent), in_the_call(simulate.microphone(echo, np.zeros_like(agent)))
    frames = [(n, e.span) for n, e in enumerate(pushed(far, mic, PIPELINE_RATE), 1) if e.span is not None]
    empty = DelayEstimator(PIPELINE_RATE)
    assert frames[0][0] * PIPELINE_RATE // 50 == empty.window + empty.max_lag
    shortest, longest = (1000 * np.array([span for _, span in frames]) / PIPELINE_RATE).T
    assert min(shortest) >= delay_ms - 1 and max(longest) <= delay_ms + 1, (min(shortest), max(longest))
