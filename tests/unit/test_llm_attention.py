"""Paged attention against plain SDPA over each sequence's own contiguous K/V, for the layouts the runner builds:
one sequence in consecutive blocks, scattered blocks, a batch sharing a first run (the system prompt), GQA, decode
rows of different lengths, and decodes mixed with prefill chunks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from voicepipe.llm.attention import paged_attention
from voicepipe.llm.request import Request
from voicepipe.llm.runner import ModelRunner
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.scheduler import ScheduledItem
from voicepipe.llm.session import Session

BS = 4
DIM = 8


def make_runner(heads: int, kv_heads: int, dtype: torch.dtype) -> ModelRunner:
    cfg = LlamaConfig(vocab_size=16, hidden_size=heads * DIM, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=DIM)
    return ModelRunner(LlamaForCausalLM(cfg).to(dtype), num_blocks=40, block_size=BS)


def item(table: list[int], start: int, n_tokens: int) -> ScheduledItem:
    """``n_tokens`` new tokens at ``start`` of a sequence whose K/V lives in ``table``."""
    session = Session(ids=list(range(start + n_tokens)), block_table=table)
    return ScheduledItem(Request(session=session, params=SamplingParams()), start, n_tokens)


def reference(query: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, items: list[ScheduledItem],
              scale: float) -> torch.Tensor:
    """[1, T, heads, dim]: each item's rows attend causally to its history, copied out slot by slot."""
    rows = []
    t0 = 0
    for it in items:
        end = it.start + it.n_tokens
        table = it.request.session.block_table
        slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(end)])
        k, v = kp[:, slots].unsqueeze(0), vp[:, slots].unsqueeze(0)
        keep = torch.arange(end)[None, :] <= torch.arange(it.start, end)[:, None]
        q = query[:, :, t0:t0 + it.n_tokens]
        rows.append(F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale,
                                                   enable_gqa=kp.shape[0] != q.shape[1]))
        t0 += it.n_tokens
    return torch.cat(rows, dim=2).transpose(1, 2)


LAYOUTS = {
    "one run": [item([3, 4, 5], 9, 1)],
    "several runs": [item([7, 2, 3, 11, 0], 17, 1)],
    "decode batch sharing a first run": [item([0, 1, 9, 12], 13, 1), item([0, 1, 10], 9, 1),
                                         item([0, 1, 2, 3, 14, 15], 21, 1)],
    "decode batch, equal lengths": [item([0, 1, 9], 11, 1), item([0, 1, 10], 11, 1)],
    "decodes then a prefill chunk": [item([0, 1, 9, 12], 14, 1), item([0, 1, 10], 11, 1),
                                     item([0, 1, 20, 16, 17], 10, 7)],
    "prefill chunks between decodes": [item([0, 1, 21], 7, 4), item([0, 1, 9, 12], 13, 1),
                                       item([30, 31], 0, 6), item([0, 1, 10], 11, 1)],
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_paged_attention_matches_sdpa(layout, heads, kv_heads, dtype, tol):
    torch.manual_seed(0)
    runner = make_runner(heads, kv_heads, dtype)
    items = LAYOUTS[layout]
    _, _, step, _ = runner.build(items)
    kp, vp = runner.cache.k[0], runner.cache.v[0]
    kp.normal_()
    vp.normal_()
    n = sum(it.n_tokens for it in items)
    query = torch.randn(1, heads, n, DIM, dtype=dtype)
    scale = DIM ** -0.5
    out, _ = paged_attention(None, query, None, None, None, scaling=scale, vp_pool=(kp, vp), vp_layout=step)
    torch.testing.assert_close(out, reference(query, kp, vp, items, scale), rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", ["decode batch sharing a first run", "decode batch, equal lengths"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
def test_the_gathering_decode_path_off_the_cpu_matches_sdpa(layout, heads, kv_heads):
    """The decode path used on CUDA (keys gathered, no sparse kernels), run here on the CPU."""
    from voicepipe.llm.attention import _decode_attention

    torch.manual_seed(0)
    runner = make_runner(heads, kv_heads, torch.float64)
    items = LAYOUTS[layout]
    _, _, step, _ = runner.build(items)
    kp, vp = runner.cache.k[0].normal_(), runner.cache.v[0].normal_()
    query = torch.randn(1, heads, len(items), DIM, dtype=torch.float64)
    scale = DIM ** -0.5
    out = _decode_attention(query[0].transpose(0, 1), kp, vp, step.decode, scale, sparse=False)
    torch.testing.assert_close(out.unsqueeze(0), reference(query, kp, vp, items, scale), rtol=1e-12, atol=1e-12)
