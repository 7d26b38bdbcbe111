"""Constrained decoding for JSON mode and tool calls, with llguidance.

llguidance computes the set of allowed next tokens from a grammar (compiled from a JSON schema, or a Lark grammar
with JSON schemas inside for tool calls, see `tools.py`) in Rust, on the CPU, in tens of microseconds per token,
and has no dependency of its own; the mask is applied to the logits on whichever device they live, so the same
code serves CPU and CUDA.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from voicepipe.llm.errors import InvalidRequestError

_ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
_COMPACT = {"whitespace_flexible": False}
# Near the end of the token budget the constraint steers towards the shortest way to finish the JSON
# value: it takes the first of these that the grammar allows (closing a string or container, a
# separator, the shortest values), and leaves the choice to the model only when none is allowed.
_CLOSERS = ['"}', '"]', '"', "}", "]", ":", "0", "null"]
_CLOSING_RESERVE = 24  # tokens kept for closing: enough for a few nesting levels and one key


class GrammarTokenizer:
    """The llguidance view of a tokenizer; building it takes about a second, so build it once."""

    _lock = threading.Lock()

    def __init__(self, hf_tokenizer) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._ll_tokenizer = None
        self.closer_ids: list[int] = []

    def get(self):
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                self._ll_tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer)
                vocab = self._hf_tokenizer.get_vocab()
                by_text = {self._hf_tokenizer.convert_tokens_to_string([tok]): i for tok, i in vocab.items()}
                self.closer_ids = [by_text[text] for text in _CLOSERS if text in by_text]
            return self._ll_tokenizer

    def decode(self, token_id: int) -> str:
        return self._hf_tokenizer.decode([token_id])


class GrammarConstraint:
    """Allows only tokens that keep the output a prefix of a string of ``grammar`` (llguidance's form)."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str, max_tokens: int | None = None) -> None:
        from llguidance import LLMatcher

        self._matcher = LLMatcher(tokenizer.get(), grammar, log_level=0)
        if self._matcher.is_error():
            raise InvalidRequestError(f"unsupported JSON schema: {self._matcher.get_error()}")
        self._closer_ids = tokenizer.closer_ids
        reserve = min(_CLOSING_RESERVE, max_tokens // 2) if max_tokens else 0
        self._closing_after = None if max_tokens is None else max_tokens - reserve
        self._consumed = 0

    def allowed(self, vocab_size: int) -> torch.Tensor:
        """A bool mask over the vocabulary of the tokens allowed next."""
        packed = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(packed, bitorder="little")[:vocab_size]
        mask = np.zeros(vocab_size, dtype=bool)
        mask[: len(bits)] = bits.astype(bool)
        if self._closing_after is not None and self._consumed >= self._closing_after:
            closer = next((t for t in self._closer_ids if t < vocab_size and mask[t]), None)
            if closer is not None:
                mask[:] = False
                mask[closer] = True
        return torch.from_numpy(mask)

    def accept(self, token_id: int) -> None:
        self._matcher.consume_token(token_id)
        self._consumed += 1

    def forced(self) -> list[int]:
        """The tokens the grammar allows no alternative to from here (llguidance's fast-forward tokens): the engine
        appends them without a decode step each, e.g. a tool call's `<tool_call>{"name":"...","arguments":`."""
        return list(self._matcher.compute_ff_tokens())

    @property
    def finished(self) -> bool:
        """True once the output is complete (the only token left is end-of-sequence)."""
        return self._matcher.is_stopped()


class JsonConstraint(GrammarConstraint):
    """Allows only tokens that keep the output a prefix of a JSON value matching ``schema``."""

    def __init__(self, tokenizer: GrammarTokenizer, schema: dict[str, Any] | None = None,
                 max_tokens: int | None = None) -> None:
        from llguidance import LLMatcher

        try:
            grammar = LLMatcher.grammar_from_json_schema(schema or _ANY_JSON_OBJECT, defaults=_COMPACT)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid JSON schema: {exc}") from None
        super().__init__(tokenizer, grammar, max_tokens)


class ToolConstraint(GrammarConstraint):
    """A reply under a tool grammar (`tools.call_grammar`): a call finishes within ``max_tokens``; a reply that
    turned out to be plain text (its first token does not open a call) is left to the model to end."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: str, max_tokens: int | None = None) -> None:
        from llguidance import LLMatcher

        try:
            compiled = LLMatcher.grammar_from_lark(grammar)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid tool parameters: {exc}") from None
        super().__init__(tokenizer, compiled, max_tokens)
        self._decode = tokenizer.decode

    def accept(self, token_id: int) -> None:
        if self._consumed == 0 and not self._decode(token_id).startswith("<"):
            self._closing_after = None
        super().accept(token_id)


def constraint_for(response_format: dict[str, Any] | None, tokenizer: GrammarTokenizer,
                   max_tokens: int | None = None) -> JsonConstraint | None:
    """The constraint for an OpenAI ``response_format`` (None for plain text), finishing within ``max_tokens``."""
    if not response_format or response_format.get("type") in (None, "text"):
        return None
    if response_format["type"] == "json_object":
        return JsonConstraint(tokenizer, max_tokens=max_tokens)
    if response_format["type"] == "json_schema":
        return JsonConstraint(tokenizer, response_format.get("schema") or _ANY_JSON_OBJECT, max_tokens)
    raise InvalidRequestError(f"unknown response_format type {response_format['type']!r}")
