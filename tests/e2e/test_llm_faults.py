"""Faults inside the LLM engine's thread, with the real model: a model step that fails for one session's request
fails that request alone (the requests batched with it go on), and a KV pool with no room makes the newest
request wait and then refuses it as overloaded, while the engine keeps serving.

Where a fault is injected, a wrapper around the engine's real `ModelRunner.forward` raises whenever the poisoned
session's work is in the step (a stand-in for what cannot be produced on demand: a kernel or device error on
that request's data); everything else runs the real model.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.llm_helpers import start_engine
from voicepipe.llm.errors import LLMError, OverloadedError

pytestmark = pytest.mark.e2e

ASK = [{"role": "user", "content": "Name three farm animals."}]
OTHER = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "What is bread?"}]


async def collect(gen) -> str:
    return "".join([p.text async for p in gen])


async def test_a_step_that_fails_for_one_request_fails_that_request_alone(engine_model):
    engine = start_engine(engine_model)
    try:
        poisoned, healthy = engine.open_session("You are brief."), engine.open_session("You are brief.")
        baseline = await collect(engine.generate(engine.open_session("You are brief."), ASK, max_tokens=12))
        real_forward, steps = engine.runner.forward, []

        def forward(items):
            steps.append({id(item.session) for item in items})
            if any(item.session is poisoned for item in items):
                raise RuntimeError("injected fault")
            return real_forward(items)

        engine.runner.forward = forward
        bad = asyncio.ensure_future(collect(engine.generate(poisoned, ASK, max_tokens=12)))
        good = asyncio.ensure_future(collect(engine.generate(healthy, ASK, max_tokens=12)))
        results = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(results[0], LLMError) and "injected fault" in str(results[0])
        assert results[1] == baseline, "the request batched with the fault must go on as if alone"
        assert any(len(s) > 1 and id(poisoned) in s for s in steps), "the fault never hit a shared step"
        engine.runner.forward = real_forward
        assert await collect(engine.generate(poisoned, ASK, max_tokens=4)), "the session itself recovers"
        assert engine.stats()["errors"] == 1
    finally:
        engine.stop()


async def test_a_full_kv_pool_makes_the_newest_request_wait_then_refuses_it(engine_model):
    """A running reply holds every block (paused mid-reply, as a call pauses it for its first audio); a newer
    request of the same tier cannot preempt it, waits, and is refused as overloaded after
    `llm.admission_timeout_s`; the running reply then finishes whole and the engine goes on serving."""
    engine = start_engine(engine_model, kv_cache_mib=4, admission_timeout_s=1.0)
    try:
        capacity = engine.stats()["capacity_tokens"]
        prompt = len(engine.renderer.encode(engine.renderer.render(ASK, add_generation_prompt=True)))
        first = engine.generate(None, ASK, max_tokens=capacity - prompt, ignore_eos=True)
        running = asyncio.ensure_future(collect(first))
        while engine.stats()["blocks_free"] > 0 and not running.done():
            await asyncio.sleep(0.005)
        first.pause(30.0)
        assert not running.done() and engine.stats()["blocks_free"] == 0
        with pytest.raises(OverloadedError, match="could not admit"):
            await collect(engine.generate(None, OTHER, max_tokens=4))
        first.resume()
        await running
        assert first.stats.output_tokens == capacity - prompt, "the running reply lost tokens"
        assert engine.stats()["overloaded"] == 1 and engine.crashed is None
        assert await collect(engine.generate(None, OTHER, max_tokens=4)), "the engine serves once room is back"
    finally:
        engine.stop()
