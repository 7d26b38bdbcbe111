"""Model runner: one forward pass over a packed batch (every scheduled sequence's new tokens, batch dim 1).

The forward is voicepipe's ``Decoder`` (``decoder.py``) when it can run the model, else transformers' own modules
with our attention function and cache object."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from voicepipe.llm.attention import (
    BlockGather,
    DecodeBatch,
    PagedKVCache,
    PrefillSpan,
    StepLayout,
    additive_mask,
    register,
)
from voicepipe.llm.decoder import Decoder
from voicepipe.llm.graphs import StaticDecode
from voicepipe.llm.scheduler import ScheduledItem

log = logging.getLogger(__name__)


@dataclass
class ModelShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int

    @property
    def group(self) -> int:
        """Query heads per kv head (1 without GQA)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def of(cls, model) -> ModelShape:
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        heads = text_cfg.num_attention_heads
        head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // heads
        return cls(text_cfg.num_hidden_layers, heads, getattr(text_cfg, "num_key_value_heads", None) or heads, head_dim,
                   int(getattr(text_cfg, "max_position_embeddings", 4096)))


class ModelRunner:
    """``decoder``: the model's weights in the chosen format (``quality.choose_weights``); None runs the model's
    own modules."""

    def __init__(self, model, num_blocks: int, block_size: int, decoder: Decoder | None = None,
                 cuda_graphs: bool = False) -> None:
        self.model = model
        self.decoder = decoder
        self.device = next(model.parameters()).device
        self.dtype = decoder.dtype if decoder is not None else next(model.parameters()).dtype
        self.shape = ModelShape.of(model)
        if decoder is None:
            model.config._attn_implementation = register()
            text_cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
            text_cfg._attn_implementation = model.config._attn_implementation
        self.block_size = block_size
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.cache = PagedKVCache(self.shape.num_layers, num_blocks, block_size, self.shape.num_kv_heads,
                                  self.shape.head_dim, self.dtype, self.device)
        self.last_inputs_s = 0.0  # building the last step's inputs (the engine's step profile)
        # decode-only steps from CUDA graphs (graphs.py): with the decoder, on a GPU
        self.static: StaticDecode | None = None
        if cuda_graphs and decoder is not None and self.device.type == "cuda":
            self.static = StaticDecode(decoder, self.cache, block_size, -(-self.shape.max_context // block_size))
        self.bytes_per_token = PagedKVCache.bytes_per_token(self.shape.num_layers, self.shape.num_kv_heads,
                                                            self.shape.head_dim, self.dtype)

    # -- layout -----------------------------------------------------------------------------------------------------
    def _slot_ids(self, table: list[int], start: int, stop: int) -> list[int]:
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, stop)]

    def _kv_ref(self, table: list[int], length: int) -> slice | BlockGather:
        """The history's slots: a slice of the pool when the blocks are consecutive, else a block gather."""
        bs = self.block_size
        n_blocks = -(-length // bs)
        first = table[0]
        if table[n_blocks - 1] - first == n_blocks - 1 and all(
                table[i] == first + i for i in range(1, n_blocks)):
            return slice(first * bs, first * bs + length)
        return BlockGather(torch.tensor(table[:n_blocks], dtype=torch.long, device=self.device), bs, length)

    def _decode_ref(self, items: list[ScheduledItem]) -> slice | DecodeBatch:
        """A slice for one sequence in consecutive blocks, else every decode history as slots read in place."""
        lengths = [it.start + 1 for it in items]
        if len(items) == 1:
            kv = self._kv_ref(items[0].block_table, lengths[0])
            if isinstance(kv, slice):
                return kv
        slots = self._padded_slots([it.block_table for it in items], lengths)
        return DecodeBatch.build(slots, lengths, self.shape.num_kv_heads, self.shape.group,
                                 self.cache.k[0].shape[1], self.dtype)

    def _padded_slots(self, tables: list[list[int]], lengths: list[int]) -> torch.Tensor:
        """[rows, max(lengths)]: the pool slots of each row's first ``length`` positions on its block table, padded
        with a valid slot (its first block's) that the row's length masks out."""
        bs = self.block_size
        n_max = -(-max(lengths) // bs)
        padded = []
        for table, length in zip(tables, lengths, strict=True):
            table = table[:-(-length // bs)]
            padded.append(table + [table[0]] * (n_max - len(table)))
        blocks = torch.tensor(padded, dtype=torch.long, device=self.device)
        slots = (blocks[:, :, None] * bs + torch.arange(bs, device=self.device)).view(len(lengths), -1)
        return slots[:, :max(lengths)]

    def _row_history(self, items: list[ScheduledItem]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each packed row's history as pool slots, padded to the longest ([T, Lmax]), and its length [T]: a row
        sees its sequence's positions up to its own (a drafted or prefilled token its predecessors in the step)."""
        lengths = [p + 1 for it in items for p in range(it.start, it.start + it.n_tokens)]
        tables = [it.block_table for it in items for _ in range(it.n_tokens)]
        return (self._padded_slots(tables, lengths).contiguous(),
                torch.tensor(lengths, dtype=torch.long, device=self.device))

    def build(self, items: list[ScheduledItem]) -> tuple[torch.Tensor, torch.Tensor, StepLayout, list[int]]:
        """Packed input ids and position ids ([T]), the step layout and the packed rows whose logits the step keeps:
        each sampling item's (its last token's, then each drafted token's), then each probe's (in item order)."""
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        logit_rows: list[int] = []
        probe_rows: list[int] = []
        for item in items:
            t0 = len(ids)
            ids.extend(item.token_ids)
            pos.extend(range(item.start, item.start + item.n_tokens))
            slots.extend(self._slot_ids(item.block_table, item.start, item.start + item.n_tokens))
            if item.samples:  # the row after the sequence's last token, then after each drafted token
                logit_rows.extend(range(t0 + item.n_tokens - 1 - len(item.draft), t0 + item.n_tokens))
            if item.probe is not None:
                probe_rows.append(t0 + item.probe)
        layout = StepLayout(slots=torch.tensor(slots, dtype=torch.long, device=dev))
        reread = max(((it.n_tokens - 1) * it.start for it in items if not it.draft), default=0)
        if self.decoder is not None and self.decoder.fuses(len(ids), reread):  # row by row: nothing else to build
            layout.row_history, layout.row_lengths = self._row_history(items)
        else:
            self._attention_layout(items, layout)
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        position_ids = torch.tensor(pos, dtype=torch.long, device=dev)
        return input_ids, position_ids, layout, logit_rows + probe_rows

    def _attention_layout(self, items: list[ScheduledItem], layout: StepLayout) -> None:
        """The op-by-op attention's view of the step: the decode rows and their histories, each prefill span with its
        history and causal mask."""
        dev = self.device
        decodes: list[tuple[int, ScheduledItem]] = []
        t0 = 0
        for item in items:
            end = item.start + item.n_tokens
            if item.n_tokens == 1 and item.start > 0:
                decodes.append((t0, item))
            else:
                kv = self._kv_ref(item.block_table, end)
                mask = None
                if item.start > 0:
                    keep = torch.arange(end, device=dev)[None, :] <= torch.arange(item.start, end, device=dev)[:, None]
                    mask = additive_mask(keep.repeat(self.shape.group, 1), self.dtype)[None, None]
                layout.prefills.append(PrefillSpan(t0, item.n_tokens, kv, mask))
            t0 += item.n_tokens
        if decodes:
            rows = [t for t, _ in decodes]
            layout.decode_rows = torch.tensor(rows, dtype=torch.long, device=dev)
            if rows == list(range(rows[0], rows[0] + len(rows))):
                layout.decode_rows_slice = slice(rows[0], rows[0] + len(rows))
            layout.decode = self._decode_ref([it for _, it in decodes])
        layout.decode_only = not layout.prefills and layout.decode_rows_slice == slice(0, t0)
        layout.single_prefill = not decodes and len(layout.prefills) == 1

    def _static_step(self, items: list[ScheduledItem]) -> bool:
        """A decode-only step (one sampled token per sequence, no probe) that fits a static step."""
        return (all(it.n_tokens == 1 and it.start > 0 and it.samples and it.probe is None for it in items)
                and self.static.fits(items))

    # -- forward ----------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, items: list[ScheduledItem], logits: bool = True) -> torch.Tensor | None:
        """Run one step; returns float32 logits [sampled rows + n_probes, vocab]: the sampling items' rows, then the
        probing items' rows (None when no item needs any, or ``logits`` is off: the step only fills the cache)."""
        started = time.perf_counter()
        if logits and self.static is not None and self._static_step(items):
            self.last_inputs_s = 0.0  # the static buffers' copies are queued with the graph
            return self.static.run(items).float()
        input_ids, position_ids, layout, logit_rows = self.build(items)
        keep = torch.tensor(logit_rows, dtype=torch.long, device=self.device) if logit_rows and logits else None
        self.last_inputs_s = time.perf_counter() - started
        if self.decoder is not None:
            return self.decoder.forward(input_ids, position_ids, layout, keep, self.cache)
        self.cache.layout = layout
        try:
            out = self.model(input_ids=input_ids[None], position_ids=position_ids[None], cache=self.cache,
                             use_cache=False, logits_to_keep=1 if keep is None else keep)
        finally:
            self.cache.layout = None
        if keep is None:
            return None
        return out.logits[0].float()
