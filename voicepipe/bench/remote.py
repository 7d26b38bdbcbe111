"""`voicepipe bench call --remote`: the same calls with the LLM in process and with the LLM on a remote
OpenAI-compatible server (another voicepipe's /v1, started here: the same model on the same machine).

Twilio calls through `caller/` to two servers in this process: one with the local engine, one with
`llm.backend = "openai"` pointing at a `voicepipe serve` subprocess. The calls alternate between them (`rounds`
calls of each, local first), so a load on the machine that comes and goes falls on both; each side's turns are
pooled. The report holds both and
- `remote_over_local_v2v`: the remote run's voice-to-voice p50 over the local run's (at the first N),
- `remote_cached_fraction`: the share of each turn's prompt the remote server's prefix cache served, from turn 2
  (its own `cached_tokens`), min and median.
Both runs use the `silence` turn policy, so the end-of-turn rule is the same: a remote engine gives no end probe,
so under `text` it would run as `silence` anyway and the ratio would measure the turn-taking, not the engine. The
calls carry `AGENT_PROMPT`, an agent's system prompt of realistic length (about 500 tokens).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from voicepipe.bench.call import make_utterances, run_calls, summarize_run
from voicepipe.server import serve_in_thread, wait_until_ready

POLICY = "silence"
AGENT_PROMPT = " ".join([
    "You are Maya, the phone assistant of Bella Vista, an Italian restaurant at 12 Harbour Street.",
    "You answer callers in one short, friendly sentence that is easy to say out loud, with no lists and no emoji.",
    "The restaurant is open from Tuesday to Sunday, from noon to three in the afternoon for lunch and from six to",
    "eleven in the evening for dinner; it is closed on Mondays and on public holidays.",
    "Tables seat two, four, six or eight people; larger groups book the private room upstairs, which seats twenty",
    "and needs a deposit of one hundred dollars, paid by card over the phone or at the restaurant.",
    "To book a table you need the caller's name, the number of guests, the date, the time and a phone number;",
    "repeat them back before you confirm, and never confirm a time outside the opening hours.",
    "The menu changes with the seasons: there are always three pastas made in house, a risotto, two fish dishes,",
    "a steak, a vegetarian main and four desserts, and the chef can make most dishes without gluten or dairy.",
    "Children are welcome, there are high chairs, and the children's menu costs twelve dollars.",
    "Dogs are welcome on the terrace but not inside. Parking is free after six in the evening in the lot behind",
    "the restaurant; during lunch the street parking is limited to two hours.",
    "If a caller asks about allergies, say that the kitchen handles nuts and shellfish and that the staff will",
    "tell them which dishes are safe; never promise that a dish is free of an allergen.",
    "If a caller wants to cancel, ask for the name and the time of the booking and confirm the cancellation;",
    "cancellations less than two hours before the booking lose the deposit for the private room.",
    "If a caller asks for something you cannot do, such as a refund, a complaint or a job application, offer to",
    "have the manager, Luca, call them back the same day, and take their name and number.",
    "Gift cards are sold at the restaurant and online, in amounts from twenty-five to five hundred dollars.",
    "Never make up prices, dishes or opening hours that are not written here; if you do not know, say so.",
    "Speak naturally, as on a real phone call, and keep every answer short unless the caller asks for details.",
])


def run_remote_bench(settings, calls: list[int], turns: int, rounds: int = 3,
                     progress: Callable[[str], None] = print) -> dict[str, Any]:
    remote_settings = settings.model_copy(update={"llm": settings.llm.model_copy(update={"backend": "openai"})})
    with tempfile.TemporaryDirectory() as tmp:
        utterances = make_utterances(turns, Path(tmp))
        progress("starting the local server, the LLM server (`voicepipe serve`, its /v1) and a server that uses it")
        with serve_in_thread(settings) as (local, _), _llm_server(settings) as llm_base:
            remote_settings.llm.base_url = f"{llm_base}/v1"
            with serve_in_thread(remote_settings) as (remote, _):
                report: dict[str, list[dict[str, Any]]] = {"local": [], "remote": []}
                for n in calls:
                    pooled: dict[str, list] = {"local": [], "remote": []}
                    seconds = {"local": 0.0, "remote": 0.0}
                    for round_ in range(1, rounds + 1):  # alternating, so a load that comes and goes hits both
                        for label, base in (("local", local), ("remote", remote)):
                            progress(f"round {round_}/{rounds}, {label}: {n} concurrent call(s) of {turns} turns")
                            started = time.monotonic()
                            pooled[label] += asyncio.run(run_calls(base, n, utterances, policy=POLICY,
                                                                   system_prompt=AGENT_PROMPT))
                            seconds[label] += time.monotonic() - started
                    for label in report:
                        run = {"concurrency": n, "policy": POLICY,
                               **summarize_run(pooled[label], turns, seconds[label])}
                        report[label].append(run)
                        progress(f"{label}: {_line(run)}")
    return {"transport": "twilio", "turns": turns, "rounds": rounds, "policy": POLICY, **report,
            **remote_ratios(report["local"], report["remote"])}


def remote_ratios(local: list[dict[str, Any]], remote: list[dict[str, Any]]) -> dict[str, Any]:
    """`remote_over_local_v2v` at the first N (and by N), and the remote cached fraction from turn 2."""
    by_calls = {}
    for lo, re in zip(local, remote, strict=True):
        a, b = lo["voice_to_voice_ms"]["p50"], re["voice_to_voice_ms"]["p50"]
        by_calls[str(lo["concurrency"])] = round(b / a, 3) if a and b is not None else None
    return {"remote_over_local_v2v": next(iter(by_calls.values()), None),
            "remote_over_local_v2v_by_calls": by_calls,
            "remote_cached_fraction": remote[0]["cached_fraction_from_turn2"] if remote else None,
            "local_cached_fraction": local[0]["cached_fraction_from_turn2"] if local else None}


@contextmanager
def _llm_server(settings) -> Iterator[str]:
    """`voicepipe serve` in a subprocess with the local engine (the same models); yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [sys.executable, "-m", "voicepipe.cli", "--set", f"models.llm={settings.models.llm}",
            "--set", f"paths.models_dir={settings.paths.models_dir}", "serve", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICEPIPE_")}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            def failure() -> str | None:
                if proc.poll() is None:
                    return None
                log.seek(0)
                return f"the LLM server exited:\n{log.read()[-2000:]}"

            base = f"http://127.0.0.1:{port}"
            wait_until_ready(base, 600, failure)
            yield base
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _line(run: dict[str, Any]) -> str:
    v, t = run["voice_to_voice_ms"], run["ttft_ms"]
    return (f"{run['calls']} call(s): voice-to-voice p50/p95 {v['p50']}/{v['p95']} ms, TTFT p50 {t['p50']} ms, "
            f"cached fraction from turn 2 {run['cached_fraction_from_turn2']}, "
            f"turns without reply {run['turns_without_reply']}")
