"""`voicepipe bench soak`: churn. N calls in waves of 4 through an in-process server with the real models, over
every call link (the five providers' WebSockets, the native protocol, AudioSocket and WebRTC), with barge-ins,
abrupt hang-ups and bad frames mixed in, and the process's resources counted before and after.

The figures, each read with the server idle: RSS, open file descriptors, OS threads, asyncio tasks on the server's
loops, KV blocks in use, LLM sessions, STT and TTS streams still in memory, live calls, WebRTC peers and held
connection slots. Three snapshots: `cold` (before any call), `warm` (after the warm-up: the waves that give every
transport its first call; each transport's first call builds what later ones reuse: its codecs, resamplers and model
input shapes, pools and threads) and `after` (after the last wave). The bounds hold `after` against
`warm`: the counts come back to exactly their warm values, threads to at most theirs plus what the event loops'
executor pools grew by (within their bound), and RSS grows by at most `RSS_GROWTH_MB`. Resources are released
asynchronously (a peer connection's teardown, a socket's close), so each snapshot is taken once the counts settle
(`settle`), for at most `SETTLE_S`.

Healthy calls (all but the abrupt ones) must lose no audio and no turn: every utterance gets agent audio back
and a turn on the server, with the caller's words and no error. The caller side runs in this process too (its own
loop), so its sockets and threads are counted as well: they must come back as well.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voicepipe.bench.call import make_utterances
from voicepipe.caller import CallResult, Utterance, endpoint_url, scripted_call
from voicepipe.caller.turns import converse
from voicepipe.server import serve_in_thread
from voicepipe.transports.serializers.audiosocket import encode_message

WAVE = 4
# In turn; the first wave has a call on each kind of link (WebRTC, TCP, the native and a provider's WebSocket).
TRANSPORTS = ("webrtc", "audiosocket", "native", "twilio", "telnyx", "plivo", "vonage", "exotel")
KINDS = ("normal", "barge_in", "bad_frames", "abrupt")
RSS_GROWTH_MB = 50.0
SETTLE_S = 30.0
EXACT = ("fds", "tasks", "kv_blocks_used", "llm_sessions", "stt_streams", "tts_streams", "live_calls",
         "webrtc_peers", "connection_slots")  # back to exactly their warm value
# The server's two event loops (uvicorn's, a uvloop, and AudioSocket's) each start default-executor threads
# ("uvloop_N", "asyncio_N") as `to_thread` calls overlap, up to the pool's bound, and keep them: they may grow after
# the warm-up without leaking. A pool thread may bring native threads of its own (OpenMP gives each thread that runs
# a parallel op its own team), at most `threads_per_pool_thread()` in all; any other new thread must be gone again.
EXECUTOR_THREADS_MAX = 2 * min(32, (os.cpu_count() or 1) + 4)
EXECUTOR_PREFIXES = ("asyncio_", "uvloop")
# The soak's server: short greedy replies after a short greeting (the turns, not the words, are under test), and an
# AudioSocket listener on a free port.
SOAK_SETTINGS = {"calls": {"greeting": "Hi, how can I help?", "max_reply_tokens": 24, "temperature": 0.0,
                           "audiosocket_port": 0}}
REPLY_TIMEOUT_S = 60.0
# Frames every protocol must shrug off (a log line, no effect on the call): not JSON, not an object, an unknown
# event, media that is not base64.
BAD_TEXT = ["{oops", "[1, 2, 3]", json.dumps({"event": "nonsense", "type": "nonsense"}),
            json.dumps({"event": "media", "media": {"payload": "@@not base64@@"}})]
AUDIOSOCKET_UNKNOWN_KIND = 0x77


@dataclass(frozen=True)
class PlannedCall:
    index: int
    transport: str
    kind: str
    record: bool  # the call asks to be recorded (its `record` parameter): the recorder's files churn too

    @property
    def healthy(self) -> bool:
        return self.kind != "abrupt"


def plan_calls(n: int) -> list[PlannedCall]:
    """Transports in turn; the kinds cycle at another pace, so every transport meets every kind (WebRTC carries no
    frames of ours to garble: its bad-frames calls are normal ones)."""
    plans = []
    for i in range(n):
        transport = TRANSPORTS[i % len(TRANSPORTS)]
        kind = KINDS[(i + i // len(TRANSPORTS)) % len(KINDS)]
        if transport == "webrtc" and kind == "bad_frames":
            kind = "normal"
        plans.append(PlannedCall(i, transport, kind, record=i % 3 == 0))
    return plans


# -- the process's resources --------------------------------------------------------------------------------------


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _tasks(loop: asyncio.AbstractEventLoop | None) -> int:
    if loop is None or loop.is_closed():
        return 0

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1  # less this one

    return asyncio.run_coroutine_threadsafe(count(), loop).result(10)


def _thread_names() -> Counter[str]:
    """The Python threads by name, numbers dropped (what `threads_gained` lists, to tell which pool grew)."""
    return Counter(re.sub(r"[0-9_-]+$", "", t.name) for t in threading.enumerate())


def snapshot(app) -> dict[str, float]:
    """The resources of the process and of the server in `app`, as counted now."""
    gc.collect()  # what is garbage is not a leak
    runtime, state = app.state.runtime, app.state
    stats = runtime.engine.stats()
    threads = _proc_status("Threads")  # the OS's count: native pools (torch, onnxruntime, ...) included
    executor_threads = sum(t.name.startswith(EXECUTOR_PREFIXES) for t in threading.enumerate())
    return {
        "rss_mb": round(_proc_status("VmRSS") / 1024, 1),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threads,
        "executor_threads": executor_threads,
        "tasks": _tasks(getattr(state, "serve_loop", None)) + _tasks(getattr(state, "audiosocket_loop", None)),
        "kv_blocks_used": stats["blocks_used"],
        "llm_sessions": stats["sessions"],
        "stt_streams": runtime.transcriber.streams_in_memory,
        "tts_streams": runtime.synthesizer.streams_in_memory,
        "live_calls": len(state.calls.active),
        "webrtc_peers": len(state.webrtc_calls),
        "connection_slots": state.client_slots.held(),
    }


def settle(app, target: dict[str, float] | None, timeout_s: float = SETTLE_S) -> tuple[dict[str, float], float]:
    """Snapshots until the counts stop moving (or, given a `target`, are back within it), for at most `timeout_s`;
    returns the last one and how long it took."""
    started = time.monotonic()
    last = snapshot(app)
    while time.monotonic() - started < timeout_s:
        time.sleep(1.0)
        now = snapshot(app)
        if target is not None and not bound_problems(now, target):
            return now, round(time.monotonic() - started, 1)
        if target is None and all(now[k] == last[k] for k in (*EXACT, "threads")):
            return now, round(time.monotonic() - started, 1)
        last = now
    return last, round(time.monotonic() - started, 1)


def threads_per_pool_thread() -> int:
    """An executor thread and the OpenMP team torch gives each thread that runs an op in parallel."""
    import torch

    return 1 + max(0, torch.get_num_threads() - 1)


def bound_problems(after: dict[str, float], warm: dict[str, float]) -> list[str]:
    problems = [f"{k}: {after[k]:g} after, {warm[k]:g} warm" for k in EXACT if after[k] != warm[k]]
    pool_growth = max(0, after["executor_threads"] - warm["executor_threads"])
    allowed = warm["threads"] + pool_growth * threads_per_pool_thread()
    if after["threads"] > allowed:
        problems.append(f"threads: {after['threads']:g} after, more than {allowed:g} ({warm['threads']:g} warm, "
                        f"{pool_growth:g} more executor threads)")
    if after["executor_threads"] > EXECUTOR_THREADS_MAX:
        problems.append(f"executor_threads: {after['executor_threads']:g}, over the loops' {EXECUTOR_THREADS_MAX}")
    growth = after["rss_mb"] - warm["rss_mb"]
    if growth > RSS_GROWTH_MB:
        problems.append(f"rss_mb grew {growth:.1f} MB after warm-up (bound {RSS_GROWTH_MB:g})")
    return problems


# -- the calls -------------------------------------------------------------------------------------------------


def bad_frames(transport: str) -> list[str | bytes]:
    if transport == "audiosocket":  # a well-framed message of a kind nobody defines: the stream stays in step
        return [encode_message(AUDIOSOCKET_UNKNOWN_KIND, b"junk")]
    frames: list[str | bytes] = list(BAD_TEXT)
    if transport == "native":
        frames.append(b"\x01\x02\x03")  # odd-length PCM16
    return frames


def call_url(base: str, app, transport: str) -> str:
    if transport == "webrtc":
        return base
    if transport == "audiosocket":
        return f"tcp://127.0.0.1:{app.state.audiosocket_port}"
    return endpoint_url(base.replace("http://", "ws://"), transport)


async def run_planned(plan: PlannedCall, base: str, app, utterances: list[Utterance]) -> CallResult:
    """One call of the plan through the caller's real client."""
    greeting_s, quiet_s = 30.0, 0.6

    async def normal(line, server) -> None:
        await converse(line, utterances, server, greeting_wait_s=greeting_s, reply_timeout_s=REPLY_TIMEOUT_S,
                       quiet_s=quiet_s, barge_in_after_ms=None)

    async def barge_in(line, server) -> None:  # the second utterance starts 0.7 s into the first reply
        await converse(line, utterances, server, greeting_wait_s=greeting_s, reply_timeout_s=REPLY_TIMEOUT_S,
                       quiet_s=quiet_s, barge_in_after_ms=700)

    async def with_bad_frames(line, server) -> None:
        async def spray() -> None:
            for _ in range(3):
                await asyncio.sleep(1.0)
                if not line.closed.is_set():
                    await line.send(bad_frames(plan.transport))

        sprayer = asyncio.create_task(spray())
        try:
            await normal(line, server)
        finally:
            await sprayer

    async def abrupt(line, server) -> None:  # gone mid-reply: no stop message, no close handshake
        talk = asyncio.create_task(converse(line, utterances[:1], server, greeting_wait_s=greeting_s,
                                            reply_timeout_s=REPLY_TIMEOUT_S, quiet_s=quiet_s, barge_in_after_ms=None))
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while not (line.result.turns and line.result.turns[0].first_audio) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        talk.cancel()
        await asyncio.gather(talk, return_exceptions=True)
        line.closed.set()
        transport = getattr(line.link, "transport", None)
        if transport is not None:
            transport.abort()

    turns = {"normal": normal, "barge_in": barge_in, "bad_frames": with_bad_frames, "abrupt": abrupt}[plan.kind]
    params = {"record": "true"} if plan.record else None
    return await scripted_call(call_url(base, app, plan.transport), plan.transport, turns, params=params,
                               call_id=f"soak-{plan.index}-{plan.transport}", record_url=base)


def call_problems(plan: PlannedCall, result: CallResult | BaseException, expected_turns: int) -> list[str]:
    """What a healthy call lost: an utterance without agent audio, a turn the server never had, or one that
    failed or heard no words."""
    if isinstance(result, BaseException):
        return [f"the call failed: {type(result).__name__}: {result}"[:200]]
    if not plan.healthy:
        return []
    problems = [f"turn {t.index}: no agent audio" for t in result.turns if t.first_audio is None]
    if len(result.turns) != expected_turns:
        problems.append(f"{len(result.turns)} of {expected_turns} utterances spoken")
    server_turns = (result.record or {}).get("turns", [])
    if len(server_turns) != expected_turns:
        problems.append(f"the server has {len(server_turns)} turns, not {expected_turns}")
    for turn in server_turns:
        if turn.get("error"):
            problems.append(f"turn {turn.get('turn')}: {turn['error']}"[:200])
        elif not (turn.get("user_text") or "").strip():
            problems.append(f"turn {turn.get('turn')}: no words heard")
    return problems


# -- the run ---------------------------------------------------------------------------------------------------------


def soak_settings(settings, directory: Path):
    """`settings` with `SOAK_SETTINGS` over them, and the store and recordings under `directory`."""
    soak = settings.model_copy(deep=True)
    for section, values in SOAK_SETTINGS.items():
        for key, value in values.items():
            setattr(getattr(soak, section), key, value)
    soak.paths.data_dir, soak.paths.recordings_dir = directory / "data", directory / "recordings"
    return soak


def run_soak(settings, calls: int, wave: int = WAVE, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The soak on an in-process server made from `settings` (`soak_settings`); see `soak`."""
    with tempfile.TemporaryDirectory(prefix="voicepipe-soak-") as tmp:
        utterances = make_utterances(2, Path(tmp))
        progress("starting an in-process server (models load first)")
        with serve_in_thread(soak_settings(settings, Path(tmp))) as (base, app):
            return soak(base, app, utterances, calls, wave, progress)


def soak(base: str, app, utterances: list[Utterance], calls: int, wave: int = WAVE,
         progress: Callable[[str], None] = print) -> dict[str, Any]:
    """`calls` calls in waves of `wave` against the running server at `base` (`app` is its app, in this process).
    The report is flat apart from its lists: the snapshots as `cold.*`, `warm.*`, `after.*`, the bound problems and
    each unhealthy call's problems (both empty when the soak passes), and `passed`."""
    if calls <= len(TRANSPORTS):
        raise ValueError(f"a soak warms up with a call on every transport: more than {len(TRANSPORTS)} calls")
    plans = plan_calls(calls)
    cold, _ = settle(app, None)
    unhealthy: dict[str, list[str]] = {}
    rss_by_wave: list[float] = []  # right after each wave (not settled): the trend
    warm = None
    started = time.monotonic()
    warm_after = -(-len(TRANSPORTS) // wave) * wave  # the warm-up: every transport's first call
    for first in range(0, calls, wave):
        batch = plans[first:first + wave]
        outcomes = asyncio.run(_wave(batch, base, app, utterances))
        for plan, outcome in zip(batch, outcomes, strict=True):  # the results go: the soak keeps no call's audio
            problems = call_problems(plan, outcome, 1 if plan.kind == "abrupt" else len(utterances))
            if problems:
                unhealthy[f"soak-{plan.index}-{plan.transport}/{plan.kind}"] = problems
        del outcomes
        rss_by_wave.append(round(_proc_status("VmRSS") / 1024, 1))
        progress(f"wave {first // wave + 1}: calls {first + 1}-{first + len(batch)} "
                 f"({', '.join(f'{p.transport}/{p.kind}' for p in batch)}), RSS {rss_by_wave[-1]} MB")
        if warm is None and first + wave >= warm_after:
            warm, warm_s = settle(app, None)
            warm_threads = _thread_names()
            progress(f"warm: {_line(warm)} (settled in {warm_s} s)")
    seconds = time.monotonic() - started
    after, after_s = settle(app, warm)
    progress(f"after: {_line(after)} (settled in {after_s} s)")
    bounds = bound_problems(after, warm)
    report: dict[str, Any] = {
        "calls": calls, "wave": wave, "seconds": round(seconds, 1), "healthy_calls": sum(p.healthy for p in plans),
        "calls_by_kind": {k: sum(p.kind == k for p in plans) for k in KINDS},
        "calls_by_transport": {t: sum(p.transport == t for p in plans) for t in TRANSPORTS},
        **{f"{name}.{k}": v for name, snap in (("cold", cold), ("warm", warm), ("after", after))
           for k, v in snap.items()},
        "rss_growth_mb": round(after["rss_mb"] - warm["rss_mb"], 1), "rss_growth_bound_mb": RSS_GROWTH_MB,
        "after_settle_s": after_s, "rss_mb_by_wave": rss_by_wave, "warmup_calls": min(warm_after, calls),
        "threads_gained": sorted((_thread_names() - warm_threads).elements()), "bound_problems": bounds,
        "unhealthy_calls": unhealthy,
        "healthy_calls_lost": len([k for k in unhealthy if not k.endswith("/abrupt")]),
    }
    report["passed"] = not bounds and not unhealthy
    return report


async def _wave(batch: list[PlannedCall], base: str, app, utterances: list[Utterance]) -> list[Any]:
    return await asyncio.gather(*(run_planned(p, base, app, utterances) for p in batch), return_exceptions=True)


def _line(snap: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in snap.items())
