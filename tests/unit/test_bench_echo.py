"""`bench echo`'s figures from synthetic calls (what the caller simulator sent and heard, the server's events and
turns, all on one clock), its grid, and the benchmark's speakerphone (`SpeakerEcho` with the room's tail, the
loudspeaker's clock skew and the phone line)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from voicepipe.audio.g711 import decode_pcmu, encode_pcmu
from voicepipe.bench.echo import plan_calls
from voicepipe.bench.echo_metrics import (
    CallFacts,
    Said,
    Stop,
    call_facts,
    call_figures,
    call_timeline,
    headline,
    playing_spans,
    stops,
)
from voicepipe.caller import CallResult, ClientTurn
from voicepipe.caller.echo import SpeakerEcho
from voicepipe.echo.simulate import CLIP_LEVEL

RATE = 8000
FRAME = 160


def ev(kind: str, at: float) -> dict:
    return {"type": kind, "at": at}


def facts(said: list[Said], events: list[dict], playing=((0.0, 100.0),), turns=(), level_db: float | None = -10,
          v2v=(1000.0,)) -> CallFacts:
    return CallFacts("c", level_db, said, events, list(turns), list(playing), list(v2v), None, started=0.0,
                     ended=100.0)


# -- what played, and when the server held or cut it ------------------------------------------------------------


def test_the_agents_audio_plays_back_to_back_until_a_gap_or_a_clear() -> None:
    chunks = [(1.0, 0.5), (1.2, 0.5), (2.1, 0.5), (5.0, 1.0)]  # the second queues behind the first; a short gap
    assert playing_spans(chunks, []) == [(1.0, 2.6), (5.0, 6.0)]
    assert playing_spans(chunks, [1.5]) == [(1.0, 1.5), (2.1, 2.6), (5.0, 6.0)]  # the clear drops what was queued


def test_stops_are_holds_until_their_unhold_and_cuts_but_not_a_reopened_turns_clear() -> None:
    events = [ev("hold", 1.0), ev("unhold", 1.4),  # a backchannel: the agent went on
              ev("hold", 2.0), ev("clear", 2.9), ev("unhold", 2.9), ev("barge_in", 2.95),  # a barge-in
              ev("clear", 4.0), ev("turn_reopened", 4.0),  # nothing of that reply had been sent
              ev("clear", 6.0),  # a cut with no hold before it
              ev("hold", 8.0)]  # still on when the call ended
    assert stops(events, until=9.0) == [Stop(1.0, 1.4, False), Stop(2.0, 2.9, True), Stop(6.0, 6.0, True),
                                        Stop(8.0, 9.0, False)]


# -- self-interruptions, echo holds, echo turns -----------------------------------------------------------------


def test_a_stop_while_the_caller_was_silent_is_a_self_interruption_allowing_for_the_wire_and_a_late_vad() -> None:
    said = [Said("first", 10.0, 12.0, False), Said("second", 20.0, 22.0, True)]
    events = [ev("hold", 5.0), ev("unhold", 5.3),  # silence: echo held the agent 300 ms
              ev("hold", 10.2), ev("unhold", 10.4),  # the caller speaks
              ev("hold", 12.25), ev("unhold", 12.4),  # 250 ms after their last voiced sample: theirs, read late
              ev("hold", 12.5), ev("clear", 13.0), ev("unhold", 13.0),  # 500 ms after: echo, and it cut the reply
              ev("clear", 30.0)]  # echo cut the agent outright
    figures = call_figures(facts(said, events))
    assert figures.self_interruptions == 3
    assert figures.echo_hold_s == pytest.approx(0.3 + 0.5)


def test_the_gates_openings_while_the_agent_played_and_the_caller_was_silent_are_its_leaks() -> None:
    said = [Said("first", 10.0, 12.0, False)]
    events = [ev("echo_gate_open", 3.0),  # echo let through, whether or not the VAD then took it for speech
              ev("echo_gate_open", 10.1), ev("echo_gate_open", 12.2),  # the caller, and their last sound read late
              ev("echo_gate_open", 15.0), ev("hold", 15.1), ev("unhold", 15.3),  # a leak that held the agent
              ev("echo_gate_open", 21.0)]  # after the agent's audio: the line alone went through
    playing = [(2.0, 9.0), (14.0, 20.0)]
    echo, clean = facts(said, events, playing), facts(said, [ev("echo_gate_open", 10.1)], playing, level_db=None)
    assert call_figures(echo).gate_leaks == 2 and call_figures(echo).self_interruptions == 1
    assert call_timeline(echo)["gate_leaks"] == [3.0, 15.0]
    report = headline([echo, clean], [-10])
    assert report["echo_gate_leaks"] == 2 and report["clean"]["echo_gate_leaks"] == 0
    assert report["by_level"]["-10"]["echo_gate_leaks"] == 2


def test_a_turn_whose_speech_touches_no_caller_speech_is_an_echo_turn() -> None:
    said = [Said("first", 10.0, 12.0, False)]
    turns = [((10.1, 12.3), "first"), ((12.25, 13.0), "its tail"),  # within 300 ms of its end
             ((12.4, 13.0), "the agent's own words"), ((16.0, 17.0), "again"), (None, "")]
    assert call_figures(facts(said, [], turns=turns)).echo_turns == 2


# -- barge-in recall ----------------------------------------------------------------------------------------------


def test_a_barge_in_is_recalled_when_the_agent_stopped_within_500_ms_for_good() -> None:
    said = [Said("first", 1.0, 3.0, False),
            Said("held in time", 10.0, 12.0, True),
            Said("held too late", 20.0, 22.0, True),
            Said("already held by echo", 30.0, 32.0, True),
            Said("only a pause: a backchannel to the server", 40.0, 42.0, True),
            Said("over silence", 50.0, 52.0, True),
            Said("echo held the agent, which went on after the caller's words", 60.0, 62.0, True)]
    events = [ev("hold", 10.3), ev("clear", 10.9), ev("unhold", 10.9), ev("barge_in", 10.95),
              ev("hold", 20.7), ev("clear", 21.0), ev("unhold", 21.0), ev("barge_in", 21.0),
              ev("hold", 29.5), ev("clear", 30.9), ev("unhold", 30.9), ev("barge_in", 30.9),  # held by echo first
              ev("hold", 40.2), ev("unhold", 40.8),
              ev("hold", 59.0), ev("unhold", 62.5)]
    playing = [(5.0, 11.0), (15.0, 21.0), (25.0, 31.0), (35.0, 45.0), (55.0, 59.2), (62.5, 63.0)]
    figures = call_figures(facts(said, events, playing=playing))
    assert figures.barge_ins == [(True, True), (True, False), (True, True), (True, False), (False, False),
                                 (True, False)]
    assert [text for text, _ in figures.double_talk] == [s.text for s in said[1:5]] + [said[6].text]


# -- WER and the ratios against the clean calls ------------------------------------------------------------------


def two_turn_call(level_db: float | None, heard: tuple[str, str]) -> CallFacts:
    said = [Said("book a table for two", 1.0, 2.0, False), Said("what time do you open", 5.0, 6.0, True)]
    events = [ev("hold", 5.2), ev("clear", 5.8), ev("unhold", 5.8), ev("barge_in", 5.8)]
    turns = [((1.1, 2.2), heard[0]), ((5.1, 6.2), heard[1])]
    return facts(said, events, playing=[(3.0, 5.9)], turns=turns, level_db=level_db,
                 v2v=[1000.0, 1200.0] if level_db is None else [1500.0, 1800.0])


def test_wer_voice_to_voice_and_recall_of_echo_calls_over_clean_calls() -> None:
    clean = two_turn_call(None, ("book a table for two", "what time do you close"))  # 1 error in 10 words
    echo = two_turn_call(-10, ("book a table for you", "what time do you close the"))  # 3 errors
    report = headline([clean, echo], [-10])
    assert report["clean"]["wer"] == pytest.approx(0.1) and report["echo"]["wer"] == pytest.approx(0.3)
    assert report["wer_echo_over_clean"] == pytest.approx(3.0)
    assert report["wer_double_talk_echo_over_clean"] == pytest.approx(2.0)  # 2 of 5 words against 1 of 5
    assert report["v2v_p50_echo_over_clean"] == pytest.approx(1650 / 1100, abs=1e-3)
    assert report["barge_in_recall_min"] == 1.0 and report["by_level"]["-10"]["barge_ins_over_agent"] == 1
    assert report["echo_cpu_ms_per_s"] is None and "echo_cpu_ms_per_s" in report["null_reasons"]


def test_a_ratio_over_a_perfect_clean_run_is_null_with_its_reason_and_equal_perfection_is_one() -> None:
    perfect = ("book a table for two", "what time do you open")
    report = headline([two_turn_call(None, perfect), two_turn_call(-10, ("book a table", "what time do you open"))],
                      [-10])
    assert report["wer_echo_over_clean"] is None and "is 0" in report["null_reasons"]["wer_echo_over_clean"]
    assert report["wer_double_talk_echo_over_clean"] == 1.0
    assert headline([two_turn_call(None, perfect)], [-10, -20])["barge_in_recall_min"] is None


def test_call_facts_read_the_callers_turns_and_the_servers_record_on_one_clock() -> None:
    result = CallResult("twilio", "c", started=100.0, audio_chunks=[(101.0, 2.0)], clears=[102.5])
    result.turns = [ClientTurn(1, speech_start=103.0, speech_end=105.0, first_audio=106.0),
                    ClientTurn(2, speech_start=107.0, speech_end=109.0),
                    ClientTurn(3)]  # never spoken: the call ended first
    result.record = {"turns": [{"user_text": "hello", "timeline": {"speech_start": 3.1, "speech_end": 5.2}}],
                     "metadata": {"echo_canceller": {"delay_ms": 150.0, "cpu_ms": 12.0, "audio_s": 6.0}}}
    call = call_facts(result, ["one", "two", "three"], -10, 100.0, [ev("hold", 107.2)])
    assert call.said == [Said("one", 103.0, 105.0, False), Said("two", 107.0, 109.0, True)]
    assert call.turns == [((103.1, 105.2), "hello")] and call.playing == [(101.0, 102.5)]
    assert call.voice_to_voice_ms == [pytest.approx(1000.0)] and call.ended == 107.2
    assert call_timeline(call) == {"said": [[3.0, 5.0], [7.0, 9.0]], "played": [[1.0, 2.5]],
                                   "stops": [[7.2, 7.2, False, False]], "gate_leaks": [], "heard": ["hello"]}
    assert headline([call], [-10])["echo_cpu_ms_per_s"] == 2.0


# -- the grid ---------------------------------------------------------------------------------------------------


def test_the_grid_has_enough_barge_ins_per_echo_level_and_a_clean_call_beside_each_cell() -> None:
    plans = plan_calls([20, 150, 400], [-6, -10, -20, -30, -40], ["twilio", "audiosocket", "webrtc"], 20)
    assert len(plans) == 3 * 3 * 6 and all(p.barge_ins == 3 for p in plans)
    for level in (None, -6, -40):
        assert sum(p.barge_ins for p in plans if p.level_db == level) >= 20
    assert [p.level_db for p in plans[:6]] == [None, -6, -10, -20, -30, -40]  # interleaved: the same load
    one_cell = plan_calls([150], [-10], ["twilio"], 20)  # long scripts are split over calls
    assert len(one_cell) == 8 and sum(p.barge_ins for p in one_cell if p.level_db == -10) >= 20


# -- the benchmark's speakerphone -----------------------------------------------------------------------------------


def speakerphone(echo: SpeakerEcho, agent: np.ndarray, seconds: float, near: np.ndarray | None = None) -> np.ndarray:
    """The microphone's frames over `seconds`, the agent's audio played from 20 ms on in back-to-back 20 ms chunks
    (as the caller's playout queues them)."""
    frames = round(seconds / 0.02)
    near = np.zeros(frames * FRAME, np.int16) if near is None else near
    out = [echo.mix(near[:FRAME], 0.02)]  # the microphone's first frame: its clock starts 20 ms before it went
    for k in range(0, len(agent), FRAME):
        echo.played(agent[k:k + FRAME], 0.02 + k / RATE)
    out += [echo.mix(near[n * FRAME:(n + 1) * FRAME], 0.02 * (n + 1)) for n in range(1, frames)]
    return np.concatenate(out).astype(float)


@pytest.mark.parametrize(("delay_ms", "level_db"), [(20, -6), (150, -20), (400, -40)])
def test_the_rooms_echo_comes_at_its_delay_and_level(delay_ms: float, level_db: float) -> None:
    agent = (5000 * np.random.default_rng(0).standard_normal(2 * RATE)).astype(np.int16)
    heard = speakerphone(SpeakerEcho(RATE, delay_ms, level_db, tail=True), agent, 2.8)
    onset = int(0.02 * RATE) + int(delay_ms * RATE / 1000)
    assert not heard[:onset].any() and heard[onset] != 0
    steady = heard[onset + int(0.15 * RATE):onset + int(1.9 * RATE)]  # the whole tail in, the agent still playing
    level = 10 * np.log10(np.mean(steady**2) / np.mean(agent.astype(float) ** 2))
    assert level == pytest.approx(level_db, abs=1.0)


def test_a_fast_loudspeaker_clock_brings_the_echo_earlier_as_a_reply_goes_on() -> None:
    agent = np.zeros(10 * RATE, np.int16)
    agent[0] = agent[-1] = 20000  # two clicks 10 s apart in one reply
    heard = {}
    for skew in (0.0, 0.001):
        mic = np.abs(speakerphone(SpeakerEcho(RATE, 150, -6, tail=True, skew=skew), agent, 10.5))
        first = int(np.argmax(mic[:RATE]))
        heard[skew] = (first, int(np.argmax(mic[RATE:])) + RATE - first)
    assert heard[0.001][0] == heard[0.0][0]  # the first click comes on time
    assert heard[0.0][1] == 10 * RATE - 1
    assert heard[0.0][1] - heard[0.001][1] == pytest.approx(80, abs=1)  # 0.1 % of 10 s earlier


def test_the_line_clips_and_codes_to_mu_law_and_without_echo_carries_the_voice_alone() -> None:
    agent = (12000 * np.random.default_rng(1).standard_normal(RATE)).astype(np.int16)
    voice = (9000 * np.sin(np.arange(RATE) * 0.3)).astype(np.int16)
    heard = speakerphone(SpeakerEcho(RATE, 20, -6, tail=True, line=True), agent, 1.0, voice).astype(np.int16)
    assert np.array_equal(decode_pcmu(encode_pcmu(heard)), heard)  # mu-law values only
    assert np.abs(heard.astype(float)).max() <= CLIP_LEVEL * 32768 * 1.04  # clipped, within mu-law's last step
    clean = speakerphone(SpeakerEcho(RATE, 20, None, tail=True, line=True), agent, 1.0, voice)
    residue = np.sqrt(np.mean((clean - voice) ** 2) / np.mean(voice.astype(float) ** 2))
    assert residue < 0.03  # mu-law's own noise (about -38 dB), no agent (-6 dB)


def test_a_calls_speakerphone_and_its_result_cross_the_caller_process_boundary_whole() -> None:
    """`bench echo` sends each call's `SpeakerEcho` to a caller worker process and gets its `CallResult` back, both
    pickled: the echo must be the same room and line there, and the result keep what the figures read."""
    agent = (5000 * np.random.default_rng(2).standard_normal(RATE)).astype(np.int16)
    echo = SpeakerEcho(RATE, 150, -10, tail=True, skew=0.001, line=True, seed=7)
    there = pickle.loads(pickle.dumps(echo))
    assert np.array_equal(speakerphone(there, agent, 1.5), speakerphone(echo, agent, 1.5))
    result = CallResult("webrtc", "c", turns=[ClientTurn(0, speech_start=1.0, speech_end=2.5, first_audio=3.1)],
                        agent_audio=agent, clears=[4.2], record={"turns": [{"user_text": "hello"}]}, started=0.5)
    back = pickle.loads(pickle.dumps(result))
    assert back.turns == result.turns and back.clears == [4.2] and back.record == result.record
    assert np.array_equal(back.agent_audio, agent) and back.turns[0].voice_to_voice_ms == pytest.approx(600)
