"""A small reorder buffer: release items in sequence-number order, waiting at most `window` items for a gap."""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

T = TypeVar("T")


class ReorderBuffer(Generic[T]):
    """Holds out-of-order items until the missing numbers arrive.

    `push(seq, item)` returns the items now ready, in order. A number that never comes is given up once
    more than `window` items wait behind it (the gap is skipped). Items older than what was already
    released are dropped as late duplicates. `skip(seq)` consumes a number without an item (a non-media
    message that shares the numbering). Until `reset(first)` is called, the first number seen starts
    the sequence.
    """

    def __init__(self, window: int = 5) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.next: int | None = None
        self.late = 0  # items dropped because their turn had passed
        self.skipped = 0  # sequence numbers given up on
        self._heap: list[tuple[int, int, T | None]] = []
        self._tie = 0

    def __len__(self) -> int:
        return sum(1 for _, _, item in self._heap if item is not None)

    def reset(self, first: int) -> None:
        """Expect `first` next (e.g. the start message's number + 1)."""
        self.next = first

    def push(self, seq: int, item: T) -> list[T]:
        return self._add(seq, item)

    def skip(self, seq: int) -> list[T]:
        return self._add(seq, None)

    def drain(self) -> list[T]:
        """Release everything held, in order (end of stream)."""
        out = [item for _, _, item in sorted(self._heap, key=lambda e: e[:2]) if item is not None]
        if self._heap:
            self.next = max(s for s, _, _ in self._heap) + 1
        self._heap.clear()
        return out

    def _add(self, seq: int, item: T | None) -> list[T]:
        if self.next is None:
            self.next = seq
        if seq < self.next or any(s == seq for s, _, _ in self._heap):
            if item is not None:
                self.late += 1
            return []
        self._tie += 1
        heapq.heappush(self._heap, (seq, self._tie, item))
        out: list[T] = []
        while self._heap:
            head = self._heap[0][0]
            if head != self.next:
                if len(self._heap) <= self.window:
                    break
                self.skipped += head - self.next  # give up on the gap
                self.next = head
            _, _, ready = heapq.heappop(self._heap)
            self.next += 1
            if ready is not None:
                out.append(ready)
        return out
