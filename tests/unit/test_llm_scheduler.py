"""Scheduler policy (pure logic, no model): tier order, token budget, flex aging, memory pressure."""

from __future__ import annotations

from voicepipe.llm.blocks import BlockManager
from voicepipe.llm.request import TIER_RANK, Request, State
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.scheduler import Scheduler
from voicepipe.llm.session import Session

BS = 4


def make_request(n_prompt: int, tier: str = "default", max_tokens: int = 4, base: int = 0) -> Request:
    session = Session(ids=[base + i for i in range(n_prompt)])
    return Request(session=session, params=SamplingParams(max_tokens=max_tokens), tier=tier)


def run_step(sched: Scheduler, now: float = 0.0):
    """One step with a fake model: commit the scheduled tokens, 'sample' token 7, finish at max_tokens."""
    plan = sched.schedule(now)
    for item in plan.items:
        req = item.request
        item.session.commit(sched.blocks, item.n_tokens)
        if item.samples:
            req.session.ids.append(7)
            req.output_ids.append(7)
            if len(req.output_ids) >= req.params.max_tokens:
                sched.remove(req)
                sched.session_idle(req.session)
    return plan


def test_tier_order_then_arrival():
    sched = Scheduler(BlockManager(64, BS), max_tokens_per_step=8, max_running=8)
    flex = make_request(8, "flex", base=100)
    default1 = make_request(8, "default", base=200)
    priority = make_request(8, "priority", base=300)
    default2 = make_request(8, "default", base=400)
    for r in (flex, default1, priority, default2):
        sched.add(r)
    admitted = []
    for _ in range(30):
        plan = run_step(sched)
        admitted += [it.request for it in plan.items if it.start == 0]
    assert admitted == [priority, default1, default2, flex]


def test_token_budget_decodes_first_then_chunked_prefill():
    sched = Scheduler(BlockManager(256, BS), max_tokens_per_step=16, max_running=8)
    short = [make_request(3, max_tokens=50, base=100 * i) for i in range(3)]
    for r in short:
        sched.add(r)
    run_step(sched)  # prefills the three short prompts (9 tokens)
    long = make_request(100, max_tokens=2, base=5000)
    sched.add(long)
    chunks = []
    for _ in range(12):
        plan = run_step(sched)
        assert plan.num_tokens <= 16
        decodes = [it for it in plan.items if it.request in short]
        assert all(it.n_tokens == 1 for it in decodes)
        # decodes come before any prefill chunk in the plan
        kinds = ["d" if it.request in short or it.start >= 100 else "p" for it in plan.items]
        assert kinds == sorted(kinds)
        chunks += [it.n_tokens for it in plan.items if it.request is long and it.start < 100]
    assert chunks[0] == 13  # 16 minus the three decodes
    assert sum(chunks) == 100 and len(chunks) == 8  # 7 chunks of 13, then the last 9
    assert max(chunks) <= 13


def test_flex_progresses_under_constant_priority_load():
    def flex_wait(aging: int) -> int | None:
        sched = Scheduler(BlockManager(512, BS), max_tokens_per_step=4, max_running=1, flex_aging_steps=aging)
        flex = make_request(4, "flex", max_tokens=1)
        sched.add(flex)
        for step in range(60):
            sched.add(make_request(4, "priority", max_tokens=1, base=1000 + step * 10))
            run_step(sched)
            if flex.state is State.FINISHED:
                return step
        return None

    assert flex_wait(aging=10) is not None and flex_wait(aging=10) <= 12
    assert flex_wait(aging=10_000) is None  # without aging, priority load would starve it


def test_idle_sessions_unpinned_before_running_preempted():
    bm = BlockManager(5, BS)
    sched = Scheduler(bm, max_tokens_per_step=64, max_running=8)
    idle_req = make_request(8, max_tokens=1, base=500)  # keeps its 2 blocks after its reply
    sched.add(idle_req)
    run_step(sched)
    assert idle_req.state is State.FINISHED and idle_req.session.block_table
    assert list(sched.idle) == [idle_req.session.id]

    running = make_request(8, "flex", max_tokens=20, base=0)
    sched.add(running)
    run_step(sched)
    newcomer = make_request(4, "priority", max_tokens=20, base=900)
    sched.add(newcomer)
    # two steps: the newcomer's prefill (the flex decode sits it out), then both decode
    plans = [run_step(sched), run_step(sched)]
    # memory ran short: the idle session went first, nobody running was preempted
    assert idle_req.session in [s for p in plans for s in p.unpinned]
    assert idle_req.session.block_table == [] and idle_req.session.num_cached == 0
    assert [r for p in plans for r in p.preempted] == [] and running.state is State.RUNNING
    assert newcomer.state is State.RUNNING

    # keep decoding until the pool is exhausted again: now the lowest tier is preempted
    preempted = []
    for _ in range(12):
        preempted += run_step(sched).preempted
        if preempted:
            break
    assert preempted == [running]
    assert running.state is State.WAITING and running.session.block_table == []
    assert newcomer.state is State.RUNNING
    assert sched.preemptions == 1
    assert sched.preemptions_by_tier == {running.tier: 1}  # the metrics count preemptions by tier


def test_preempted_request_resumes_and_recomputes():
    bm = BlockManager(5, BS)
    sched = Scheduler(bm, max_tokens_per_step=64, max_running=8)
    low = make_request(6, "flex", max_tokens=6, base=0)
    high = make_request(6, "priority", max_tokens=6, base=100)
    sched.add(low)
    sched.add(high)
    for _ in range(40):
        run_step(sched)
        if low.state is State.FINISHED and high.state is State.FINISHED:
            break
    assert high.state is State.FINISHED and low.state is State.FINISHED
    assert len(low.output_ids) == 6 and len(high.output_ids) == 6
    assert low.stats.preemptions >= 1 and high.stats.preemptions == 0


def test_pool_never_overcommits():
    bm = BlockManager(10, BS)
    sched = Scheduler(bm, max_tokens_per_step=32, max_running=16)
    reqs = [make_request(7, tier, max_tokens=9, base=100 * i)
            for i, tier in enumerate(["flex", "default", "priority"] * 3)]
    for r in reqs:
        sched.add(r)
    for _ in range(400):
        run_step(sched)
        bm.check()
        for r in sched.running:
            assert len(r.session.block_table) * BS >= r.session.num_cached
        if all(r.state is State.FINISHED for r in reqs):
            break
    assert all(len(r.output_ids) == 9 for r in reqs)


def test_expired_lists_only_never_admitted_requests():
    sched = Scheduler(BlockManager(8, BS))
    r = make_request(4)
    r.stats.arrival = 0.0
    sched.add(r)
    assert sched.expired(now=100.0, timeout_s=30.0) == [r]
    run_step(sched)
    assert sched.expired(now=100.0, timeout_s=30.0) == []


def test_priority_prefill_step_defers_lower_tier_decodes_once():
    sched = Scheduler(BlockManager(256, BS), max_tokens_per_step=64, max_running=8)
    flex = [make_request(3, "flex", max_tokens=100, base=100 * i) for i in range(4)]
    for r in flex:
        sched.add(r)
    run_step(sched)  # prefill the flex prompts; from now on they decode
    assert {it.request for it in run_step(sched).items} == set(flex)

    voice = make_request(30, "priority", max_tokens=5, base=9000)
    sched.add(voice)
    first = run_step(sched)
    assert [it.request for it in first.items] == [voice]  # the voice prompt runs alone
    second = run_step(sched)
    assert set(flex) <= {it.request for it in second.items}  # never two steps in a row: flex decodes again
    assert voice in {it.request for it in second.items}  # and the voice reply decodes beside them


def start_flex(sched: Scheduler, n: int) -> list[Request]:
    """``n`` flex requests past their prefill, decoding one token a step."""
    flex = [make_request(3, "flex", max_tokens=1000, base=100 * i) for i in range(n)]
    for r in flex:
        sched.add(r)
    run_step(sched)
    return flex


def test_flex_decodes_progress_under_constant_priority_arrivals():
    sched = Scheduler(BlockManager(4096, BS), max_tokens_per_step=64, max_running=64)
    flex = start_flex(sched, 6)
    for step in range(60):  # a new voice prompt every step, each replying with 2 tokens
        sched.add(make_request(8, "priority", max_tokens=2, base=10_000 + 100 * step))
        run_step(sched, now=float(step))
    # prefill steps defer flex at most every other step: of 60 steps, at least 30 decode every flex request
    assert all(len(r.output_ids) >= 30 for r in flex)


def test_a_paused_request_sits_out_until_resumed_or_its_pause_ends():
    sched = Scheduler(BlockManager(64, BS), max_tokens_per_step=16, max_running=8)
    voice, other = make_request(4, "priority", max_tokens=20), make_request(4, max_tokens=20, base=100)
    for r in (voice, other):
        sched.add(r)
    run_step(sched, now=0.0)  # both prefill and sample their first token
    voice.paused_until = 5.0  # Generation.pause(max_s=5) at t=0
    for t in (1.0, 2.0):
        assert [it.request for it in run_step(sched, now=t).items] == [other]
    assert {it.request.id for it in run_step(sched, now=5.0).items} == {voice.id, other.id}  # the pause ran out
    voice.paused_until = 9.0
    assert voice not in [it.request for it in run_step(sched, now=6.0).items]
    voice.paused_until = 0.0  # Generation.resume()
    assert voice in [it.request for it in run_step(sched, now=6.5).items]


def test_flex_only_steps_are_abortable_but_flex_keeps_one_step_in_three():
    sched = Scheduler(BlockManager(512, BS), max_tokens_per_step=64, max_running=16)
    flex = start_flex(sched, 3)
    plan = sched.schedule(0.0)
    assert plan.abortable and {it.request for it in plan.items} == set(flex)
    sched.step_aborted()  # a voice prompt arrived: the engine dropped the step, nothing was committed
    voice = make_request(30, "priority", max_tokens=3, base=9000)
    sched.add(voice)
    replanned = run_step(sched)
    assert [it.request for it in replanned.items] == [voice] and not replanned.abortable
    after = run_step(sched)  # flex was held back twice (aborted, then deferred): this step is flex's
    assert set(flex) <= {it.request for it in after.items}
    assert not after.abortable  # it also holds the voice reply's decode
    for _ in range(2):
        run_step(sched)  # the voice reply ends
    assert voice.state is State.FINISHED

    assert sched.schedule(0.0).abortable  # flex work only again
    sched.step_aborted()
    assert sched.schedule(0.0).abortable  # one lost step: the one before it made progress
    sched.step_aborted()
    assert sched.aborted_steps == 3
    again = run_step(sched)
    assert {it.request for it in again.items} == set(flex)  # the aborted decodes are planned again
    assert not again.abortable  # two steps in a row made no flex progress: this one must not be lost


def finished_session(sched: Scheduler, n_prompt: int, opener: list[int], base: int) -> Session:
    """A session whose reply ended (its last sampled token is pending) and that now holds the next turn's opener."""
    req = make_request(n_prompt, max_tokens=1, base=base)
    sched.add(req)
    while req.state is not State.FINISHED:
        run_step(sched)
    req.session.ids += opener
    sched.session_idle(req.session)
    return req.session


def test_idle_sessions_warm_with_the_budget_left_and_never_sample():
    sched = Scheduler(BlockManager(16, BS), max_tokens_per_step=8, max_running=8)
    idle = finished_session(sched, 4, [50, 51, 52], base=100)
    assert idle.pending == 4
    voice = make_request(6, "priority", max_tokens=10, base=200)
    sched.add(voice)
    plan = run_step(sched)
    assert [(it.request, it.n_tokens) for it in plan.items] == [(voice, 6), (None, 2)]  # the prompt first
    warm = plan.items[1]
    assert warm.session is idle and warm.start == 4 and not warm.samples and warm.rank == TIER_RANK["flex"]
    assert warm.token_ids == [7, 50] and warm.edits == idle.edits
    plan = run_step(sched)
    assert [(it.request, it.n_tokens) for it in plan.items] == [(voice, 1), (None, 2)]
    assert idle.pending == 0
    assert all(it.request is voice for it in run_step(sched).items) and not sched.warming


def test_warming_waits_for_queued_requests_and_never_takes_blocks_from_others():
    bm = BlockManager(3, BS)
    sched = Scheduler(bm, max_tokens_per_step=64, max_running=1)
    idle = finished_session(sched, 4, [50, 51, 52, 53, 54], base=100)  # holds 1 block, needs 2 more to warm
    running = make_request(3, max_tokens=50, base=200)
    queued = make_request(3, max_tokens=5, base=300)
    sched.add(running)
    sched.add(queued)  # max_running=1: it waits
    plan = run_step(sched)
    assert [it.request for it in plan.items] == [running]  # a request waits: no warming
    sched.remove(queued)
    plan = run_step(sched)
    # one block is free, warming needs two: it is given up rather than unpinning or preempting anyone
    assert [it.request for it in plan.items] == [running] and not plan.unpinned and not plan.preempted
    assert not sched.warming and idle.block_table and idle.pending == 6
