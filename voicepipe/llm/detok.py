"""Incremental detokenization: text pieces from a growing list of token ids, never splitting a character.

Decoding token by token breaks multi-byte characters (a UTF-8 character may span several byte-level tokens) and
drops the spaces some tokenizers add between tokens. We decode a small window instead: the text of
``ids[prefix:]`` minus the text of ``ids[prefix:read]`` is what the new tokens add. While that ends in U+FFFD (an
incomplete character) we wait for more tokens.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # start of the decoding window
        self.read = 0  # ids before this were already turned into text
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: list[int]) -> str:
        """Add tokens; return the text they complete (possibly empty)."""
        self.ids.extend(new_ids)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if after.endswith(REPLACEMENT) or len(after) < len(before):
            return ""
        piece = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += piece
        return piece

    def flush(self) -> str:
        """At the end: whatever is left, even an incomplete character."""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        piece = after[len(before):] if after.startswith(before) else ""
        self.prefix = self.read = len(self.ids)
        self.text += piece
        return piece
