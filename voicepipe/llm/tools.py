"""Tool calls: the tools a request offers, how the model is told about them, the grammar that makes its call exact,
and the reply split into content or a call as it streams. Pure: no model, no tokenizer (the grammar is compiled
against the tokenizer in `constraints.py`).

A call is written in the reply as one line of compact JSON between markers, the format the system prompt shows:

    <tool_call>{"name":"lookup_order","arguments":{"order_id":"4217"}}</tool_call>

With ``tool_choice`` "auto" the grammar lets the reply be either plain text (its first character is not ``<``) or
exactly one call; "required" allows only a call to one of the tools, a tool's name only a call to that tool, and
"none" offers no call at all. The arguments are constrained to the tool's JSON schema (llguidance), so a call the
engine returns always parses and validates.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from voicepipe.llm.errors import InvalidRequestError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_CALL_TAIL = "}" + CALL_CLOSE  # what follows the arguments object
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")
_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
_TEXT = r"TEXT: /[^<](.|\n)*/"  # a reply that is not a call


@dataclass(frozen=True)
class ToolSpec:
    """One tool the model may call: its name, what it does, and its arguments' JSON schema (an object)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None

    @property
    def schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else _EMPTY_OBJECT


@dataclass
class ToolCall:
    """A call the model made: `arguments` is its JSON text (schema-valid when it came out of the grammar)."""

    id: str
    name: str
    arguments: str

    @property
    def complete(self) -> bool:
        """Whether the arguments are a whole JSON object (a call cut short by max_tokens is not)."""
        try:
            return isinstance(json.loads(self.arguments), dict)
        except ValueError:
            return False

    def parsed(self) -> dict[str, Any]:
        """The arguments as an object ({} when the text is not a JSON object, e.g. a call cut by max_tokens)."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass
class ToolCallDelta:
    """A piece of a call as it streams: the first one carries its id and name, every one a piece of arguments."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


# -- the request ---------------------------------------------------------------------------------------------------
def parse_tools(raw: Any) -> list[ToolSpec]:
    """Tools in OpenAI's shape (``{"type": "function", "function": {name, description, parameters}}``), the flat
    shape (``{name, description, parameters}``) or `ToolSpec`s; InvalidRequestError for anything else."""
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        raise InvalidRequestError("tools must be a list.", "pass a list of function tools.")
    specs: list[ToolSpec] = []
    for i, item in enumerate(raw):
        spec = item if isinstance(item, ToolSpec) else _spec_from_dict(i, item)
        if not _NAME.fullmatch(spec.name):
            raise InvalidRequestError(f"tools[{i}]: name {spec.name!r} is not 1-64 letters, digits, _ or -.",
                                      "rename the tool.")
        if not isinstance(spec.schema, dict) or spec.schema.get("type", "object") != "object":
            raise InvalidRequestError(f"tools[{i}] ({spec.name}): parameters must be a JSON schema of an object.",
                                      'pass e.g. {"type": "object", "properties": {...}}.')
        if any(s.name == spec.name for s in specs):
            raise InvalidRequestError(f"tools[{i}]: a second tool named {spec.name!r}.", "give each tool its name.")
        specs.append(spec)
    return specs


def _spec_from_dict(i: int, item: Any) -> ToolSpec:
    if not isinstance(item, dict):
        raise InvalidRequestError(f"tools[{i}] is not an object.", "pass {type: function, function: {...}}.")
    if "function" in item:
        if item.get("type", "function") != "function":
            raise InvalidRequestError(f"tools[{i}]: type {item.get('type')!r} is not supported.",
                                      "only function tools are.")
        item = item["function"]
        if not isinstance(item, dict):
            raise InvalidRequestError(f"tools[{i}].function is not an object.", "pass {name, parameters}.")
    name, description, parameters = item.get("name"), item.get("description") or "", item.get("parameters")
    if not isinstance(name, str) or not isinstance(description, str) \
            or not (parameters is None or isinstance(parameters, dict)):
        raise InvalidRequestError(f"tools[{i}] needs a name (text), an optional description (text) and optional "
                                  "parameters (a JSON schema object).", "fix the tool's definition.")
    return ToolSpec(name, description, parameters)


def resolve_choice(choice: Any, tools: list[ToolSpec]) -> str:
    """``tool_choice`` as "none", "auto", "required" or a tool's name (default: "auto" with tools, else "none")."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, dict):  # {"type": "function", "function": {"name": ...}}
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise InvalidRequestError("tool_choice as an object must name a function.",
                                      'pass {"type": "function", "function": {"name": ...}}.')
        choice = name
    if not isinstance(choice, str):
        raise InvalidRequestError("tool_choice must be none, auto, required or a function.", "fix tool_choice.")
    if choice in CHOICES:
        if choice != "none" and not tools:
            raise InvalidRequestError(f"tool_choice {choice!r} needs tools.", "pass tools, or drop tool_choice.")
        return choice
    if not any(t.name == choice for t in tools):
        raise InvalidRequestError(f"tool_choice names {choice!r}, which is not one of the tools.",
                                  "name one of the tools passed.")
    return choice


# -- what the model sees -------------------------------------------------------------------------------------------
def tools_text(tools: list[ToolSpec]) -> str:
    """The system prompt's description of the tools and of how to call one."""
    lines = ["# Tools", "", "You can call one of these tools instead of answering. To call one, reply with only:",
             f'{CALL_OPEN}{{"name":"<tool name>","arguments":<its arguments as a JSON object>}}{CALL_CLOSE}',
             "The result comes back in a message from the tool; then answer the user.", "", "<tools>"]
    for tool in tools:
        lines.append(json.dumps({"name": tool.name, "description": tool.description, "parameters": tool.schema},
                                separators=(",", ":")))
    lines.append("</tools>")
    return "\n".join(lines)


def with_tools(system_prompt: str | None, tools: list[ToolSpec]) -> str | None:
    """A system prompt followed by the tools' description (unchanged without tools)."""
    if not tools:
        return system_prompt
    return f"{system_prompt}\n\n{tools_text(tools)}" if system_prompt else tools_text(tools)


def messages_with_tools(messages: list[dict[str, str]], tools: list[ToolSpec]) -> list[dict[str, str]]:
    """A whole conversation with the tools described in its system message (one is added if it has none)."""
    if not tools:
        return messages
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": with_tools(messages[0]["content"], tools)}, *messages[1:]]
    return [{"role": "system", "content": tools_text(tools)}, *messages]


def render_call(name: str, arguments: str) -> str:
    """A call as the model writes it (how an API client's earlier `tool_calls` are put back in the conversation:
    the arguments verbatim, so a conversation sent back as it came hits the cache)."""
    return f'{CALL_OPEN}{{"name":{json.dumps(name)},"arguments":{arguments.strip() or "{}"}}}{CALL_CLOSE}'


# -- the grammar ---------------------------------------------------------------------------------------------------
def call_grammar(tools: list[ToolSpec], choice: str, prefix: str = "") -> str | None:
    """The Lark grammar (llguidance's dialect) of a reply under ``choice`` (None without tools or a prefix). Under
    "none" the reply is text that does not start like a call (a model that has seen calls in its conversation may
    copy one); with ``prefix`` it is text that starts with exactly ``prefix``."""
    if prefix:
        if choice != "none" and tools:
            raise InvalidRequestError("a reply prefix is for text replies.", 'pass tool_choice="none" with it.')
        return "\n".join(["%llguidance {}", f"start: {json.dumps(prefix)} REST?", r"REST: /(.|\n)+/"])
    if not tools:
        return None
    if choice == "none":
        return "\n".join(["%llguidance {}", "start: TEXT", _TEXT])
    offered = tools if choice in ("auto", "required") else [t for t in tools if t.name == choice]
    rules, alternatives = [], []
    for i, tool in enumerate(offered):
        head = f'{CALL_OPEN}{{"name":"{tool.name}","arguments":'
        alternatives.append(f"{json.dumps(head)} args_{i} {json.dumps(_CALL_TAIL)}")
        schema = {**tool.schema, "x-guidance": {"whitespace_flexible": False}}
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
    start = "start: call | TEXT" if choice == "auto" else "start: call"
    lines = ["%llguidance {}", start, "call: " + " | ".join(alternatives), *rules]
    if choice == "auto":
        lines.append(_TEXT)
    return "\n".join(lines)


# -- the reply -----------------------------------------------------------------------------------------------------
class CallSplitter:
    """Tells whether a reply is a tool call as its text grows, and cuts the call into deltas. A reply whose first
    character is ``<`` is a call (the grammar allows no other); its arguments are held back by the length of the
    markup that follows them, so a delta never holds any of it."""

    def __init__(self) -> None:
        self.is_call: bool | None = None  # None: no text yet
        self.call: ToolCall | None = None
        self._args_start = 0
        self._args_sent = 0

    def decide(self, text: str) -> bool | None:
        """Whether the reply whose text so far is ``text`` is a call (None: not known yet)."""
        if self.is_call is None and text:
            self.is_call = text.startswith("<")
        return self.is_call

    def delta(self, text: str, final: bool = False) -> ToolCallDelta | None:
        """What ``text`` (the call's text so far; ``final``: all of it) adds to the call."""
        first = None
        if self.call is None:
            match = re.match(re.escape(CALL_OPEN) + r'\{"name":"([A-Za-z0-9_-]+)","arguments":', text)
            if match is None:
                return None
            self.call = ToolCall(f"call_{uuid.uuid4().hex[:24]}", match.group(1), "")
            self._args_start = self._args_sent = match.end()
            first = ToolCallDelta(0, "", self.call.id, self.call.name)
        end = len(text)
        if not final or text.endswith(_CALL_TAIL):  # a call cut short (max_tokens) keeps all it has
            end -= len(_CALL_TAIL)
        end = max(end, self._args_sent)
        piece = text[self._args_sent:end]
        self._args_sent = end
        self.call.arguments = text[self._args_start:end]
        if first is not None:
            first.arguments = piece
            return first
        return ToolCallDelta(0, piece) if piece else None

    @property
    def calls(self) -> list[ToolCall]:
        return [self.call] if self.call is not None else []
