"""Speculative decoding on the real SmolLM2, in the default weight format: greedy replies are token for token
those of plain decoding, one request at a time and three at once, with prompt lookup and with the draft-model path
(the default model drafting for itself, as the CPU has no smaller one to offer), also after drafts were rejected
and across a barge-in rollback; each request's acceptance goes to its stats and the engine's counters."""

from __future__ import annotations

import asyncio

import pytest

from tests.llm_helpers import start_engine

pytestmark = pytest.mark.e2e

SYSTEM = "You are a phone assistant. Read names, numbers and times back exactly as the caller gave them."
PROMPTS = ["My name is Daniel Okafor and my number is 555 0192. Please repeat both back to me.",
           "Book a table for four on Friday at seven thirty under Rivera, and confirm the booking.",
           "List the days of the week, then list them again."]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def engines(engine_model):
    model, _ = engine_model
    built = {"plain": start_engine(engine_model, speculative="off"),
             "ngram": start_engine(engine_model, speculative="ngram"),
             "draft": start_engine(engine_model, speculative="draft", draft_model=model)}
    yield built
    for engine in built.values():
        engine.stop()


async def replies(engine, prompts: list[str]):
    gens = [engine.generate(None, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}],
                            max_tokens=MAX_TOKENS) for p in prompts]

    async def drain(gen) -> None:
        async for _ in gen:
            pass

    await asyncio.gather(*(drain(g) for g in gens))
    return gens


async def test_replies_are_plain_decodings_one_at_a_time_and_batched(engines) -> None:
    plain = [(await replies(engines["plain"], [p]))[0].token_ids for p in PROMPTS]
    assert plain == [g.token_ids for g in await replies(engines["plain"], PROMPTS)]
    for name in ("ngram", "draft"):
        engine = engines[name]
        before = dict(engine.counters)
        alone = [(await replies(engine, [p]))[0] for p in PROMPTS]
        batched = await replies(engine, PROMPTS)
        assert [g.token_ids for g in alone] == plain, name
        assert [g.token_ids for g in batched] == plain, name
        drafted = engine.counters["draft_tokens"] - before["draft_tokens"]
        accepted = engine.counters["accepted_tokens"] - before["accepted_tokens"]
        assert drafted == sum(g.stats.draft_tokens for g in alone + batched) > 0
        assert accepted == sum(g.stats.accepted_tokens for g in alone + batched) > 0
        assert all(g.stats.output_tokens == len(g.token_ids) == len(g.stats.token_times) for g in alone + batched)
        assert engine.stats()["spec_acceptance_rate"] > 0
    ngram = engines["ngram"]
    assert ngram.counters["accepted_tokens"] < ngram.counters["draft_tokens"]  # some drafts were rejected, rolled back
    assert engines["draft"].counters["accepted_tokens"] >= 0.9 * engines["draft"].counters["draft_tokens"]


async def conversation(engine) -> tuple[list[int], list[int], list[int]]:
    """Turn 1, a barge-in after 6 heard tokens, turn 2: the two replies and the session's ids."""
    session = engine.open_session(SYSTEM)
    try:
        first = engine.generate(session, [{"role": "user", "content": PROMPTS[0]}], max_tokens=MAX_TOKENS)
        async for _ in first:
            pass
        engine.rollback_reply(session, 6)
        second = engine.generate(session, [{"role": "user", "content": "Sorry, say my number again, slowly."}],
                                 max_tokens=MAX_TOKENS)
        async for _ in second:
            pass
        assert second.stats.draft_tokens > 0 or engine.proposer is None
        return first.token_ids, second.token_ids, list(session.ids)
    finally:
        engine.close_session(session)


async def test_a_barge_in_rollback_then_the_next_turn_are_plain_decodings(engines) -> None:
    expected = await conversation(engines["plain"])
    for name in ("ngram", "draft"):
        assert await conversation(engines[name]) == expected, name
