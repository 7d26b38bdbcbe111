"""JSON constraints with the real tokenizer, driven by a random 'model' that picks any allowed token."""

import json

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from voicepipe.llm.constraints import GrammarTokenizer, JsonConstraint, ToolConstraint, constraint_for
from voicepipe.llm.errors import InvalidRequestError
from voicepipe.llm.tools import CallSplitter, call_grammar, parse_tools, render_call
from voicepipe.models import resolve_model

pytestmark = pytest.mark.e2e

SCHEMA = {"type": "object", "required": ["name", "guests"], "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "guests": {"type": "integer"}}}


@pytest.fixture(scope="module")
def tokenizers(settings):
    hf = AutoTokenizer.from_pretrained(resolve_model(settings.models.llm, "llm", settings.paths.models_dir))
    return hf, GrammarTokenizer(hf)


def ramble(constraint, hf, max_tokens, seed):
    """Pick uniformly among allowed tokens (a worst-case model) until EOS or the budget runs out."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(max_tokens):
        allowed = constraint.allowed(len(hf)).nonzero().flatten()
        token = int(allowed[torch.randint(len(allowed), (1,), generator=gen)])
        if token == hf.eos_token_id:
            break
        constraint.accept(token)
        out.append(token)
    return hf.decode(out)


@pytest.mark.parametrize("seed", range(10))
def test_rambling_output_still_closes_within_budget(tokenizers, seed):
    hf, grammar = tokenizers
    text = ramble(JsonConstraint(grammar, max_tokens=60), hf, 60, seed)
    assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("seed", range(5))
def test_schema_output_validates_within_budget(tokenizers, seed):
    hf, grammar = tokenizers
    text = ramble(constraint_for({"type": "json_schema", "schema": SCHEMA}, grammar, 60), hf, 60, seed)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_without_budget_pressure_the_model_chooses(tokenizers):
    hf, grammar = tokenizers
    constraint = JsonConstraint(grammar, max_tokens=1000)
    assert not constraint.allowed(len(hf))[hf.encode("Hello")[0]]  # not JSON
    brace = hf.encode("{")[0]
    assert constraint.allowed(len(hf))[brace]
    constraint.accept(brace)
    quote = hf.encode('"')[0]
    constraint.accept(quote)
    assert constraint.allowed(len(hf)).sum() > 1000  # inside a key: the model may write almost anything


def test_plain_text_has_no_constraint_and_bad_schema_is_rejected(tokenizers):
    _, grammar = tokenizers
    assert constraint_for({"type": "text"}, grammar) is None
    with pytest.raises(InvalidRequestError):
        JsonConstraint(grammar, {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})


# -- tool calls: the same worst-case model under a tool grammar -----------------------------------------------------
TOOL_SPECS = parse_tools([
    {"type": "function", "function": {"name": "book", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "end_call", "parameters": {"type": "object", "properties": {}}}},
])


def split(text: str) -> CallSplitter:
    splitter = CallSplitter()
    if splitter.decide(text):
        splitter.delta(text, final=True)
    return splitter


@pytest.mark.parametrize("seed", range(8))
def test_a_rambling_required_call_is_complete_and_schema_valid_within_budget(tokenizers, seed):
    hf, grammar = tokenizers
    text = ramble(ToolConstraint(grammar, call_grammar(TOOL_SPECS, "required"), 60), hf, 60, seed)
    (call,) = split(text).calls
    assert text == render_call(call.name, call.arguments)
    schema = next(t.schema for t in TOOL_SPECS if t.name == call.name)
    jsonschema.validate(json.loads(call.arguments), schema)


@pytest.mark.parametrize("seed", range(4))
def test_auto_is_text_or_one_valid_call(tokenizers, seed):
    hf, grammar = tokenizers
    text = ramble(ToolConstraint(grammar, call_grammar(TOOL_SPECS, "auto"), 60), hf, 60, seed)
    splitter = split(text)
    if splitter.is_call:
        jsonschema.validate(json.loads(splitter.calls[0].arguments), SCHEMA if splitter.calls[0].name == "book"
                            else {"type": "object"})
    else:
        assert not text.startswith("<")


def test_a_text_reply_under_auto_is_not_cut_short_by_the_closing_rule(tokenizers):
    """Near its budget a call is closed with the shortest tokens; a reply that is text is left alone."""
    hf, grammar = tokenizers
    constraint = ToolConstraint(grammar, call_grammar(TOOL_SPECS, "auto"), max_tokens=4)
    for token in hf.encode("Sure, I can"):
        assert constraint.allowed(len(hf))[token]
        constraint.accept(token)
    assert constraint.allowed(len(hf)).sum() > 1000


def test_a_reply_prefix_is_forced_then_free(tokenizers):
    hf, grammar = tokenizers
    constraint = ToolConstraint(grammar, call_grammar([], "none", prefix="Order 4217 has shipped."), 40)
    out = []
    while True:
        allowed = constraint.allowed(len(hf)).nonzero().flatten().tolist()
        if len(allowed) > 1000:
            break
        out.append(allowed[0])
        constraint.accept(allowed[0])
    assert hf.decode(out) == "Order 4217 has shipped."
