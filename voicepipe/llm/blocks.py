"""The paged KV store's bookkeeping: which block holds which tokens, who uses it, and which to reuse next.

Pure logic, no tensors: the runner owns the K/V pool and indexes it with the block ids handed out here.

- A block holds ``block_size`` consecutive tokens of one sequence.
- A *full* block is registered under a chain hash ``hash((parent_hash, tokens))``; a later sequence with the same
  prefix finds it (the tokens are compared on every hit, so a hash collision can never serve wrong KV).
- Blocks are reference counted. A block whose count drops to zero joins the free list but keeps its hash, so it can
  still be hit until it is reused; reuse takes the least recently freed block first (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

NO_HASH = None


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """The hash of a full block: its parent's hash and its own token ids."""
    return hash((parent, tuple(tokens)))


class OutOfBlocksError(RuntimeError):
    """Raised by ``allocate`` when the free list is empty (the scheduler checks ``num_free`` first)."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [NO_HASH] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        # Free blocks in LRU order: first = least recently freed = reused first.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        # Counters for the engine's stats.
        self.hit_blocks = 0
        self.lookup_blocks = 0

    # -- capacity ---------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def free_order(self) -> list[int]:
        """Free block ids, the next to be reused first."""
        return list(self._free)

    # -- allocation ---------------------------------------------------------------------------------------------
    def allocate(self, prefer: int | None = None) -> int:
        """Take a free block (refcount 1). ``prefer`` (the block after a sequence's last one) is taken instead of
        the LRU head when it is free and holds no hash, so a lone sequence stays contiguous without evicting a
        cached block out of LRU order."""
        if not self._free:
            raise OutOfBlocksError("the KV pool has no free block")
        if prefer is not None and prefer in self._free and self.block_hash[prefer] is NO_HASH:
            del self._free[prefer]
            block = prefer
        else:
            block, _ = self._free.popitem(last=False)
        self._forget_hash(block)
        self.ref_count[block] = 1
        return block

    def unregister(self, block: int) -> None:
        """Forget a block's hash (its owner is about to overwrite part of it)."""
        self._forget_hash(block)

    def _forget_hash(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not NO_HASH and self.hash_to_block.get(h) == block:
            del self.hash_to_block[h]
        self.block_hash[block] = NO_HASH
        self.block_tokens[block] = None

    def incref(self, block: int) -> None:
        if self.ref_count[block] == 0:
            del self._free[block]
        self.ref_count[block] += 1

    def release(self, block: int) -> None:
        if self.ref_count[block] <= 0:
            raise AssertionError(f"block {block} released more often than taken")
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self._free[block] = None  # most recently freed: reused last

    def release_table(self, table: list[int]) -> None:
        """Release a sequence's blocks, tail first, so that its prefix (the most shareable part) is reused last."""
        for block in reversed(table):
            self.release(block)
        table.clear()

    # -- prefix cache -------------------------------------------------------------------------------------------
    def register(self, block: int, parent_hash: int | None, tokens: Sequence[int]) -> int:
        """Record that ``block`` now holds the full, computed block ``tokens``; returns its chain hash."""
        tokens = tuple(tokens)
        if len(tokens) != self.block_size:
            raise AssertionError("only full blocks are registered")
        h = chain_hash(parent_hash, tokens)
        self.block_hash[block] = h
        self.block_tokens[block] = tokens
        self.hash_to_block.setdefault(h, block)
        return h

    def lookup(self, parent_hash: int | None, tokens: Sequence[int]) -> tuple[int, int] | None:
        """Find a computed block for ``tokens`` after ``parent_hash``: ``(block, hash)`` or None."""
        tokens = tuple(tokens)
        h = chain_hash(parent_hash, tokens)
        block = self.hash_to_block.get(h)
        if block is None or self.block_tokens[block] != tokens:
            return None
        return block, h

    def match_prefix(self, token_ids: Sequence[int], max_tokens: int | None = None) -> tuple[list[int], list[int]]:
        """Take (incref) the cached full blocks that start ``token_ids``; returns ``(blocks, hashes)``.

        At most ``max_tokens`` tokens are matched (the engine passes ``len(ids) - 1``: the last prompt token is
        always computed, since its logits give the first reply token)."""
        limit = len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
        blocks: list[int] = []
        hashes: list[int] = []
        parent = None
        bs = self.block_size
        for start in range(0, limit - bs + 1, bs):
            self.lookup_blocks += 1
            found = self.lookup(parent, token_ids[start:start + bs])
            if found is None:
                break
            block, parent = found
            self.incref(block)
            self.hit_blocks += 1
            blocks.append(block)
            hashes.append(parent)
        return blocks, hashes

    def check(self) -> None:
        """Consistency check for tests: refcounts, free list and hash map agree."""
        for b in range(self.num_blocks):
            assert self.ref_count[b] >= 0
            assert (self.ref_count[b] == 0) == (b in self._free), f"block {b}: refcount and free list disagree"
        for h, b in self.hash_to_block.items():
            assert self.block_hash[b] == h
