"""A conversation's exact token ids and its block table in the paged KV store.

``ids`` are every token the conversation holds, in order; the first ``num_cached`` of them have their K/V in the
blocks of ``block_table`` (the rest are computed by the next prefill). Between turns a session keeps its blocks
pinned; the engine may unpin an idle one under memory pressure (its ids stay, so the next turn recomputes, after
re-matching whatever full blocks are still cached by hash).

After a reply, ``ids`` may end with the next turn's *opener* (from ``warm_start``): the chat template's text that
starts any user turn, which the engine prefills while the session is idle. The next turn keeps those ids if its
own rendering starts with them, and cuts them off otherwise.

The methods that touch blocks take the engine's ``BlockManager`` and must run under the engine's lock.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from voicepipe.llm.blocks import BlockManager

_ids = itertools.count(1)


@dataclass
class TurnMark:
    """Where a turn started: rolling back to a mark restores the history exactly."""

    n_messages: int
    n_ids: int
    text_len: int


@dataclass(eq=False)
class Session:
    """One conversation. Create it with ``engine.open_session()``; close it with ``engine.close_session()``."""

    id: int = field(default_factory=lambda: next(_ids))
    ids: list[int] = field(default_factory=list)
    num_cached: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chain hash of each full, computed block
    messages: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""  # the rendered chat text that ``ids`` tokenize to
    marks: list[TurnMark] = field(default_factory=list)
    reply_start: int | None = None  # index in ids where the last assistant reply begins
    warm_start: int | None = None  # index in ids where the next turn's opener begins (see the module doc)
    edits: int = 0  # counts cuts of ids or K/V, so a step planned before one knows its work is stale
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    closed: bool = False
    ephemeral: bool = False  # a sessionless request's own session: closed when the request ends
    compactions: int = 0
    requests: int = 0  # the turns' generations, less those rolled back: the turn count (labels TTFT in metrics)
    system_prompt: str | None = None  # rendered as the first message of the first turn

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def reply_end(self) -> int:
        """Where the last reply (or, with no reply, the conversation) ends: before the opener, if one is held."""
        return len(self.ids) if self.warm_start is None else self.warm_start

    @property
    def pending(self) -> int:
        """Tokens whose K/V still has to be computed."""
        return len(self.ids) - self.num_cached

    # -- blocks ------------------------------------------------------------------------------------------------
    def blocks_needed(self, bm: BlockManager, n_total: int) -> int:
        return max(0, bm.blocks_for(n_total) - len(self.block_table))

    def ensure_slots(self, bm: BlockManager, n_total: int) -> bool:
        """Grow the block table to hold ``n_total`` tokens; False (and nothing taken) if the pool is short."""
        need = self.blocks_needed(bm, n_total)
        if need > bm.num_free:
            return False
        for _ in range(need):
            prefer = self.block_table[-1] + 1 if self.block_table else None
            if prefer is not None and prefer >= bm.num_blocks:
                prefer = None
            self.block_table.append(bm.allocate(prefer))
        return True

    def commit(self, bm: BlockManager, n_new: int) -> None:
        """``n_new`` more tokens now have their K/V written: register the blocks that became full."""
        self.num_cached += n_new
        bs = bm.block_size
        for i in range(len(self.block_hashes), self.num_cached // bs):
            parent = self.block_hashes[-1] if self.block_hashes else None
            self.block_hashes.append(bm.register(self.block_table[i], parent, self.ids[i * bs:(i + 1) * bs]))

    def attach_prefix(self, bm: BlockManager) -> int:
        """With no blocks held, take the cached full blocks that start ``ids``; returns the tokens reused."""
        if self.block_table or self.num_cached:
            return 0
        blocks, hashes = bm.match_prefix(self.ids, len(self.ids) - 1)
        self.block_table, self.block_hashes = blocks, hashes
        self.num_cached = len(blocks) * bm.block_size
        return self.num_cached

    def drop_kv(self, bm: BlockManager) -> None:
        """Release every block (unpin or preempt); the ids stay and are recomputed later."""
        self.edits += 1
        bm.release_table(self.block_table)
        self.block_hashes = []
        self.num_cached = 0

    def recompute_from(self, bm: BlockManager, n_tokens: int) -> None:
        """Keep every id but only the K/V of the first ``n_tokens``, so the next prefill computes the rest again."""
        if n_tokens >= self.num_cached:
            return
        rest = self.ids[n_tokens:]
        self.truncate_kv(bm, n_tokens)
        self.ids.extend(rest)

    def truncate_kv(self, bm: BlockManager, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` ids and the K/V that belongs to them; release the blocks past them."""
        bs = bm.block_size
        self.edits += 1
        del self.ids[n_tokens:]
        if self.warm_start is not None and n_tokens <= self.warm_start:
            self.warm_start = None
        keep_blocks = bm.blocks_for(min(n_tokens, self.num_cached))
        for block in reversed(self.block_table[keep_blocks:]):
            bm.release(block)
        del self.block_table[keep_blocks:]
        self.num_cached = min(self.num_cached, n_tokens)
        full = self.num_cached // bs
        if full < len(self.block_table) and len(self.block_hashes) > full:
            # The last kept block was full and registered; it is now partial and will be written again.
            last = self.block_table[full]
            if bm.ref_count[last] == 1:
                bm.unregister(last)
            else:  # shared with another sequence: never write into it; recompute its kept tokens instead
                bm.release(last)
                del self.block_table[full:]
                self.num_cached = full * bs
        del self.block_hashes[full:]  # a cut at a block boundary keeps only the full blocks' hashes
