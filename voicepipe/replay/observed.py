"""What a replayed call did, as plain data: the server's turns, client-side barge-in stop times, the send lag.

`observe()` turns the client's `CallResult` (with the server's `/calls/{id}` record) into an `ObservedCall`;
the expectations are checked against that (checks.py), so the checks are pure and unit-tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voicepipe.caller import CallResult


@dataclass
class ObservedTurn:
    turn: int
    user_text: str = ""
    agent_text: str = ""  # everything the agent generated
    heard_text: str | None = None  # what the caller heard of an interrupted reply
    interrupted: bool = False
    timings_ms: dict[str, float] = field(default_factory=dict)
    stop_ms: float | None = None  # interrupted: the caller's speech onset -> the clear, at the client
    reopened: int = 0  # end-of-turn decisions the caller's speech reopened before the turn really ended


@dataclass
class ObservedCall:
    call_id: str
    turns: list[ObservedTurn] = field(default_factory=list)
    error: str | None = None  # the call could not be made, or the server kept no record of it
    send_lag_p95_ms: float | None = None
    send_lag_max_ms: float | None = None
    send_lag_ms: list[float] = field(default_factory=list, repr=False)  # every caller frame's (not in reports)
    end_reason: str | None = None
    wall_s: float = 0.0

    def p95(self, key: str) -> float | None:
        values = [t.timings_ms[key] for t in self.turns if isinstance(t.timings_ms.get(key), (int, float))]
        return round(float(np.percentile(values, 95)), 1) if values else None


def speech_onsets(audio: np.ndarray, rate: int, min_gap_s: float = 0.2) -> list[float]:
    """Seconds into `audio` where speech starts after at least `min_gap_s` of quiet. Loud means 10 ms RMS over
    the line's noise floor (its 20th percentile) times 4, and over 300 (int16)."""
    win = max(1, rate // 100)
    n = len(audio) // win
    if n == 0:
        return []
    rms = np.sqrt(np.mean(audio[: n * win].astype(np.float64).reshape(n, win) ** 2, axis=1))
    loud = rms > max(300.0, 4 * float(np.percentile(rms, 20)))
    onsets, quiet = [], min_gap_s * 100  # windows of quiet so far (the call starts quiet)
    for i, is_loud in enumerate(loud):
        if is_loud:
            if quiet >= min_gap_s * 100:
                onsets.append(i * win / rate)
            quiet = 0
        else:
            quiet += 1
    return onsets


def stop_latencies_ms(onsets: list[float], clears: list[float]) -> list[float | None]:
    """For each clear (client clock): ms since the last caller speech onset before it (None: no onset)."""
    out: list[float | None] = []
    for clear in clears:
        before = [o for o in onsets if o <= clear]
        out.append((clear - before[-1]) * 1000 if before else None)
    return out


def observe(result: CallResult, audio: np.ndarray, rate: int) -> ObservedCall:
    record: dict[str, Any] | None = result.record
    lag = result.send_lag_ms
    call = ObservedCall(result.call_id, send_lag_p95_ms=round(float(np.percentile(lag, 95)), 2) if lag else None,
                        send_lag_max_ms=round(max(lag), 2) if lag else None, send_lag_ms=list(lag))
    if not record:
        call.error = "the server kept no record of the call (GET /calls/{id})"
        return call
    call.end_reason = record.get("end_reason")
    for t in record.get("turns", []):
        call.turns.append(ObservedTurn(t["turn"], t.get("user_text") or "", t.get("agent_text") or "",
                                       t.get("heard_text"), bool(t.get("interrupted")), t.get("timings_ms") or {},
                                       reopened=len(t.get("reopened") or [])))
    start = result.turns[0].audio_start if result.turns else None
    if start is not None:
        onsets = [start + s for s in speech_onsets(audio, rate)]
        stops = stop_latencies_ms(onsets, result.clears)
        # The clears go out in order: the greeting's (when the caller cut it), then each interrupted turn's.
        if record.get("greeting_heard") is not None and stops:
            stops = stops[1:]
        for turn, stop in zip((t for t in call.turns if t.interrupted), stops, strict=False):
            turn.stop_ms = None if stop is None else round(stop, 1)
    return call
