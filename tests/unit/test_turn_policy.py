"""The end-of-turn policy on recorded evidence: the wait each verdict asks for, and how hybrid weighs the two."""

from __future__ import annotations

import pytest

from voicepipe.config import TurnSettings
from voicepipe.turns.policy import TurnEvidence, TurnPolicy, effective_policy, marked_end

S = TurnSettings(short_wait_ms=200, middle_wait_ms=700, long_wait_ms=2500, text_complete=0.1,
                 text_complete_marked=0.1, text_incomplete=0.01, acoustic_complete=0.6, acoustic_incomplete=0.3)


def policy(name: str) -> TurnPolicy:
    return TurnPolicy(name, S, silence_ms=600)


def test_silence_is_the_old_fixed_rule_whatever_the_evidence_says() -> None:
    p = policy("silence")
    assert p.decide(TurnEvidence(599, text_prob=0.9, acoustic_prob=0.9)).action == "wait"
    decision = p.decide(TurnEvidence(600, text_prob=0.0, acoustic_prob=0.0))
    assert (decision.action, decision.wait_ms, decision.reason) == ("end", 600, "silence of 600 ms")


@pytest.mark.parametrize(("prob", "wait", "before"), [(0.5, 200, "wait"), (0.05, 700, "wait"), (0.001, 2500, "hold"),
                                                     (None, 700, "wait")])
def test_text_sets_the_wait_from_its_verdict(prob, wait, before) -> None:
    p = policy("text")
    assert p.decide(TurnEvidence(wait - 1, text_prob=prob)).action == before
    assert p.decide(TurnEvidence(wait, text_prob=prob)).action == "end"
    assert p.decide(TurnEvidence(wait, text_prob=prob, acoustic_prob=0.0)).wait_ms == wait  # sound is not its evidence


def test_words_the_stt_ended_with_a_sentence_mark_are_complete_from_their_own_threshold() -> None:
    marked = TurnPolicy("text", S.model_copy(update={"text_complete": 0.5, "text_complete_marked": 0.2}), 600)
    decision = marked.decide(TurnEvidence(0, text_prob=0.3, text_marked=True))
    assert (decision.wait_ms, decision.reason) == (200, "text says complete; the words end with a sentence mark")
    assert marked.decide(TurnEvidence(0, text_prob=0.3)).wait_ms == 700  # no mark: unsure below 0.5
    assert marked.decide(TurnEvidence(0, text_prob=0.005, text_marked=True)).wait_ms == 2500  # still mid-thought


@pytest.mark.parametrize(("words", "marked"), [("Can I pay with a credit card?", True),
                                               ("That's all, thank you.", True), ("Wow!", True),
                                               ("I'd like to change my...", False), ("The total is…", False),
                                               ("My name is", False),
                                               ("where in the nearest hospital,", False), ("Yes.  ", True)])
def test_a_sentence_mark_is_a_full_stop_a_question_or_an_exclamation_not_an_ellipsis(words, marked) -> None:
    assert marked_end(words) is marked


def test_acoustic_reads_only_the_sound() -> None:
    p = policy("acoustic")
    assert p.decide(TurnEvidence(200, acoustic_prob=0.9, text_prob=0.0)).action == "end"
    held = p.decide(TurnEvidence(1000, acoustic_prob=0.1))
    assert (held.action, held.wait_ms, held.reason) == ("hold", 2500, "sound says mid-thought")


@pytest.mark.parametrize(("text", "sound", "wait"), [
    (0.5, 0.1, 200),  # words that are sure decide: the sound does not overrule them ...
    (0.5, None, 200),  # ... nor is it waited for
    (0.001, 0.9, 2500),
    (0.05, 0.9, 200),  # unsure words leave it to the sound
    (0.05, 0.1, 2500),
    (0.05, 0.4, 700),  # both unsure
    (0.05, None, 700),  # the sound not known yet
    (None, 0.9, 700),  # before the words are known, the sound alone does not end the turn ...
    (None, 0.1, 2500),  # ... but holds it
    (None, None, 700),  # no evidence yet: the middle wait
])
def test_hybrid_takes_sure_words_and_asks_the_sound_when_they_are_unsure(text, sound, wait) -> None:
    assert policy("hybrid").decide(TurnEvidence(0, text_prob=text, acoustic_prob=sound)).wait_ms == wait


def test_only_hybrid_with_unsure_or_unknown_words_and_acoustic_need_the_sound() -> None:
    hybrid = policy("hybrid")
    assert hybrid.needs_sound(None) and hybrid.needs_sound(0.05)
    assert not hybrid.needs_sound(0.5) and not hybrid.needs_sound(0.001)
    marked = TurnPolicy("hybrid", S.model_copy(update={"text_complete": 0.5, "text_complete_marked": 0.2}), 600)
    assert marked.needs_sound(0.3) and not marked.needs_sound(0.3, text_marked=True)  # complete with its mark
    assert policy("acoustic").needs_sound(0.5)
    assert not policy("text").needs_sound(None) and not policy("silence").needs_sound(None)


def test_with_acoustic_alone_the_sound_may_end_the_turn_before_the_words_are_known() -> None:
    alone = TurnPolicy("hybrid", S.model_copy(update={"acoustic_alone": True}), 600)
    decision = alone.decide(TurnEvidence(200, acoustic_prob=0.9))
    assert (decision.action, decision.reason) == ("end", "sound says complete; words not known yet")
    waiting = policy("hybrid").decide(TurnEvidence(200, acoustic_prob=0.9))
    assert (waiting.action, waiting.reason) == ("wait", "sound says complete; waiting for the words")


def test_a_decision_is_recorded_with_its_evidence_and_reason() -> None:
    evidence = TurnEvidence(231.04, text_prob=0.052345, acoustic_prob=0.88)
    decision = policy("hybrid").decide(evidence)
    assert decision.record("hybrid", evidence) == {
        "policy": "hybrid", "action": "end", "reason": "text says unsure, sound says complete", "silence_ms": 231.0,
        "wait_ms": 200.0, "text_prob": 0.0523, "acoustic_prob": 0.88}


def test_a_call_runs_the_policy_its_evidence_allows() -> None:
    names = ("silence", "text", "acoustic", "hybrid")
    assert [effective_policy(n, acoustic_loaded=True) for n in names] == list(names)
    assert [effective_policy(n, acoustic_loaded=False) for n in names] == ["silence", "text", "text", "text"]
    # no early replies, no end probe: the words are never scored
    assert [effective_policy(n, True, words_scored=False) for n in names] == [
        "silence", "silence", "acoustic", "acoustic"]
    assert [effective_policy(n, False, words_scored=False) for n in names] == ["silence"] * 4
    with pytest.raises(ValueError, match="unknown turn policy"):
        TurnPolicy("semantic", S, 600)
