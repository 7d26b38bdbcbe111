"""Decode steps replayed from CUDA graphs, for the common batch sizes (``llm.cuda_graphs``; GPU only).

On a GPU a decode step of a small model is bound by kernel launches, not by the GPU: ~15 kernels a layer, each
queued by Python. Capturing the step once as a CUDA graph and replaying it launches all of them at once (vLLM and
gpt-fast do this). A graph needs every tensor at a fixed address with a fixed shape, so a decode-only step is
written into static buffers (``StaticDecode``) of a captured batch size: the smallest of ``sizes`` that holds it
(``padded_size``); the padding rows decode token 0 at position 0 into a scratch slot past the block manager's blocks,
with a history of one slot, and their logits are dropped. Attention reads each history through its block table
(``StaticDecodeBatch``: the table padded to a bucket of blocks, a power of two, so that the graphs per batch size
stay few, and positions past each length masked).

Everything but the capture itself (``torch.cuda.CUDAGraph``) runs on any device: on the CPU the same static step
runs eagerly, which is how the tests check the padding, the buckets and that the buffers are reused. The capture
and replay are untested here (no GPU in this project's CI or on its development machine).
"""

from __future__ import annotations

import torch

from voicepipe.llm.attention import StaticDecodeBatch, StepLayout

CAPTURE_SIZES = (1, 2, 4, 8, 16, 32)


def padded_size(batch: int, sizes: tuple[int, ...] = CAPTURE_SIZES) -> int | None:
    """The smallest captured batch size that holds ``batch`` decodes (None: more than the largest)."""
    return next((size for size in sorted(sizes) if size >= batch), None)


def block_bucket(n_blocks: int, max_blocks: int) -> int:
    """History blocks a static step reads: the next power of two of the longest history, at most ``max_blocks``."""
    bucket = 1
    while bucket < n_blocks:
        bucket *= 2
    return min(bucket, max_blocks)


class StaticDecode:
    """Static buffers for decode-only steps of up to ``max(sizes)`` sequences and one static forward (a graph on
    CUDA) per (padded batch size, block bucket), made on first use.

    ``decoder``: the model's ``Decoder``; ``cache``: its KV pool, whose ``scratch_slot`` takes the padding rows'
    K/V; ``max_blocks``: the most blocks a history can have."""

    def __init__(self, decoder, cache, block_size: int, max_blocks: int, sizes: tuple[int, ...] = CAPTURE_SIZES,
                 capture: bool | None = None) -> None:
        self.decoder, self.cache = decoder, cache
        self.block_size, self.max_blocks = block_size, max_blocks
        self.sizes = tuple(sorted(sizes))
        device = cache.k[0].device
        self.capture = device.type == "cuda" if capture is None else capture
        n = self.sizes[-1]
        self.ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slots = torch.zeros(n, dtype=torch.long, device=device)
        self.tables = torch.zeros(n, max_blocks, dtype=torch.long, device=device)
        self.lengths = torch.ones(n, dtype=torch.long, device=device)
        self.rows = torch.arange(n, device=device)
        self._host = torch.zeros(4, n, dtype=torch.long, pin_memory=device.type == "cuda")
        self._host_tables = torch.zeros(n, max_blocks, dtype=torch.long, pin_memory=device.type == "cuda")
        self.graphs: dict[tuple[int, int], tuple[object, torch.Tensor]] = {}
        self.pool = None

    def fits(self, items) -> bool:
        """Whether a decode-only step of ``items`` can run here."""
        return (padded_size(len(items), self.sizes) is not None
                and all(-(-(it.start + 1) // self.block_size) <= self.max_blocks for it in items))

    def fill(self, items) -> tuple[int, int]:
        """Write the step's decodes into the buffers (one host-to-device copy each); returns the padded batch size
        and the block bucket."""
        size = padded_size(len(items), self.sizes)
        bs = self.block_size
        host, tables = self._host, self._host_tables
        host[0].zero_()
        host[1].zero_()
        host[2].fill_(self.cache.scratch_slot)
        host[3].fill_(1)
        tables.fill_(self.cache.scratch_slot // bs)
        longest = 1
        for row, item in enumerate(items):
            n_blocks = -(-(item.start + 1) // bs)
            longest = max(longest, n_blocks)
            host[0, row] = item.token_ids[0]
            host[1, row] = item.start
            host[2, row] = item.block_table[item.start // bs] * bs + item.start % bs
            host[3, row] = item.start + 1
            tables[row, :n_blocks] = torch.tensor(item.block_table[:n_blocks])
        for buffer, values in zip((self.ids, self.positions, self.slots, self.lengths), host, strict=True):
            buffer.copy_(values, non_blocking=True)
        self.tables.copy_(tables, non_blocking=True)
        return size, block_bucket(longest, self.max_blocks)

    def _forward(self, size: int, bucket: int) -> torch.Tensor:
        layout = StepLayout(slots=self.slots[:size], decode_only=True, decode_rows_slice=slice(0, size),
                            decode=StaticDecodeBatch(self.tables[:size, :bucket], self.lengths[:size],
                                                     self.block_size))
        return self.decoder.forward(self.ids[:size], self.positions[:size], layout, self.rows[:size], self.cache)

    def run(self, items) -> torch.Tensor:
        """Logits [len(items), vocab] of a decode-only step (replayed from its graph on CUDA)."""
        size, bucket = self.fill(items)
        if not self.capture:
            return self._forward(size, bucket)[:len(items)]
        key = (size, bucket)
        if key not in self.graphs:
            self.graphs[key] = self._capture(size, bucket)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits[:len(items)]

    def _capture(self, size: int, bucket: int):  # pragma: no cover - needs a GPU
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(size, bucket)  # warm-up: lazy initialisations stay out of the graph
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(size, bucket)
        return graph, logits
