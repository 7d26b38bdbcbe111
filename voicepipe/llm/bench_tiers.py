"""`voicepipe bench tiers`: does a voice turn keep its TTFT while flex work soaks up the engine?

Voice-like requests (a ~30-token message on a cached ~300-token history) are measured three ways in one
run: on an idle engine (the baseline, before and after the rest), then as `priority` and as `default` while
8 `flex` requests generate 256 tokens each. Ratios of p95 TTFT against the idle p95 are what matters.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

HISTORY = (
    "You are the phone agent of Harbor Lights Bistro, a seafood restaurant on Pier 9. We open Tuesday to Sunday "
    "from five to eleven in the evening and close on Mondays. Tables seat two, four or six guests; larger parties "
    "call the events desk. The tasting menu costs sixty-five dollars, with a wine pairing for thirty more. We hold "
    "a table for fifteen minutes past the booking time. Parking is free after six in the garage on Water Street, "
    "and the restaurant is wheelchair accessible through the side entrance. Vegetarian, vegan and gluten-free "
    "dishes are marked on the menu, and the kitchen can handle most allergies with a day's notice. Gift cards are "
    "sold at the host stand and online. Dogs are welcome on the patio in summer. Answer briefly and warmly, in one "
    "or two short sentences, because the caller hears you over the phone. Confirm names, party sizes, dates and "
    "times back to the caller. Never invent availability: say you will check and ask for a phone number instead. "
    "If the caller is upset, apologise once and offer the manager's callback. Speak in plain words and avoid lists. "
    "We take reservations up to thirty days ahead, and for parties of six we ask for a card to hold the table. The "
    "bar opens at half past four for walk-ins, and happy hour runs until six on weekdays with half-price oysters. "
    "Live jazz plays on Friday and Saturday nights from eight, so the dining room is louder then."
)
TURNS = [
    "Hi there, I was hoping to book a table for four people this Friday evening, maybe around seven thirty?",
    "Great, and do you have anything vegetarian on the tasting menu, because my sister does not eat fish?",
    "Perfect. Is there somewhere close by to park the car, and is it free at that time of the evening?",
    "One more thing, we might bring our small dog along, is that allowed if we sit outside on the patio?",
    "Could you also tell me how long you hold the table if we are running a little bit late on Friday?",
    "Alright, please put the booking under the name Rivera, and my phone number is five five five, one two.",
]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


async def _voice_turns(engine, tier: str, n_turns: int, n_sessions: int) -> list[float]:
    """TTFTs (ms) of `n_turns` voice-like turns, round-robin over sessions whose history is already cached."""
    sessions = [engine.open_session(HISTORY) for _ in range(n_sessions)]
    try:
        for session in sessions:  # warm-up turn: puts the history in the KV cache
            await _collect(engine.generate(session, [{"role": "user", "content": TURNS[0]}], tier=tier, max_tokens=1))
        ttfts = []
        for i in range(n_turns):
            session = sessions[i % n_sessions]
            generation = engine.generate(session, [{"role": "user", "content": TURNS[1 + i % (len(TURNS) - 1)]}],
                                         tier=tier, max_tokens=4)
            await _collect(generation)
            ttfts.append(generation.stats.ttft * 1000)
        return ttfts
    finally:
        for session in sessions:
            engine.close_session(session)


async def _collect(generation) -> int:
    count = 0
    async for _ in generation:
        count += 1
    return count


async def _with_flex_load(engine, tier: str, n_turns: int, n_sessions: int, n_flex: int, flex_tokens: int):
    flex = [engine.generate(None, [{"role": "user", "content": f"Write story number {i} about the sea."}],
                            tier="flex", max_tokens=flex_tokens, ignore_eos=True) for i in range(n_flex)]
    start = time.monotonic()
    flex_tasks = [asyncio.create_task(_collect(g)) for g in flex]
    await asyncio.sleep(0.2)  # let the flex requests get going
    ttfts = await _voice_turns(engine, tier, n_turns, n_sessions)
    await asyncio.gather(*flex_tasks)
    elapsed = time.monotonic() - start
    flex_tokens_total = sum(g.stats.output_tokens for g in flex)
    return ttfts, flex_tokens_total / elapsed


def summarize(ttfts: list[float]) -> dict[str, float]:
    return {"p50": percentile(ttfts, 50), "p95": percentile(ttfts, 95), "n": len(ttfts)}


async def run_tiers_bench(engine, n_turns: int = 24, n_sessions: int = 4, n_flex: int = 8,
                          flex_tokens: int = 256) -> dict[str, Any]:
    # The idle baseline is measured before and after the loaded runs and pooled, so that a drift of the shared
    # machine's speed (or a cold start) over the run does not land on one side of the ratios only.
    idle_before = await _voice_turns(engine, "priority", n_turns, n_sessions)
    priority, flex_tps_p = await _with_flex_load(engine, "priority", n_turns, n_sessions, n_flex, flex_tokens)
    default, flex_tps_d = await _with_flex_load(engine, "default", n_turns, n_sessions, n_flex, flex_tokens)
    idle_after = await _voice_turns(engine, "priority", n_turns, n_sessions)
    idle = idle_before + idle_after
    idle_s, prio_s, def_s = summarize(idle), summarize(priority), summarize(default)
    return {
        "workload": {"voice_turns": n_turns, "voice_sessions": n_sessions, "flex_requests": n_flex,
                     "flex_tokens_each": flex_tokens,
                     "history_tokens": len(engine.tokenizer(HISTORY)["input_ids"])},
        "ttft_ms": {"idle": idle_s, "idle_before": summarize(idle_before), "idle_after": summarize(idle_after),
                    "priority_under_flex": prio_s, "default_under_flex": def_s},
        "flex_tokens_per_s": flex_tps_p,
        "flex_tokens_per_s_during_default": flex_tps_d,
        "ratios": {"priority_p95_over_idle_p95": prio_s["p95"] / idle_s["p95"],
                   "default_p95_over_idle_p95": def_s["p95"] / idle_s["p95"],
                   "priority_p50_over_idle_p50": prio_s["p50"] / idle_s["p50"]},
    }
