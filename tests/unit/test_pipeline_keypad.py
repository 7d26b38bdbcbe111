"""The keypad (voicepipe/pipeline/keypad.py): DTMF keys become a caller turn the LLM reads as "[keypad: ...]", with
the session's scripted stand-ins for the models (tests/unit/test_pipeline_session.py's Harness). The entry's rules
run without early replies (`plain`); the last test runs the reply held from each key."""

from __future__ import annotations

import asyncio

from tests.pipeline_fakes import PER_CHAR
from tests.unit.test_pipeline_session import Harness, run
from voicepipe.pipeline import CallState


async def listening(h: Harness) -> None:
    await h.settle(lambda: h.output.ended_replies == len(h.engine.calls))
    h.output.playing = False
    await h.settle(lambda: h.call.state is CallState.LISTENING)
    h.output.playing = True


def plain(**kw) -> Harness:
    """A call whose keypad turns start at the entry's end (no reply held from each key)."""
    return Harness(preemptive_generation=False, **kw)


def keys(h: Harness, digits: str) -> None:
    for digit in digits:
        h.call.push_dtmf(digit)


def test_an_entry_ended_by_the_terminator_is_a_turn_the_llm_reads_plainly() -> None:
    async def main():
        h = plain()
        await h.call.start()
        keys(h, "4217")
        assert h.call.state is CallState.LISTENING and not h.engine.calls  # still typing
        keys(h, "#")
        assert h.call.state is CallState.THINKING
        await h.settle(lambda: h.output.plays)
        assert h.engine.calls == [[{"role": "user", "content": "[keypad: 4 2 1 7]"}]]
        await listening(h)
        (turn,) = h.call.record.turns
        assert turn.dtmf == "4217" and turn.user_text == "[keypad: 4 2 1 7]" and turn.agent_text
        timeline = turn.timeline
        assert timeline["dtmf_start"] <= timeline["dtmf_end"] == timeline["end_of_turn"]
        assert timeline["dtmf_end"] <= timeline["first_audio_sent"]
        assert turn.timings_ms["dtmf_response"] == turn.timings_ms["response"]
        assert "voice_to_voice" not in turn.timings_ms  # no speech
        assert [e["digit"] for e in h.observer.events if e["type"] == "dtmf"] == list("4217#")
        assert any(e["type"] == "keypad" and e["digits"] == "4217" for e in h.observer.events)
        assert ("transcript", {"text": "[keypad: 4 2 1 7]", "final": True, "turn": 1}) in h.output.events
        await h.call.close()

    run(main())


def test_a_pause_or_the_maximum_length_ends_an_entry() -> None:
    async def main():
        h = plain()
        h.call.cfg.dtmf_timeout_ms = 60
        h.call.cfg.dtmf_max_digits = 3
        await h.call.start()
        keys(h, "12")
        await asyncio.sleep(0.03)
        keys(h, "*")  # a key restarts the pause: three keys reach the maximum first
        await h.settle(lambda: h.engine.calls)
        assert h.engine.calls[-1] == [{"role": "user", "content": "[keypad: 1 2 *]"}]
        await listening(h)
        keys(h, "9")
        await asyncio.sleep(0.03)
        assert len(h.engine.calls) == 1
        await h.settle(lambda: len(h.engine.calls) == 2)  # the pause ended it
        assert h.engine.calls[-1] == [{"role": "user", "content": "[keypad: 9]"}]
        await listening(h)
        keys(h, "#")  # the terminator alone is an entry of its own ("press # to continue")
        await h.settle(lambda: len(h.engine.calls) == 3)
        assert h.engine.calls[-1] == [{"role": "user", "content": "[keypad: #]"}]
        await h.call.close()

    run(main())


def test_a_key_while_the_agent_speaks_interrupts_it_as_speech_does() -> None:
    async def main():
        h = plain()
        await h.call.start()
        await h.one_turn()
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.played = len("Hello there") * PER_CHAR
        keys(h, "1")
        assert h.output.clears == 1 and h.call.state is CallState.LISTENING
        await h.settle(lambda: h.engine.rollbacks)
        assert h.engine.rollbacks == [2]  # "Hello there": what the caller heard stays in the LLM session
        assert h.call.record.turns[0].interrupted and h.call.record.barge_ins == 1
        keys(h, "#")
        await h.settle(lambda: len(h.engine.calls) == 2)
        assert h.engine.calls[1] == [{"role": "user", "content": "[keypad: 1]"}]
        await h.call.close()

    run(main())


def test_a_key_before_the_reply_was_heard_drops_it_and_its_words_open_the_keypad_turn() -> None:
    async def main():
        h = plain()
        await h.call.start()
        h.speak(400)
        assert h.call.state is CallState.THINKING
        keys(h, "7#")  # before the reply has run at all
        await h.settle(lambda: h.engine.calls)
        assert h.engine.calls == [[{"role": "user", "content": "what time is it [keypad: 7]"}]]
        assert [t.turn for t in h.call.record.turns] == [1] and h.call.record.turns[0].dtmf == "7"
        assert h.call.record.barge_ins == 0 and not h.call.turns.reopened  # a keypad turn reopens no speech turn
        await h.call.close()

    run(main())


def test_keys_during_the_callers_pause_end_their_speech_turn_and_carry_its_words() -> None:
    async def main():
        h = Harness(texts=["my account number is"])  # early replies on: the speech's is dropped
        await h.call.start()
        h.push(20, h.ev("speech_start"))
        h.push(400)
        h.push(20, h.ev("speech_end"))  # the early reply starts; no end of turn yet
        await h.settle(lambda: h.engine.calls)
        keys(h, "55#")
        await h.settle(lambda: len(h.engine.calls) == 2)
        assert h.engine.calls[1] == [{"role": "user", "content": "my account number is [keypad: 5 5]"}]
        assert h.engine.dropped == [0] and h.stt.cancelled_turns == 1
        h.push(20, h.ev("end_of_turn"))  # the detector's late decision on the speech: nothing more happens
        await asyncio.sleep(0.05)
        assert len(h.engine.calls) == 2 and [t.dtmf for t in h.call.record.turns] == ["55"]
        await h.call.close()

    run(main())


def test_bad_keys_are_dropped_and_a_closed_call_takes_none() -> None:
    async def main():
        h = plain()
        h.call.cfg.dtmf_timeout_ms = 50
        await h.call.start()
        for bad in ("x", "12", "", None):
            h.call.push_dtmf(bad)
        keys(h, "3")
        await h.call.close()
        await asyncio.sleep(0.1)  # the pause timer was cancelled with the call
        assert h.engine.calls == [] and h.call.record.turns == []
        assert [e["digit"] for e in h.observer.events if e["type"] == "dtmf"] == ["3"]

    run(main())


def test_each_key_starts_the_reply_held_until_the_entry_ends() -> None:
    async def main():
        h = Harness()
        await h.call.start()
        keys(h, "4")
        await h.settle(lambda: h.engine.calls)
        keys(h, "2")
        await h.settle(lambda: len(h.engine.calls) == 2 and "first_audio_synth" in h.call._early.record.timeline)
        # the first key's reply was dropped by the second; the held one answers "4 2" and nobody hears it yet
        assert h.engine.calls == [[{"role": "user", "content": "[keypad: 4]"}],
                                  [{"role": "user", "content": "[keypad: 4 2]"}]]
        assert h.engine.dropped == [0] and not h.output.plays and h.call.state is CallState.LISTENING
        assert h.engine.probes == [False, False]  # keys tell the turn-taking nothing
        keys(h, "#")
        await h.settle(lambda: h.output.plays)
        assert len(h.engine.calls) == 2  # released, not generated again
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        (turn,) = h.call.record.turns
        assert (turn.dtmf, turn.user_text) == ("42", "[keypad: 4 2]")
        timeline = turn.timeline
        assert timeline["dtmf_start"] < timeline["llm_queued"] < timeline["dtmf_end"] == timeline["end_of_turn"]
        assert turn.timings_ms["dtmf_response"] < (timeline["first_audio_sent"] - timeline["llm_queued"]) * 1000
        keys(h, "7")
        await h.settle(lambda: len(h.engine.calls) == 3 and h.call._early.llm_started)
        keys(h, "*")  # the terminator is "#": "*" is a key like the others and drops the held "7"
        await h.settle(lambda: len(h.engine.calls) == 4)
        assert h.engine.dropped == [0, 1]
        await h.call.close()  # the held reply leaves no turn behind
        assert len(h.call.record.turns) == 1

    run(main())
