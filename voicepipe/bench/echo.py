"""`voicepipe bench echo`: calls whose caller is on a speakerphone, over a grid of echo paths, against the same
calls without echo in the same run.

The caller simulator's microphone picks up the agent's audio as it received it over the wire and played it
(`caller.echo.SpeakerEcho` with `tail`: `echo.simulate`'s room of four reflections and a 120 ms decaying tail,
the loudspeaker's clock 0.1 % fast, the line's -70 dBFS noise floor, clipping at half scale and mu-law coding),
for every echo delay x echo level x transport. Each call has the same script: a first question once the greeting
has played, then barge-ins, each `BARGE_IN_AFTER_MS` into the agent's reply, so the caller talks over the agent at
known moments (enough calls per grid cell for `barge_ins` per echo level). The clean calls (the baseline) run the
same script over the same microphone and line with no echo, once per delay and transport, interleaved with the echo
calls so that both see the same load. The server is started here, with echo cancelling on for every transport of
the grid (off with `cancel=False`), short replies and an AudioSocket listener; calls run `at_once` at a time.

The callers run in worker processes of their own (`caller_processes`): their codecs and echo would otherwise share
the server's interpreter, and six aiortc peers in one process fall seconds behind real time, so that the WebRTC
cells measured the bench, not the server (docs/benchmarks.md, "WebRTC in the echo grid"). A script that calls
`run_echo_bench` needs an `if __name__ == "__main__":` guard: each spawned worker imports the script's main module.

The figures are `echo_metrics`'s, from the caller's clock and the server's call events, which an observer of the
in-process server (`CallEvents`) collects. Both read `time.monotonic()`, one clock for every process.
"""

from __future__ import annotations

import asyncio
import functools
import math
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voicepipe.audio.l16 import float32_to_int16
from voicepipe.bench.echo_metrics import CallFacts, call_facts, call_figures, call_timeline, group_figures, headline
from voicepipe.bench.soak import call_url
from voicepipe.caller import Utterance, utterance
from voicepipe.caller.call import line_rate, run_call_in_process
from voicepipe.caller.echo import SpeakerEcho
from voicepipe.echo.simulate import spoken
from voicepipe.server import serve_in_thread

DELAYS_MS = (20, 150, 400)
LEVELS_DB = (-6, -10, -20, -30, -40)
TRANSPORTS = ("twilio", "audiosocket", "webrtc")
BARGE_INS = 20  # per echo level, at least
MAX_BARGE_INS_PER_CALL = 6
BARGE_IN_AFTER_MS = 1500
SKEW = 0.001  # the caller's loudspeaker clock against its microphone's
RATE = 16000
CALLER_PEAK = 0.4  # the caller's voice peaks here, under the line's clipping (0.5): only echo plus voice clips
# The first line asks the listening agent; each later one talks over the reply to the one before.
LINES = ("Tell me a long story about a brave dragon and a princess.",
         "Now tell me about the weather in London this week.",
         "How do I make a good cup of tea at home?",
         "What should I pack for a week of hiking in the mountains?",
         "Explain to me how an old steam train works.",
         "Tell me about the history of the city of Rome.",
         "What can I cook for dinner with rice and beans?")
# Replies long enough to be talked over, short enough for the grid to finish: ~6 s of speech.
SERVER = {"max_reply_tokens": 32, "audiosocket_port": 0,
          "system_prompt": "You are a friendly voice assistant on a phone call. Answer every question in three or "
                           "four full, plain sentences that are easy to say out loud."}
# The expected duration: the models' load, then per call the greeting, each line and its answer's wait, the
# barge-ins' waits, the last reply played out and the record fetched (the waits as measured on a shared 2-core CPU).
LOAD_S, GREETING_S, ANSWER_S, LAST_REPLY_S = 30.0, 4.0, 2.0, 6.0


@dataclass(frozen=True)
class PlannedCall:
    index: int
    transport: str
    delay_ms: int
    level_db: int | None  # None: clean
    barge_ins: int

    @property
    def cell(self) -> str:
        return f"{self.transport} {self.delay_ms} ms {'clean' if self.level_db is None else f'{self.level_db} dB'}"


def plan_calls(delays: list[int], levels: list[int], transports: list[str], barge_ins: int) -> list[PlannedCall]:
    """Every cell of the grid and its clean twin, interleaved: at least `barge_ins` barge-ins per echo level, at
    most `MAX_BARGE_INS_PER_CALL` in one call."""
    per_cell = math.ceil(barge_ins / (len(delays) * len(transports)))
    calls_per_cell = math.ceil(per_cell / MAX_BARGE_INS_PER_CALL)
    per_call = math.ceil(per_cell / calls_per_cell)
    plans: list[PlannedCall] = []
    for _ in range(calls_per_cell):
        for transport in transports:
            for delay in delays:
                for level in (None, *levels):
                    plans.append(PlannedCall(len(plans), transport, delay, level, per_call))
    return plans


def expected_s(plans: list[PlannedCall], utterances: list[Utterance], at_once: int) -> float:
    """A rough duration of the run (see `LOAD_S`)."""
    barge_ins = plans[0].barge_ins
    said = sum(len(u.audio) / u.rate + ANSWER_S for u in utterances[:barge_ins + 1])
    call_s = GREETING_S + said + barge_ins * BARGE_IN_AFTER_MS / 1000 + LAST_REPLY_S
    return LOAD_S + math.ceil(len(plans) / at_once) * call_s


class CallEvents:
    """An observer of the in-process server: each call's start and the events the figures read, on the caller's
    clock (the server's `t` is seconds from its `started_mono`)."""

    KEPT = ("hold", "unhold", "clear", "turn_reopened", "echo_gate_open")

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}

    def call_started(self, call) -> None:
        self.started[call.call_id] = call.started_mono
        self.events[call.call_id] = []

    def event(self, call, event: dict[str, Any]) -> None:
        if event["type"] in self.KEPT and call.call_id in self.events:
            self.events[call.call_id].append({"type": event["type"], "at": call.started_mono + event["t"]})

    def audio(self, call, channel, samples, rate, t) -> None:
        pass

    def turn_finished(self, call, turn) -> None:
        pass

    def call_ended(self, call) -> None:
        pass


def caller_line(text: str) -> Utterance:
    audio = spoken(text, RATE)
    return utterance(float32_to_int16(audio * (CALLER_PEAK / abs(audio).max())), RATE)


def bench_settings(settings, directory: Path, transports: list[str], cancel: bool):
    """`settings` with `SERVER` over its calls, echo cancelling on (`cancel`) or off for the grid's transports,
    and the call store under `directory`."""
    out = settings.model_copy(deep=True)
    for key, value in SERVER.items():
        setattr(out.calls, key, value)
    out.echo.enabled = {**out.echo.enabled, **dict.fromkeys(transports, cancel)}
    out.paths.data_dir, out.paths.recordings_dir = directory / "data", directory / "recordings"
    return out


def caller_processes(at_once: int) -> ProcessPoolExecutor:
    """A worker process per call in flight. Spawned, not forked: the server's threads are running here."""
    return ProcessPoolExecutor(at_once, mp_context=multiprocessing.get_context("spawn"))


async def one_call(plan: PlannedCall, base: str, app, texts: list[str], utterances: list[Utterance],
                   events: CallEvents, callers: Executor) -> CallFacts:
    rate = line_rate(plan.transport)
    echo = SpeakerEcho(rate, plan.delay_ms, plan.level_db, tail=True, skew=SKEW, line=True, seed=plan.index)
    said = utterances[:plan.barge_ins + 1]
    call = functools.partial(run_call_in_process, call_url(base, app, plan.transport), plan.transport, said,
                             call_id=f"echo-{plan.index}", record_url=base, quiet_s=0.6, greeting_wait_s=30.0,
                             reply_timeout_s=60.0, barge_in_after_ms=BARGE_IN_AFTER_MS, echo=echo)
    result = await asyncio.get_running_loop().run_in_executor(callers, call)
    return call_facts(result, texts[:len(said)], plan.level_db, events.started.get(result.call_id),
                      events.events.get(result.call_id, []))


async def run_grid(plans: list[PlannedCall], base: str, app, texts: list[str], utterances: list[Utterance],
                   events: CallEvents, at_once: int, progress: Callable[[str], None]) -> list[Any]:
    """Every planned call, `at_once` at a time, each in a worker process: their `CallFacts`, or the exception a call
    failed with."""
    gate = asyncio.Semaphore(at_once)
    started, done = time.monotonic(), []

    async def run(plan: PlannedCall) -> CallFacts:
        try:
            async with gate:
                facts = await one_call(plan, base, app, texts, utterances, events, callers)
        except Exception as exc:
            done.append(plan)
            progress(f"[{len(done)}/{len(plans)}] {plan.cell}: the call failed: {type(exc).__name__}: {exc}")
            raise
        done.append(plan)
        f = call_figures(facts)
        over = [stopped for over_agent, stopped in f.barge_ins if over_agent]
        progress(f"[{len(done)}/{len(plans)}] {plan.cell}: {f.self_interruptions} self-interruptions, "
                 f"{f.echo_turns} echo turns, {f.gate_leaks} gate leaks, barge-ins: {len(over)} of "
                 f"{len(f.barge_ins)} over the agent, {sum(over)} of those stopped it in 500 ms; "
                 f"{(time.monotonic() - started) / 60:.1f} min in")
        return facts

    with caller_processes(at_once) as callers:
        return await asyncio.gather(*(run(p) for p in plans), return_exceptions=True)


def grid_cpu(before: os.times_result, after: os.times_result) -> dict[str, float]:
    """The CPU the grid's calls took, as cores busy on average: the server's process (this one), and the callers'
    worker processes (counted once they have exited)."""
    wall = after.elapsed - before.elapsed
    server = after.user + after.system - before.user - before.system
    callers = after.children_user + after.children_system - before.children_user - before.children_system
    return {"seconds": round(wall, 1), "server_cores": round(server / wall, 2),
            "caller_cores": round(callers / wall, 2)}


def run_echo_bench(settings, delays: list[int], levels: list[int], transports: list[str], barge_ins: int = BARGE_INS,
                   at_once: int = 3, cancel: bool = True, progress: Callable[[str], None] = print) -> dict[str, Any]:
    plans = plan_calls(delays, levels, transports, barge_ins)
    texts = [LINES[i % len(LINES)] for i in range(plans[0].barge_ins + 1)]
    utterances = [caller_line(text) for text in texts]
    expected = expected_s(plans, utterances, at_once)
    per_level = sum(p.barge_ins for p in plans if p.level_db == levels[0])
    progress(f"{len(plans)} calls ({len(plans) - len(plans) // (len(levels) + 1)} with echo, "
             f"{len(plans) // (len(levels) + 1)} clean), {plans[0].barge_ins} barge-ins each ({per_level} per echo "
             f"level), {at_once} at once, echo cancelling {'on' if cancel else 'off'}: expect about "
             f"{expected / 60:.0f} min")
    started = time.monotonic()
    events = CallEvents()
    with tempfile.TemporaryDirectory(prefix="voicepipe-echo-") as tmp:
        progress("starting an in-process server (models load first)")
        with serve_in_thread(bench_settings(settings, Path(tmp), transports, cancel)) as (base, app):
            app.state.observers.add(events)
            before = os.times()
            outcomes = asyncio.run(run_grid(plans, base, app, texts, utterances, events, at_once, progress))
            cpu = grid_cpu(before, os.times())
    progress(f"the grid's CPU: {cpu['server_cores']} cores for the server, {cpu['caller_cores']} for the callers")
    facts = [o for o in outcomes if isinstance(o, CallFacts)]
    failed = [{"call": p.cell, "error": f"{type(o).__name__}: {o}"[:200]}
              for p, o in zip(plans, outcomes, strict=True) if not isinstance(o, CallFacts)]
    cells: dict[str, list[CallFacts]] = {}
    for plan, outcome in zip(plans, outcomes, strict=True):
        if isinstance(outcome, CallFacts):
            cells.setdefault(plan.cell, []).append(outcome)
    return {
        **headline(facts, list(levels)),
        "grid": {"delays_ms": list(delays), "levels_db": list(levels), "transports": list(transports),
                 "calls": len(plans), "barge_ins_per_call": plans[0].barge_ins, "barge_ins_per_echo_level": per_level,
                 "barge_in_after_ms": BARGE_IN_AFTER_MS, "clock_skew": SKEW, "echo_cancelling": cancel,
                 "calls_at_once": at_once, "script": texts, "max_reply_tokens": SERVER["max_reply_tokens"]},
        "seconds": round(time.monotonic() - started, 1), "expected_seconds": round(expected), "cpu": cpu,
        "failed_calls": failed,
        "cells": {name: group_figures(calls) for name, calls in cells.items()},
        "calls": [{"cell": p.cell, "call_id": o.call_id, **call_timeline(o)}
                  for p, o in zip(plans, outcomes, strict=True) if isinstance(o, CallFacts)],
    }
