"""Speculative decoding: propose a few tokens cheaply, verify them all in the next decode step, keep what the
model would have produced anyway.

A decode step reads every weight once whatever its row count, so checking k drafted tokens costs little more than
one token (SmolLM2 int8 on this CPU, all linears: 10.4 ms for 1 row, 15.8 ms for 4). The step computes the logits
after the decode's token and after each drafted token; with greedy sampling the target picks ``t_0 .. t_k``, the
drafts ``d_1 .. d_a`` that equal ``t_0 .. t_(a-1)`` are accepted, and ``t_a`` comes on top: every kept token is
the argmax of the logits after exactly the tokens before it, as plain decoding would compute it. The rejected
drafts' K/V stays in slots past the sequence's cached length, where the next step overwrites it.

Only greedy, unconstrained requests speculate (``Request.speculate``); sampled ones decode one token a step.

Proposers fill the room the scheduler held (``ScheduledItem.draft_slots``) before the forward:

- ``PromptLookup``: the continuation of the latest earlier occurrence of the sequence's last n-gram (longest first)
  in its own ids, the system prompt and earlier turns included: a caller's name, a number read back, a repeated
  phrase. No model, no extra forward.
- ``DraftModel``: a smaller model of the same vocabulary (on a GPU: a small draft for a larger target) decodes the
  draft greedily. It keeps its own K/V pool on the target's block tables: every step's tokens are run through it
  too (``mirror``), so its cache holds what the target's holds.
"""

from __future__ import annotations

from typing import Protocol

from voicepipe.llm.scheduler import ScheduledItem


class Proposer(Protocol):
    def propose(self, items: list[ScheduledItem]) -> None:
        """``set_draft`` on every item with ``draft_slots``."""

    def mirror(self, items: list[ScheduledItem]) -> None:
        """The step's forward ran over ``items``: keep any state of the proposer in step with it."""


def accept(draft: list[int], targets: list[int]) -> tuple[list[int], int]:
    """Greedy verification: ``targets[i]`` is the target's token after the decode's token and ``draft[:i]``.
    Returns the tokens to emit (the accepted drafts, then the target's next token) and how many drafts were
    accepted."""
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return targets[:n + 1], n


class _NgramIndex:
    """Where each n-gram of a sequence last ended, for the positions indexed so far."""

    def __init__(self, min_n: int, max_n: int, start: int) -> None:
        self.sizes = range(max_n, min_n - 1, -1)
        self.last_end: dict[tuple[int, ...], int] = {}
        self.indexed = start  # n-grams ending before this position are indexed
        self.start = start

    def update(self, ids: list[int]) -> None:
        """Index the n-grams ending at every position but the last (which has no continuation yet)."""
        for end in range(self.indexed, len(ids) - 1):
            for n in self.sizes:
                if end - n + 1 >= self.start:
                    self.last_end[tuple(ids[end - n + 1:end + 1])] = end
        self.indexed = max(self.indexed, len(ids) - 1)

    def continuation(self, ids: list[int], k: int) -> list[int]:
        for n in self.sizes:
            end = self.last_end.get(tuple(ids[-n:])) if len(ids) >= n else None
            if end is not None:
                return ids[end + 1:end + 1 + k]
        return []


class PromptLookup:
    """Drafts from the sequence's own history (n-grams of ``min_n`` to ``max_n`` tokens, longest match first), over
    its last ``window`` tokens."""

    def __init__(self, max_n: int = 3, min_n: int = 2, window: int = 4096) -> None:
        self.max_n, self.min_n, self.window = max_n, min_n, window

    def propose(self, items: list[ScheduledItem]) -> None:
        for item in items:
            if item.draft_slots:
                item.set_draft(self.draft(item.request, item.draft_slots))

    def draft(self, req, k: int) -> list[int]:
        ids = req.session.ids
        if req.lookup is None:
            req.lookup = _NgramIndex(self.min_n, self.max_n, max(0, len(ids) - self.window))
        req.lookup.update(ids)
        return req.lookup.continuation(ids, k)

    def mirror(self, items: list[ScheduledItem]) -> None:
        pass


class DraftModel:
    """Drafts decoded greedily by ``runner``, a ``ModelRunner`` of the draft model whose K/V pool has the target
    pool's blocks."""

    def __init__(self, runner) -> None:
        self.runner = runner

    def propose(self, items: list[ScheduledItem]) -> None:
        active = [item for item in items if item.draft_slots]
        drafts: dict[int, list[int]] = {id(item): [] for item in active}
        for _ in range(max((item.draft_slots for item in active), default=0)):
            rounds = []
            for item in active:
                draft = drafts[id(item)]
                if len(draft) < item.draft_slots:
                    step = ScheduledItem(item.request, item.start, 1, session=item.session)
                    step.draft_slots = len(draft)
                    step.set_draft(draft)
                    rounds.append((step, draft))
            logits = self.runner.forward([step for step, _ in rounds])
            rows, row = [], -1
            for step, _ in rounds:
                row += 1 + len(step.draft)  # each step's rows: its token's, then each draft token's
                rows.append(row)
            for (_, draft), token in zip(rounds, logits[rows].argmax(dim=-1).tolist(), strict=True):
                draft.append(token)
        for item in active:
            item.set_draft(drafts[id(item)])

    def mirror(self, items: list[ScheduledItem]) -> None:
        self.runner.forward(items, logits=False)
