"""`voicepipe bench call`: N concurrent multi-turn calls over Twilio with `voicepipe call`'s client.

Per run (one per N) the report holds p50/p95/p99 of
- voice-to-voice: the caller's last speech sample sent -> the first agent audio received (client clock),
- response: the server's end-of-turn decision -> the first agent audio handed to the transport,
- the LLM TTFT of each turn (server side), and TTFT at the last turn (30 by default) over turn 2, the
  figure that shows whether the call's KV cache keeps later turns as cheap as early ones (and the same over
  windows of seven turns, less noisy).
Each N runs once per end-of-turn policy (the call's `turn_policy` parameter): `silence`, the old fixed rule, as
the baseline, and the configured default; `voice_to_voice_ratio` is the default's voice-to-voice p50 over
silence's, at the same N.
Then one call types keypad entries (`--dtmf-turns`, each ended by #): `dtmf_response_ms` is the server's figure
from the entry's end (the # key) to the first agent audio handed to the transport, `dtmf_response_client_ms` the
caller's, from sending # to the first agent audio received; `dtmf_response_over_response` divides its p50 by the
spoken turns' response p50 (end of turn to first audio) at one call in the same run.
Each run's `event_loop_lag` is what it added to the server's `voicepipe_event_loop_lag_seconds` (from /metrics; None
where the server serves none): a loop held up delays every call's turn-taking at once.
Caller utterances are made with espeak-ng; calls run against `--url`, or an in-process server.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from voicepipe.caller import CallResult, Utterance, keypad, read_wav, run_call, utterance
from voicepipe.caller.server_api import http_client
from voicepipe.observability.metrics import LOOP_LAG
from voicepipe.server import serve_in_thread

# The caller says these in turn. Seven of them: turn 30 says turn 2's sentence again (28 = 4 x 7) and any seven
# consecutive turns say each one once, so the late-over-early TTFT ratios compare the same words early and late in
# the call. A turn's TTFT depends on how many of its tokens are left to prefill, i.e. on its sentence; with ten
# sentences turn 30 ("I want to cancel my subscription.") was a different, shorter turn than turn 2.
SENTENCES = [
    "I want to book a table for dinner.",
    "Tell me about the weather in London.",
    "What is the capital of France?",
    "My computer will not turn on.",
    "Please send me the invoice.",
    "How do I reset my password?",
    "Where is the nearest hospital?",
]
WINDOW = len(SENTENCES)  # turns per window of the window ratio: each sentence once
KEY_ENTRIES = ["4217#", "1#", "305#", "9#", "7788#", "0#"]  # what the keypad call types, in turn
DTMF_TARGET_P50_MS = 500.0
WINDOW_RATIO = f"ttft_last{WINDOW}_over_turns2to{WINDOW + 1}"
# The server's figures of a spoken turn's path (observability/timeline.py), reported as `stages_ms` with two more:
# `end_of_turn_wait`, from the caller's end of speech to the end-of-turn decision (server clock), and
# `outside_server`, the caller's voice-to-voice less the server's (audio late into or out of either event loop).
STAGES = ("stt_final", "queue", "ttft", "first_clause", "tts_first_audio", "send_delay")
LATE_S = 0.1  # `event_loop_lag`'s `late` counts the lags over this (a bucket bound of the histogram)


def stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    arr = np.asarray(values, dtype=float)
    return {"p50": round(float(np.percentile(arr, 50)), 1), "p95": round(float(np.percentile(arr, 95)), 1),
            "p99": round(float(np.percentile(arr, 99)), 1), "n": len(values)}


def sentence_of_turn(turn: int) -> str:
    """What the caller says at ``turn`` (from 1)."""
    return SENTENCES[(turn - 1) % len(SENTENCES)]


def make_utterances(turns: int, directory: Path) -> list[Utterance]:
    cache: dict[str, Utterance] = {}
    out = []
    for turn in range(1, turns + 1):
        text = sentence_of_turn(turn)
        if text not in cache:
            path = directory / f"u{len(cache)}.wav"
            subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
            audio, rate = read_wav(path)
            cache[text] = utterance(audio, rate)
        out.append(cache[text])
    return out


async def bench_run(base: str, n_calls: int, utterances: list[Utterance], token: str | None = None,
                    policy: str | None = None) -> dict[str, Any]:
    lag_before = await loop_lag_counts(base, token)
    started = time.monotonic()
    results = await run_calls(base, n_calls, utterances, token, policy)
    run = summarize_run(results, len(utterances), time.monotonic() - started)
    return {"policy": policy, **run, "event_loop_lag": loop_lag_summary(lag_before, await loop_lag_counts(base, token))}


async def loop_lag_counts(base: str, token: str | None = None) -> dict[float, float] | None:
    """The server's event-loop lag histogram from its /metrics (None where it serves none)."""
    async with http_client(base, token) as client:
        try:
            response = await client.get("/metrics")
        except httpx.TransportError:
            return None
    return parse_loop_lag(response.text) if response.status_code == 200 else None


def parse_loop_lag(exposition: str) -> dict[float, float] | None:
    """The lag histogram's cumulative sample counts by bucket bound in seconds (the last bound is inf)."""
    counts = {float(sample.labels["le"]): sample.value
              for family in text_string_to_metric_families(exposition) if family.name == LOOP_LAG
              for sample in family.samples if sample.name == LOOP_LAG + "_bucket"}
    return counts or None


def loop_lag_summary(before: dict[float, float] | None, after: dict[float, float] | None) -> dict[str, Any] | None:
    """What a run added to the server's loop-lag histogram: ``samples``, how many were ``late`` (over ``LATE_S``)
    and ``worst_ms_at_most``, the bound of the worst one's bucket (None: beyond the last finite bound)."""
    if before is None or after is None:
        return None
    added = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    samples = added[float("inf")]
    on_time = max((count for bound, count in added.items() if bound <= LATE_S), default=0.0)
    worst = next(bound for bound, count in added.items() if count == samples) if samples else 0.0
    return {"samples": int(samples), "late": int(samples - on_time),
            "worst_ms_at_most": round(worst * 1000.0, 1) if worst != float("inf") else None}


async def run_calls(base: str, n_calls: int, utterances: list[Utterance], token: str | None = None,
                    policy: str | None = None, system_prompt: str | None = None) -> list[CallResult]:
    """``n_calls`` Twilio calls at once to the server at ``base``, each saying ``utterances`` in turn."""
    url = base.replace("http://", "ws://").replace("https://", "wss://") + "/ws/twilio"
    params = {k: v for k, v in (("turn_policy", policy), ("system_prompt", system_prompt)) if v} or None
    return await asyncio.gather(*[
        run_call(url, "twilio", utterances, params=params, token=token, quiet_s=0.6, reply_timeout_s=120,
                 record_url=base)
        for _ in range(n_calls)])


def summarize_run(results: list[CallResult], turns: int, seconds: float) -> dict[str, Any]:
    """One run's report: latencies over every turn of every call, per turn, and TTFT late over early.

    ``ttft_turn30_over_turn2`` divides one turn's TTFT p50 by another's: with one call, one sample by one sample.
    The window ratio (``WINDOW_RATIO``) divides the median of the last ``WINDOW`` turns by that of as many turns
    from turn 2, which a noisy machine moves less; it needs the two windows apart (``2 * WINDOW + 1`` turns)."""
    v2v, response = [], []
    stages: dict[str, list[float]] = {name: [] for name in ("end_of_turn_wait", *STAGES, "outside_server")}
    per_turn: dict[int, dict[str, list[float]]] = {}
    for result in results:
        server_turns = {t["turn"]: t for t in (result.record or {}).get("turns", [])}
        for turn in result.turns:
            row = per_turn.setdefault(turn.index, {"voice_to_voice": [], "response": [], "ttft": []})
            if turn.voice_to_voice_ms is not None:
                v2v.append(turn.voice_to_voice_ms)
                row["voice_to_voice"].append(turn.voice_to_voice_ms)
            record = server_turns.get(turn.index, {})
            timings, timeline = record.get("timings_ms", {}), record.get("timeline") or {}
            for name in STAGES:
                if name in timings:
                    stages[name].append(timings[name])
            if "speech_end" in timeline and "end_of_turn" in timeline:
                stages["end_of_turn_wait"].append(1000 * (timeline["end_of_turn"] - timeline["speech_end"]))
            if turn.voice_to_voice_ms is not None and "voice_to_voice" in timings:
                stages["outside_server"].append(turn.voice_to_voice_ms - timings["voice_to_voice"])
            for key in ("response", "ttft"):
                if key in timings:
                    row[key].append(timings[key])
            if "response" in timings:
                response.append(timings["response"])
    last = max(per_turn) if per_turn else 0

    def ttft_median(first: int, stop: int) -> float | None:
        values = [v for k in range(first, stop + 1) for v in per_turn.get(k, {}).get("ttft", [])]
        return float(np.median(values)) if values else None

    t2, tl = ttft_median(2, 2), ttft_median(last, last)
    later = [t for r in results for t in (r.record or {}).get("turns", [])
             if t["turn"] >= 2 and t.get("prompt_tokens")]
    cached = [t["cached_prompt_tokens"] / t["prompt_tokens"] for t in later]
    early, late = ttft_median(2, WINDOW + 1), ttft_median(last - WINDOW + 1, last)
    return {
        "calls": len(results),
        "turns": turns,
        "seconds": round(seconds, 1),
        "voice_to_voice_ms": stats(v2v),
        "response_ms": stats(response),
        "ttft_ms": stats(stages["ttft"]),
        "stages_ms": {name: stats(values) for name, values in stages.items()},
        f"ttft_turn{last}_over_turn2": round(tl / t2, 3) if t2 and tl else None,
        "ttft_turn30_over_turn2": round(tl / t2, 3) if t2 and tl and last == 30 else None,
        WINDOW_RATIO: round(late / early, 3) if early and late and last >= 2 * WINDOW + 1 else None,
        "per_turn": [{"turn": k, **{f"{name}_ms_p50": stats(v)["p50"] for name, v in row.items()}}
                     for k, row in sorted(per_turn.items())],
        # the share of each turn's prompt its LLM served from the prefix cache, from turn 2 on (min and median)
        "cached_fraction_from_turn2": {"min": round(min(cached), 3), "p50": round(float(np.median(cached)), 3)}
        if cached else None,
        "turns_without_reply": sum(1 for r in results for t in r.turns if t.first_audio is None),
        "turn_problems": [{"call": r.call_id, "turn": t.get("turn"), "user_text": t.get("user_text"),
                           "error": t.get("error"), "interrupted": t.get("interrupted")}
                          for r in results for t in (r.record or {}).get("turns", [])
                          if t.get("error") or t.get("interrupted") or not (t.get("user_text") or "").strip()],
    }


async def dtmf_run(base: str, turns: int, token: str | None = None) -> dict[str, Any]:
    """One Twilio call of `turns` keypad entries: the figures from each entry's end (#) to the agent's answer."""
    url = base.replace("http://", "ws://").replace("https://", "wss://") + "/ws/twilio"
    entries = [keypad(KEY_ENTRIES[i % len(KEY_ENTRIES)]) for i in range(turns)]
    result = await run_call(url, "twilio", entries, token=token, quiet_s=0.6, reply_timeout_s=120, record_url=base)
    stored = (result.record or {}).get("turns", [])
    server = [t["timings_ms"]["dtmf_response"] for t in stored if "dtmf_response" in t.get("timings_ms", {})]
    client = [t.voice_to_voice_ms for t in result.turns if t.voice_to_voice_ms is not None]
    return {"turns": turns, "dtmf_response_ms": stats(server), "dtmf_response_client_ms": stats(client),
            "keypad_turns_seen": sum(1 for t in stored if t.get("dtmf")),
            "turns_without_reply": sum(1 for t in result.turns if t.first_audio is None)}


def run_call_bench(settings, calls: list[int], turns: int = 30, url: str | None = None, token: str | None = None,
                   progress: Callable[[str], None] = print, dtmf_turns: int = 10,
                   voice: bool = True) -> dict[str, Any]:
    policies = list(dict.fromkeys(["silence", settings.turn.policy]))
    with tempfile.TemporaryDirectory() as tmp:
        utterances = make_utterances(turns, Path(tmp)) if voice else []
        runs = []
        keys: dict[str, Any] = {}

        def run_all(base: str) -> None:
            for n in calls if voice else []:
                for policy in policies:
                    progress(f"{n} concurrent call(s) of {turns} turns, turn policy {policy}")
                    runs.append(asyncio.run(bench_run(base, n, utterances, token, policy)))
                    progress(_one_line(runs[-1]))
            if dtmf_turns:
                progress(f"1 call of {dtmf_turns} keypad entries")
                keys.update(asyncio.run(dtmf_run(base, dtmf_turns, token)))
                progress(f"dtmf_response p50/p95 {keys['dtmf_response_ms']['p50']}/{keys['dtmf_response_ms']['p95']} "
                         f"ms (at the client {keys['dtmf_response_client_ms']['p50']} ms)")

        if url is None:
            progress("starting an in-process server (models load first)")
            with serve_in_thread(settings) as (base, _app):
                run_all(base)
        else:
            run_all(url.replace("ws://", "http://").replace("wss://", "https://").rstrip("/"))
    return {"transport": "twilio", "turns": turns, "policies": policies, "runs": runs,
            **policy_ratios(runs, policies[-1]), **dtmf_summary(keys, runs, policies[-1])}


def dtmf_summary(keys: dict[str, Any], runs: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    """The keypad call's figures at the top of the report, against the target and the spoken turns' response."""
    if not keys:
        return {}
    p50 = keys["dtmf_response_ms"]["p50"]
    response = next((r["response_ms"]["p50"] for r in runs if r["calls"] == 1 and r["policy"] == policy), None)
    return {"dtmf": keys, "dtmf_response_ms": keys["dtmf_response_ms"],
            "dtmf_response_target_p50_ms": DTMF_TARGET_P50_MS,
            "dtmf_response_meets_target": p50 is not None and p50 <= DTMF_TARGET_P50_MS,
            "dtmf_response_over_response": round(p50 / response, 3) if p50 is not None and response else None}


def policy_ratios(runs: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    """`voice_to_voice_ratio`: `policy`'s voice-to-voice p50 over silence's at one call (else at the first N run),
    and the same for every N (`voice_to_voice_ratio_by_calls`)."""
    by_calls: dict[str, float | None] = {}
    for n in dict.fromkeys(r["calls"] for r in runs):
        p50 = {r["policy"]: r["voice_to_voice_ms"]["p50"] for r in runs if r["calls"] == n}
        base, new = p50.get("silence"), p50.get(policy)
        by_calls[str(n)] = round(new / base, 3) if base and new is not None else None
    return {"voice_to_voice_ratio": by_calls.get("1", next(iter(by_calls.values()), None)),
            "voice_to_voice_ratio_by_calls": by_calls}


def _one_line(run: dict[str, Any]) -> str:
    v, r, t = run["voice_to_voice_ms"], run["response_ms"], run["ttft_ms"]
    ratio = next((value for key, value in run.items()
                  if key.startswith("ttft_turn") and key.endswith("_over_turn2") and value is not None), None)
    return (f"calls={run['calls']} ({run['policy']}): voice-to-voice p50/p95 {v['p50']}/{v['p95']} ms, "
            f"response p50/p95 {r['p50']}/{r['p95']} ms, TTFT p50 {t['p50']} ms, TTFT last/turn2 {ratio} "
            f"(last {WINDOW} / turns 2-{WINDOW + 1}: {run[WINDOW_RATIO]}), "
            f"turns without reply {run['turns_without_reply']}; stages p50/p95 ms: "
            + ", ".join(f"{name} {s['p50']}/{s['p95']}" for name, s in run["stages_ms"].items())
            + f"; event loop lag {run['event_loop_lag']}")
