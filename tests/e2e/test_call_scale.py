"""Beyond one machine, with real servers: calls whose LLM is another voicepipe's /v1 (llm.backend = "openai"),
two replicas sharing one PostgreSQL call store, admission control over two transports, and a graceful drain.

The processes of this module:
- the backend: `voicepipe serve` (a subprocess) with the in-process engine, serving /v1;
- replica A: the app in this process, its LLM the backend, calls.max_concurrent = 2, AudioSocket on;
- replica B: `voicepipe serve` (a subprocess), its LLM the backend, drained by SIGTERM in `test_drain`;
- PostgreSQL from Debian's package, the call store of both replicas.
The backend is killed by the last test.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
import websockets

from tests.call_helpers import GREETING, assert_history_keeps_what_was_heard, call_settings
from tests.e2e.test_call_transports import speak
from tests.net_helpers import in_process_server, server_process, wait_for_process
from tests.postgres_helpers import postgres_server
from tests.unit.test_transport_webrtc import AUDIO_SDP
from voicepipe.bench.remote import AGENT_PROMPT
from voicepipe.caller import run_call

pytestmark = pytest.mark.e2e

MAX_REPLY_TOKENS = 40
# The barge-in call's own reply budget. The caller cuts in 300 ms into the reply's audio, about 700 ms after the
# reply's first token on a quiet machine (25 tokens at 36 tok/s); with 40 tokens a loaded CI machine saw the stream
# complete first. 200 tokens take the backend 5.5 s.
STORY_TOKENS = 200
SYSTEM_PROMPT = AGENT_PROMPT  # an agent's system prompt of realistic length (about 500 tokens)


def backend_requests(base: str, reason: str) -> float:
    """The backend's LLM requests that ended with ``reason`` (its /metrics)."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf'^voicepipe_llm_requests_total{{[^}}]*reason="{reason}"[^}}]*}} (\S+)$',
                                           text, re.M))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(backend base, backend process, replica A (base, app), replica B (base, process), store URL).

    The backend decodes in fp16 (36 tok/s here), not q4 (79 tok/s), so that a reply's stream is still open when a
    caller barges in (`STORY_TOKENS`)."""
    tmp = tmp_path_factory.mktemp("scale")
    with postgres_server() as store_url, \
            server_process("--set", "llm.kv_cache_mib=128", "--set", "llm.weights=fp16", wait=False) \
            as (backend, backend_proc):
        remote = {"backend": "openai", "base_url": f"{backend}/v1", "read_timeout_s": 20.0}
        store = {"store_url": store_url}
        b_args = [f"--set={k}={v}" for k, v in (
            ("llm.backend", "openai"), ("llm.base_url", f"{backend}/v1"), ("observability.store_url", store_url),
            ("observability.replica", "replica-b"), ("paths.data_dir", tmp / "b"), ("calls.greeting", GREETING),
            ("calls.max_reply_tokens", 16), ("server.drain_timeout_s", 120))]
        with server_process(*b_args, wait=False) as (b_base, b_proc):
            # turn.middle_wait_ms: the end-of-turn decision waits for the remote end probe, which queues behind the
            # reply on a backend that shares the two cores with both replicas (it landed after the default 1.3 s)
            settings = call_settings(tmp / "a", llm={**remote, "tokenizer": "smollm2-135m-instruct"},
                                     observability={**store, "replica": "replica-a"}, turn={"middle_wait_ms": 6000},
                                     calls={"max_reply_tokens": MAX_REPLY_TOKENS, "max_concurrent": 2,
                                            "audiosocket_port": 0})
            with in_process_server(settings) as (a_base, a_app):
                wait_for_process(backend, backend_proc)
                wait_for_process(b_base, b_proc)
                yield backend, backend_proc, (a_base, a_app), (b_base, b_proc), store_url


async def until(condition, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the call"
        await asyncio.sleep(0.05)


def ws(base: str, path: str = "/ws") -> str:
    return base.replace("http://", "ws://") + path


def test_a_call_on_a_remote_engine_reuses_the_servers_prefix_cache(setup, voice_dir: Path) -> None:
    """The history goes back byte for byte each turn, so the backend's prefix cache serves all of it: at least
    0.9 of each later turn's prompt is cached (the server's own cached_tokens)."""
    _, _, (a_base, a_app), _, _ = setup
    utts = [speak("I want to book a table for dinner.", voice_dir), speak("What is the capital of France?", voice_dir)]
    result = asyncio.run(run_call(ws(a_base), "native", utts, quiet_s=0.6, reply_timeout_s=90,
                                  params={"system_prompt": SYSTEM_PROMPT}, record_url=a_base))

    turns = result.record["turns"]
    assert [t["turn"] for t in turns] == [1, 2] and all(t.audio_s > 0.3 for t in result.turns)
    for t in turns:
        assert t["agent_text"].strip() and t["error"] is None, t
        assert t["prompt_tokens"] > 400, t  # the server's usage: the system prompt and the history
    for t in turns[1:]:
        fraction = t["cached_prompt_tokens"] / t["prompt_tokens"]
        print(f"turn {t['turn']}: {t['cached_prompt_tokens']} of {t['prompt_tokens']} prompt tokens cached "
              f"({fraction:.3f})")
        assert fraction >= 0.9, t
    # the remote end probe (llm.tokenizer) gives the text policy its evidence, as the local engine would
    decisions = [t["decision"] for t in turns]
    assert all(d["policy"] == "text" for d in decisions), decisions
    assert any(d["text_prob"] is not None for d in decisions), decisions
    history = result.record["history"]
    assert history[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert [m["content"] for m in history if m["role"] == "user"] == [t["user_text"] for t in turns]
    assert not a_app.state.calls.active


def test_the_remote_end_probe_gives_what_the_local_engine_gives(setup, engine_model, settings) -> None:
    """P(the caller's words end here) from the backend's /v1/completions logprobs, against the in-process engine's
    own end probe on the same model and conversation."""
    from voicepipe.llm.engine import LLMEngine
    from voicepipe.llm.remote import RemoteEngine
    from voicepipe.llm.remote.probe import EndProbe

    backend = setup[0]
    model, tokenizer = engine_model
    local = LLMEngine(model, tokenizer, settings.llm.model_copy(update={"kv_cache_mib": 32}))
    local.start()
    remote = RemoteEngine(settings.llm.model_copy(update={"backend": "openai", "base_url": f"{backend}/v1"}),
                          EndProbe(tokenizer))
    remote.start()

    async def probe(engine, words: str) -> float | None:
        session = engine.open_session(SYSTEM_PROMPT)
        generation = engine.generate(session, [{"role": "assistant", "content": GREETING},
                                               {"role": "user", "content": words}], max_tokens=1, end_probe=True)
        async for _ in generation:
            pass
        value = await generation.end_prob
        engine.close_session(session)
        return value

    try:
        for words in ("I want to book a table for dinner.", "I want to book a table for", "Is the terrace"):
            here, there = asyncio.run(probe(local, words)), asyncio.run(probe(remote, words))
            print(f"{words!r}: local {here:.5f}, remote {there:.5f}")
            assert there == pytest.approx(here, abs=0.01)  # the same distribution; alternatives past 20 left out
    finally:
        local.stop()


def test_barge_in_closes_the_remote_stream_and_keeps_what_was_heard(setup, voice_dir: Path) -> None:
    backend, _, (a_base, a_app), _, _ = setup
    cancelled = backend_requests(backend, "cancelled")
    utts = [speak("Tell me a long story about a brave dragon and a princess.", voice_dir),
            speak("What is the capital of France?", voice_dir)]
    result = asyncio.run(run_call(ws(a_base), "native", utts, quiet_s=0.6, reply_timeout_s=90,
                                  barge_in_after_ms=300, params={"max_reply_tokens": STORY_TOKENS},
                                  record_url=a_base))

    record = result.record
    assert record["barge_ins"] == 1 and result.turns[1].audio_s > 0.3
    first = record["turns"][0]
    assert first["output_tokens"] < STORY_TOKENS, first  # its stream was closed before the reply was complete
    assert_history_keeps_what_was_heard(record)
    deadline = time.monotonic() + 10
    while backend_requests(backend, "cancelled") <= cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend_requests(backend, "cancelled") > cancelled, "the backend never saw its request cancelled"
    assert not a_app.state.calls.active


def test_the_call_over_the_limit_is_refused_and_the_others_go_on(setup, voice_dir: Path) -> None:
    """calls.max_concurrent = 2 on replica A: a native call and an AudioSocket call take both places; a third
    (native) is closed with 1013 and a WebRTC offer gets 503, at once; /ready says saturated; both calls finish."""
    _, _, (a_base, a_app), _, _ = setup
    utts = [speak("How do I reset my password?", voice_dir)]

    async def scenario():
        calls = [asyncio.create_task(run_call(ws(a_base), "native", utts, quiet_s=0.6, reply_timeout_s=90,
                                              record_url=a_base)),
                 asyncio.create_task(run_call(f"tcp://127.0.0.1:{a_app.state.audiosocket_port}", "audiosocket", utts,
                                              quiet_s=0.6, reply_timeout_s=90, record_url=a_base))]
        await until(lambda: a_app.state.admission.active >= 2)
        started = time.monotonic()
        async with websockets.connect(ws(a_base)) as extra:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await extra.recv()
        refused_ms = (time.monotonic() - started) * 1000
        async with httpx.AsyncClient() as client:
            ready = await client.get(f"{a_base}/ready")
            offer = await client.post(f"{a_base}/webrtc/offer", json={"type": "offer", "sdp": AUDIO_SDP})
            metrics = (await client.get(f"{a_base}/metrics")).text
        return await asyncio.gather(*calls), closed.value, refused_ms, ready, offer, metrics

    results, closed, refused_ms, ready, offer, metrics = asyncio.run(scenario())
    print(f"refused the third call in {refused_ms:.1f} ms (connect to close)")
    assert closed.rcvd.code == 1013 and "max_concurrent" in closed.rcvd.reason
    assert ready.status_code == 503 and ready.json()["saturated"] and ready.json()["active_calls"] == 2
    assert offer.status_code == 503 and "max_concurrent" in offer.json()["detail"]
    assert 'voicepipe_calls_refused_total{reason="saturated",transport="native"} 1.0' in metrics
    for result in results:
        assert result.record["turns"][0]["agent_text"].strip() and result.turns[0].audio_s > 0.3
        assert result.record["turns"][0]["error"] is None
    assert httpx.get(f"{a_base}/ready").status_code == 200  # places free again


def test_drain_lets_the_live_call_finish_and_exits_0(setup, voice_dir: Path) -> None:
    """SIGTERM to replica B during a call: /ready turns 503 at once, a new call is refused, the live call goes on
    to its end, every turn reaches the shared store, and the process exits 0."""
    _, _, (a_base, _), (b_base, b_proc), _ = setup
    utts = [speak("I want to book a table for dinner.", voice_dir), speak("How do I reset my password?", voice_dir)]

    async def scenario():
        call = asyncio.create_task(run_call(ws(b_base), "native", utts, quiet_s=0.6, reply_timeout_s=90,
                                            fetch_record=False))
        async with httpx.AsyncClient() as client:
            deadline = time.monotonic() + 90
            while not (await client.get(f"{b_base}/calls")).json()["active"]:
                assert time.monotonic() < deadline, "the call never started"
                await asyncio.sleep(0.05)
            await asyncio.sleep(2.0)  # the greeting is playing, the first turn is on its way
            b_proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            ready = await client.get(f"{b_base}/ready")
        async with websockets.connect(ws(b_base)) as extra:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await extra.recv()
        return await call, ready, closed.value

    result, ready, closed = asyncio.run(scenario())
    assert ready.status_code == 503 and ready.json()["draining"]
    assert closed.rcvd.code == 1013 and "shutting down" in closed.rcvd.reason
    assert [t.audio_s > 0.3 for t in result.turns] == [True, True], "the live call did not go on to its end"
    assert b_proc.wait(timeout=60) == 0
    stored = httpx.get(f"{a_base}/api/calls/{result.call_id}").json()  # replica A reads what B wrote
    assert stored["replica"] == "replica-b" and stored["ended"] is not None and stored["outcome"] == "completed"
    assert [t["turn"] for t in stored["turns"]] == [1, 2]
    assert all(t["agent_text"].strip() and t["user_text"].strip() for t in stored["turns"]), stored["turns"]


def test_both_replicas_calls_are_listed_from_the_shared_store(setup) -> None:
    _, _, (a_base, _), _, _ = setup
    calls = httpx.get(f"{a_base}/api/calls").json()["calls"]
    assert {c["replica"] for c in calls} == {"replica-a", "replica-b"}, calls
    page = httpx.get(f"{a_base}/dashboard").text
    assert "replica-a" in page and "replica-b" in page


def test_a_dead_backend_gets_an_apology_and_a_clean_error_not_a_hang(setup, voice_dir: Path) -> None:
    backend, backend_proc, (a_base, a_app), _, _ = setup
    utts = [speak("What is the capital of France?", voice_dir), speak("How do I reset my password?", voice_dir)]

    async def scenario():
        call = asyncio.create_task(run_call(ws(a_base), "native", utts, quiet_s=0.6, reply_timeout_s=60,
                                            record_url=a_base))
        await until(lambda: first_turn_played(a_app))
        backend_proc.kill()  # mid-call: the second turn has no LLM
        backend_proc.wait(timeout=10)
        return await call

    result = asyncio.run(scenario())
    first, second = result.record["turns"]
    assert first["error"] is None and first["agent_text"].strip()
    assert second["error"] and "RemoteBackendError" in second["error"], second
    assert second["agent_text"] == a_app.state.settings.calls.apology
    assert result.turns[1].audio_s > 1.0, "the apology was not spoken"
    assert result.record["end_reason"] != "error" and not a_app.state.calls.active


def first_turn_played(app) -> bool:
    return any(c.record.turns and "playout_end" in c.record.turns[0].timeline
               for c in list(app.state.calls.active.values()))
