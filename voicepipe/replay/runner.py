"""The replay runner: each case's caller channel over its transport, at real-time pace, against a server.

Cases run `concurrency` at a time on one event loop. Without a URL, an in-process server is started on a free
port with the effective settings (so `--set` pairs reach it). Every call carries the case's system prompt and
greeting, its `echo` parameter where the case sets one, and, with a seed, a `seed` parameter (the server seeds
each turn's sampling from it). A case with an `[echo]` path plays its channel through a speakerphone of its own
(`caller_echo`), so the echo the server hears is of this call's replies. With `repeat`, the whole set runs that
many times, one run after the other on the same server, and each case's runs are compared (repeat.py); with
`cpu_load`, that many processes spin beside the server while the calls run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from voicepipe.caller import endpoint_url, http_base, play_call
from voicepipe.caller.call import line_rate
from voicepipe.caller.echo import SpeakerEcho
from voicepipe.cpu_load import cpu_load
from voicepipe.replay.case import CallCase, load_case
from voicepipe.replay.checks import check_call
from voicepipe.replay.golden import update_golden
from voicepipe.replay.observed import ObservedCall, observe
from voicepipe.replay.repeat import repeated_result
from voicepipe.replay.results import CaseResult, baseline_checks, report_dict

REPLY_TAIL_S = 120.0  # past the end of the caller's audio: the last reply (up to 60 s) and the record (30 s)


@dataclass
class ReplayOptions:
    url: str | None = None
    concurrency: int = 1
    seed: int | None = None
    token: str | None = None
    baseline: dict[str, dict[str, float | None]] | None = None
    tolerance: float = 0.25
    tolerance_ms: float = 100.0
    update_golden: bool = False
    repeat: int = 1
    cpu_load: int = 0  # processes spinning beside the server while the calls run


def call_params(case: CallCase, seed: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if case.system_prompt is not None:
        params["system_prompt"] = case.system_prompt
    if case.greeting is not None:
        params["greeting"] = case.greeting
    if case.echo_cancelling is not None:
        params["echo"] = "true" if case.echo_cancelling else "false"
    if seed is not None:
        params["seed"] = str(seed)  # providers carry custom parameters as strings
    return params


def caller_echo(case: CallCase) -> SpeakerEcho | None:
    """A fresh speakerphone for one call of `case` (it keeps what that call played), at its line's rate."""
    if case.echo is None:
        return None
    return SpeakerEcho(line_rate(case.transport), delay_ms=case.echo.delay_ms, level_db=case.echo.level_db)


def ws_base(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


async def replay_case(case: CallCase, url: str, options: ReplayOptions) -> ObservedCall:
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(
            play_call(endpoint_url(ws_base(url), case.transport), case.transport, case.audio, case.rate,
                      params=call_params(case, options.seed), token=options.token, record_url=http_base(url),
                      keys=case.keys, echo=caller_echo(case)),
            timeout=case.duration_s + REPLY_TAIL_S)
        call = observe(result, case.audio, case.rate)
    except Exception as exc:  # one case that cannot connect must not stop the others
        call = ObservedCall("-", error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    call.wall_s = time.monotonic() - started
    return call


def judge(case: CallCase, call: ObservedCall, options: ReplayOptions, say: Callable[[str], None]) -> CaseResult:
    if options.update_golden:
        diff = update_golden(case, call)
        if diff:
            say(diff.rstrip("\n"))
            case = load_case(case.directory)
    result = CaseResult(case.name, str(case.directory), case.transport, call, check_call(case, call))
    if options.baseline is not None and not call.error:
        result.checks += baseline_checks(result.metrics(), options.baseline.get(case.name), options.tolerance,
                                         options.tolerance_ms)
    return result


async def replay_all(cases: list[CallCase], url: str, options: ReplayOptions,
                     say: Callable[[str], None]) -> list[CaseResult]:
    gate = asyncio.Semaphore(max(1, options.concurrency))

    async def one(case: CallCase) -> CaseResult:
        async with gate:
            say(f"replaying {case.name} ({case.transport}, {case.duration_s:.1f} s of caller audio)")
            result = judge(case, await replay_case(case, url, options), options, say)
            failed = sum(not c.passed for c in result.checks)
            say(f"{'PASS' if result.passed else 'FAIL'} {case.name}: {len(result.checks) - failed}/"
                f"{len(result.checks)} checks, {len(result.call.turns)} turns, send lag p95 "
                f"{result.call.send_lag_p95_ms} ms")
            return result

    return list(await asyncio.gather(*(one(c) for c in cases)))


@contextlib.contextmanager
def server_url(url: str | None, settings) -> Iterator[str]:
    """`url`, or the base URL of an in-process server started for the run."""
    if url is not None:
        yield url
        return
    from voicepipe.server import serve_in_thread

    with serve_in_thread(settings) as (base, _app):
        yield base


def run_replay(case_dirs: list[Path], settings, options: ReplayOptions,
               say: Callable[[str], None] = print) -> tuple[dict[str, Any], list[CaseResult]]:
    cases = [load_case(d) for d in case_dirs]  # every case is checked before any call is made
    with server_url(options.url, settings) as url, cpu_load(options.cpu_load):
        started = time.monotonic()
        runs = [asyncio.run(replay_all(cases, url, options, _in_run(say, run, options.repeat)))
                for run in range(1, options.repeat + 1)]
    results = runs[0] if options.repeat == 1 else [repeated_result(list(each)) for each in zip(*runs, strict=True)]
    report = report_dict(results, time.monotonic() - started, url=options.url or "in-process",
                         seed=options.seed, concurrency=options.concurrency, repeat=options.repeat,
                         cpu_load=options.cpu_load)
    return report, results


def _in_run(say: Callable[[str], None], run: int, runs: int) -> Callable[[str], None]:
    return say if runs == 1 else lambda line: say(f"[run {run}/{runs}] {line}")
