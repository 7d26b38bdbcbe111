"""Pure conversions between the session's records and the call store's rows.

The write side snapshots a `CallRecord` / `TurnRecord` on the event loop (the session keeps mutating its
records), so the writer thread only ever sees plain values. The read side turns rows back into the JSON the
API serves.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from voicepipe.observability.records import CallRecord, TurnRecord

CALL_COLUMNS = ("id", "transport", "started", "ended", "outcome", "end_reason", "metadata", "system_prompt",
                "greeting", "greeting_heard", "barge_ins", "error", "replica", "last_record")
# TurnRecord.decision's keys; each has a column of its own, "decision_<key>", so decisions can be queried
DECISION_KEYS = ("policy", "action", "reason", "silence_ms", "wait_ms", "text_prob", "acoustic_prob")
_DECISION_TEXT_KEYS = ("policy", "action", "reason")
TURN_COLUMNS = ("call_id", "turn", "user_text", "agent_text", "heard_text", "interrupted", "prompt_tokens",
                "cached_prompt_tokens", "output_tokens", "voice_to_voice_ms", "timings_ms", "timeline", "error",
                *(f"decision_{key}" for key in DECISION_KEYS), "reopened", "backchannels", "dtmf")
TOOL_CALL_COLUMNS = ("call_id", "turn", "idx", "name", "arguments", "t", "latency_ms", "result_chars", "error")
JSON_COLUMNS = {"metadata": dict, "timings_ms": dict, "timeline": dict, "reopened": list, "backchannels": list}


def _json(value: Any) -> str:
    return json.dumps(value, default=str, separators=(",", ":"))  # default=str: metadata may hold anything


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _decision_columns(decision: dict[str, Any]) -> dict[str, Any]:
    """The decision's columns: texts as text, figures as finite floats, NULL for what it lacks."""
    columns = {}
    for key in DECISION_KEYS:
        value = decision.get(key)
        if key in _DECISION_TEXT_KEYS:
            columns[f"decision_{key}"] = None if value is None else str(value)
        else:
            columns[f"decision_{key}"] = _finite(value)
    return columns


def call_row(call: CallRecord, replica: str | None = None) -> dict[str, Any]:
    return {"id": call.call_id, "transport": call.transport, "started": call.started, "ended": call.ended,
            "outcome": call.outcome, "end_reason": call.end_reason, "metadata": _json(call.metadata),
            "system_prompt": call.system_prompt or "", "greeting": call.greeting,
            "greeting_heard": call.greeting_heard, "barge_ins": int(call.barge_ins), "error": call.error,
            "replica": replica, "last_record": call.ended or call.started}


def turn_row(call_id: str, turn: TurnRecord) -> dict[str, Any]:
    return {"call_id": call_id, "turn": int(turn.turn), "user_text": turn.user_text or "",
            "agent_text": turn.agent_text or "", "heard_text": turn.heard_text, "interrupted": int(turn.interrupted),
            "prompt_tokens": int(turn.prompt_tokens), "cached_prompt_tokens": int(turn.cached_prompt_tokens),
            "output_tokens": int(turn.output_tokens),
            "voice_to_voice_ms": _finite(turn.timings_ms.get("voice_to_voice")),
            "timings_ms": _json(turn.timings_ms), "timeline": _json(turn.timeline), "error": turn.error,
            **_decision_columns(turn.decision or {}), "reopened": _json(turn.reopened or []),
            "backchannels": _json(turn.backchannels or []), "dtmf": turn.dtmf}


def tool_call_rows(call_id: str, turn: TurnRecord) -> list[dict[str, Any]]:
    """One row per tool call of the turn's reply (`TurnRecord.tool_calls`)."""
    return [{"call_id": call_id, "turn": int(turn.turn), "idx": i, "name": str(c.get("name", "")),
             "arguments": str(c.get("arguments", "{}")), "t": _finite(c.get("t")),
             "latency_ms": _finite(c.get("latency_ms")), "result_chars": int(c.get("result_chars") or 0),
             "error": None if c.get("error") is None else str(c.get("error"))}
            for i, c in enumerate(turn.tool_calls or [])]


def upsert_sql(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
    """INSERT that updates every non-key column when the key is already there."""
    names = ", ".join(columns)
    marks = ", ".join(f":{c}" for c in columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    return f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"


UPSERT_CALL = upsert_sql("calls", CALL_COLUMNS, ("id",))
UPSERT_TURN = upsert_sql("turns", TURN_COLUMNS, ("call_id", "turn"))
UPSERT_TOOL_CALL = upsert_sql("tool_calls", TOOL_CALL_COLUMNS, ("call_id", "turn", "idx"))
# A turn was written: the call's last record (where a lost call ends) and its metadata as it stands (the echo figures
# so far), so a live call's page shows them.
TOUCH_CALL = "UPDATE calls SET last_record = :t, metadata = :metadata WHERE id = :id"


def touch_row(call: CallRecord, t: float) -> dict[str, Any]:
    return {"id": call.call_id, "t": t, "metadata": _json(call.metadata)}


def row_dict(row: Any) -> dict[str, Any]:
    """A row as JSON-able data: JSON columns parsed, flags as booleans, a turn's decision columns as its
    `decision` dict (the record's shape; {} when it had none)."""
    out = dict(row)
    for name, empty in JSON_COLUMNS.items():
        if name in out:
            out[name] = json.loads(out[name]) if out[name] else empty()
    if "interrupted" in out:
        out["interrupted"] = bool(out["interrupted"])
    if "decision_policy" in out:
        decision = {key: out.pop(f"decision_{key}") for key in DECISION_KEYS}
        out["decision"] = decision if any(v is not None for v in decision.values()) else {}
    return out


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p95 (numpy's linear interpolation), in ms rounded to 0.1; None when there is nothing to rank."""
    if not values:
        return {"p50": None, "p95": None}
    arr = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(arr, 50)), 1), "p95": round(float(np.percentile(arr, 95)), 1)}
