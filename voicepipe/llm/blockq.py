"""Block-quantized weights (``llm.weights = "q4"``) and the native CPU kernels that multiply them.

A layer's weight matrix is stored in blocks of 32 inputs, 4-bit codes with a scale and an offset per block
(``w = d * q + m``, GGUF's Q4_1 layout). A model converted from a Q4_1 GGUF, as the default SmolLM2 is, is stored
without loss: the blocks give back its float32 weights exactly. Any other model loses precision, and ``auto`` takes
the format only when it passes the quality check (``quality.py``). The output projection stays in fp16 (``weights``):
a 49k x 576 matrix of blocks cost more to unpack than to read here (one decode step: 3 ms more).

A decode step reads every weight: 4-bit blocks are 0.625 bytes a weight against fp16's 2. The kernels
(``csrc/blockq.cpp``, AVX-512, built with the machine's C++ compiler at first use and cached by torch) multiply a
few rows at a time. ``fused_layer`` runs a whole decoder layer of a step of up to ``FUSED_ROWS`` rows (decodes,
drafted tokens, a short prefill) in one native call (the decoder's ``_fused``) and one OpenMP region, each row
attending to its own history: the ~40 small tensor ops a layer cost about as much as its matmuls (one SmolLM2
decode step: 9 ms fused against 28 in fp16 op by op). A larger step (a prefill chunk) runs op by op: up to
``FEW_ROWS`` rows on the native kernel, more on oneDNN's float32 GEMM of a dequantized copy packed at load (the
same weights, and faster at many rows).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from voicepipe.llm import prepack

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "blockq.cpp"
BLOCK = 32
# up to this many rows the native kernel beats oneDNN's float32 GEMM (scripts/bench_blockq.py, 2 threads: 24 rows
# 34.6 against 35.1 ms for SmolLM2's layers, 32 rows 45.2 against 42.5)
FEW_ROWS = 24
# steps of up to this many rows run fused (``fused_layer``): past FEW_ROWS its matmuls cost a little more than
# oneDNN's, but the ~40 tensor ops a layer it saves cost more
FUSED_ROWS = 32
# ... unless a prompt span's rows would re-read more history slots than this: each row of a fused step reads its
# whole history (K/V in float32), where op by op the span reads it once: a caller's turn 30 turns into a call
# (~1300 slots) had a TTFT of 275 ms fused against 182 op by op (`voicepipe bench llm --turns 30`); a handful of
# prompt tokens over a few hundred slots stays cheaper fused
FUSED_REREAD = 4096
# -fopenmp: without it ATen's parallel_for (an OpenMP pragma in its header) runs the kernels on one thread; the
# extension then links libgomp.so.1, which resolves to the copy torch has loaded already
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-fopenmp"]


@functools.cache
def native():
    """The compiled kernels (built once per machine into torch's extension cache; raises when that fails)."""
    from torch.utils.cpp_extension import load

    log.info("LLM: loading the block-quantized kernels (the first time on a machine builds them: about 20 s)")
    return load("voicepipe_blockq", [str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], verbose=False)


def stalls() -> int:
    """How many barrier waits of the fused layers have lasted over 1 ms, a thread having lost its core (0 while the
    kernels are not loaded: nothing has run on them)."""
    return native().stalls() if native.cache_info().currsize else 0


def set_threads(threads: int) -> None:
    """The calling thread's threads, for the fused layers and torch's ops (after a stall, a fused layer leaves it
    at one); a no-op while the kernels are not loaded."""
    if native.cache_info().currsize:
        native().set_threads(threads)


@functools.cache
def unavailable_reason() -> str | None:
    """Why the kernels cannot run here, or None."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX512":
        return f"its kernels need an AVX-512 CPU (this one: {capability})"
    try:
        native()
    except Exception as exc:  # no compiler, no headers: say so and let auto choose another format
        return f"building its kernels failed ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    return None


def quantize(weight: torch.Tensor) -> list[torch.Tensor]:
    """``weight`` [out, in] (``in`` a multiple of 32) as [codes, scales, offsets]: per block of 32 inputs, 4-bit
    codes 0..15 between the block's minimum (its offset) and maximum, two a byte."""
    out, inp = weight.shape
    if inp % BLOCK:
        raise ValueError(f"q4 needs layer widths in multiples of {BLOCK}, not {inp}")
    blocks = weight.detach().float().reshape(out, inp // BLOCK, BLOCK)
    low = blocks.amin(-1)
    scale = (blocks.amax(-1) - low) / 15
    codes = ((blocks - low[..., None]) / torch.where(scale > 0, scale, 1)[..., None]).round_().clamp_(0, 15)
    codes = codes.to(torch.uint8)
    packed = codes[..., :16] | (codes[..., 16:] << 4)  # GGUF's nibble order: inputs i and i + 16 share a byte
    return [packed.reshape(out, inp // 2).contiguous(), scale.contiguous(), low.contiguous()]


def dequantize(blocks: list[torch.Tensor]) -> torch.Tensor:
    """The float32 weight [out, in] that ``blocks`` stand for."""
    codes, scale, offset = blocks
    out, nb = scale.shape
    by_block = codes.view(out, nb, BLOCK // 2)
    q = torch.stack([by_block & 15, by_block >> 4], dim=-2).view(out, nb, BLOCK).float()
    return (q * scale[..., None] + offset[..., None]).view(out, nb * BLOCK)


class BlockLinear:
    """A linear layer's weights in blocks: the native kernel for up to ``FEW_ROWS`` rows, oneDNN's float32 GEMM on
    the dequantized weights for more."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.blocks = quantize(weight)
        self.bias = None if bias is None else bias.detach().float()
        dense = dequantize(self.blocks)
        self.packed = prepack.pack(dense) if prepack.available() else None
        self.dense = None if self.packed is not None else dense

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= FEW_ROWS:
            y = native().linear(x.contiguous(), self.blocks)
            return y if self.bias is None else y.add_(self.bias)
        if self.packed is not None:
            return prepack.packed_linear(x, self.packed, self.bias)
        return torch.nn.functional.linear(x, self.dense, self.bias)
