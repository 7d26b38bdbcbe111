"""The OpenAI-compatible API, driven by the official `openai` SDK against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from tests.net_helpers import in_process_server
from voicepipe.config import load_settings
from voicepipe.llm.bench_tiers import HISTORY

pytestmark = pytest.mark.e2e

API_KEY = "test-key"
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server():
    settings = load_settings(overrides={"server": {"api_key": API_KEY}})
    with in_process_server(settings) as (base_url, app):
        yield base_url, app.state.runtime.engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def engine_greedy(engine, messages, max_tokens):
    async def run():
        generation = engine.generate(None, messages, max_tokens=max_tokens, temperature=0.0)
        return "".join([piece.text async for piece in generation])

    return asyncio.run(run())


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_non_streaming_equals_engine_greedy(server, client):
    messages = [{"role": "user", "content": "Name three colors of the rainbow."}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content == engine_greedy(server[1], messages, 24)
    assert reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.service_tier == "default"


def test_chat_streaming_equals_non_streaming(client):
    messages = [{"role": "user", "content": "Say something about the sea."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=20)
    stream = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=20,
                                            stream=True, stream_options={"include_usage": True},
                                            service_tier="priority")
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[0].service_tier == "priority"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_completions_endpoint(client):
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert reply.choices[0].text.strip()
    assert reply.usage.prompt_tokens > 0


def test_completions_logprobs_are_the_greedy_tokens_and_their_alternatives(client):
    kwargs = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "logprobs": 5}
    reply = client.completions.create(**kwargs)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(4)]
    for token, chosen, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 0 < len(top) <= 5 and top[token] == chosen == max(top.values())  # greedy: the likeliest
        assert sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-6
    chunks = list(client.completions.create(**kwargs, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == logprobs.tokens
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError):
        client.completions.create(**{**kwargs, "logprobs": 21})


def test_cached_tokens_grow_over_a_resent_conversation(client):
    messages = [{"role": "system", "content": HISTORY}]  # a realistic ~300-token system prompt
    cached = []
    for turn, question in enumerate(["Hi, I'd like a table.", "For four people.", "Tonight at eight.",
                                     "Is there parking?", "Great, thank you."]):
        messages.append({"role": "user", "content": question})
        reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=16)
        usage = reply.usage
        cached.append(usage.prompt_tokens_details.cached_tokens)
        if turn >= 1:
            assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens, usage
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    assert all(b > a for a, b in zip(cached, cached[1:], strict=False)), cached


def test_json_object_mode_always_parses(client):
    def ask(seed):
        return client.chat.completions.create(
            model=MODEL, seed=seed, temperature=1.0, max_tokens=64, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": f"Describe pet number {seed} as JSON."}])

    with ThreadPoolExecutor(max_workers=20) as pool:  # concurrent, so the engine batches them
        replies = list(pool.map(ask, range(20)))
    for reply in replies:
        content = reply.choices[0].message.content
        assert isinstance(json.loads(content), dict), content


def test_json_schema_mode_validates(client):
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "guests", "time"],
              "properties": {"name": {"type": "string", "maxLength": 30},
                             "guests": {"type": "integer", "minimum": 1, "maximum": 20},
                             "time": {"type": "string", "enum": ["18:00", "19:00", "20:00"]}}}

    def ask(seed):
        return client.chat.completions.create(
            model=MODEL, seed=seed, temperature=1.0, max_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "booking", "schema": schema}},
            messages=[{"role": "user", "content": "Book a table for Ada, 4 guests, at 7pm."}])

    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(ask, range(8)))
    for reply in replies:
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n": 2}, openai.BadRequestError),
        ({"model": "gpt-17"}, openai.NotFoundError),
        ({"max_tokens": -5}, openai.BadRequestError),
        ({"messages": "not a list"}, openai.BadRequestError),
        ({"temperature": "hot"}, openai.BadRequestError),
        ({"service_tier": "platinum"}, openai.BadRequestError),
    ],
)
def test_errors_map_to_sdk_exceptions(client, kwargs, error):
    args = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kwargs}
    with pytest.raises(error) as info:
        client.chat.completions.create(**args)
    body = info.value.body
    assert set(body) >= {"message", "type", "param", "code"}, body


def test_bad_key_is_401(server):
    bad = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_unknown_fields_are_ignored(client):
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           extra_body={"frobnicate": True, "logit_bias": {}})
    assert reply.choices[0].message.content is not None


def test_disconnect_mid_stream_frees_the_request(server):
    base_url, engine = server
    body = {"model": MODEL, "stream": True, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        assert engine.stats()["running"] + engine.stats()["waiting"] >= 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (engine.stats()["running"] or engine.stats()["waiting"]):
        time.sleep(0.05)
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0, stats


def test_flex_completes_while_priority_keeps_arriving(client):
    done = threading.Event()
    priority_served = []

    def priority_load():
        while not done.is_set():
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Quick: hello?"}],
                                           max_tokens=8, temperature=0, service_tier="priority")
            priority_served.append(time.monotonic())

    workers = [threading.Thread(target=priority_load) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.5)
        flex = client.chat.completions.create(model=MODEL, service_tier="flex", max_tokens=48, temperature=0,
                                              messages=[{"role": "user", "content": "Write a long poem."}])
        finished_during_load = not done.is_set()
    finally:
        done.set()
        for worker in workers:
            worker.join()
    assert flex.service_tier == "flex"
    assert flex.usage.completion_tokens > 0
    assert finished_during_load and len(priority_served) >= 3


# -- tools ---------------------------------------------------------------------------------------------------------
ORDER_TOOL = {"type": "function", "function": {
    "name": "lookup_order", "description": "Look up an order's status by its number.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["order_id"],
                   "properties": {"order_id": {"type": "string", "pattern": "^[0-9]{3,8}$"}}}}}
BOOKING_TOOL = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table at the restaurant.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["name", "guests", "time"],
                   "properties": {"name": {"type": "string", "maxLength": 30},
                                  "guests": {"type": "integer", "minimum": 1, "maximum": 20},
                                  "time": {"type": "string", "enum": ["18:00", "19:00", "20:00"]},
                                  "notes": {"type": "array", "maxItems": 3,
                                            "items": {"type": "string", "maxLength": 20}}}}}}
END_TOOL = {"type": "function", "function": {"name": "end_call", "description": "Hang up the phone.",
                                             "parameters": {"type": "object", "properties": {}}}}
TOOLS = [ORDER_TOOL, BOOKING_TOOL, END_TOOL]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def assert_valid_call(call) -> dict:
    """A call names one of the tools, and its arguments parse and validate against that tool's schema."""
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_a_named_tool_choice_returns_a_schema_valid_call(client):
    reply = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=60, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "lookup_order"}},
        messages=[{"role": "user", "content": "Where is my order 4217?"}])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "lookup_order"
    assert assert_valid_call(call) == {"order_id": "4217"}  # the small model copies a number it was given


def test_tool_call_arguments_are_schema_valid_every_time(client):
    """The target: 100 % schema-valid arguments, here over sampled (temperature 1) replies under `required`, whatever
    tool the model picks, and the nested booking schema forced."""
    def ask(args):
        seed, choice = args
        return client.chat.completions.create(
            model=MODEL, seed=seed, temperature=1.0, max_tokens=80, tools=TOOLS, tool_choice=choice,
            messages=[{"role": "user", "content": f"Book a table for Ada, {seed % 6 + 1} guests at 7pm, or look up "
                                                  f"order {4000 + seed}."}])

    jobs = [(seed, "required") for seed in range(6)] + \
        [(seed, {"type": "function", "function": {"name": "book_table"}}) for seed in range(6, 12)]
    with ThreadPoolExecutor(max_workers=12) as pool:  # concurrent, so the engine batches them
        replies = list(pool.map(ask, jobs))
    names = []
    for reply in replies:
        (call,) = reply.choices[0].message.tool_calls
        assert_valid_call(call)
        names.append(call.function.name)
    assert names[6:] == ["book_table"] * 6


def test_streamed_tool_call_deltas_add_up_to_the_whole_call(client):
    args = {"model": MODEL, "temperature": 0, "max_tokens": 80, "tools": TOOLS, "tool_choice": "required",
            "messages": [{"role": "user", "content": "Book a table for Ada, 4 guests, at 7pm."}]}
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls[0]
    chunks = list(client.chat.completions.create(**args, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) > 2, "the arguments should stream in pieces"
    first = deltas[0]
    assert first.id and first.type == "function" and first.function.name == whole.function.name
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    assert "".join(d.function.arguments or "" for d in deltas) == whole.function.arguments
    assert all(not (c.choices[0].delta.content or "") for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert_valid_call(whole)


def test_a_tool_result_goes_back_and_the_model_answers_in_text(server, client):
    messages = [{"role": "user", "content": "Where is my order 4217?"}]
    first = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, tools=TOOLS,
                                           tool_choice="required", messages=messages)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "Order 4217 has shipped; it arrives Friday."}]
    reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=30, tools=TOOLS,
                                           tool_choice="none", messages=messages)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    text = choice.message.content
    assert text and not text.startswith("<"), text  # "none" allows no call, not even one copied as text
    # The call went back into the conversation as the model wrote it: resending the same turns hits the cache.
    again = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=30, tools=TOOLS,
                                           tool_choice="none", messages=messages)
    assert again.choices[0].message.content == text
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * again.usage.prompt_tokens


def test_auto_lets_the_model_answer_in_text(client):
    """Under "auto" the small default model answers in text (it does not start calls on its own; README)."""
    reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=20, tools=TOOLS,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
    message = reply.choices[0].message
    if message.tool_calls:  # a call is allowed, and then it is a valid one
        assert_valid_call(message.tool_calls[0])
    else:
        assert message.content and reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("kwargs", [
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "order_pizza"}}},
    {"tool_choice": "required"},
    {"tools": [{"type": "function", "function": {"name": "bad name!", "parameters": {"type": "object"}}}]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
    {"tools": TOOLS, "response_format": {"type": "json_object"}},
    {"tools": [ORDER_TOOL, ORDER_TOOL]},
])
def test_bad_tool_requests_are_400(client, kwargs):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                       **kwargs)
