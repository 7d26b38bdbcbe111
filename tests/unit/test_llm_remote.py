"""The remote LLM backend's client (voicepipe/llm/remote/) against a scripted OpenAI-shaped server: retries before
the first token, timeouts, a stream cut short, and the session history it keeps. The server here is a stand-in
for the failures of a real one (a real one, another voicepipe's /v1, is in tests/e2e/test_call_scale.py)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import deque

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tests.net_helpers import free_port
from voicepipe.config import load_settings
from voicepipe.errors import SettingsError
from voicepipe.llm.errors import InvalidRequestError, SessionBusyError
from voicepipe.llm.remote import RemoteBackendError, RemoteEngine


def chunk(text: str | None = None, finish: str | None = None, usage: dict | None = None) -> str:
    body = {"object": "chat.completion.chunk", "choices": [] if usage else
            [{"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


class Script:
    """What the server does for each next POST: ("status", code), ("stream", [pieces]), ("stall", seconds before
    the first piece), ("cut", [pieces]) (the connection drops after them)."""

    def __init__(self) -> None:
        self.plans: deque = deque()
        self.requests: list[tuple[dict, dict]] = []  # (headers, body)


def scripted_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "scripted-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):  # the end probe's request
        body = await request.json()
        script.requests.append((dict(request.headers), body))
        top = {".": math.log(0.5), "?": math.log(0.2), "<|im_end|>": math.log(0.05), " and": math.log(0.2)}
        return {"choices": [{"text": ".", "logprobs": {"tokens": ["."], "token_logprobs": [top["."]],
                                                       "top_logprobs": [top], "text_offset": [0]}}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        script.requests.append((dict(request.headers), body))
        kind, arg = script.plans.popleft() if script.plans else ("stream", ["Hello", " there."])
        if kind == "status":
            return JSONResponse({"error": {"message": f"scripted {arg}"}}, status_code=arg)

        async def events():
            if kind == "stall":
                await asyncio.sleep(arg)
            for piece in ([] if kind == "stall" else arg):
                yield chunk(piece)
                await asyncio.sleep(0.01)
            if kind == "cut":
                raise RuntimeError("scripted: the server dies mid-reply")
            yield chunk(finish="stop")
            yield chunk(usage={"prompt_tokens": 100, "completion_tokens": 2,
                               "prompt_tokens_details": {"cached_tokens": 96}})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def server():
    script = Script()
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(scripted_app(script), host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1", script
    uv.should_exit = True
    thread.join(10)


def engine_for(base: str, **llm) -> RemoteEngine:
    settings = load_settings(overrides={"llm": {"backend": "openai", "base_url": base, "api_key": "k3y",
                                                "read_timeout_s": 2.0, "retries": 2, **llm}})
    engine = RemoteEngine(settings.llm)
    engine.start()
    return engine


async def reply(engine: RemoteEngine, session, text: str):
    gen = engine.generate(session, [{"role": "user", "content": text}], tier="priority", max_tokens=20,
                          temperature=0.0, seed=7, end_probe=True)
    pieces = [piece async for piece in gen]
    return gen, pieces


def test_a_turn_streams_and_sends_the_history_back_as_it_was(server) -> None:
    base, script = server
    engine = engine_for(base)
    assert engine.model == "scripted-model" and engine.scores_words is False

    async def run():
        session = engine.open_session("Be brief.")
        first, pieces = await reply(engine, session, "Hi")
        assert await first.end_prob is None  # no end probe from a remote engine
        second, _ = await reply(engine, session, "And you?")
        return session, first, pieces, second

    script.requests.clear()
    session, first, pieces, second = asyncio.run(run())
    assert [p.text for p in pieces] == ["Hello", " there."] and [p.token_ids for p in pieces] == [[0], [1]]
    assert first.finish_reason == "stop" and first.text == "Hello there."
    stats = second.stats
    assert (stats.prompt_tokens, stats.cached_prompt_tokens, stats.output_tokens) == (100, 96, 2)
    assert stats.ttft is not None and stats.first_scheduled is not None
    (h1, b1), (h2, b2) = script.requests
    assert h1["authorization"] == "Bearer k3y" and h1["x-session-id"] == h2["x-session-id"] == b1["user"]
    assert b1["stream_options"] == {"include_usage": True} and b1["model"] == "scripted-model"
    assert b1["max_tokens"] == 20 and b1["temperature"] == 0.0 and b1["seed"] == 7
    assert b2["messages"][:len(b1["messages"])] == b1["messages"]  # the same bytes, then the new turn
    assert b2["messages"][len(b1["messages"]):] == [{"role": "assistant", "content": "Hello there."},
                                                    {"role": "user", "content": "And you?"}]
    assert engine.history(session)[-1] == {"role": "assistant", "content": "Hello there."}


def test_rollback_keeps_the_heard_deltas_and_drop_turns_goes_back_to_a_mark(server) -> None:
    base, script = server
    engine = engine_for(base)

    async def run():
        session = engine.open_session("Be brief.")
        await reply(engine, session, "One")
        script.plans.append(("stream", ["A", " long", " story"]))
        await reply(engine, session, "Two")
        engine.rollback_reply(session, 2)
        assert engine.history(session)[-1] == {"role": "assistant", "content": "A long"}
        engine.drop_turns(session, 1)
        return session

    session = asyncio.run(run())
    assert [m["content"] for m in engine.history(session)] == ["Be brief.", "One", "Hello there."]
    assert session.requests == 1 and len(session.marks) == 1


def test_answers_worth_a_retry_are_retried_before_the_first_token(server) -> None:
    base, script = server
    engine = engine_for(base)
    script.plans.extend([("status", 503), ("status", 429)])
    _, pieces = asyncio.run(reply(engine, engine.open_session(), "Hi"))
    assert "".join(p.text for p in pieces) == "Hello there." and engine.counters["retries"] == 2


def test_a_refusal_is_not_retried_and_says_what_the_server_said(server) -> None:
    base, script = server
    engine = engine_for(base)
    script.plans.append(("status", 401))

    async def run():
        session = engine.open_session("Be brief.")
        with pytest.raises(RemoteBackendError, match="401: scripted 401") as failed:
            await reply(engine, session, "Hi")
        return session, failed.value

    session, error = asyncio.run(run())
    assert "llm.api_key" in error.fix and engine.counters["retries"] == 0
    assert engine.history(session) == [{"role": "system", "content": "Be brief."}]  # the failed turn left no trace
    assert not session.busy and session.requests == 0


def test_a_server_that_stalls_times_out_after_its_retries(server) -> None:
    base, script = server
    engine = engine_for(base, read_timeout_s=0.3, retries=1)
    # The server answers 1.5 s late, before the default read timeout (2 s) but after the one set: each try ending
    # on a read timeout shows that the setting bounded the wait, however fast the machine.
    script.plans.extend([("stall", 1.5), ("stall", 1.5)])
    with pytest.raises(RemoteBackendError, match="after 2 tries: ReadTimeout"):
        asyncio.run(reply(engine, engine.open_session(), "Hi"))
    assert engine.counters["errors"] == 1 and engine.counters["retries"] == 1


def test_a_server_that_is_down_fails_fast() -> None:
    engine = engine_for(f"http://127.0.0.1:{free_port()}/v1", model="m", connect_timeout_s=0.5, retries=2)
    with pytest.raises(RemoteBackendError, match="after 3 tries: ConnectError"):  # refused, never a timeout
        asyncio.run(reply(engine, engine.open_session(), "Hi"))
    assert engine.counters["retries"] == 2


def test_a_reply_cut_short_raises_after_its_pieces_and_keeps_them(server) -> None:
    base, script = server
    engine = engine_for(base)
    script.plans.append(("cut", ["Half", " a"]))

    async def run():
        session = engine.open_session()
        gen = engine.generate(session, [{"role": "user", "content": "Hi"}])
        got = []
        with pytest.raises(RemoteBackendError, match="in the middle of its reply"):
            async for piece in gen:
                got.append(piece.text)
        return session, got

    session, got = asyncio.run(run())
    assert got == ["Half", " a"] and engine.counters["retries"] == 0  # never retried: the caller heard it
    assert engine.history(session)[-1] == {"role": "assistant", "content": "Half a"}


def test_leaving_the_stream_early_cancels_the_request_and_frees_the_session(server) -> None:
    base, script = server
    engine = engine_for(base)
    script.plans.append(("stream", ["a"] * 50))

    async def run():
        session = engine.open_session()
        gen = engine.generate(session, [{"role": "user", "content": "Hi"}])
        async for _ in gen:
            with pytest.raises(SessionBusyError):
                engine.rollback_reply(session, 0)
            break
        await asyncio.sleep(0.05)
        engine.rollback_reply(session, 0)
        return session

    session = asyncio.run(run())
    assert not session.busy and engine.counters["cancelled"] == 1
    assert engine.history(session)[-1] == {"role": "assistant", "content": ""}


def test_the_end_probe_asks_for_the_next_tokens_logprobs_after_the_callers_words(server, settings) -> None:
    """With the remote model's tokenizer (llm.tokenizer) a turn's end probe is a /completions request for one token's
    logprobs, on the chat rendered up to the caller's words; P(end) sums the end tokens among them."""
    from transformers import AutoTokenizer

    from voicepipe.llm.remote.probe import EndProbe
    from voicepipe.models import resolve_model

    base, script = server
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(settings.models.llm, "llm", settings.paths.models_dir))
    settings = load_settings(overrides={"llm": {"backend": "openai", "base_url": base}})
    engine = RemoteEngine(settings.llm, EndProbe(tokenizer))
    engine.start()
    assert engine.scores_words

    async def run():
        session = engine.open_session("Be brief.")
        gen = engine.generate(session, [{"role": "user", "content": "Book a table, please."}], end_probe=True)
        async for _ in gen:
            pass
        return await gen.end_prob, gen.stats.end_prob

    script.requests.clear()
    value, recorded = asyncio.run(run())
    assert value == recorded == pytest.approx(0.75)  # . ? and <|im_end|>; " and" is no end
    probe = next(body for _, body in script.requests if "prompt" in body)
    assert probe["prompt"].endswith("<|im_start|>user\nBook a table, please")  # the words, less their full stop
    assert probe["prompt"].startswith("<|im_start|>system\nBe brief.")
    assert (probe["max_tokens"], probe["logprobs"], probe["temperature"]) == (1, 20, 0.0)


def test_a_request_cancelled_before_it_ran_frees_the_session_and_wakes_its_reader(server) -> None:
    base, _ = server
    engine = engine_for(base)

    async def run():
        session = engine.open_session()
        gen = engine.generate(session, [{"role": "user", "content": "Hi"}])
        gen.cancel()  # before the event loop ever ran the request
        pieces = [piece async for piece in gen]  # ends at once, no hang
        await asyncio.sleep(0)
        engine.rollback_reply(session, 0)  # the session is idle again and has its (empty) reply
        return session, pieces, gen

    session, pieces, gen = asyncio.run(asyncio.wait_for(run(), 5))
    assert pieces == [] and gen.finish_reason == "cancelled" and not session.busy
    assert engine.counters["cancelled"] == 1


def test_tools_are_refused_over_a_remote_backend(server) -> None:
    """A remote server's tool calls are not read yet: the settings refuse calls.tools with a remote backend, and a
    call that brings its own tools gets a clear error rather than a reply that silently ignores them."""
    base, _ = server
    with pytest.raises(SettingsError, match="need the in-process engine"):
        load_settings(overrides={"llm": {"backend": "openai", "base_url": base}, "calls": {"tools": ["end_call"]}})
    engine = engine_for(base)

    async def run():
        session = engine.open_session()
        with pytest.raises(InvalidRequestError, match="tools are not supported over a remote"):
            engine.generate(session, [{"role": "user", "content": "Bye"}], tools=[{"type": "function"}])
        gen, pieces = await reply(engine, session, "Hi")  # the session is untouched: the next turn streams
        return gen, pieces

    gen, pieces = asyncio.run(run())
    assert gen.text == "Hello there." and gen.tool_calls == []
