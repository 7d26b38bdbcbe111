"""Feeding call records to observers the way a `CallSession` reports them (for the call store's tests)."""

from __future__ import annotations

from voicepipe.observability.records import CallRecord


def report_call(observer, call: CallRecord, end: bool = True) -> None:
    """`call_started`, `turn_finished` for each turn, then (with `end`) `call_ended` as a completed call."""
    observer.call_started(call)
    for turn in call.turns:
        observer.turn_finished(call, turn)
    if end:
        call.ended, call.end_reason, call.outcome = call.started + 20, "stop", "completed"
        observer.call_ended(call)
