"""Our KV cache object and the attention function registered with transformers.

The stock model code (Llama, Qwen2/3, Mistral, ...) calls ``cache.update(k, v, layer_idx, kwargs=...)`` and then the
attention function named by ``config._attn_implementation``. ``PagedKVCache.update`` writes the step's new K/V into
the pool and hands the layer's pool and the step's layout to ``paged_attention`` through those kwargs; the attention
function then runs, for every sequence in the packed batch, SDPA of its new queries against its own paged history.

Everything that depends only on the step (slot indices, gather indices, masks) is built once per step in
``StepLayout``, not per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_NAME = "voicepipe_paged"


@dataclass
class PrefillSpan:
    """A prefill chunk: tokens ``t0 .. t0+n`` of the packed batch attend to history slots ``kv`` (a ``slice`` of
    the pool when the blocks are consecutive, else a ``BlockGather``); ``mask`` is additive (0 / -inf, [1, 1, n, L]),
    None for a chunk that starts the sequence (plain causal)."""

    t0: int
    n: int
    kv: slice | BlockGather
    mask: torch.Tensor | None


@dataclass
class StepLayout:
    slots: torch.Tensor  # [T] pool slot of each new token
    decode_rows: torch.Tensor | None = None  # [B] packed positions of the decode tokens
    decode_kv: slice | BlockGather | None = None  # a slice (one sequence in consecutive blocks) or block ids
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, Lmax] additive (0 / -inf), None when all lengths are equal
    decode_rows_slice: slice | None = None  # the decode rows as a slice when they are consecutive
    prefills: list[PrefillSpan] = field(default_factory=list)
    decode_only: bool = False  # every token of the step is a decode, in packed order
    single_prefill: bool = False  # the step is one prefill span and nothing else


class PagedKVCache:
    """Per-layer K and V pools, token-major: ``[num_blocks * block_size, num_kv_heads, head_dim]``."""

    is_compileable = False

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str | torch.device) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.layout: StepLayout | None = None

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, kwargs=None, **_):
        """Write the new tokens' K/V ([1, kv_heads, T, head_dim]) into their slots; pass the pool on to attention."""
        layout = self.layout
        kp, vp = self.k[layer_idx], self.v[layer_idx]
        kp.index_copy_(0, layout.slots, key_states[0].transpose(0, 1))
        vp.index_copy_(0, layout.slots, value_states[0].transpose(0, 1))
        if kwargs is not None:
            kwargs["vp_pool"] = (kp, vp)
            kwargs["vp_layout"] = layout
        return key_states, value_states

    # The model's mask helpers may ask a cache for these; our attention function builds its own masks.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


@dataclass
class BlockGather:
    """History held in non-consecutive blocks: ``blocks`` is [n] (one sequence, ``length`` tokens kept) or
    [B, n] (a batch, padded; the step's mask hides the padding). Whole blocks are copied, not single slots."""

    blocks: torch.Tensor
    block_size: int
    length: int = 0


def _history(pool: torch.Tensor, kv: slice | BlockGather) -> torch.Tensor:
    """[1 or B, kv_heads, L, head_dim]: a view of the pool (consecutive blocks) or a block-wise copy."""
    if isinstance(kv, slice):
        return pool[kv].transpose(0, 1).unsqueeze(0)
    tail = pool.shape[1:]
    by_block = pool.view(-1, kv.block_size, *tail)
    if kv.blocks.dim() == 1:
        return by_block.index_select(0, kv.blocks).view(-1, *tail)[:kv.length].transpose(0, 1).unsqueeze(0)
    b, n = kv.blocks.shape
    return by_block.index_select(0, kv.blocks.reshape(-1)).view(b, n * kv.block_size, *tail).transpose(1, 2)


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``query`` is [1, heads, T, head_dim] for the whole packed batch; returns ([1, T, heads, head_dim], None)."""
    layout: StepLayout | None = kwargs.get("vp_layout")
    if layout is None:  # not one of our steps (e.g. plain ``model.generate``): behave like stock SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kp, vp = kwargs["vp_pool"]
    gqa = query.shape[1] != kp.shape[1]
    # Fast paths (the common steps): no output buffer, no scatter, fewer kernel launches.
    if layout.decode_only:
        q = query if query.shape[2] == 1 else query[0].transpose(0, 1).unsqueeze(2)  # [B, heads, 1, head_dim]
        k, v = _history(kp, layout.decode_kv), _history(vp, layout.decode_kv)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.decode_mask, scale=scaling, enable_gqa=gqa)
        return o.reshape(1, o.shape[0], o.shape[1], o.shape[3]), None
    if layout.single_prefill:
        span = layout.prefills[0]
        k, v = _history(kp, span.kv), _history(vp, span.kv)
        o = F.scaled_dot_product_attention(query, k, v, attn_mask=span.mask, is_causal=span.mask is None,
                                           scale=scaling, enable_gqa=gqa)
        return o.transpose(1, 2), None
    out = torch.empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype,
                      device=query.device)
    if layout.decode_rows is not None:
        if layout.decode_rows_slice is not None:
            q = query[0, :, layout.decode_rows_slice]
        else:
            q = query[0].index_select(1, layout.decode_rows)
        q = q.transpose(0, 1).unsqueeze(2)  # [B, heads, 1, head_dim]
        k, v = _history(kp, layout.decode_kv), _history(vp, layout.decode_kv)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.decode_mask, scale=scaling, enable_gqa=gqa)
        if layout.decode_rows_slice is not None:
            out[0, layout.decode_rows_slice] = o[:, :, 0]
        else:
            out[0].index_copy_(0, layout.decode_rows, o[:, :, 0])
    for span in layout.prefills:
        q = query[:, :, span.t0:span.t0 + span.n]
        k, v = _history(kp, span.kv), _history(vp, span.kv)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=span.mask, is_causal=span.mask is None,
                                           scale=scaling, enable_gqa=gqa)
        out[0, span.t0:span.t0 + span.n] = o[0].transpose(0, 1)
    return out, None


def register() -> str:
    """Register ``paged_attention`` with transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTN_NAME, paged_attention)
    return ATTN_NAME
