"""One call's end-of-turn evidence: what Smart Turn hears, which evidence counts, and what a decision records."""

from __future__ import annotations

import asyncio

import numpy as np

from voicepipe.config import TurnSettings
from voicepipe.pipeline.turn_taking import PRE_SPEECH_S, TurnTaking
from voicepipe.turns.policy import TurnPolicy
from voicepipe.vad.turn import TurnView

RATE = 16000


class FakeSmartTurn:
    """Stands in for the ONNX model: records what it was given, answers `prob`."""

    def __init__(self, prob: float) -> None:
        self.prob, self.heard = prob, []

    def predict(self, audio: np.ndarray) -> float:
        self.heard.append(audio.copy())
        return self.prob


def taking(prob: float = 0.9, policy: str = "hybrid",
           evidence_wait_ms: float = 1000) -> tuple[TurnTaking, FakeSmartTurn]:
    model = FakeSmartTurn(prob)
    settings = TurnSettings(short_wait_ms=200, middle_wait_ms=700, long_wait_ms=2500)
    return TurnTaking(TurnPolicy(policy, settings, 600), model, RATE, evidence_wait_ms), model


def view(silence_ms: float) -> TurnView:
    return TurnView(speech_seen=True, in_speech=False, silence_ms=silence_ms)


def test_smart_turn_hears_the_turn_from_just_before_its_speech_to_its_end_and_no_silence_after() -> None:
    async def main():
        turns, model = taking()
        audio = np.arange(3 * RATE, dtype=np.int64).astype(np.int16)  # sample i holds i (mod 2**16)
        turns.push(audio[:RATE])
        turns.speech_started(RATE // 2)
        turns.push(audio[RATE:])
        turns.speech_ended(2 * RATE)  # the speech ended 1 s ago
        await asyncio.sleep(0.05)
        (heard,) = model.heard
        first = RATE // 2 - int(PRE_SPEECH_S * RATE)
        assert np.array_equal(heard, audio[first:2 * RATE])
        assert turns.acoustic_prob == 0.9

    asyncio.run(main())


def test_evidence_of_an_earlier_pause_does_not_count_once_the_caller_speaks_again() -> None:
    async def main():
        turns, _ = taking()
        turns.push(np.zeros(RATE, np.int16))
        turns.speech_started(100)
        turns.speech_ended(RATE)
        segment = turns.segment
        turns.speech_started(RATE + 100)  # before the score lands
        await asyncio.sleep(0.05)
        told = []
        turns.on_evidence = lambda kind, seg, value: told.append((kind, seg, value))
        turns.text_known(segment, 0.9)
        assert turns.acoustic_prob is None and turns.text_prob is None
        assert told == [("text", segment, 0.9)]  # the bench still records when it landed
        turns.text_known(turns.segment, 0.8)
        assert turns.text_prob == 0.8

    asyncio.run(main())


def test_decide_asks_the_policy_with_the_evidence_and_records_the_deciding_one() -> None:
    turns, _ = taking(policy="text")
    assert not turns.decide(TurnView(speech_seen=True, in_speech=True, silence_ms=0))
    assert not turns.decide(view(300)) and turns.decision_record() == {}  # unsure (no words yet): 700 ms
    turns.text_known(turns.segment, 0.9)
    assert turns.decide(view(300))
    record = turns.decision_record()
    assert (record["policy"], record["action"], record["wait_ms"], record["text_prob"]) == ("text", "end", 200, 0.9)


def pause_with_words_coming(prob: float = 0.4, evidence_wait_ms: float = 1000) -> tuple[TurnTaking, FakeSmartTurn]:
    turns, model = taking(prob, evidence_wait_ms=evidence_wait_ms)
    turns.push(np.zeros(2 * RATE, np.int16))
    turns.speech_started(100)
    turns.speech_ended(RATE, words_coming=True)
    return turns, model


def test_the_sound_waits_for_the_words_and_is_scored_when_they_are_unsure() -> None:
    """On two cores Smart Turn beside the early reply's prefill slowed the words by ~100 ms: it now goes after."""
    async def main():
        turns, model = pause_with_words_coming()
        await asyncio.sleep(0.05)
        assert model.heard == [] and not turns.decide(view(300))  # no evidence yet: the middle wait
        turns.text_known(turns.segment, 0.05)  # unsure (defaults: complete from 0.6, mid-thought under 0.003)
        await turns._scoring
        assert len(model.heard) == 1 and turns.acoustic_prob == 0.4
        assert not turns.decide(view(300))  # both unsure
        assert turns.decision_record() == {}

    asyncio.run(main())


def test_words_that_are_sure_settle_the_pause_without_the_sound() -> None:
    async def main():
        turns, model = pause_with_words_coming()
        turns.text_known(turns.segment, 0.9)
        assert turns.decide(view(300))  # at once: hybrid does not wait for a sound it does not need
        await turns._scoring
        assert model.heard == [] and turns.decision_record()["acoustic_prob"] is None

    asyncio.run(main())


def test_words_that_never_come_leave_the_sound_to_be_scored_after_the_bound() -> None:
    async def main():
        turns, model = pause_with_words_coming(evidence_wait_ms=50)
        await turns._scoring
        assert len(model.heard) == 1 and turns.acoustic_prob == 0.4

    asyncio.run(main())


def awaited_pause(policy: str = "text", evidence_wait_ms: float = 1000) -> tuple[TurnTaking, list[str]]:
    """A listening pause whose words are being scored; `ready` logs each `on_ready`."""
    turns, _ = taking(policy=policy, evidence_wait_ms=evidence_wait_ms)
    ready: list[str] = []
    turns.on_ready = lambda: ready.append("ready")
    turns.speech_started(100)
    turns.speech_ended(RATE, words_coming=True, awaited=True)
    return turns, ready


def test_a_decision_parks_at_its_window_until_the_words_are_in_then_is_taken_there() -> None:
    """The decision at 250 ms of silence is the same whether the words landed before that window or long after."""
    async def main():
        turns, ready = awaited_pause()
        assert not turns.decide(view(150)) and not turns.waiting  # no evidence could end the turn yet (200 ms)
        assert not turns.decide(view(250)) and turns.waiting and ready == []
        await asyncio.sleep(0.05)  # the words are late
        turns.text_known(turns.segment, 0.9, "A table for two.")
        assert ready == ["ready"] and not turns.waiting
        assert turns.decide(view(250))  # asked again at the parked window: complete, 200 ms
        assert turns.decision_record()["text_prob"] == 0.9 and turns.evidence_waited()["evidence_wait_ms"] >= 40

    asyncio.run(main())


def test_a_pause_over_the_agent_never_parks_its_decision() -> None:
    async def main():
        turns, _ = taking(policy="text")
        turns.speech_started(100)
        turns.speech_ended(RATE, words_coming=True, awaited=False)
        assert not turns.decide(view(250)) and not turns.waiting  # the middle wait, without the words

    asyncio.run(main())


def test_past_the_bound_a_parked_decision_goes_on_without_the_words_and_says_so(caplog) -> None:
    async def main():
        turns, ready = awaited_pause(evidence_wait_ms=50)
        assert not turns.decide(view(250)) and turns.waiting
        await asyncio.sleep(0.2)
        assert ready == ["ready"] and not turns.waiting
        assert not turns.decide(view(250))  # no words: the middle wait (700 ms)
        assert turns.decide(view(700)) and turns.evidence_waited()["evidence_missing"] == ["words"]

    asyncio.run(main())
    assert "went on without the words" in caplog.text


def test_a_reply_without_words_releases_a_parked_decision_at_once() -> None:
    async def main():
        turns, ready = awaited_pause()
        assert not turns.decide(view(250)) and turns.waiting
        turns.text_known(turns.segment, None)  # the early reply heard nothing to score
        assert ready == ["ready"] and not turns.decide(view(250)) and turns.decide(view(700))

    asyncio.run(main())


def test_under_hybrid_a_parked_decision_waits_for_the_sound_when_the_words_are_unsure() -> None:
    async def main():
        turns, ready = awaited_pause(policy="hybrid")
        turns.acoustic.prob = 0.99
        assert not turns.decide(view(250)) and turns.waiting
        turns.text_known(turns.segment, 0.05)  # unsure: the sound decides
        assert turns.waiting and ready == []
        await turns._scoring
        assert ready == ["ready"] and turns.decide(view(250))
        assert turns.decision_record()["acoustic_prob"] == 0.99

    asyncio.run(main())


def test_a_sound_waiting_for_words_gives_up_when_the_caller_speaks_again() -> None:
    async def main():
        turns, model = pause_with_words_coming()
        await asyncio.sleep(0.01)
        turns.speech_started(RATE + 100)
        await asyncio.wait_for(turns._scoring, 0.5)  # at once, not after the bound (1 s)
        assert model.heard == [] and turns.acoustic_prob is None

    asyncio.run(main())


def test_words_the_stt_ended_with_a_sentence_mark_are_judged_by_that_threshold() -> None:
    turns, _ = taking(policy="text")  # the defaults: complete from 0.6, or from 0.3 with a mark
    turns.speech_started(0)
    turns.text_known(turns.segment, 0.45, "I need to reschedule my appointment")
    assert not turns.decide(view(300))  # unsure without the mark
    turns.text_known(turns.segment, 0.45, "I need to reschedule my appointment.")
    assert turns.decide(view(300)) and turns.decision_record()["reason"].endswith("sentence mark")
    turns.speech_started(RATE)  # the caller goes on: the mark of the old words no longer counts
    assert not turns.decide(view(300))


def test_a_reopened_decision_goes_to_the_turn_that_goes_on() -> None:
    turns, _ = taking(policy="text")
    turns.speech_started(RATE)
    turns.text_known(turns.segment, 0.9)
    turns.decide(view(250))
    decision = turns.decision_record()
    turns.turn_ended()
    turns.speech_started(5 * RATE)
    turns.reopen(decision, t=3.5)
    assert turns.take_reopened() == [{**decision, "t": 3.5}] and turns.take_reopened() == []
    assert turns._turn_start == RATE - int(PRE_SPEECH_S * RATE)  # the reopened turn's audio starts where it began
