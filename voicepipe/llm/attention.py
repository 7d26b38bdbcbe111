"""Our KV cache object and the attention function registered with transformers.

The stock model code (Llama, Qwen2/3, Mistral, ...) calls ``cache.update(k, v, layer_idx, kwargs=...)`` and then the
attention function named by ``config._attn_implementation``. ``PagedKVCache.update`` writes the step's new K/V into
the pool and hands the layer's pool and the step's layout to ``paged_attention`` through those kwargs; the attention
function then attends, for every sequence in the packed batch, its new queries to its own paged history.

Decode rows read their histories in place (``DecodeBatch``): a sampled matmul computes each query's scores against
exactly its own slots, and a weighted bag sum reads the values, so no history is ever copied out of the pool, however
its blocks are scattered. Prefill spans copy their blocks when they are not consecutive (one sequence, once per
chunk). Everything that depends only on the step (slot indices, masks) is built once per step in ``StepLayout``, not
per layer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_NAME = "voicepipe_paged"

# Our CSR tensors only carry the decode pattern into ``sampled_addmm``; torch says once that CSR is "beta".
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)


@dataclass
class BlockGather:
    """One sequence's history in non-consecutive blocks: ``blocks`` [n], of which ``length`` tokens are kept."""

    blocks: torch.Tensor
    block_size: int
    length: int


def additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``keep``, -inf elsewhere. SDPA turns a boolean mask into exactly this, but on every call, i.e. in
    every layer; built once per step it is shared by all layers."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))


@dataclass
class PrefillSpan:
    """A prefill chunk: tokens ``t0 .. t0+n`` of the packed batch attend to history slots ``kv`` (a ``slice`` of
    the pool when the blocks are consecutive, else a ``BlockGather``); ``mask`` is additive (0 / -inf), None for a
    chunk that starts the sequence (plain causal). Its rows are the chunk's ``n`` rows once for each query head of
    a kv head's group ([1, 1, group * n, L]), as ``_prefill`` folds a group's query heads into one head's rows."""

    t0: int
    n: int
    kv: slice | BlockGather
    mask: torch.Tensor | None


@dataclass
class DecodeBatch:
    """The decode rows' histories as pool slots, padded to the longest (``slots`` [B, Lmax]).

    Query rows are ordered (kv head, sequence, query head of the group), so each kv head is one sampled matmul over
    its own plane of the pool. ``pattern`` is the sparse CSR [kv_heads, B * group, pool slots] whose row (b, g) holds
    sequence b's slots; ``bag_ids`` [kv_heads * B * group, Lmax] are the same slots as rows of the value pool viewed
    [kv_heads * slots, head_dim]. ``mask`` [B, Lmax] is additive (0 / -inf) for the padding, None when all lengths
    are equal."""

    pattern: torch.Tensor
    bag_ids: torch.Tensor
    mask: torch.Tensor | None

    @classmethod
    def build(cls, slots: torch.Tensor, lengths: list[int], kv_heads: int, group: int, pool_slots: int,
              dtype: torch.dtype) -> DecodeBatch:
        b, width = slots.shape
        dev = slots.device
        rows = slots[:, None, :].expand(b, group, width).reshape(1, -1)
        crow = torch.arange(0, (b * group + 1) * width, width, device=dev).expand(kv_heads, -1)
        pattern = torch.sparse_csr_tensor(crow.contiguous(), rows.expand(kv_heads, -1).contiguous(),
                                          torch.zeros(kv_heads, rows.shape[1], dtype=dtype, device=dev),
                                          size=(kv_heads, b * group, pool_slots), check_invariants=False)
        planes = torch.arange(kv_heads, device=dev)[:, None] * pool_slots
        bag_ids = (rows + planes).view(kv_heads * b * group, width)
        mask = None
        if min(lengths) < width:
            mask = additive_mask(torch.arange(width, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None],
                                 dtype)
        return cls(pattern, bag_ids, mask)


@dataclass
class StepLayout:
    slots: torch.Tensor  # [T] pool slot of each new token
    decode_rows: torch.Tensor | None = None  # [B] packed positions of the decode tokens
    # a slice: one sequence in consecutive blocks; a StaticDecodeBatch: a static (CUDA graph) step, graphs.py
    decode: slice | DecodeBatch | StaticDecodeBatch | None = None
    decode_rows_slice: slice | None = None  # the decode rows as a slice when they are consecutive
    prefills: list[PrefillSpan] = field(default_factory=list)
    decode_only: bool = False  # every token of the step is a decode, in packed order
    single_prefill: bool = False  # the step is one prefill span and nothing else
    # each row's history as pool slots [T, Lmax] (its sequence's positions up to its own) and their counts [T]:
    # built for the decoder's fused steps (decoder.py), which attend row by row
    row_history: torch.Tensor | None = None
    row_lengths: torch.Tensor | None = None


class StepAborted(Exception):
    """Raised inside the model's forward when the engine asked to stop the running step (see ``PagedKVCache``)."""


class PagedKVCache:
    """Per-layer K and V pools, head-major: ``[num_kv_heads, (num_blocks + 1) * block_size, head_dim]``, so that the
    slots of one kv head form one matrix (a run of consecutive slots is a matmul-ready view).

    ``abort_requested``, set from another thread, stops the running forward at its next layer (``StepAborted``).
    One block more than the block manager's is kept as scratch: a static step's padding rows write there
    (``scratch_slot``, graphs.py)."""

    is_compileable = False

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str | torch.device) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_slot = num_blocks * block_size
        shape = (num_kv_heads, (num_blocks + 1) * block_size, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.layout: StepLayout | None = None
        self.abort_requested = False

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, kwargs=None, **_):
        """Write the new tokens' K/V ([1, kv_heads, T, head_dim]) into their slots; pass the pool on to attention."""
        if self.abort_requested:
            raise StepAborted
        layout = self.layout
        kp, vp = self.k[layer_idx], self.v[layer_idx]
        kp.index_copy_(1, layout.slots, key_states[0])
        vp.index_copy_(1, layout.slots, value_states[0])
        if kwargs is not None:
            kwargs["vp_pool"] = (kp, vp)
            kwargs["vp_layout"] = layout
        return key_states, value_states

    # The model's mask helpers may ask a cache for these; our attention function builds its own masks.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def _history(pool: torch.Tensor, kv: slice | BlockGather) -> torch.Tensor:
    """[1, kv_heads, L, head_dim]: a view of the pool (consecutive blocks) or a block-wise copy."""
    if isinstance(kv, slice):
        return pool[:, kv].unsqueeze(0)
    heads, _, dim = pool.shape
    by_block = pool.view(heads, -1, kv.block_size, dim)
    return by_block.index_select(1, kv.blocks).view(heads, -1, dim)[:, :kv.length].unsqueeze(0)


def _decode_attention(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, batch: DecodeBatch,
                      scale: float | None, sparse: bool | None = None) -> torch.Tensor:
    """``q`` [B, heads, head_dim] -> [B, heads, head_dim], reading K and V where they lie in the pool.

    ``sparse`` (default: on CPU) computes the scores with a sampled matmul. Elsewhere the keys are gathered first:
    the sparse kernels there do not cover every dtype (bf16 on CUDA), and device memory makes the copy cheap."""
    b, heads, dim = q.shape
    kv_heads = kp.shape[0]
    group = heads // kv_heads
    scale = dim ** -0.5 if scale is None else scale
    qk = q.reshape(b, kv_heads, group, dim).transpose(0, 1).reshape(kv_heads, b * group, dim)
    if sparse is None:  # torch's sparse CPU kernels take float32 and float64 only
        sparse = kp.device.type == "cpu" and kp.dtype in (torch.float32, torch.float64)
    if sparse:
        scores = torch.sparse.sampled_addmm(batch.pattern, qk, kp.transpose(1, 2), beta=0.0, alpha=scale).values()
    else:
        keys = kp.view(-1, dim)[batch.bag_ids]  # [kv_heads * B * group, Lmax, head_dim]
        scores = torch.bmm(keys, qk.reshape(-1, dim, 1)).mul_(scale)
    s = scores.view(kv_heads, b, group, -1)
    if batch.mask is not None:
        s = s + batch.mask[None, :, None]
    p = torch.softmax(s, dim=-1).view(batch.bag_ids.shape)
    o = F.embedding_bag(batch.bag_ids, vp.view(-1, dim), mode="sum", per_sample_weights=p)
    return o.view(kv_heads, b, group, dim).transpose(0, 1).reshape(b, heads, dim)


@dataclass
class StaticDecodeBatch:
    """Decode histories by block table: ``tables`` [B, n_blocks], ``lengths`` [B] (tokens, the new one included)."""

    tables: torch.Tensor
    lengths: torch.Tensor
    block_size: int


def _static_decode_attention(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, batch: StaticDecodeBatch,
                            scale: float | None) -> torch.Tensor:
    """``q`` [B, heads, head_dim] -> [B, heads, head_dim] with shapes fixed by the tables' width: each row's keys
    and values gathered from its blocks, the positions past its length masked. No host synchronisation."""
    b, heads, dim = q.shape
    kv_heads = kp.shape[0]
    bs = batch.block_size
    slots = (batch.tables[:, :, None] * bs + torch.arange(bs, device=q.device)).reshape(b, -1)  # [B, L]
    keys, values = kp[:, slots], vp[:, slots]  # [kv_heads, B, L, head_dim]
    qg = q.view(b, kv_heads, heads // kv_heads, dim).transpose(0, 1)  # [kv_heads, B, group, head_dim]
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * (dim ** -0.5 if scale is None else scale)
    keep = torch.arange(slots.shape[1], device=q.device)[None, :] < batch.lengths[:, None]  # [B, L]
    scores = scores + additive_mask(keep, scores.dtype)[None, :, None, :]
    out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(values.dtype), values)  # [kv_heads, B, group, dim]
    return out.transpose(0, 1).reshape(b, heads, dim)


def _decode(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, layout: StepLayout,
            scale: float | None) -> torch.Tensor:
    """``q`` [B, heads, head_dim] (the decode rows) -> [B, heads, head_dim]."""
    if isinstance(layout.decode, DecodeBatch):
        return _decode_attention(q, kp, vp, layout.decode, scale)
    if isinstance(layout.decode, StaticDecodeBatch):
        return _static_decode_attention(q, kp, vp, layout.decode, scale)
    # one sequence in consecutive blocks: its history is a view of the pool, and three small ops beat SDPA's
    # per-call cost (measured 130-360 us a layer for one query row)
    _, heads, dim = q.shape
    kv_heads = kp.shape[0]
    k, v = kp[:, layout.decode], vp[:, layout.decode]  # [kv_heads, L, head_dim]
    scores = torch.bmm(q.reshape(kv_heads, heads // kv_heads, dim), k.transpose(1, 2))
    p = torch.softmax(scores.mul_(dim ** -0.5 if scale is None else scale), dim=-1)
    return torch.bmm(p, v).view(1, heads, dim)


def _prefill(query: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, span: PrefillSpan, scale: float | None,
             gqa: bool) -> torch.Tensor:
    """``query`` [1, heads, n, head_dim] (the span's rows) -> [1, heads, n, head_dim].

    A chunk with a history folds the query heads that share a kv head into that head's rows ([1, kv_heads,
    group * n, head_dim]): each K/V block is then read once per group, not once per query head (on the CPU a
    35-token chunk over 2.7k cached tokens took 1.95 instead of 2.41 ms a layer, so a late turn's TTFT grows less)."""
    k, v = _history(kp, span.kv), _history(vp, span.kv)
    if span.mask is None:
        return F.scaled_dot_product_attention(query, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    _, heads, n, dim = query.shape
    rows = query.reshape(1, k.shape[1], -1, dim)
    return F.scaled_dot_product_attention(rows, k, v, attn_mask=span.mask, scale=scale).view(1, heads, n, dim)


def attend(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, layout: StepLayout,
           scale: float | None) -> torch.Tensor:
    """The step's attention: ``q`` [T, heads, head_dim] (the packed batch's rows) -> [T, heads, head_dim], each row
    attending to its own sequence's history in the pool ``kp``/``vp`` (its new K/V already written)."""
    gqa = q.shape[1] != kp.shape[0]
    if layout.decode_only:
        return _decode(q, kp, vp, layout, scale)
    if layout.single_prefill:
        return _prefill(q.transpose(0, 1).unsqueeze(0), kp, vp, layout.prefills[0], scale, gqa)[0].transpose(0, 1)
    out = torch.empty_like(q)
    if layout.decode_rows is not None:
        if layout.decode_rows_slice is not None:
            out[layout.decode_rows_slice] = _decode(q[layout.decode_rows_slice], kp, vp, layout, scale)
        else:
            out.index_copy_(0, layout.decode_rows, _decode(q.index_select(0, layout.decode_rows), kp, vp, layout,
                                                           scale))
    for span in layout.prefills:
        rows = q[span.t0:span.t0 + span.n].transpose(0, 1).unsqueeze(0)
        out[span.t0:span.t0 + span.n] = _prefill(rows, kp, vp, span, scale, gqa)[0].transpose(0, 1)
    return out


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``query`` is [1, heads, T, head_dim] for the whole packed batch; returns ([1, T, heads, head_dim], None)."""
    layout: StepLayout | None = kwargs.get("vp_layout")
    if layout is None:  # not one of our steps (e.g. plain ``model.generate``): behave like stock SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kp, vp = kwargs["vp_pool"]
    return attend(query[0].transpose(0, 1), kp, vp, layout, scaling).unsqueeze(0), None


def register() -> str:
    """Register ``paged_attention`` with transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTN_NAME, paged_attention)
    return ATTN_NAME
