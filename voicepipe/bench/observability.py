"""`voicepipe bench observability`: what the call store, the metrics and the recordings cost a caller.

Two in-process servers run side by side on the same models: one with the store, /metrics and recording of
every call switched on, one with all three off (the turn timeline itself is always kept). Calls alternate
between them (on, off, off, on, ...) so that the machine's noise falls on both alike, and the report gives the
response latency (end-of-turn decision -> first agent audio on the wire) and the client's voice-to-voice of each,
with on/off ratios.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from voicepipe.bench.call import make_utterances, stats
from voicepipe.caller import run_call
from voicepipe.config import Settings
from voicepipe.server import serve_in_thread


def _variant(settings: Settings, on: bool, root: Path) -> Settings:
    variant = settings.model_copy(deep=True)
    variant.observability.store = on
    variant.observability.metrics = on
    variant.observability.record_calls = on
    variant.paths.data_dir = root / "data"
    variant.paths.recordings_dir = root / "recordings"
    return variant


def run_observability_bench(settings: Settings, calls: int = 6, turns: int = 5,
                            progress: Callable[[str], None] = print) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {name: {"response": [], "voice_to_voice": []}
                                                  for name in ("on", "off")}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        root = Path(tmp)
        utterances = make_utterances(turns, root)
        progress("starting two in-process servers (observability on and off; models load first)")
        bases = {name: stack.enter_context(serve_in_thread(_variant(settings, name == "on", root / name)))[0]
                 for name in ("on", "off")}
        for i in range(calls):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for name in order:
                base = bases[name]
                result = asyncio.run(run_call(base.replace("http://", "ws://") + "/ws/twilio", "twilio", utterances,
                                              quiet_s=0.6, reply_timeout_s=120, record_url=base))
                server_turns = (result.record or {}).get("turns", [])
                samples[name]["response"] += [t["timings_ms"]["response"] for t in server_turns
                                              if "response" in t.get("timings_ms", {})]
                samples[name]["voice_to_voice"] += [t.voice_to_voice_ms for t in result.turns
                                                    if t.voice_to_voice_ms is not None]
                progress(f"call {i + 1}/{calls}, observability {name}: {len(server_turns)} turns")
    report: dict[str, Any] = {"calls_each": calls, "turns": turns,
                              **{name: {key: stats(values) for key, values in figures.items()}
                                 for name, figures in samples.items()}}
    report["ratios"] = {
        f"{key}_{p}_on_over_off": _ratio(report["on"][key][p], report["off"][key][p])
        for key in ("response", "voice_to_voice") for p in ("p50", "p95")}
    return report


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
