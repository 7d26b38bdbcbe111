"""The legacy completions API's ``logprobs`` object, from the `Piece`s of a request that asked for them:
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, each token as its own decoded text."""

from __future__ import annotations

from typing import Any


def completion_logprobs(tokenizer, pieces: list[Any], offset: int = 0) -> dict[str, list] | None:
    """``pieces``' tokens in order; ``offset``: the text length before the first of them (the stream so far)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []
    for piece in pieces:
        for token_id, (logprob, top) in zip(piece.token_ids, piece.logprobs or [], strict=False):
            text = _text(tokenizer, token_id)
            tokens.append(text)
            token_logprobs.append(logprob)
            alternatives: dict[str, float] = {}
            for alt_id, alt_logprob in top:  # two ids with one text: the likelier one (the list is sorted)
                alternatives.setdefault(_text(tokenizer, alt_id), alt_logprob)
            top_logprobs.append(alternatives)
            text_offset.append(offset)
            offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}


def _text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)
