"""Feeding call records to observers the way a `CallSession` reports them, and turns with an end-of-turn decision
(for the observability tests)."""

from __future__ import annotations

from voicepipe.observability.records import CallRecord, TurnRecord


def report_call(observer, call: CallRecord, end: bool = True) -> None:
    """`call_started`, `turn_finished` for each turn, then (with `end`) `call_ended` as a completed call."""
    observer.call_started(call)
    for turn in call.turns:
        observer.turn_finished(call, turn)
    if end:
        call.ended, call.end_reason, call.outcome = call.started + 20, "stop", "completed"
        observer.call_ended(call)


def decision(policy: str = "hybrid", reason: str = "text and sound say complete", silence_ms: float = 212.0,
             wait_ms: float = 200.0, text_prob: float | None = 0.91, acoustic_prob: float | None = 0.88) -> dict:
    """An end-of-turn decision as the call session records it (TurnRecord.decision)."""
    return {"policy": policy, "action": "end", "reason": reason, "silence_ms": silence_ms, "wait_ms": wait_ms,
            "text_prob": text_prob, "acoustic_prob": acoustic_prob}


REOPENED = {**decision("text", "text says complete", 320.0, 300.0, 0.62, None), "t": 4.2}


def decide(turn: TurnRecord, reopened: int = 0, backchannels: tuple[str, ...] = ()) -> TurnRecord:
    """`turn` ended by `decision()`, after `reopened` earlier decisions the caller's speech reopened."""
    turn.decision = decision()
    turn.reopened = [dict(REOPENED) for _ in range(reopened)]
    turn.backchannels = list(backchannels)
    return turn
