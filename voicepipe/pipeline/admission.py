"""Admission control: how many calls this process takes at once (`calls.max_concurrent`), and whether it takes
any at all (a draining process takes none).

Every transport asks before it spends anything on a call: `slot = admission.admit(transport)` returns a
`CallSlot` to release when the call's connection ends, or raises `CallRefused`, whose `reason` is
``"saturated"`` (at the limit) or ``"draining"`` (SIGTERM: the process stops taking calls). Each transport refuses
the way its peer expects:

| transport | refusal |
|---|---|
| WebSocket (`/ws`, `/ws/{provider}`) | accept, then close 1013 (try again later) with the reason |
| WebRTC (`POST /webrtc/offer`) | HTTP 503 with the reason, before any SDP is applied |
| AudioSocket | the hangup message, then the TCP close |
| SIP | `CallRefused.sip_status`: 486 Busy Here when saturated, 503 Service Unavailable when draining |

`check()` answers the same question without taking a slot (a SIP INVITE may ask before it answers 100 Trying).
Thread-safe: the AudioSocket listener runs on its own event loop. Refusals are counted by transport and reason
for the metrics (`voicepipe_calls_refused_total`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

log = logging.getLogger(__name__)

SATURATED = "saturated"
DRAINING = "draining"
SIP_STATUS = {SATURATED: 486, DRAINING: 503}
REASON_TEXT = {SATURATED: "busy: this server is at calls.max_concurrent calls",
               DRAINING: "unavailable: this server is shutting down"}


class CallRefused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(REASON_TEXT[reason])
        self.reason = reason

    @property
    def sip_status(self) -> int:
        return SIP_STATUS[self.reason]


class CallSlot:
    """One admitted call; `release()` gives the place back (once, however often it is called)."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._release()


class Admission:
    def __init__(self, max_concurrent: int | None) -> None:
        self.max_concurrent = max_concurrent
        self._lock = threading.Lock()
        self._active = 0
        self._draining = False
        self.refused: Counter[tuple[str, str]] = Counter()  # (transport, reason) -> calls refused

    def check(self) -> str | None:
        """Why a call arriving now would be refused (``"draining"``, ``"saturated"``), or None."""
        with self._lock:
            return self._refusal()

    def _refusal(self) -> str | None:
        if self._draining:
            return DRAINING
        if self.max_concurrent is not None and self._active >= self.max_concurrent:
            return SATURATED
        return None

    def admit(self, transport: str) -> CallSlot:
        """Take a place for one call on ``transport``, or raise `CallRefused` (counted, and logged)."""
        with self._lock:
            reason = self._refusal()
            if reason is None:
                self._active += 1
                return CallSlot(self)
            self.refused[(transport, reason)] += 1
        log.warning("%s: call refused (%s, %d active)", transport, REASON_TEXT[reason], self._active)
        raise CallRefused(reason)

    def _release(self) -> None:
        with self._lock:
            self._active -= 1

    def drain(self) -> None:
        """Take no more calls (the calls in progress go on)."""
        with self._lock:
            self._draining = True

    @property
    def active(self) -> int:
        return self._active

    @property
    def draining(self) -> bool:
        return self._draining

    def snapshot(self) -> dict:
        """For /ready and the metrics."""
        with self._lock:
            return {"active_calls": self._active, "max_concurrent": self.max_concurrent, "draining": self._draining,
                    "saturated": self._refusal() == SATURATED, "refused": dict(self.refused)}
