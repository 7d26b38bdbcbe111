"""The echo gate: the level gate silences echo the canceller left and lets a caller who talks over the agent
through (`echo/level_gate.py`, on `echo/simulate.py`'s echo path), and the text gate tells the agent's own words
heard back from a caller's (`echo/words.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from voicepipe.audio.l16 import float32_to_int16
from voicepipe.echo.level_gate import EchoLevelGate
from voicepipe.echo.path import EchoPath
from voicepipe.echo.reference import FarEndReference
from voicepipe.echo.simulate import NOISE_RMS, echo_of, microphone, mulaw, spoken
from voicepipe.echo.words import AgentWords, is_echo, without_echo

RATE = 16000
FRAME = 320
AGENT = ["Thank you for calling the city library, how can I help you today?",
         "Your books are due back on the fourteenth of next month.",
         "I can renew them for another three weeks if you would like."]
CALLER_AT_S = 8.0


@pytest.fixture(scope="module")
def far() -> np.ndarray:
    pause = np.zeros(RATE // 2, np.float32)
    return mulaw(0.5 * np.concatenate([np.concatenate([spoken(text, RATE), pause]) for text in AGENT]))


@pytest.fixture(scope="module")
def caller() -> np.ndarray:
    return 0.5 * spoken("Actually I wanted to ask about the opening hours on Sunday.", RATE, voice="en-us+f3",
                        speed=1.1)


def path_over(far: np.ndarray) -> EchoPath:
    """A call's echo path over the agent's audio `far`, all placed before the call hears any (as a reference keeps
    it)."""
    reference = FarEndReference(RATE, capacity_s=30.0)
    reference.append(far, at=0)
    return EchoPath(reference)


def through_path(far: np.ndarray, mic: np.ndarray) -> tuple[EchoPath, np.ndarray]:
    """The caller's microphone `mic` (int16) through a call's echo path over the agent's audio `far`; the path and
    what came out."""
    path = path_over(far)
    return path, np.concatenate([path.process(mic[i:i + FRAME]) for i in range(0, len(mic), FRAME)])


def gated(far: np.ndarray, near: np.ndarray, delay_ms: float, level_db: float) -> tuple[np.ndarray, np.ndarray]:
    """The caller's microphone (`near` plus the echo of `far`) through a call's echo path; (input, output) frames."""
    mic = float32_to_int16(microphone(echo_of(far, RATE, delay_ms, level_db), near))
    _, out = through_path(far, mic)
    whole = len(out) // FRAME * FRAME
    return mic[:whole].reshape(-1, FRAME), out[:whole].reshape(-1, FRAME)


def frame_power(frames: np.ndarray) -> np.ndarray:
    return np.mean(np.square(frames.astype(np.float64) / 32768), axis=1)


@pytest.mark.parametrize("delay_ms", [20, 150, 400])
@pytest.mark.parametrize("level_db", [-6, -20, -40])
def test_echo_alone_is_silenced_and_a_caller_talking_over_the_agent_passes(far, caller, delay_ms, level_db) -> None:
    near = np.zeros_like(far)
    start = int(CALLER_AT_S * RATE)
    near[start:start + len(caller)] = caller
    heard, out = gated(far, near, delay_ms, level_db)
    talking = np.mean(np.square(near[: heard.size].reshape(-1, FRAME)), axis=1) > 1e-4  # the caller's voiced frames
    echo_alone = ~talking
    echo_alone[int(CALLER_AT_S * RATE) // FRAME:] = False  # (the agent stops after the caller, as a barge-in does)
    # What comes through of the echo alone is at least 20 dB under what came (Speex alone: 5-16 dB in real calls).
    # At -40 dB the echo is barely over the line's noise floor: what comes through is no louder than that noise.
    kept = frame_power(out)[echo_alone].sum() / frame_power(heard)[echo_alone].sum()
    assert kept <= 0.01 or frame_power(out)[echo_alone].mean() <= 2 * NOISE_RMS**2, kept
    # The caller's speech over the agent passes, but for a few soft frames.
    assert (frame_power(out)[talking] > 0).mean() >= 0.9


def test_a_caller_with_no_echo_on_the_line_passes_whole_while_the_agent_talks(far, caller) -> None:
    near = np.zeros_like(far)
    near[2 * RATE:][: len(caller)] = caller  # once the gate has measured the line (before: docs/echo.md)
    near[int(CALLER_AT_S * RATE):][: len(caller)] = caller
    mic = float32_to_int16(microphone(np.zeros_like(far), near))
    _, out = through_path(far, mic)
    frames = len(out) // FRAME * FRAME
    talking = np.mean(np.square(near[:frames].reshape(-1, FRAME)), axis=1) > 1e-4
    untouched = np.all(out[:frames].reshape(-1, FRAME) == mic[:frames].reshape(-1, FRAME), axis=1)
    assert untouched[talking].mean() >= 0.98  # (frames of the line's noise alone may be silenced: harmless)


@pytest.mark.parametrize(("delay_ms", "level_db", "erl_db"), [(20, -6, 8), (400, -20, 22)])
def test_the_gate_reads_the_lines_echo_return_loss_once_it_knows_the_delay(far, delay_ms, level_db, erl_db) -> None:
    mic = float32_to_int16(microphone(echo_of(far, RATE, delay_ms, level_db), np.zeros_like(far)))
    path, _ = through_path(far, mic)
    assert path.gate.erl_db == pytest.approx(erl_db, abs=1.5)  # 2 dB over the echo's loss (the module docstring)


def test_a_line_with_no_echo_has_no_echo_return_loss(far) -> None:
    path, _ = through_path(far, float32_to_int16(microphone(np.zeros_like(far), np.zeros_like(far))))
    assert len(path.gate._levels) and path.delay.delay is None  # history, but against no delay: no figure
    assert path.gate.erl_db is None


def test_the_agents_words_are_found_where_their_echo_can_fall_and_forgotten_after_30_s() -> None:
    words = AgentWords()
    words.sent(10.0, "The capital", 0.6)
    words.sent(10.4, "of France is Paris.", 1.0)
    words.sent(40.0, "Goodbye.", 0.5)  # 30 s later: the first words are forgotten
    assert words.around(41.0, 42.0, 0.15) == ["goodbye"]
    words = AgentWords()
    words.sent(10.0, "The capital", 0.6)  # played out by 10.6: its echo, 150 ms late, is over by 11.1 with the slack
    words.sent(12.0, "of France", 0.5)
    assert words.around(11.0, 11.5, 0.15) == ["the", "capital"]
    assert words.around(11.2, 11.5, 0.15) == []  # a caller who answers after the echo's tail: nothing is echo
    assert words.around(11.2, 11.5, 0.5) == ["the", "capital"]  # ... unless the echo may come 500 ms late
    assert words.around(12.5, 13.0, 0.15) == ["of", "france"]
    assert words.around(9.0, 9.5, 0.15) == []  # the caller spoke before the agent did


@pytest.mark.parametrize(("text", "echo"), [
    ("the capital of France", True),
    ("The child.", True),  # "children", as the STT hears it in an echo
    ("capital", True),
    ("No, I said London", False),
    ("the capital of Spain please", False),  # a caller repeating some of the agent's words, with their own
    ("", False),
])
def test_a_callers_words_are_echo_only_when_all_are_the_agents(text, echo) -> None:
    agent = ["the", "capital", "of", "france", "is", "paris", "and", "the", "children", "love", "it"]
    assert is_echo(text, agent) is echo


def test_half_the_words_make_a_partial_likely_echo_but_not_a_turn() -> None:
    agent = ["it's", "a", "bit", "of", "a", "non", "local", "day"]
    assert not is_echo("that's a bit of a non local", agent)
    assert is_echo("that's a bit of a non local", agent, share=0.5)


def test_common_words_alone_do_not_make_a_callers_question_echo() -> None:
    story = ["once", "upon", "a", "time", "there", "was", "a", "brave", "dragon", "who", "lived", "in", "the",
             "hills", "of", "wales", "and", "it", "is", "said"]
    assert not is_echo("What is the capital of France", story, share=0.5)
    assert is_echo("and the", story)  # nothing but common words, all the agent's: an echo fragment


def test_with_no_agent_words_around_nothing_is_echo() -> None:
    assert not is_echo("the capital of France", [])
    assert without_echo("the capital of France", []) == "the capital of France"


def test_a_run_of_the_agents_words_is_taken_out_of_the_callers_and_two_words_stay() -> None:
    agent = ["your", "table", "for", "two", "is", "booked", "for", "friday", "evening"]
    assert without_echo("booked for Friday wait I said Saturday", agent) == "wait i said saturday"
    assert without_echo("no Friday is wrong", agent) == "no Friday is wrong"  # two words: the caller's too


def test_the_lines_noise_against_a_replys_faint_first_sound_does_not_open_the_gate_for_the_echo_behind_it(far) -> None:
    pause = np.zeros(RATE // 2, np.float32)
    lead_in = 0.005 * np.sin(2 * np.pi * 300 * np.arange(int(0.08 * RATE)) / RATE).astype(np.float32)  # -55 dBFS
    replies = [spoken(text, RATE) for text in AGENT]
    agent = mulaw(0.5 * np.concatenate([np.concatenate([lead_in, reply, pause]) for reply in replies]))
    _, out = gated(agent, np.zeros_like(agent), 150, -30)
    passed, start = [], 0
    for reply in replies:  # the echo of each reply's first 300 ms of words, after its lead-in
        first = (start + len(lead_in)) // FRAME + int(0.15 * RATE) // FRAME
        passed.append(int((frame_power(out[first:first + int(0.3 * RATE) // FRAME]) > 0).sum()))
        start += len(lead_in) + len(reply) + len(pause)
    assert passed == [0, 0, 0]  # the line's noise passed the faint lead-in, and opened the gate for 7-8 frames


def test_the_gate_looks_for_the_echo_over_every_delay_its_last_readings_put_it_at(far) -> None:
    reference = FarEndReference(RATE, capacity_s=30.0)
    reference.append(far, at=0)
    gate = EchoLevelGate(reference, 0, 8000, FRAME)
    at = int(0.4 * RATE)  # the echo at 150 ms of the agent's first words (nothing played 452 ms before)
    block = float32_to_int16(0.3 * far[at - int(0.15 * RATE):][:FRAME])
    assert np.array_equal(gate.process(block, at, (7232, 7232)), block)  # a spurious reading alone: missed
    assert not gate.process(block, at, (2400, 7232)).any()  # with the true one among the last readings: gated


def test_once_the_delay_is_found_the_threshold_stays_what_it_was_until_the_history_fills_again(far) -> None:
    reference = FarEndReference(RATE, capacity_s=30.0)
    reference.append(far, at=0)
    gate = EchoLevelGate(reference, 0, 8000, FRAME)
    echo = float32_to_int16(echo_of(far, RATE, 150, -20))
    at = 0
    for at in range(0, 3 * RATE, FRAME):  # the delay not yet known
        gate.process(echo[at:at + FRAME], at, None)
    before = gate.threshold_db(aligned=False)
    assert before < -10  # measured on the line, not the cap
    gate.process(echo[at + FRAME:at + 2 * FRAME], at + FRAME, (2400, 2400))
    assert gate.threshold_db() == before  # not the cap, which cut a caller talking over the agent just then


def test_mid_reply_a_caller_quieter_than_loud_echo_passes_by_what_the_canceller_takes_out(far, caller) -> None:
    near = np.zeros_like(far)
    start = int(CALLER_AT_S * RATE)
    near[start:start + len(caller)] = 0.4 * caller  # 8 dB under the agent: under the -6 dB echo as it comes
    heard, out = gated(far, near, 150, -6)
    talking = np.mean(np.square(near[: heard.size].reshape(-1, FRAME)), axis=1) > 1e-4 * 0.16
    assert (frame_power(out)[talking] > 0).mean() >= 0.8


@pytest.mark.parametrize(("loud_blocks", "opened"), [(2, False), (3, True)])
def test_two_loud_blocks_alone_leave_the_gate_shut_and_three_in_a_row_open_it(far, loud_blocks, opened) -> None:
    """Residual echo leaves a loud block or two over the bar (traced in bench echo: -4.8 and -7.4 dB against a bar
    of -15.3, then the 200 ms the hangover let through started speech); a caller's speech stays loud longer."""
    reference = FarEndReference(RATE, capacity_s=30.0)
    reference.append(far, at=0)
    gate = EchoLevelGate(reference, 0, 8000, FRAME)
    echo = float32_to_int16(echo_of(far, RATE, 150, -20))
    loud_at = int(2.0 * RATE) // FRAME * FRAME  # mid-sentence, the history full
    passed = []
    for at in range(0, loud_at + 8 * FRAME, FRAME):
        loud = loud_at <= at < loud_at + loud_blocks * FRAME  # as loud as the agent: over any bar
        block = float32_to_int16(np.clip(2 * far[at - 2400:at - 2400 + FRAME], -1, 1)) if loud else echo[at:at + FRAME]
        passed.append(bool(gate.process(block, at, (2400, 2400)).any()))
    after = passed[loud_at // FRAME + loud_blocks:]
    assert all(passed[loud_at // FRAME:][:loud_blocks])  # the loud blocks pass by their level either way
    assert after == [opened] * len(after)  # the echo behind them: through the hangover, or shut
    assert gate.openings == int(opened)  # counted once (the call's timeline has each: `echo_gate_open`)


Bars = tuple[float, float]  # the gate's bar as before the canceller, and in a settled stretch


def bars_around(far: np.ndarray, mic: np.ndarray, start: int, end: int) -> tuple[Bars, Bars]:
    """The gate's bars (as before the canceller, and in a settled stretch) just before input sample `start` and at
    `end`, with `mic` (int16) through a call's echo path over `far`."""
    path = path_over(far)

    def bars() -> Bars:
        return path.gate.threshold_db(), path.gate._threshold_now(settled=True)

    for at in range(0, start, FRAME):
        path.process(mic[at:at + FRAME])
    before = bars()
    for at in range(start, end, FRAME):
        path.process(mic[at:at + FRAME])
    return before, bars()


@pytest.mark.parametrize(("level_db", "gain"), [(-6, 0.2), (-10, 0.2), (-20, 0.3)])
def test_a_caller_the_gate_shuts_does_not_raise_its_bar(far, caller, level_db, gain) -> None:
    """A caller who talks over the agent no louder than the bar is shut, and their blocks once joined the histories
    as echo: the bar rose towards their level and shut them for the rest of the call (bench echo at -6 dB, traced:
    the settled bar at -11.6 dB at a call's first barge-in, -1.7 at its third; of the barge-ins there, 12 of 18 first
    ones stopped the agent and 4 of 16 third ones). Before: -6 dB: the settled bar from -15 to -8.5 dB; -10 dB: from
    -19 to -12; -20 dB: the bar before the canceller from -17.5 to -9."""
    start = 4 * RATE
    near = np.zeros_like(far)
    near[start:start + len(caller)] = gain * caller
    mic = float32_to_int16(microphone(echo_of(far, RATE, 150, level_db), near))
    (raw_before, settled_before), (raw_after, settled_after) = bars_around(far, mic, start, start + len(caller))
    assert raw_after <= raw_before + 2 and settled_after <= settled_before + 2, (raw_before, raw_after,
                                                                                 settled_before, settled_after)


def test_echo_that_comes_back_louder_still_raises_the_bar(far) -> None:
    start = 4 * RATE
    echo = echo_of(far, RATE, 150, -20)
    echo[start:] *= 2  # 6 dB louder from here on
    mic = float32_to_int16(microphone(echo, np.zeros_like(far)))
    (raw_before, _), (raw_after, _) = bars_around(far, mic, start, start + 4 * RATE)
    assert raw_after >= raw_before + 4, (raw_before, raw_after)
