"""The weight formats' quality on the real SmolLM2 against float32 (the issue's bounds): on a fixed prompt set a
format's greedy replies agree with fp32's on >= 90 % of their first 32 tokens on average, and its perplexity of a
held-out text rises <= 3 %. ``auto`` must pick the first format, in its speed order, that meets both.

Measured here: q4 and fp16 meet them (agreement 100 %: SmolLM2's weights came from a Q4_1 GGUF, which q4 stores
without loss); int8 and bf16 do not (greedy replies compound a flipped argmax; see voicepipe/llm/quality.py).
``auto`` picks q4 on this CPU."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
import torch.nn.functional as F

from tests.llm_helpers import start_engine
from voicepipe.llm.quality import build_decoder, check, choose_weights, score
from voicepipe.llm.weights import auto_candidates

pytestmark = pytest.mark.e2e

PROMPTS = ["What are the opening hours of a typical bakery?", "Name three farm animals and describe each.",
           "How do I reset my password?", "Tell me a short story about a lighthouse keeper.",
           "Can you book a table for four at seven thirty on Friday?", "Explain photosynthesis in simple words.",
           "My order number is 4 5 7 2 1. Where is my package?", "Why is the sky blue?"]
HELD_OUT = ("The old harbour town wakes early. Before the sun clears the hills, the fishing boats are already "
            "heading out past the breakwater, and the bakery on the corner has its first loaves on the shelves. By "
            "eight the market square fills with stalls selling cheese, apples and bright bunches of flowers, and "
            "the ferry to the islands sounds its horn twice before it leaves. Visitors often ask why the houses "
            "are painted in such strong colours; the answer, the locals say, is that sailors wanted to find their "
            "own home from far out at sea. In winter the town is quieter, the cafes close at six, and the only "
            "sound at night is the wind in the rigging of the boats tied up along the quay.")
N = 32


def greedy(engine) -> list[list[int]]:
    async def run() -> list[list[int]]:
        outputs = []
        for prompt in PROMPTS:
            gen = engine.generate(None, [{"role": "user", "content": prompt}], max_tokens=N, ignore_eos=True)
            async for _ in gen:
                pass
            outputs.append(gen.token_ids)
        return outputs

    return asyncio.run(run())


def agreement(reference: list[list[int]], outputs: list[list[int]]) -> float:
    """The issue's measure: the share of the first N tokens that equal fp32's, averaged over the prompts."""
    return sum(sum(a == b for a, b in zip(ref, out, strict=True)) / N
               for ref, out in zip(reference, outputs, strict=True)) / len(reference)


@pytest.fixture(scope="module")
def figures(engine_model) -> dict[str, tuple[float, float]]:
    """Each format's (greedy agreement with fp32, perplexity ratio to fp32)."""
    model, tokenizer = engine_model
    ids = torch.tensor(tokenizer(HELD_OUT)["input_ids"])

    def perplexity(fmt: str) -> float:
        logits = score(build_decoder(model, tokenizer, fmt), ids)
        return math.exp(F.cross_entropy(logits[:-1], ids[1:]).item())

    outputs = {}
    for fmt in ("fp32", "q4", "fp16", "bf16", "int8"):
        engine = start_engine(engine_model, weights=fmt, speculative="off")
        try:
            assert engine.weights.format == fmt
            outputs[fmt] = greedy(engine)
        finally:
            engine.stop()
    base = perplexity("fp32")
    return {fmt: (agreement(outputs["fp32"], outputs[fmt]), perplexity(fmt) / base) for fmt in outputs}


def passes(figure: tuple[float, float]) -> bool:
    agree, ppl_ratio = figure
    return agree >= 0.9 and ppl_ratio <= 1.03


def test_q4_and_fp16_meet_the_quality_bounds(figures) -> None:
    assert figures["fp32"] == (1.0, 1.0)
    assert passes(figures["fp16"]), figures["fp16"]
    assert passes(figures["q4"]), figures["q4"]


def test_auto_picks_the_first_format_in_speed_order_that_meets_them(figures, engine_model) -> None:
    model, tokenizer = engine_model
    expected = next(fmt for fmt in auto_candidates(torch.device("cpu")) if passes(figures[fmt]))
    choice, _ = choose_weights(model, tokenizer, "auto")
    assert choice.format == expected, (choice.reason, figures)
    for fmt in ("q4", "fp16", "bf16", "int8"):  # the cheap load-time check agrees with the generation bound
        assert check(model, tokenizer, build_decoder(model, tokenizer, fmt)).passed == passes(figures[fmt]), fmt
