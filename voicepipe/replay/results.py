"""One case's outcome (its checks and figures), a baseline comparison, and the JSON report's shape."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.errors import VoicepipeError
from voicepipe.replay.checks import Check
from voicepipe.replay.observed import ObservedCall

LATENCY_METRICS = ("voice_to_voice_p95_ms", "response_p95_ms")


@dataclass
class CaseResult:
    name: str
    path: str
    transport: str
    call: ObservedCall
    checks: list[Check] = field(default_factory=list)
    repeat: dict[str, Any] | None = None  # --repeat: the runs compared (repeat.py)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def metrics(self) -> dict[str, float | None]:
        return {"voice_to_voice_p95_ms": self.call.p95("voice_to_voice"), "response_p95_ms": self.call.p95("response"),
                "send_lag_p95_ms": self.call.send_lag_p95_ms}

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "transport": self.transport, "call_id": self.call.call_id,
                "passed": self.passed, "wall_s": round(self.call.wall_s, 2), "end_reason": self.call.end_reason,
                "error": self.call.error, "metrics": self.metrics(), "send_lag_max_ms": self.call.send_lag_max_ms,
                "turns": [asdict(t) for t in self.call.turns], "checks": [c.as_dict() for c in self.checks],
                **({"repeat": self.repeat} if self.repeat is not None else {})}


def report_dict(results: list[CaseResult], wall_s: float, **run: Any) -> dict[str, Any]:
    lags = [lag for r in results for lag in r.call.send_lag_ms]  # every caller frame of the run
    return {"version": 1, **run, "wall_s": round(wall_s, 2), "cases_passed": sum(r.passed for r in results),
            "cases_failed": sum(not r.passed for r in results),
            "cases_differing": sum(r.repeat is not None and not r.repeat["same"] for r in results),
            "send_lag_p95_ms": round(float(np.percentile(lags, 95)), 2) if lags else None,
            "cases": [r.as_dict() for r in results]}


def load_baseline(path: Path) -> dict[str, dict[str, float | None]]:
    """Case name -> metrics of an earlier `report.json`."""
    try:
        data = json.loads(path.read_text())
        return {c["name"]: c["metrics"] for c in data["cases"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VoicepipeError(f"{path}: not a replay report.json ({type(exc).__name__}: {exc}).",
                             "pass the report.json of an earlier `voicepipe replay` run.") from None


def baseline_checks(metrics: dict[str, float | None], base: dict[str, float | None] | None, tolerance: float,
                    floor_ms: float) -> list[Check]:
    """A regression: slower than the baseline by more than `tolerance` (a fraction) and by more than `floor_ms`."""
    if base is None:
        return []
    out = []
    for key in LATENCY_METRICS:
        now, before = metrics.get(key), base.get(key)
        if not isinstance(now, (int, float)) or not isinstance(before, (int, float)):
            continue
        limit = max(before * (1 + tolerance), before + floor_ms)
        out.append(Check(f"baseline_{key}", f"<= {limit:.0f} (baseline {before:g} +{tolerance:.0%})", f"{now:g}",
                         now <= limit))
    return out
