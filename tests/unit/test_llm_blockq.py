"""The q4 format's blocks and native kernels (voicepipe/llm/blockq.py): weights made of blocks come back exactly,
the kernel computes the matmul of the blocks with each row independent of the others, and a decode step run
layer by layer in one native call each gives the logits and the K/V of the step run op by op.

The kernels are built with this machine's compiler (about 20 s the first time on a machine); they need AVX-512,
which the CI machines have: only on a CPU without it are these tests skipped, and there ``q4`` must say why."""

from __future__ import annotations

import functools
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from voicepipe.llm import blockq
from voicepipe.llm.blockq import FEW_ROWS, FUSED_REREAD, FUSED_ROWS, BlockLinear, dequantize, quantize
from voicepipe.llm.decoder import Decoder
from voicepipe.llm.request import Request
from voicepipe.llm.runner import ModelRunner
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.scheduler import ScheduledItem
from voicepipe.llm.session import Session
from voicepipe.llm.weights import unsupported_reason

AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
needs_avx512 = pytest.mark.skipif(not AVX512, reason="the q4 kernels need an AVX-512 CPU")


def blocky_weight(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    """A weight made of Q4_1 blocks as a GGUF holds them: 4-bit codes times a half-precision scale plus offset."""
    g = torch.Generator().manual_seed(seed)
    nb = inp // 32
    scale = (torch.rand(out, nb, 1, generator=g) * 0.05 + 0.001).half().float()
    codes = torch.randint(0, 16, (out, nb, 32), generator=g)
    codes[:, :, 0], codes[:, :, 1] = 0, 15  # Q4_1's blocks span their range
    offset = (torch.randn(out, nb, 1, generator=g) * 0.3).half().float()
    return (codes * scale + offset).reshape(out, inp)


def test_weights_made_of_blocks_come_back_exactly() -> None:
    weight = blocky_weight(40, 96)
    weight[3, 32:64] = 0.25  # a constant block: no range, still exact
    assert torch.equal(dequantize(quantize(weight)), weight)
    codes, scale, offset = quantize(weight)
    assert codes.dtype == torch.uint8 and codes.shape == (40, 48) and scale.shape == offset.shape == (40, 3)
    with pytest.raises(ValueError, match="multiples of 32"):
        quantize(torch.randn(4, 40))


def test_any_weight_is_rounded_to_within_half_a_step_of_its_block() -> None:
    weight = torch.randn(16, 64)
    back = dequantize(quantize(weight)).view(16, 2, 32)
    blocks = weight.view(16, 2, 32)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15
    assert ((back - blocks).abs() <= step[..., None] / 2 + 1e-6).all()


@needs_avx512
@torch.inference_mode()
def test_the_kernel_is_the_matmul_of_the_blocks_and_a_row_does_not_depend_on_the_others() -> None:
    weight = blocky_weight(100, 128, seed=1)  # 100 outputs: the tiles' remainders too
    bias = torch.randn(100)
    x = torch.randn(FEW_ROWS + 3, 128)
    lin = BlockLinear(weight, bias)
    want = F.linear(x, weight, bias)
    few = lin(x[:FEW_ROWS])
    torch.testing.assert_close(few, want[:FEW_ROWS], rtol=1e-5, atol=1e-5)
    for i in range(FEW_ROWS):
        assert torch.equal(lin(x[i:i + 1]), few[i:i + 1])
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-5)  # more rows: oneDNN on the dequantized copy


@needs_avx512
def test_the_kernels_run_on_every_torch_thread() -> None:
    """Built without OpenMP, ATen's parallel_for in the kernels runs serially: every q4 matmul took twice as long."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert blockq.native().threads_used() == 2
    finally:
        torch.set_num_threads(threads)


@needs_avx512
def test_other_python_threads_run_while_a_kernel_does() -> None:
    """The kernels let go of the GIL: held, a call's event loops (inbound audio, the VAD) waited on the engine's
    matmuls, in a four-call run for hundreds of ms at a time."""
    kernels, blocks, x = blockq.native(), quantize(torch.randn(4096, 4096)), torch.randn(384, 4096)  # ~50 ms a call
    wakes, done = [], threading.Event()

    def ticker() -> None:
        while not done.is_set():
            time.sleep(0.001)
            wakes.append(time.perf_counter())  # needs the GIL

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        while not wakes:
            time.sleep(0.001)
        start = time.perf_counter()
        kernels.linear(x, blocks)
        end = time.perf_counter()
    finally:
        done.set()
        thread.join()
    during = [t for t in wakes if start < t < end]
    # held through the call, the ticker could wake at most once or twice (before the call took the GIL back)
    assert len(during) >= 10, f"{len(during)} wakes in a {1000 * (end - start):.0f} ms call"


@needs_avx512
def test_bad_arguments_raise_instead_of_crashing() -> None:
    blocks = quantize(torch.randn(8, 64))
    with pytest.raises(RuntimeError, match="contiguous float32"):
        blockq.native().linear(torch.randn(2, 32), blocks)
    with pytest.raises(RuntimeError, match="codes"):
        blockq.native().linear(torch.randn(2, 64), [blocks[0][:4], blocks[1], blocks[2]])


def test_without_avx512_q4_says_why(monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    blockq.unavailable_reason.cache_clear()
    try:
        assert "need an AVX-512 CPU (this one: AVX2)" in unsupported_reason("q4", torch.device("cpu"))
    finally:
        blockq.unavailable_reason.cache_clear()
    assert "CPU format" in unsupported_reason("q4", torch.device("cuda"))


def tiny_llama():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         max_position_embeddings=256)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model


class Twins:
    """Two runners, each with its own pool, on one q4 decoder; ``step`` runs a step fused or op by op."""

    def __init__(self) -> None:
        model = tiny_llama()
        self.decoder = Decoder(model, "q4")
        assert self.decoder.fused
        self.runners = [ModelRunner(model, num_blocks=64, block_size=4, decoder=self.decoder) for _ in range(2)]
        self.fused_steps = 0
        fused = self.decoder._fused

        def counted(*args):
            self.fused_steps += 1
            return fused(*args)

        self.decoder._fused = counted

    def step(self, items, fused: bool):
        """On the first pool fused, on the second op by op."""
        self.decoder.fused = fused
        try:
            return self.runners[0 if fused else 1].forward(items)
        finally:
            self.decoder.fused = True


def sequences(g, lengths):
    scattered = torch.randperm(56, generator=g).add_(8).view(7, 8).tolist()
    tables = [list(range(8)), *scattered]
    return [Request(session=Session(ids=torch.randint(0, 96, (n,), generator=g).tolist(), block_table=table),
                    params=SamplingParams()) for n, table in zip(lengths, tables, strict=False)]


@needs_avx512
@torch.inference_mode()
def test_a_fused_step_is_the_step_run_op_by_op() -> None:
    """On scattered blocks: short prompts (one past ``FEW_ROWS``, where the op-by-op step multiplies on oneDNN),
    one sequence's decode (its history in consecutive blocks), three and six decodes of different lengths, then a
    step of decodes, a decode with three drafted tokens and a short prompt: fused and op by op on twin pools, the
    same logits and K/V."""
    twins = Twins()
    g = torch.Generator().manual_seed(2)
    lengths = (9, 6, 11, 3, FEW_ROWS + 4, 7, 5)  # FEW_ROWS + 4: also a history past 16 slots, the softmax's width
    assert FEW_ROWS + 4 <= FUSED_ROWS
    requests = sequences(g, lengths)
    for req in requests[:6]:
        for fused in (True, False):
            twins.step([ScheduledItem(req, 0, len(req.session.ids))], fused)
        req.session.num_cached = len(req.session.ids)
    assert twins.fused_steps == 6

    def run(items) -> None:
        fused_steps = twins.fused_steps
        got, want = twins.step(items, True), twins.step(items, False)
        assert twins.fused_steps == fused_steps + 1
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for item in items:
            item.session.num_cached = item.start + item.n_tokens

    def decodes(reqs) -> list[ScheduledItem]:
        for req in reqs:
            req.session.ids.append(int(torch.randint(0, 96, (1,), generator=g)))
        return [ScheduledItem(req, len(req.session.ids) - 1, 1) for req in reqs]

    run(decodes(requests[:1]))
    run(decodes(requests[:3]))
    run(decodes(requests[:6]))
    items = decodes(requests[1:3])
    drafted = decodes(requests[3:4])[0]
    drafted.draft_slots = 3
    drafted.set_draft(torch.randint(0, 96, (3,), generator=g).tolist())
    run([*items, drafted, ScheduledItem(requests[6], 0, len(requests[6].session.ids))])
    for layer in range(2):
        for pools in ("k", "v"):
            torch.testing.assert_close(getattr(twins.runners[0].cache, pools)[layer],
                                       getattr(twins.runners[1].cache, pools)[layer], rtol=1e-5, atol=1e-5)


@needs_avx512
def test_a_prompt_span_over_a_long_history_runs_op_by_op() -> None:
    """A fused step attends row by row, so each row of a prompt span would re-read the span's whole history: past
    ``FUSED_REREAD`` slots of such re-reading the step runs op by op, while decodes and drafted tokens over the same
    history stay fused (a drafted token's logits must be plain decoding's, bit for bit)."""
    model = tiny_llama()
    history = 1000
    runner = ModelRunner(model, num_blocks=history // 4 + 8, block_size=4, decoder=Decoder(model, "q4"))

    def item(span: int, draft: int = 0) -> ScheduledItem:
        session = Session(ids=[i % 96 for i in range(history + span)], block_table=list(range(history // 4 + 8)))
        scheduled = ScheduledItem(Request(session=session, params=SamplingParams()), history, span, draft_slots=draft)
        scheduled.set_draft([1] * draft)
        return scheduled

    def fused(items) -> bool:
        return runner.build(items)[2].row_history is not None

    assert (FUSED_REREAD // history + 1) * history > FUSED_REREAD
    assert not fused([item(FUSED_REREAD // history + 2)])
    assert fused([item(FUSED_REREAD // history + 1)])
    assert fused([item(1) for _ in range(FUSED_ROWS)])
    assert not fused([item(1) for _ in range(FUSED_ROWS + 1)])
    assert fused([item(1, draft=FUSED_REREAD // history + 4), item(1)])


@needs_avx512
@torch.inference_mode()
def test_a_drafted_tokens_logits_are_bit_for_bit_those_of_plain_decoding() -> None:
    """Speculation keeps a drafted token by comparing argmaxes: in a fused step each row's arithmetic is its own,
    so verifying three drafts in one step (beside another sequence's decode) gives the logits three plain decode
    steps give, to the bit."""
    twins = Twins()
    g = torch.Generator().manual_seed(3)
    requests = sequences(g, (8, 5))
    draft = torch.randint(0, 96, (3,), generator=g).tolist()
    for req in requests:
        for runner in twins.runners:
            runner.forward([ScheduledItem(req, 0, len(req.session.ids))])
        req.session.num_cached = len(req.session.ids)
    seq, other = requests
    start = len(seq.session.ids)
    seq.session.ids.append(7)
    other.session.ids.append(9)
    item = ScheduledItem(seq, start, 1)
    item.draft_slots = 3
    item.set_draft(draft)
    verified = twins.runners[0].forward([ScheduledItem(other, len(other.session.ids) - 1, 1), item])
    plain = []
    for i, token in enumerate([None, *draft]):
        if token is not None:
            seq.session.ids.append(token)
        plain.append(twins.runners[1].forward([ScheduledItem(seq, start + i, 1)]))
    assert twins.fused_steps == 2 * 2 + 1 + 4  # every step of this test
    assert torch.equal(verified[1:], torch.cat(plain))


@needs_avx512
@torch.inference_mode()
def test_a_fused_step_refuses_slots_outside_the_pool() -> None:
    decoder = Decoder(tiny_llama(), "q4")
    layer = decoder.layers[0]
    pool = torch.zeros(2, 64, 16)
    rot = torch.view_as_real(decoder.rotation(torch.tensor([5]))).contiguous()

    def step(slot: int, history: list[int]) -> None:
        blockq.native().fused_layer(torch.randn(1, 64), layer.norm_in, layer.norm_post, layer.qkv.blocks,
                                     layer.o.blocks, layer.gate_up.blocks, layer.down.blocks, rot, pool,
                                     pool.clone(), torch.tensor([slot]), torch.tensor([history]),
                                     torch.tensor([len(history)]), decoder.num_heads, decoder.eps, decoder.scale)

    step(5, [0, 1, 2, 3, 4, 5])
    with pytest.raises(RuntimeError, match="slots out of the pool"):
        step(64, [0, 64])
    with pytest.raises(RuntimeError, match="history slots out of the pool"):
        step(5, [0, 1, 99, 5])


def _layers_sharing_a_core_with_a_spinner(results) -> None:
    """In a fresh process (its OpenMP threads are made here, on one core): fused layers on two threads beside a
    process that spins on the same core, until a barrier has stalled or 30 s went by."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        torch.set_num_threads(2)
        decoder = Decoder(tiny_llama(), "q4")
        layer = decoder.layers[0]
        pool = torch.zeros(2, 64, 16)
        rot = torch.view_as_real(decoder.rotation(torch.tensor([5]))).contiguous()
        kernels = blockq.native()
        before, deadline = kernels.stalls(), time.monotonic() + 30
        while kernels.stalls() == before and time.monotonic() < deadline:
            kernels.fused_layer(torch.randn(1, 64), layer.norm_in, layer.norm_post, layer.qkv.blocks, layer.o.blocks,
                                layer.gate_up.blocks, layer.down.blocks, rot, pool, pool.clone(), torch.tensor([5]),
                                torch.tensor([[0, 1, 2, 3, 4, 5]]), torch.tensor([6]), decoder.num_heads,
                                decoder.eps, decoder.scale)
        results.put((kernels.stalls() - before, torch.get_num_threads()))
    finally:
        spinner.kill()
        spinner.wait()


@needs_avx512
def test_a_layer_whose_thread_lost_its_core_counts_a_stall_and_leaves_one_thread() -> None:
    """Two threads and a spinning process on one core: a barrier waits out the spinner's slice for the other
    thread. The kernels count it, and the caller's later layers (and torch's ops) run on one thread: each would
    wait out the same slice (beside one busy process, a one-token step took 330 ms instead of 15)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_layers_sharing_a_core_with_a_spinner, args=(results,))
    child.start()
    try:
        stalls, threads_after = results.get(timeout=120)
    finally:
        child.join(timeout=30)
    assert stalls >= 1
    assert threads_after == 1


def test_stalls_read_zero_and_set_threads_does_nothing_before_the_kernels_load(monkeypatch) -> None:
    monkeypatch.setattr(blockq, "native", functools.cache(lambda: pytest.fail("built the kernels")))
    assert blockq.stalls() == 0
    blockq.set_threads(1)
