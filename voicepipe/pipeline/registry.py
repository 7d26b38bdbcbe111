"""The calls of one process: the live ones, and a short list of ended ones (their records only)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from voicepipe.observability.records import CallRecord
from voicepipe.pipeline.session import CallSession


class CallRegistry:
    def __init__(self, keep_ended: int = 50) -> None:
        self.active: dict[str, CallSession] = {}
        self.ended: OrderedDict[str, CallRecord] = OrderedDict()
        self.keep_ended = keep_ended

    def add(self, call: CallSession) -> None:
        self.active[call.call_id] = call

    def finish(self, call: CallSession) -> None:
        """Move a live call to the ended ones; once only, so a later call that took the same id stays live."""
        if self.active.get(call.call_id) is not call:
            return
        del self.active[call.call_id]
        self.ended[call.call_id] = call.record
        while len(self.ended) > self.keep_ended:
            self.ended.popitem(last=False)

    def get(self, call_id: str) -> CallRecord | None:
        call = self.active.get(call_id)
        return call.record_now() if call is not None else self.ended.get(call_id)

    def summary(self) -> dict[str, Any]:
        return {"active": sorted(self.active), "ended": list(self.ended)}
