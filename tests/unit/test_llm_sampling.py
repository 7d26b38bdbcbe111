"""Sampling, incremental detokenization and chat-message validation (no model)."""

from __future__ import annotations

import pytest
import torch

from voicepipe.llm.chat import validate_messages
from voicepipe.llm.detok import IncrementalDetokenizer
from voicepipe.llm.errors import EmptyMessagesError, InvalidSamplingError, UnknownRoleError, UnknownTierError
from voicepipe.llm.request import tier_rank
from voicepipe.llm.sampling import SamplingParams, make_generator, sample


def logits_batch() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(3, 50)


def test_greedy_is_argmax():
    logits = logits_batch()
    params = [SamplingParams()] * 3
    assert sample(logits, params, [None] * 3) == logits.argmax(-1).tolist()


def test_top_k_1_and_tiny_top_p_are_argmax():
    logits = logits_batch()
    for p in (SamplingParams(temperature=1.0, top_k=1, seed=1), SamplingParams(temperature=1.0, top_p=1e-6, seed=1)):
        gens = [make_generator(p, "cpu") for _ in range(3)]
        assert sample(logits, [p] * 3, gens) == logits.argmax(-1).tolist()


def test_seed_is_reproducible_and_sampling_varies():
    logits = torch.zeros(1, 1000)
    p = SamplingParams(temperature=1.0, seed=1234)
    draw = [sample(logits, [p], [make_generator(p, "cpu")])[0] for _ in range(2)]
    assert draw[0] == draw[1]
    gen = make_generator(p, "cpu")
    many = {sample(logits, [p], [gen])[0] for _ in range(20)}
    assert len(many) > 10


def test_top_k_restricts_support():
    logits = torch.arange(10, dtype=torch.float32)[None]
    p = SamplingParams(temperature=5.0, top_k=3, seed=0)
    gen = make_generator(p, "cpu")
    seen = {sample(logits, [p], [gen])[0] for _ in range(200)}
    assert seen <= {7, 8, 9} and len(seen) == 3


def test_top_p_restricts_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = SamplingParams(temperature=1.0, top_p=0.7, seed=0)
    gen = make_generator(p, "cpu")
    seen = {sample(logits, [p], [gen])[0] for _ in range(300)}
    assert seen == {0, 1}


@pytest.mark.parametrize("kwargs", [{"max_tokens": -1}, {"temperature": -0.5}, {"top_k": -2}, {"top_p": 0.0},
                                    {"top_p": 1.5}, {"stop": [""]}, {"temperature": float("nan")}])
def test_bad_sampling_values(kwargs):
    with pytest.raises(InvalidSamplingError):
        SamplingParams(**kwargs).validate()


def test_tiers():
    assert tier_rank("priority") < tier_rank("default") < tier_rank("flex")
    with pytest.raises(UnknownTierError, match="unknown tier"):
        tier_rank("urgent")


def test_messages_validation():
    with pytest.raises(EmptyMessagesError):
        validate_messages([])
    with pytest.raises(UnknownRoleError, match="wizard"):
        validate_messages([{"role": "wizard", "content": "x"}])
    assert validate_messages([{"role": "user", "content": "hi", "name": "x"}]) == [{"role": "user", "content": "hi"}]


class ByteTokenizer:
    """One token per UTF-8 byte: decoding a partial character gives U+FFFD, like byte-level BPE."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_detok_never_splits_multibyte_characters():
    text = "héllo → 世界 🎉!"
    ids = list(text.encode("utf-8"))
    detok = IncrementalDetokenizer(ByteTokenizer())
    pieces = [detok.push([t]) for t in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert "🎉" in pieces  # the 4-byte emoji arrives whole, in one piece


def test_detok_flush_returns_the_rest():
    detok = IncrementalDetokenizer(ByteTokenizer())
    assert detok.push(list(b"ab")) == "ab"
    assert detok.push(list("é".encode())[:1]) == ""
    assert detok.flush() == "\ufffd"
