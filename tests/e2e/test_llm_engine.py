"""The LLM engine against the oracle: greedy output equals ``model.generate(do_sample=False)`` token for token.

Real SmolLM2-135M weights, in float32 (``llm.weights = "fp32"``: the lossy formats are held to their own quality
bounds in test_llm_weights.py). The engine and the reference use two separately loaded copies of the model, so the
engine's registered attention function cannot leak into the reference.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.llm_helpers import start_engine
from voicepipe.llm.loader import load_causal_lm
from voicepipe.models import resolve_model

pytestmark = pytest.mark.e2e

N = 12  # reply tokens per generation: short, to keep CPU CI fast
SYSTEM = ("You are a friendly voice assistant for a small bakery called Crumb & Co. You answer questions about "
          "opening hours, prices and orders. Opening hours are 7am to 6pm on weekdays and 8am to 2pm on Saturdays; "
          "the shop is closed on Sundays. A loaf of sourdough costs 6 dollars, a baguette 3 dollars, and a "
          "croissant 2 dollars 50. Orders over 40 dollars get free delivery within five miles. Keep every answer "
          "short, friendly and easy to say out loud.")


@pytest.fixture(scope="module")
def llm_path(settings):
    return resolve_model(settings.models.llm, "llm", settings.paths.models_dir)


@pytest.fixture(scope="module")
def reference(llm_path):
    model, tokenizer = load_causal_lm(llm_path, "cpu", "float32")
    return model, tokenizer


def greedy_reference(reference, prompt_ids: list[int], n: int = N) -> list[int]:
    model, _ = reference
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                             dtype=torch.long), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="module")
def engine(engine_model):
    engine = start_engine(engine_model, kv_cache_mib=128, weights="fp32")
    yield engine
    engine.stop()


async def run(gen):
    pieces = [piece async for piece in gen]
    return pieces


async def test_one_prompt_matches_generate(engine, reference):
    messages = [{"role": "user", "content": "Name three farm animals."}]
    gen = engine.generate(None, messages, max_tokens=N)
    pieces = await run(gen)
    prompt = reference[1].apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert gen.stats.prompt_tokens == len(prompt)
    assert gen.token_ids == greedy_reference(reference, prompt)
    assert "".join(p.text for p in pieces) == gen.text
    assert sum(len(p.token_ids) for p in pieces) == len(gen.token_ids)
    assert gen.stats.ttft is not None and gen.stats.output_tokens == len(gen.token_ids)
    assert len(gen.stats.itls) == len(gen.token_ids) - 1


async def test_four_prompts_batched_match_generate(engine, reference):
    prompts = ["Hi.", "What is the boiling point of water in Celsius?",
               "Write one sentence about the sea, then one about the mountains, and one about the sky.",
               "Count from one to five. " * 6]
    before = engine.stats()["max_batch"]
    gens = [engine.generate(None, [{"role": "user", "content": p}], max_tokens=N) for p in prompts]
    await asyncio.gather(*(run(g) for g in gens))
    assert engine.stats()["max_batch"] >= 2 or before >= 2  # they really shared steps
    for p, g in zip(prompts, gens, strict=True):
        ids = reference[1].apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               return_dict=False)
        assert g.token_ids == greedy_reference(reference, ids), p


async def test_five_turn_session_hits_cache_and_matches_generate(engine, reference):
    tokenizer = reference[1]
    session = engine.open_session(SYSTEM)
    questions = ["When do you open on Saturday?", "How much is a baguette?", "And a croissant?",
                 "Do you deliver?", "Thanks, bye!"]
    held = 0
    for turn, q in enumerate(questions):
        gen = engine.generate(session, [{"role": "user", "content": q}], max_tokens=N)
        await run(gen)
        prompt = session.ids[:gen.stats.prompt_tokens]
        # the history is kept as is: the new prompt extends the previous turn's ids
        assert gen.stats.prompt_tokens > held
        # incremental rendering gives the same ids as tokenizing the whole rendered conversation
        assert prompt == tokenizer(session.text, add_special_tokens=False)["input_ids"]
        if turn > 0:
            # everything already computed is reused: only the new message (and the last reply token) is prefilled
            assert gen.stats.cached_prompt_tokens >= held - 1
            assert gen.stats.cached_prompt_tokens / gen.stats.prompt_tokens > 0.7
        assert gen.token_ids == greedy_reference(reference, prompt), f"turn {turn}"
        held = session.reply_end  # the conversation, without the next turn's opener (which may be warming)
    engine.close_session(session)


async def test_shared_system_prompt_three_sessions_one_set_of_blocks(engine):
    sessions = [engine.open_session(SYSTEM) for _ in range(3)]
    gens = []
    for i, s in enumerate(sessions):
        g = engine.generate(s, [{"role": "user", "content": f"Question {i}: are you open today?"}], max_tokens=2)
        await run(g)
        gens.append(g)
    bs = engine.blocks.block_size
    system_ids = sessions[0].ids[:sessions[0].ids.index(2) + 1]  # up to the system turn's <|im_end|>
    shared = len(system_ids) // bs
    assert shared >= 4
    assert sessions[1].block_table[:shared] == sessions[0].block_table[:shared]
    assert sessions[2].block_table[:shared] == sessions[0].block_table[:shared]
    for b in sessions[0].block_table[:shared]:
        assert engine.blocks.ref_count[b] == 3
    for g in gens[1:]:
        assert g.stats.cached_prompt_tokens >= shared * bs
    for s in sessions:
        engine.close_session(s)
    await asyncio.sleep(0)
    st = engine.stats()
    assert st["blocks_used"] == 0 and st["blocks_free"] == st["blocks_total"]


async def test_truncate_then_one_more_turn_matches_generate(engine, reference):
    session = engine.open_session(SYSTEM)
    gen = engine.generate(session, [{"role": "user", "content": "Tell me about your bread."}], max_tokens=N,
                          ignore_eos=True)
    await run(gen)
    assert len(gen.token_ids) == N
    start = gen.stats.prompt_tokens
    engine.rollback_reply(session, 5)  # the caller heard 5 tokens, then barged in
    assert session.reply_end == start + 5
    assert session.ids[start:start + 5] == gen.token_ids[:5]
    gen2 = engine.generate(session, [{"role": "user", "content": "Sorry, how much is the sourdough?"}],
                           max_tokens=N)
    await run(gen2)
    prompt = session.ids[:gen2.stats.prompt_tokens]
    assert prompt[:start + 5] == session.ids[:start] + gen.token_ids[:5]
    assert session.messages[-2] == {"role": "assistant", "content": reference[1].decode(gen.token_ids[:5])}
    assert gen2.stats.cached_prompt_tokens >= (start + 5) // engine.blocks.block_size * engine.blocks.block_size
    assert gen2.token_ids == greedy_reference(reference, prompt)
    engine.close_session(session)


async def test_dropping_a_cancelled_early_turn_restores_the_session(engine, reference):
    """A call's early reply, cancelled and dropped: the session is exactly as before that turn began."""
    session = engine.open_session(SYSTEM)
    await run(engine.generate(session, [{"role": "user", "content": "When do you open?"}], max_tokens=8))
    ids, messages, turns = list(session.ids), engine.history(session), session.requests
    keep = len(session.marks)
    early = engine.generate(session, [{"role": "user", "content": "I would like"}], max_tokens=N, ignore_eos=True)
    async for _ in early:
        early.cancel()  # the caller went on after the first token
    while session.busy:
        await asyncio.sleep(0.01)
    assert session.requests == turns + 1
    engine.drop_turns(session, keep)
    assert session.ids == ids and engine.history(session) == messages
    assert session.requests == turns  # the next reply is labelled with the turn number the dropped one had
    gen = engine.generate(session, [{"role": "user", "content": "I would like a cake."}], max_tokens=N)
    await run(gen)
    prompt = session.ids[:gen.stats.prompt_tokens]
    assert prompt[:len(ids)] == ids and gen.stats.cached_prompt_tokens >= len(ids) - engine.blocks.block_size
    assert gen.token_ids == greedy_reference(reference, prompt)
    engine.close_session(session)


async def until_warm(session, timeout_s: float = 10.0) -> None:
    """Wait, bounded, until the engine has prefilled everything the idle session holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while session.pending and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


async def test_an_idle_session_prefills_the_next_turns_opener(engine, reference):
    """After a reply the engine prefills what any next user turn starts with; that turn then only computes the
    user's words and the assistant prompt, and its reply is still exactly greedy decoding's."""
    tok = reference[1]
    session = engine.open_session(SYSTEM)
    first = engine.generate(session, [{"role": "user", "content": "When do you open?"}], max_tokens=N,
                            ignore_eos=True)
    await run(first)
    reply_end = first.stats.prompt_tokens + N
    assert session.warm_start == session.reply_end == reply_end
    assert tok.decode(session.ids[reply_end:]) == "<|im_end|>\n<|im_start|>user\n"
    before = engine.stats()
    await until_warm(session)
    assert session.pending == 0  # the reply's last token and the opener have their K/V, computed while idle
    held = len(session.ids)

    gen = engine.generate(session, [{"role": "user", "content": "And on Sunday?"}], max_tokens=N)
    await run(gen)
    prompt = session.ids[:gen.stats.prompt_tokens]
    assert prompt == tok(session.text, add_special_tokens=False)["input_ids"]
    assert gen.stats.cached_prompt_tokens == held  # only "And on Sunday?<|im_end|>..." was left to prefill
    assert gen.token_ids == greedy_reference(reference, prompt)
    after = engine.stats()
    assert after["openers_kept"] == before["openers_kept"] + 1
    assert after["warmed_tokens"] >= before["warmed_tokens"] + held - reply_end + 1
    engine.close_session(session)


async def test_a_turn_that_does_not_start_with_the_opener_cuts_it_off(engine, reference):
    """A next turn that opens with another role (a system note) renders differently: the warmed opener is dropped,
    and the reply is still exactly greedy decoding's over the real conversation."""
    tok = reference[1]
    session = engine.open_session(SYSTEM)
    await run(engine.generate(session, [{"role": "user", "content": "Hello there."}], max_tokens=N))
    await until_warm(session)
    reply_end = session.reply_end
    missed = engine.stats()["openers_missed"]
    gen = engine.generate(session, [{"role": "system", "content": "The caller is in a hurry."},
                                    {"role": "user", "content": "Do you sell rye?"}], max_tokens=N)
    await run(gen)
    prompt = session.ids[:gen.stats.prompt_tokens]
    assert prompt == tok(session.text, add_special_tokens=False)["input_ids"]
    assert tok.decode(prompt[reply_end:]).startswith("\n<|im_start|>system\n")
    assert engine.stats()["openers_missed"] == missed + 1
    assert gen.token_ids == greedy_reference(reference, prompt)
    engine.close_session(session)


async def test_the_callers_words_so_far_are_prefilled_and_kept_by_their_turn(engine, reference):
    """While the caller speaks, the words said so far are prefilled after the opener; later words extend them, and the
    turn that starts with them computes only the rest of its message. Its reply is still greedy decoding's."""
    tok = reference[1]
    session = engine.open_session(SYSTEM)
    await run(engine.generate(session, [{"role": "user", "content": "Hello there."}], max_tokens=N))
    reply_end = session.reply_end
    engine.prefill_user_words(session, "Do you")
    engine.prefill_user_words(session, " Do you sell ")  # the next partial: extends the held ids, cuts nothing
    assert session.reply_end == reply_end
    assert tok.decode(session.ids[reply_end:]).endswith("<|im_start|>user\nDo you sell")
    await until_warm(session)
    assert session.pending == 0
    held = len(session.ids)
    before = engine.stats()
    gen = engine.generate(session, [{"role": "user", "content": "Do you sell rye bread?"}], max_tokens=N)
    await run(gen)
    prompt = session.ids[:gen.stats.prompt_tokens]
    assert prompt == tok(session.text, add_special_tokens=False)["input_ids"]
    assert gen.stats.cached_prompt_tokens == held  # only " rye bread?" and the assistant header were prefilled
    assert gen.token_ids == greedy_reference(reference, prompt)
    after = engine.stats()
    assert after["openers_kept"] == before["openers_kept"] + 1 and after["warm_ids_cut"] == before["warm_ids_cut"]
    engine.close_session(session)


async def test_words_the_turn_does_not_start_with_are_cut_back_to_the_common_prefix(engine, reference):
    """The final transcript differs from the partial: the turn keeps the ids both start with and recomputes the rest;
    a partial that changes its mind replaces the words held before it."""
    tok = reference[1]
    session = engine.open_session(SYSTEM)
    await run(engine.generate(session, [{"role": "user", "content": "Hello there."}], max_tokens=N))
    reply_end = session.reply_end
    engine.prefill_user_words(session, "Can I order")
    engine.prefill_user_words(session, "Can you")  # the STT changed its mind: " I order" goes, " you" comes
    assert tok.decode(session.ids[reply_end:]).endswith("user\nCan you")
    await until_warm(session)
    opener = len(session.ids) - len(tok("Can you", add_special_tokens=False)["input_ids"])
    before = engine.stats()
    gen = engine.generate(session, [{"role": "user", "content": "Can I pick up a cake?"}], max_tokens=N)
    await run(gen)
    prompt = session.ids[:gen.stats.prompt_tokens]
    assert prompt == tok(session.text, add_special_tokens=False)["input_ids"]
    assert gen.stats.cached_prompt_tokens == opener + 1  # the opener and "Can" were kept; " you" was cut
    assert gen.token_ids == greedy_reference(reference, prompt)
    after = engine.stats()
    assert after["openers_missed"] == before["openers_missed"] + 1
    assert after["warm_ids_cut"] == before["warm_ids_cut"] + 1
    engine.close_session(session)


async def test_words_sent_while_a_reply_is_in_flight_change_nothing(engine, reference):
    session = engine.open_session(SYSTEM)
    gen = engine.generate(session, [{"role": "user", "content": "Hello there."}], max_tokens=N)
    stream = gen.__aiter__()
    await stream.__anext__()
    gen.pause(30)  # the reply is in flight, and stays so: the session is busy
    engine.prefill_user_words(session, "And do you")
    with engine._lock:  # a step may still be appending a token: read the session as the engine leaves it
        assert session.ids[gen.stats.prompt_tokens:] == gen.request.output_ids and session.warm_start is None
    gen.resume()
    async for _ in stream:
        pass
    assert gen.token_ids == greedy_reference(reference, session.ids[:gen.stats.prompt_tokens])
    engine.close_session(session)


async def test_turns_sent_while_the_opener_is_warming_match_generate(engine, reference):
    """The next turn arrives at once, racing the warming step: whichever wins, the reply is greedy decoding's."""
    session = engine.open_session(SYSTEM)
    for q in ("Hi.", "Is the bread fresh?", "Great, thanks."):
        gen = engine.generate(session, [{"role": "user", "content": q}], max_tokens=4, ignore_eos=True)
        await run(gen)
        prompt = session.ids[:gen.stats.prompt_tokens]
        assert gen.token_ids == greedy_reference(reference, prompt, 4), q
    engine.close_session(session)


async def test_a_paused_generation_decodes_nothing_until_resumed(engine, reference):
    messages = [{"role": "user", "content": "Name three farm animals."}]
    gen = engine.generate(None, messages, max_tokens=N, ignore_eos=True)
    pieces = []
    async for piece in gen:
        pieces.append(piece)
        if len(pieces) == 1:
            gen.pause(30.0)
            paused = len(gen.request.output_ids)
            await asyncio.sleep(0.6)  # several decode steps' worth
            assert len(gen.request.output_ids) <= paused + 1  # at most the step already planned
            gen.resume()
    assert len(gen.token_ids) == N  # then it went on, and the output is what it would have been
    prompt = reference[1].apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert gen.token_ids == greedy_reference(reference, prompt)


async def test_a_voice_request_aborts_a_flex_step_and_the_flex_reply_is_unchanged(engine, reference):
    """A priority prompt stops a running flex-only step; the flex reply goes on exactly as greedy decoding would."""
    tok = reference[1]
    flex_msgs = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
    flex = engine.generate(None, flex_msgs, tier="flex", max_tokens=2 * N, ignore_eos=True)
    flex_task = asyncio.ensure_future(run(flex))
    while not flex.token_ids:
        await asyncio.sleep(0.01)
    aborted = engine.stats()["aborted_steps"]
    voice_msgs = [{"role": "user", "content": "What time do you open?"}]
    voice_replies = []
    while engine.stats()["aborted_steps"] == aborted and not flex_task.done():
        await asyncio.sleep(0.05)  # mid-step: the flex decodes are running
        voice = engine.generate(None, voice_msgs, tier="priority", max_tokens=1)
        await run(voice)
        voice_replies.append(voice.token_ids)
    assert engine.stats()["aborted_steps"] > aborted, "no flex step was aborted"
    await flex_task
    for msgs, ids in ((flex_msgs, flex.token_ids), (voice_msgs, voice_replies[-1])):
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
        assert ids == greedy_reference(reference, prompt, len(ids))


async def test_preempted_request_resumes_and_matches_generate(engine_model, reference):
    # a pool of 6 blocks x 16 tokens: two of these requests cannot both hold their KV
    engine = start_engine(engine_model, kv_cache_mib=4, block_size=16, max_tokens_per_step=64, weights="fp32")
    try:
        assert engine.blocks.num_blocks <= 6
        low_msgs = [{"role": "user", "content": "List some colours of the rainbow please."}]
        high_msgs = [{"role": "user", "content": "List some kinds of fruit please, thanks."}]
        n = 24
        low = engine.generate(None, low_msgs, tier="flex", max_tokens=n, ignore_eos=True)
        low_task = asyncio.ensure_future(run(low))
        while not low.token_ids:
            await asyncio.sleep(0.01)
        high = engine.generate(None, high_msgs, tier="priority", max_tokens=n, ignore_eos=True)
        await asyncio.gather(run(high), low_task)
        assert low.stats.preemptions >= 1 and high.stats.preemptions == 0
        assert engine.stats()["preemptions"] >= 1
        tok = reference[1]
        for msgs, g in ((low_msgs, low), (high_msgs, high)):
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
            model, _ = reference
            with torch.inference_mode():
                out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
            assert g.token_ids == out[0, len(ids):].tolist()
        assert engine.stats()["blocks_used"] == 0
    finally:
        engine.stop()

