"""Tool calls, the pure part (voicepipe/llm/tools.py): the tools a request offers, tool_choice, what the model is
told, the grammar's shape, and a reply split into a call as it streams. The grammar driven token by token with
the real tokenizer is in tests/e2e/test_json_constraint.py; the engine and the API in tests/e2e/test_openai_api.py."""

from __future__ import annotations

import json

import pytest

from voicepipe.llm.errors import InvalidRequestError
from voicepipe.llm.tools import (
    CallSplitter,
    ToolSpec,
    call_grammar,
    messages_with_tools,
    parse_tools,
    render_call,
    resolve_choice,
    tools_text,
    with_tools,
)

ORDER = {"type": "function", "function": {"name": "lookup_order", "description": "Find an order.",
                                          "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}


def test_tools_come_in_openai_or_flat_shape_and_bad_ones_are_refused() -> None:
    flat = {"name": "end_call", "description": "Hang up."}
    specs = parse_tools([ORDER, flat, ToolSpec("transfer_call")])
    assert [s.name for s in specs] == ["lookup_order", "end_call", "transfer_call"]
    assert specs[1].schema == {"type": "object", "properties": {}}  # no parameters: an empty object
    for bad in ([{"name": "has space"}], [{"name": "x", "parameters": {"type": "array"}}], [ORDER, ORDER],
                [{"type": "retrieval", "function": {"name": "x"}}], [42], "end_call", [{"description": "no name"}]):
        with pytest.raises(InvalidRequestError):
            parse_tools(bad)


def test_tool_choice() -> None:
    specs = parse_tools([ORDER])
    assert resolve_choice(None, specs) == "auto" and resolve_choice(None, []) == "none"
    assert resolve_choice({"type": "function", "function": {"name": "lookup_order"}}, specs) == "lookup_order"
    assert resolve_choice("required", specs) == "required"
    for bad, tools in (("pizza", specs), ("required", []), ({"type": "function"}, specs), (3, specs)):
        with pytest.raises(InvalidRequestError):
            resolve_choice(bad, tools)


def test_the_system_prompt_describes_the_tools_and_the_call_format() -> None:
    specs = parse_tools([ORDER])
    text = tools_text(specs)
    assert '{"name":"lookup_order","description":"Find an order."' in text and "<tool_call>" in text
    assert with_tools("Be brief.", specs).startswith("Be brief.\n\n# Tools")
    assert with_tools("Be brief.", []) == "Be brief."
    assert messages_with_tools([{"role": "user", "content": "hi"}], specs)[0] == {"role": "system",
                                                                                 "content": text}
    system = messages_with_tools([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                                 specs)
    assert system[0]["content"] == with_tools("Be brief.", specs) and len(system) == 2


def test_the_grammar_offers_what_the_choice_allows() -> None:
    specs = parse_tools([ORDER, {"name": "end_call"}])
    auto, required, named = (call_grammar(specs, c) for c in ("auto", "required", "end_call"))
    assert "start: call | TEXT" in auto and "start: call\n" in required
    assert '"name\\":\\"lookup_order' in required and '"name\\":\\"end_call' in required
    assert "lookup_order" not in named and "end_call" in named
    assert '"whitespace_flexible": false' in required  # compact arguments: what render_call writes back
    assert "start: TEXT" in call_grammar(specs, "none")  # text that does not start like a call
    assert call_grammar([], "none") is None
    assert '"Hi."' in call_grammar([], "none", prefix="Hi.")
    with pytest.raises(InvalidRequestError):
        call_grammar(specs, "auto", prefix="Hi.")


def feed(text: str, steps: list[int]) -> tuple[CallSplitter, list]:
    """Feed `text` to a splitter in growing prefixes (ending at each of `steps`), then whole and final."""
    splitter, deltas = CallSplitter(), []
    for end in [*steps, len(text)]:
        if splitter.decide(text[:end]):
            deltas.append(splitter.delta(text[:end], final=end == len(text)))
    return splitter, [d for d in deltas if d is not None]


def test_a_call_streams_its_name_first_then_its_arguments_without_the_markup() -> None:
    arguments = '{"id":"42}</tool_call>","n":[1,2]}'  # markup inside a string must not end it early
    text = render_call("lookup_order", arguments)
    splitter, deltas = feed(text, list(range(1, len(text), 3)))
    assert deltas[0].id == splitter.call.id and deltas[0].name == "lookup_order"
    assert all(d.id is None and d.name is None for d in deltas[1:])
    assert "".join(d.arguments for d in deltas) == arguments
    assert splitter.calls[0].arguments == arguments and json.loads(arguments)
    assert splitter.calls[0].parsed() == {"id": "42}</tool_call>", "n": [1, 2]}


def test_a_text_reply_is_not_a_call_and_a_cut_call_keeps_what_it_has() -> None:
    splitter = CallSplitter()
    assert splitter.decide("") is None and splitter.decide("Sure") is False and splitter.calls == []
    cut = '<tool_call>{"name":"lookup_order","arguments":{"id":"4'
    splitter, deltas = feed(cut, [5, 20])
    assert splitter.calls[0].arguments == '{"id":"4' and splitter.calls[0].parsed() == {}


def test_render_call_puts_a_call_back_as_the_model_wrote_it() -> None:
    assert render_call("end_call", "") == '<tool_call>{"name":"end_call","arguments":{}}</tool_call>'
    assert render_call("f", '{"a":"\\u2265"}') == '<tool_call>{"name":"f","arguments":{"a":"\\u2265"}}</tool_call>'
