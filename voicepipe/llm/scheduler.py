"""Scheduler policy: what one engine step computes. Pure logic over sessions and the block manager.

Each step:
1. Running decodes first, one token each, in tier order (``priority`` > ``default`` > ``flex``), then least
   recently decoded. With speculation, a decode of a speculating request holds room for up to ``spec_tokens``
   drafted tokens while the step has at most ``spec_max_batch`` decodes (beyond that the drafts' rows cost more
   than they save); the engine fills it (``ScheduledItem.set_draft``) before the forward.
2. Then prefill chunks, up to the step's token budget: requests already mid-prefill first, then the waiting queue
   in tier order then arrival. A ``flex`` request that has waited ``flex_aging_steps`` steps ranks as ``priority``,
   so it cannot starve.
3. Memory pressure: unpin idle sessions, longest-idle first; then preempt running requests of the lowest tier
   (latest arrival first). A preempted request goes back to the queue and recomputes its K/V when it resumes.
4. A paused request (``Generation.pause``, until its ``paused_until``) is left out of the steps.
5. Warming, with the budget left and only when no request waits: idle sessions' pending ids (a reply's last sampled
   token and the next turn's opener, see ``Session``) are prefilled, so the next turn has fewer to prefill. It takes
   free blocks only; it never unpins or preempts.
6. A step of ``flex`` work only is ``abortable``: a ``priority`` or ``default`` request that arrives while it runs
   stops it at the next layer (the engine discards it; nothing was committed or sampled), because on a CPU one
   step of background decodes lasts as long as the voice prompt's own prefill. Never when both of the last two
   steps held the lower tiers back (aborted, or deferred for a prefill), so flex still gets one step in three.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from voicepipe.llm.blocks import BlockManager
from voicepipe.llm.request import TIER_RANK, Request, State
from voicepipe.llm.session import Session

FLEX_RANK = TIER_RANK["flex"]


@dataclass
class ScheduledItem:
    """One sequence's tokens in a step. What the step reads of the session is copied when it is planned: a warming
    session is idle, so the engine's API may cut it while the step runs (``edits`` tells the engine it did)."""

    request: Request | None  # None: warming an idle session
    start: int  # position of the first token computed this step
    n_tokens: int  # tokens the step computes: the sequence's own, then the draft's
    session: Session = None  # type: ignore[assignment]  # the request's session unless given
    draft_slots: int = 0  # room held for drafted tokens after a decode's token (speculative decoding)
    token_ids: list[int] = field(init=False)
    draft: list[int] = field(init=False)  # drafted tokens the step verifies (``set_draft``)
    block_table: list[int] = field(init=False)
    edits: int = field(init=False)
    samples: bool = field(init=False)  # the chunk reaches the end of a request's sequence: sample the next token
    probe: int | None = field(init=False)  # the chunk holds the request's probe row (at this offset in the chunk)

    def __post_init__(self) -> None:
        if self.session is None:
            self.session = self.request.session
        end = self.start + self.n_tokens
        self.token_ids = self.session.ids[self.start:end]
        self.draft = []
        self.block_table = list(self.session.block_table)
        self.edits = self.session.edits
        self.samples = self.request is not None and end == len(self.session.ids)
        probe_at = None if self.request is None else self.request.probe_at
        self.probe = probe_at - self.start if probe_at is not None and self.start <= probe_at < end else None

    def set_draft(self, draft: list[int]) -> None:
        """Verify ``draft`` (at most ``draft_slots`` tokens) after the sequence's tokens in this step."""
        own = self.n_tokens - len(self.draft)
        self.draft = list(draft[:self.draft_slots])
        self.token_ids = self.token_ids[:own] + self.draft
        self.n_tokens = own + len(self.draft)

    @property
    def rank(self) -> int:
        return FLEX_RANK if self.request is None else self.request.rank


@dataclass
class StepPlan:
    items: list[ScheduledItem]
    preempted: list[Request]
    unpinned: list[Session]
    abortable: bool = False  # flex work only: a priority/default arrival may stop it (see the module doc)

    @property
    def num_tokens(self) -> int:
        return sum(item.n_tokens for item in self.items)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_tokens_per_step: int = 256, max_running: int = 32,
                 flex_aging_steps: int = 64, warm_idle: bool = True, spec_tokens: int = 0,
                 spec_max_batch: int = 4) -> None:
        self.blocks = blocks
        self.spec_tokens = spec_tokens  # draft slots per speculating decode (0: no speculation)
        self.spec_max_batch = spec_max_batch  # ... while a step holds at most this many decodes
        self.max_tokens_per_step = max_tokens_per_step
        self.max_running = max_running
        self.flex_aging_steps = flex_aging_steps
        self.warm_idle = warm_idle
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.idle: OrderedDict[int, Session] = OrderedDict()  # sessions holding blocks, least recently used first
        self.warming: dict[int, Session] = {}  # idle sessions with ids to prefill, in the order they went idle
        self.step_no = 0
        self.preemptions = 0
        self.preemptions_by_tier: Counter[str] = Counter()
        self.unpins = 0
        self._deferred_last_step = False  # lower-tier decodes sat out the last step (see schedule())
        self._held_back: deque[bool] = deque([False, False], maxlen=2)  # the last steps deferred or aborted flex
        self.aborted_steps = 0
        self.decodes_scheduled = 0

    # -- queue ----------------------------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.state = State.WAITING
        req.enqueued_step = self.step_no
        self.forget_session(req.session)
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Take a request out (finished or cancelled); its session becomes idle if it still holds blocks."""
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        req.state = State.FINISHED

    def session_idle(self, session: Session) -> None:
        if session.block_table and not session.closed:
            self.idle[session.id] = session
            self.idle.move_to_end(session.id)
            if session.pending and self.warm_idle:
                self.warming[session.id] = session

    def forget_session(self, session: Session) -> None:
        self.idle.pop(session.id, None)
        self.warming.pop(session.id, None)

    def _wait_key(self, req: Request) -> tuple[int, int]:
        rank = req.rank
        if req.tier == "flex" and self.step_no - req.enqueued_step >= self.flex_aging_steps:
            rank = 0
        return rank, req.seq

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.warming)

    # -- memory pressure --------------------------------------------------------------------------------------------
    def _make_room(self, need: int, victim_rank: int, protected: set[int], plan: StepPlan) -> bool:
        """Free ``need`` blocks: unpin idle sessions (longest idle first), then preempt running requests whose
        tier rank is ``victim_rank`` or lower (lowest tier, latest arrival first)."""
        bm = self.blocks
        while bm.num_free < need and self.idle:
            _, session = self.idle.popitem(last=False)
            self.warming.pop(session.id, None)
            session.drop_kv(bm)
            plan.unpinned.append(session)
            self.unpins += 1
        while bm.num_free < need:
            victims = [r for r in self.running if r.id not in protected and r.rank >= victim_rank]
            if not victims:
                return False
            victim = max(victims, key=lambda r: (r.rank, r.seq))
            self._preempt(victim, plan)
        return bm.num_free >= need

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        self.running.remove(req)
        req.session.drop_kv(self.blocks)
        req.state = State.WAITING
        req.stats.preemptions += 1
        req.enqueued_step = min(req.enqueued_step, self.step_no)
        self.waiting.append(req)
        self.preemptions += 1
        self.preemptions_by_tier[req.tier] += 1
        plan.preempted.append(req)

    # -- one step -------------------------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        """Plan the next step; ``now`` (monotonic seconds) ends the pauses that are due."""
        self.step_no += 1
        plan = StepPlan([], [], [])
        bm = self.blocks
        budget = self.max_tokens_per_step
        scheduled: set[int] = set()

        # 1. decodes. While a higher tier's prompt waits for prefill, lower tiers' decodes sit the step out, so
        # a voice turn's first token does not wait behind a batch of background decodes; never two steps in a
        # row, so the lower tiers keep at least half their pace under any load.
        decodes = sorted((r for r in self.running if r.session.pending == 1 and r.admitted and r.paused_until <= now),
                         key=lambda r: (r.rank, r.last_decode, r.seq))
        prefill_ranks = [r.rank for r in self.waiting] + [r.rank for r in self.running if r.session.pending > 1]
        best_prefill = min(prefill_ranks, default=None)
        deferring = (best_prefill is not None and not self._deferred_last_step
                     and any(r.rank > best_prefill for r in decodes))
        deferred = {r.id for r in decodes if r.rank > best_prefill} if deferring else set()
        decodes = [r for r in decodes if r.id not in deferred]
        self._deferred_last_step = deferring
        speculating = self.spec_tokens > 0 and len(decodes) <= self.spec_max_batch
        for req in decodes:
            if budget <= 0:
                break
            if req.state is not State.RUNNING:  # preempted earlier in this loop
                continue
            s = req.session
            need = s.blocks_needed(bm, s.num_cached + 1)
            if need and not self._make_room(need, req.rank, scheduled | {req.id}, plan):
                self._preempt(req, plan)
                continue
            s.ensure_slots(bm, s.num_cached + 1)
            slots = self._draft_slots(req, budget - 1) if speculating else 0
            plan.items.append(ScheduledItem(req, s.num_cached, 1, draft_slots=slots))
            self.decodes_scheduled += 1
            req.last_decode = self.decodes_scheduled
            scheduled.add(req.id)
            budget -= 1 + slots

        # 2. prefill chunks: mid-prefill running requests, then the waiting queue
        mid = sorted((r for r in self.running if r.id not in scheduled | deferred and r.session.pending > 0
                      and r.paused_until <= now), key=lambda r: (r.rank, r.seq))
        queue = sorted(self.waiting, key=self._wait_key)
        for req in mid + queue:
            if budget <= 0:
                break
            if req in plan.preempted:
                continue
            is_new = req.state is State.WAITING
            if is_new and len(self.running) >= self.max_running:
                break
            s = req.session
            if is_new and not s.block_table:
                s.attach_prefix(bm)
            if is_new and req.probe_at is not None:  # the probe's row must be computed, not read from the cache
                s.recompute_from(bm, req.probe_at)
            chunk = min(s.pending, budget)
            need = s.blocks_needed(bm, s.num_cached + chunk)
            if need > bm.num_free:
                # a prompt only preempts strictly lower tiers, so equal work never thrashes
                self._make_room(need, req.rank + 1, scheduled | {req.id}, plan)
            if need > bm.num_free:  # take what fits: the slack in the last block plus the free blocks
                room = len(s.block_table) * bm.block_size + bm.num_free * bm.block_size - s.num_cached
                chunk = min(chunk, room)
                if chunk <= 0:
                    break
            s.ensure_slots(bm, s.num_cached + chunk)
            if is_new:
                self.waiting.remove(req)
                self.running.append(req)
                req.state = State.RUNNING
                req.admitted = True
            plan.items.append(ScheduledItem(req, s.num_cached, chunk))
            scheduled.add(req.id)
            budget -= chunk
        if not self.waiting:
            self._warm(plan, budget)
        plan.abortable = (bool(plan.items) and not all(self._held_back)
                          and all(it.rank == FLEX_RANK for it in plan.items))
        self._held_back.append(deferring)
        return plan

    def _draft_slots(self, req: Request, budget: int) -> int:
        """Room for drafted tokens after a decode: up to ``spec_tokens``, no more than the reply may still take, and
        only in free blocks (a draft never unpins or preempts anything)."""
        if not req.speculate:
            return 0
        s = req.session
        slots = min(self.spec_tokens, budget, req.params.max_tokens - len(req.output_ids) - 1)
        while slots > 0 and not s.ensure_slots(self.blocks, s.num_cached + 1 + slots):
            slots -= 1
        return max(0, slots)

    def _warm(self, plan: StepPlan, budget: int) -> None:
        bm = self.blocks
        for s in list(self.warming.values()):
            if budget <= 0:
                return
            if not s.pending or not s.block_table:  # already computed, or unpinned: nothing to warm
                del self.warming[s.id]
                continue
            chunk = min(s.pending, budget)
            if s.blocks_needed(bm, s.num_cached + chunk) > bm.num_free:  # memory is short: leave it to the next turn
                del self.warming[s.id]
                continue
            s.ensure_slots(bm, s.num_cached + chunk)
            plan.items.append(ScheduledItem(None, s.num_cached, chunk, session=s))
            budget -= chunk

    def step_aborted(self) -> None:
        """The engine stopped the last planned (abortable) step: its tokens were neither committed nor sampled, and
        its requests are planned again from where they were."""
        self.aborted_steps += 1
        self._held_back[-1] = True

    def expired(self, now: float, timeout_s: float) -> list[Request]:
        """Waiting requests never admitted within ``timeout_s`` (the engine fails them as overloaded)."""
        return [r for r in self.waiting if not r.admitted and now - r.stats.arrival > timeout_s]
