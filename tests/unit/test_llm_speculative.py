"""Speculative decoding's pure parts: greedy verification, prompt lookup's drafts, and the room the scheduler holds
for drafts (only for speculating requests, only in free blocks, not past max_tokens, not in big batches). Token
for token equality with plain decoding is shown on the real model in tests/e2e/test_llm_speculative.py."""

from __future__ import annotations

from voicepipe.llm.blocks import BlockManager
from voicepipe.llm.request import Request
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.scheduler import ScheduledItem, Scheduler
from voicepipe.llm.session import Session
from voicepipe.llm.speculative import PromptLookup, accept

BS = 4


def test_accept_keeps_the_matching_drafts_and_the_targets_next_token() -> None:
    assert accept([5, 6, 7], [5, 6, 7, 8]) == ([5, 6, 7, 8], 3)  # all accepted, and a token on top
    assert accept([5, 6, 7], [5, 9, 7, 8]) == ([5, 9], 1)  # the first mismatch ends it: the target's token
    assert accept([5, 6, 7], [4, 6, 7, 8]) == ([4], 0)  # nothing accepted: one token, as plain decoding


def request_with(ids: list[int], max_tokens: int = 64, speculate: bool = True) -> Request:
    return Request(session=Session(ids=list(ids)), params=SamplingParams(max_tokens=max_tokens), speculate=speculate)


def test_prompt_lookup_continues_the_latest_earlier_occurrence_longest_ngram_first() -> None:
    lookup = PromptLookup(max_n=3, min_n=2)
    #        0  1  2  3  4  5  6  7  8  9  10 11 12
    ids = [1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]
    req = request_with(ids)
    # the trigram (1, 2, 3) occurred at 0..2: its continuation wins over the later bigram (2, 3) at 5..6
    assert lookup.draft(req, 3) == [4, 9, 2]
    req.session.ids.extend([7, 2, 3])  # now only the bigram (2, 3) matches; the latest one is at 10..11
    assert lookup.draft(req, 2) == [7, 2]
    req.session.ids.append(8)  # (3, 8) and (2, 3, 8) never occurred
    assert lookup.draft(req, 4) == []


def test_prompt_lookup_indexes_only_its_window_and_never_proposes_past_the_sequence() -> None:
    lookup = PromptLookup(max_n=2, min_n=2, window=6)
    req = request_with([1, 2, 3, 0, 0, 0, 0, 0, 0, 1, 2])
    assert lookup.draft(req, 4) == []  # (1, 2) at 0..1 is outside the last 6 tokens
    req = request_with([0, 5, 6, 7, 5, 6])
    assert lookup.draft(req, 8) == [7, 5, 6]


def scheduler(spec_tokens: int = 4, spec_max_batch: int = 4, blocks: int = 64) -> Scheduler:
    return Scheduler(BlockManager(blocks, BS), max_tokens_per_step=64, max_running=16, spec_tokens=spec_tokens,
                     spec_max_batch=spec_max_batch)


def decoding(sched: Scheduler, *reqs: Request) -> None:
    """Take ``reqs`` through their prefill (one step), so that their next step is a decode each."""
    for req in reqs:
        sched.add(req)
    plan = sched.schedule(0.0)
    assert len(plan.items) == len(reqs)
    for item in plan.items:
        item.session.commit(sched.blocks, item.n_tokens)
        item.request.session.ids.append(7)
        item.request.output_ids.append(7)


def decode_items(plan) -> list[ScheduledItem]:
    return [item for item in plan.items if item.start > 0]


def test_room_for_drafts_only_for_speculating_requests_and_within_max_tokens() -> None:
    sched = scheduler()
    fast, sampled, short = request_with([1] * 10), request_with([2] * 10, speculate=False), request_with([3] * 10, 3)
    decoding(sched, fast, sampled, short)
    plan = sched.schedule(0.0)
    slots = {item.request.id: item.draft_slots for item in decode_items(plan)}
    assert slots == {fast.id: 4, sampled.id: 0, short.id: 1}  # short: 1 output, max 3: one token and one draft
    assert all(item.n_tokens == 1 and item.samples for item in plan.items)
    for item in plan.items:  # the blocks for the drafts' positions are held
        assert len(item.block_table) * BS >= item.start + 1 + item.draft_slots


def test_no_drafts_in_a_step_with_more_decodes_than_spec_max_batch() -> None:
    sched = scheduler(spec_max_batch=2)
    decoding(sched, *(request_with([i] * 6) for i in range(3)))
    assert all(item.draft_slots == 0 for item in sched.schedule(0.0).items)


def test_drafts_take_free_blocks_only() -> None:
    sched = scheduler(blocks=3)  # 12 slots: the prompt and its first output fill 3 blocks
    req = request_with([1] * 11)
    decoding(sched, req)
    plan = sched.schedule(0.0)
    assert [item.draft_slots for item in plan.items] == [0]  # position 11 is the last free slot
    assert sched.preemptions == 0 and sched.unpins == 0


def test_set_draft_puts_the_drafted_tokens_after_the_sequence() -> None:
    sched = scheduler()
    req = request_with([1] * 10)
    decoding(sched, req)
    item = sched.schedule(0.0).items[0]
    item.set_draft([4, 5, 6, 7, 8, 9])  # more than the room held: cut to it
    assert item.draft == [4, 5, 6, 7] and item.token_ids == [7, 4, 5, 6, 7] and item.n_tokens == 5
    item.set_draft([])
    assert item.token_ids == [7] and item.n_tokens == 1
