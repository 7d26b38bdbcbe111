"""Chat messages: validation and incremental rendering through the model's own chat template.

A turn's new token ids are the tokenization of only the *new* text: the template rendered over the whole history
plus the new messages, minus the text the session already holds. The history's text is checked to be a prefix of
the new rendering, and the history's token ids are never tokenized again.
"""

from __future__ import annotations

from typing import Any

from voicepipe.llm.errors import EmptyMessagesError, InvalidRequestError, UnknownRoleError

ROLES = ("system", "user", "assistant", "tool")  # "tool": a tool's result (see tools.py)


class TemplateMismatchError(InvalidRequestError):
    """The chat template rendered the history differently from what the session holds (a template that rewrites
    earlier turns, or a history edited outside the engine)."""


def validate_messages(messages: Any, allow_empty: bool = False) -> list[dict[str, str]]:
    if not isinstance(messages, (list, tuple)):
        raise InvalidRequestError("messages must be a list of {role, content} objects.",
                                  "pass e.g. [{'role': 'user', 'content': 'Hi'}].")
    if not messages and not allow_empty:
        raise EmptyMessagesError("the request has no messages.", "send at least one user message.")
    clean = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
            raise InvalidRequestError(f"message {i} is not a {{role, content}} object.",
                                      "give every message a role and a content.")
        if msg["role"] not in ROLES:
            raise UnknownRoleError(f"message {i} has unknown role {msg['role']!r}.",
                                   f"use one of {', '.join(ROLES)}.")
        if not isinstance(msg["content"], str):
            raise InvalidRequestError(f"message {i} content must be a string.", "send plain text content.")
        clean.append({"role": msg["role"], "content": msg["content"]})
    return clean


class ChatRenderer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        if not messages:
            return ""
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja's own errors, or a template's raise_exception (roles it refuses)
            raise InvalidRequestError(f"the model's chat template cannot render this conversation: {exc}",
                                      "send roles and an order the model's template accepts.") from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def delta(self, held_text: str, history: list[dict[str, str]], new: list[dict[str, str]]) -> tuple[str, str]:
        """The new text for ``history + new`` with a generation prompt, given the text already held.

        Returns ``(full_text, delta_text)``."""
        full = self.render(history + new, add_generation_prompt=True)
        if not full.startswith(held_text):
            raise TemplateMismatchError(
                "the chat template renders this conversation's history differently from the cached text.",
                "use a template that appends turns without rewriting earlier ones, or open a new session.")
        return full, full[len(held_text):]
