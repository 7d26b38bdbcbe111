"""The engine's request handling with the real model: bad input, cancellation, stop strings, sampling,
compaction and overload. Every bad request gets a clear exception and the engine keeps serving."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.llm_helpers import start_engine
from voicepipe.errors import VoicepipeError
from voicepipe.llm.errors import (
    ContextOverflowError,
    EmptyMessagesError,
    InvalidSamplingError,
    OverloadedError,
    SessionBusyError,
    UnknownRoleError,
    UnknownTierError,
)

pytestmark = pytest.mark.e2e

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def engine(engine_model):
    engine = start_engine(engine_model, weights="fp32")  # a raw completion is compared with model.generate
    yield engine
    engine.stop()


async def collect(gen) -> str:
    return "".join([p.text async for p in gen])


async def still_serves(engine) -> None:
    text = await collect(engine.generate(None, HI, max_tokens=4))
    assert text


@pytest.mark.parametrize(("messages", "kwargs", "error", "words"), [
    ([], {}, EmptyMessagesError, "no messages"),
    ([{"role": "robot", "content": "hi"}], {}, UnknownRoleError, "unknown role 'robot'"),
    (HI, {"max_tokens": -3}, InvalidSamplingError, "max_tokens"),
    (HI, {"tier": "gold"}, UnknownTierError, "unknown tier 'gold'"),
])
async def test_bad_input_is_rejected_clearly_and_engine_keeps_serving(engine, messages, kwargs, error, words):
    with pytest.raises(error, match=words) as info:
        async for _ in engine.generate(None, messages, **{"max_tokens": 4, **kwargs}):
            pass
    assert isinstance(info.value, VoicepipeError) and info.value.fix
    await still_serves(engine)


async def test_prompt_longer_than_context_without_compaction(engine_model):
    engine = start_engine(engine_model, context_tokens=64, compaction=False)
    try:
        long = [{"role": "user", "content": "word " * 200}]
        with pytest.raises(ContextOverflowError, match="compaction is off"):
            engine.generate(None, long, max_tokens=4)
        session = engine.open_session()
        with pytest.raises(ContextOverflowError):
            engine.generate(session, long, max_tokens=4)
        assert session.ids == [] and not session.busy  # the failed turn left nothing behind
        await still_serves(engine)
    finally:
        engine.stop()


async def test_compaction_keeps_system_prompt_and_recent_turns(engine_model):
    engine = start_engine(engine_model, context_tokens=160, compaction=True, compaction_target=0.8)
    try:
        session = engine.open_session("You are terse.")
        for i in range(6):
            await collect(engine.generate(session, [{"role": "user", "content": f"Turn {i}: say the word {i}."}],
                                          max_tokens=8, ignore_eos=True))
            assert len(session.ids) <= 160
        assert engine.stats()["compactions"] >= 1 and session.compactions >= 1
        history = engine.history(session)
        assert history[0] == {"role": "system", "content": "You are terse."}
        assert [m["role"] for m in history[-2:]] == ["user", "assistant"]
        assert any("Turn 5" in m["content"] for m in history)
        assert not any("Turn 0" in m["content"] for m in history)
    finally:
        engine.stop()


async def test_cancel_by_leaving_the_loop(engine):
    session = engine.open_session()
    gen = engine.generate(session, [{"role": "user", "content": "Count to one hundred."}], max_tokens=200,
                          ignore_eos=True)
    async for _ in gen:
        break  # the dropped iterator is closed by asyncio, which cancels the request
    for _ in range(200):
        if not session.busy:
            break
        await asyncio.sleep(0.01)
    assert not session.busy and gen.request.finish_reason == "cancelled"
    assert len(gen.request.output_ids) < 20
    # the session is usable again, and its history has the partial reply
    await collect(engine.generate(session, [{"role": "user", "content": "Stop."}], max_tokens=3))
    engine.close_session(session)


async def test_task_cancellation_cancels_the_request(engine):
    gen = engine.generate(None, [{"role": "user", "content": "Tell me a long story."}], max_tokens=200,
                          ignore_eos=True)

    async def consume():
        async for _ in gen:
            pass

    task = asyncio.ensure_future(consume())
    while not gen.token_ids:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if gen.request.finish_reason:
            break
        await asyncio.sleep(0.01)
    assert gen.request.finish_reason == "cancelled" and len(gen.request.output_ids) < 30


async def test_one_generation_per_session(engine):
    session = engine.open_session()
    gen = engine.generate(session, HI, max_tokens=4)
    with pytest.raises(SessionBusyError):
        engine.generate(session, HI, max_tokens=4)
    await collect(gen)
    engine.close_session(session)


async def test_stop_string_cuts_text_and_history(engine):
    full = engine.generate(None, [{"role": "user", "content": "What is the capital of France?"}], max_tokens=16,
                           ignore_eos=True)
    text = await collect(full)
    words = text.split()
    assert len(words) >= 3
    stop = " " + words[2]
    session = engine.open_session()
    gen = engine.generate(session, [{"role": "user", "content": "What is the capital of France?"}],
                          max_tokens=16, ignore_eos=True, stop=[stop])
    cut = await collect(gen)
    assert cut == text[:text.index(stop)] and gen.finish_reason == "stop"
    assert len(gen.request.output_ids) < 16
    # the session keeps only the tokens up to the stop string
    assert session.ids[gen.stats.prompt_tokens:session.reply_end] == gen.request.output_ids
    engine.close_session(session)


async def test_seeded_sampling_is_reproducible(engine):
    kw = {"max_tokens": 10, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "ignore_eos": True}
    a = engine.generate(None, HI, seed=7, **kw)
    b = engine.generate(None, HI, seed=7, **kw)
    await asyncio.gather(collect(a), collect(b))
    assert a.token_ids == b.token_ids and len(a.token_ids) == 10
    outs = set()
    for seed in range(4):
        g = engine.generate(None, HI, seed=100 + seed, **kw)
        await collect(g)
        outs.add(tuple(g.token_ids))
    assert len(outs) > 1


async def test_multibyte_characters_stream_whole(engine):
    gen = engine.generate(None, [{"role": "user", "content": "Repeat exactly: 日本語 🎉 café"}], max_tokens=20)
    pieces = [p async for p in gen]
    # only the last piece (flushed at max_tokens) may end inside a character
    assert all("\ufffd" not in p.text for p in pieces[:-1])
    # a character spread over several byte-level tokens came out whole, in one piece
    assert any(len(p.token_ids) > 1 and any(ord(c) > 0x2000 for c in p.text) for p in pieces)
    assert "".join(p.text for p in pieces) == engine.tokenizer.decode(
        [t for t in gen.token_ids if t not in gen.request.stop_ids], skip_special_tokens=True)


async def test_overloaded_when_not_admitted_in_time(engine_model):
    engine = start_engine(engine_model, max_running=1, admission_timeout_s=0.2)
    try:
        first = engine.generate(None, HI, max_tokens=400, ignore_eos=True)
        task = asyncio.ensure_future(collect(first))
        while not first.token_ids:
            await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError, match="could not admit"):
            await collect(engine.generate(None, HI, max_tokens=4))
        assert engine.stats()["overloaded"] == 1
        first.cancel()
        await task
    finally:
        engine.stop()


async def test_raw_completion_matches_generate_and_hits_prefix_cache(engine, engine_model):
    model_ref, tokenizer = engine_model  # the engine's own model: plain generate still runs transformers' forward
    prompt = "The three primary colours are red, yellow and"
    gen = engine.complete(prompt, max_tokens=8)
    await collect(gen)
    ids = tokenizer(prompt)["input_ids"]
    with torch.inference_mode():
        ref = model_ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8)[0, len(ids):].tolist()
    assert gen.token_ids == ref
    long_prompt = "Once upon a time, in a small village by the sea, there lived an old fisherman. " * 4
    a = engine.complete(long_prompt, max_tokens=2)
    await collect(a)
    b = engine.complete(long_prompt + "He", max_tokens=2)
    await collect(b)
    bs = engine.blocks.block_size
    assert a.stats.cached_prompt_tokens == 0 or a.stats.cached_prompt_tokens < a.stats.prompt_tokens
    assert b.stats.cached_prompt_tokens >= (a.stats.prompt_tokens // bs - 1) * bs > 0
    with pytest.raises(EmptyMessagesError):
        engine.complete("", max_tokens=2)
    await still_serves(engine)


def test_what_a_grammar_forces_takes_no_decode_step_of_its_own(engine):
    """A named tool call's head and a reply prefix are appended as the grammar forces them and computed in one
    chunk: the request takes fewer steps than it has tokens, and says exactly what greedy decoding would."""
    tools = [{"name": "lookup_order", "parameters": {"type": "object", "additionalProperties": False,
                                                     "required": ["order_id"],
                                                     "properties": {"order_id": {"type": "string",
                                                                                 "pattern": "^[0-9]{4}$"}}}}]
    ask = [{"role": "user", "content": "Where is my order 4217?"}]

    async def run(**options):
        steps = engine.counters["steps"]
        gen = engine.generate(None, ask, max_tokens=60, **options)
        async for _ in gen:
            pass
        return gen, engine.counters["steps"] - steps

    call, call_steps = asyncio.run(run(tools=tools, tool_choice="lookup_order"))
    assert [(c.name, c.arguments) for c in call.tool_calls] == [("lookup_order", '{"order_id":"4217"}')]
    assert call_steps < call.stats.output_tokens / 2, (call_steps, call.stats.output_tokens)
    said, said_steps = asyncio.run(run(reply_prefix="Your order has shipped and arrives on Friday."))
    assert said.text.startswith("Your order has shipped and arrives on Friday.")
    assert said_steps < said.stats.output_tokens, (said_steps, said.stats.output_tokens)
