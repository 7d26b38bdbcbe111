"""The static decode steps that CUDA graphs replay (graphs.py), run eagerly on the CPU: the padded batch size and
history bucket they pick, that padding rows change nothing of the real rows' logits and K/V, and that every step
reuses the same buffers. The capture and replay themselves need a GPU and are not tested here."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from voicepipe.llm.decoder import Decoder
from voicepipe.llm.graphs import StaticDecode, block_bucket, padded_size
from voicepipe.llm.request import Request
from voicepipe.llm.runner import ModelRunner
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.scheduler import ScheduledItem
from voicepipe.llm.session import Session

BS = 4


def test_padded_size_and_block_bucket() -> None:
    assert [padded_size(b) for b in (1, 2, 3, 5, 16, 17, 32, 33)] == [1, 2, 4, 8, 16, 32, 32, None]
    assert padded_size(3, (2, 6)) == 6
    assert [block_bucket(n, 64) for n in (1, 2, 3, 9, 64, 65)] == [1, 2, 4, 16, 64, 64]


def runner() -> ModelRunner:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)).eval()
    return ModelRunner(model, num_blocks=40, block_size=BS, decoder=Decoder(model, "fp32"))


def prefilled(run: ModelRunner, table: list[int], n: int, seed: int) -> Request:
    """A sequence of ``n`` ids whose first ``n - 1`` have their K/V in ``table``: its next step is a decode."""
    ids = torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    session = Session(ids=ids[:n - 1], block_table=table)
    req = Request(session=session, params=SamplingParams())
    run.forward([ScheduledItem(req, 0, n - 1)], logits=False)
    session.ids, session.num_cached = ids, n - 1
    return req


@torch.inference_mode()
def test_a_static_step_computes_what_the_dynamic_one_does_and_reuses_its_buffers() -> None:
    run = runner()
    reqs = [prefilled(run, [0, 1, 2], 9, 1), prefilled(run, [7, 3, 12, 5], 14, 2), prefilled(run, [20], 3, 3)]
    items = [ScheduledItem(r, r.session.num_cached, 1) for r in reqs]
    k_before = [k.clone() for k in run.cache.k]
    dynamic = run.forward(items)
    k_dynamic = [k.clone() for k in run.cache.k]
    static = StaticDecode(run.decoder, run.cache, BS, max_blocks=8, capture=False)
    buffers = [t.data_ptr() for t in (static.ids, static.positions, static.slots, static.tables, static.lengths)]
    assert static.fits(items) and static.fill(items) == (4, 4)  # 3 decodes pad to 4; 4 blocks at most: bucket 4
    for k, before in zip(run.cache.k, k_before, strict=True):
        k.copy_(before)
    got = static.run(items)
    torch.testing.assert_close(got, dynamic, rtol=1e-4, atol=1e-4)
    assert got.shape[0] == 3  # the padding row's logits are dropped
    real = slice(0, run.cache.scratch_slot)  # the padding row wrote to the scratch block only
    for k, want in zip(run.cache.k, k_dynamic, strict=True):
        torch.testing.assert_close(k[:, real], want[:, real], rtol=1e-5, atol=1e-5)
    one = static.run(items[:1])  # another size, the same buffers
    torch.testing.assert_close(one, dynamic[:1], rtol=1e-4, atol=1e-4)
    assert buffers == [t.data_ptr() for t in (static.ids, static.positions, static.slots, static.tables,
                                              static.lengths)]
    run.static = static  # as the runner holds it on a GPU: decode-only steps go through it
    static.ids.fill_(-1)
    torch.testing.assert_close(run.forward(items), dynamic, rtol=1e-4, atol=1e-4)
    assert static.ids[:3].tolist() == [it.token_ids[0] for it in items]


def test_steps_that_do_not_fit_run_dynamically() -> None:
    run = runner()
    static = StaticDecode(run.decoder, run.cache, BS, max_blocks=2, sizes=(1, 2), capture=False)
    long_history = Request(session=Session(ids=list(range(12)), block_table=[0, 1, 2]), params=SamplingParams())
    assert not static.fits([ScheduledItem(long_history, 11, 1)])  # 3 blocks > max_blocks
    short = [Request(session=Session(ids=[1, 2], block_table=[i]), params=SamplingParams()) for i in range(3)]
    assert not static.fits([ScheduledItem(r, 1, 1) for r in short])  # 3 decodes > the largest size
