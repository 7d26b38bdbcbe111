"""The LLM's weight formats (``llm.weights``): how the decoder's linear layers store and multiply their weights.

A decode step reads every weight once and is bound by memory bandwidth, so the bytes per weight set its speed.

- ``fp32``: float32; on the CPU packed once for oneDNN (``prepack.py`` says why).
- ``bf16``: bfloat16 weights, activations and KV pool: the GPU's format; on a CPU only where oneDNN has bf16 kernels.
- ``int8``: int8 weights, one scale per output channel. On the CPU the activations are quantized too, per row
  (each row's own scale, so a row's result does not depend on the other rows of the step: batching and speculation
  give the same tokens), through fbgemm's packed int8 GEMM. SmolLM2's activations carry outlier channels (up to
  456 in the last MLP's input, median 5): per-row scales alone lost 6 % perplexity and per-tensor ones (torch's
  ``quantize_dynamic``) 190 %, so each layer's input channels are first smoothed (SmoothQuant, alpha 0.5: the
  activation channel divided by ``s``, the weight column multiplied by it, ``s`` from activation maxima measured on
  a calibration text at load). On CUDA: weight-only (``torch._weight_int8pack_mm``) where the build has the kernel.
- ``q4``: 4-bit codes in blocks of 32 inputs with a scale and an offset each, float32 activations and sums, on
  voicepipe's native kernels (``blockq.py``; CPUs with AVX-512); the output projection in fp16. Lossless for the
  layers of a model converted from a Q4_1 GGUF, as the default SmolLM2 is.
- ``auto``: the fastest format on this hardware that passes the quality check (``quality.py``) against the model's
  own weights: on the CPU q4, then int8, fp16, else fp32; on CUDA bf16. Measured here on SmolLM2: all its linears
  for one decode row take 4.6 ms in q4, 10.4 in int8, 6.5-11.2 in fp16, 18-33 in fp32 and 17.7 in bf16; a whole
  q4 decode step, fused (``blockq.py``), 9 ms against fp16's 28 op by op.

Each format gives a kernel per weight matrix (``make_linear``): a callable ``[rows, in] -> [rows, out]``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from voicepipe.llm import blockq, prepack
from voicepipe.llm.blockq import BlockLinear

log = logging.getLogger(__name__)

FORMATS = ("auto", "fp32", "fp16", "bf16", "int8", "q4")
SMOOTH_ALPHA = 0.5


@dataclass(frozen=True)
class WeightChoice:
    """The format the engine runs (never ``auto``), its activation and KV dtype, and why it was chosen."""

    format: str
    dtype: torch.dtype
    reason: str


def activation_dtype(fmt: str, device: torch.device | None = None) -> torch.dtype:
    if fmt == "bf16":
        return torch.bfloat16
    if fmt == "fp16" and device is not None and device.type == "cuda":
        return torch.float16
    return torch.float32


def unsupported_reason(fmt: str, device: torch.device) -> str | None:
    """Why ``fmt`` cannot run on ``device`` here, or None."""
    if fmt == "fp32":
        return None
    if fmt == "bf16":
        if device.type == "cuda":
            return None if torch.cuda.is_bf16_supported() else "this GPU has no bfloat16 support"
        if device.type == "cpu" and not (prepack.available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            return "this CPU has no oneDNN bfloat16 kernels (they need AVX512-BF16 or AMX)"
        return None
    if fmt == "fp16":
        if device.type == "cpu":
            engines = torch.backends.quantized.supported_engines
            return None if "fbgemm" in engines or "x86" in engines else "this torch build has no fbgemm kernels"
        return None if device.type == "cuda" else f"fp16 is not available on {device.type}"
    if fmt == "int8":
        if device.type == "cpu":
            engines = torch.backends.quantized.supported_engines
            if "fbgemm" not in engines and "x86" not in engines:
                return "this torch build has no fbgemm int8 kernels (x86 CPUs only)"
            return None
        if device.type == "cuda":
            if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_int8pack_mm", "CUDA"):
                return "this torch build has no CUDA kernel for int8 weight-only matmuls"
            return None
        return f"int8 is not available on {device.type}"
    if fmt == "q4":
        return blockq.unavailable_reason() if device.type == "cpu" else "q4 is a CPU format (its kernels are x86)"
    return f"unknown weight format {fmt!r} (use one of {', '.join(FORMATS)})"


def auto_candidates(device: torch.device) -> list[str]:
    """The formats ``auto`` tries, fastest first (the last one needs no quality check)."""
    if device.type == "cuda":
        return ["bf16", "fp16", "fp32"]
    return ["q4", "int8", "fp16", "fp32"]


# -- kernels --------------------------------------------------------------------------------------------------------
class PlainLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear:
    """oneDNN's linear on a weight packed once (float32 or bfloat16, CPU)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.packed = prepack.pack(weight)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return prepack.packed_linear(x, self.packed, self.bias)


def _channel_scales(weight: torch.Tensor) -> torch.Tensor:
    return (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)


def smoothing_from(weight_max: torch.Tensor, act_max: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's ``s`` per input channel from the channels' largest weight and activation magnitudes: the
    activation channel is divided by ``s`` and the weight column multiplied by it, which moves half (alpha) of an
    outlier channel's range from the activations, quantized per row, into the weights, quantized per column."""
    return (act_max.float().clamp(min=1e-5) ** SMOOTH_ALPHA
            / weight_max.float().clamp(min=1e-5) ** (1 - SMOOTH_ALPHA)).clamp(min=1e-5)


def smoothing(weight: torch.Tensor, act_max: torch.Tensor) -> torch.Tensor:
    """``smoothing_from`` for the input channels (columns) of ``weight`` [out, in]."""
    return smoothing_from(weight.abs().amax(dim=0), act_max)


class Int8Linear:
    """int8 weights (per output channel) times int8 activations (per row), int32 sums, on fbgemm (CPU).

    Each row is divided by its largest magnitude; fbgemm's linear with a fixed input scale of 1/127 (zero point
    128) rounds it to integers in [-127, 127], multiplies in int32 and dequantizes; the row's magnitude multiplies
    the result back. The integer sums are exact, so a row's result does not depend on the other rows. The weights
    come smoothed (``smoothing``) by the decoder."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        weight = weight.detach().float()
        scales = _channel_scales(weight).double()
        with warnings.catch_warnings():  # quantized tensors are deprecated in torch; fbgemm's kernels take no other
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales, torch.zeros_like(scales, dtype=torch.long), 0,
                                                 torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.bias = None if bias is None else bias.detach().float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        magnitude = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_(min=1e-12)
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(x / magnitude, 1 / 127, 128,
                                                                                self.packed)
        y.mul_(magnitude)
        return y if self.bias is None else y.add_(self.bias)


class Fp16Linear:
    """float16 weights, float32 activations: fbgemm converts the packed weights inside its GEMM (CPU)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.detach().float(),
                                                              None if bias is None else bias.detach().float())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)


class WeightOnlyInt8Linear:
    """int8 weights (per output channel) dequantized inside the matmul (``torch._weight_int8pack_mm``); the
    activations stay in their dtype. For CUDA, where torch has the kernel (on this CPU it is slower than fp32)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        weight = weight.detach().float()
        scales = _channel_scales(weight)
        self.qweight = (weight / scales[:, None]).round_().clamp_(-127, 127).to(torch.int8).contiguous()
        self.scales = scales
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x, self.qweight, self.scales.to(x.dtype))
        return y if self.bias is None else y + self.bias


def make_linear(fmt: str, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True,
                output: bool = False):
    """The kernel of one weight matrix ``[out, in]`` in format ``fmt`` on the weight's device; ``pack``: float
    weights on the CPU are packed for oneDNN; ``output``: the model's output projection (q4 keeps it in fp16)."""
    device = weight.device
    weight = weight.detach()
    if fmt == "q4":
        return Fp16Linear(weight, bias) if output else BlockLinear(weight, bias)
    if fmt == "fp16" and device.type == "cpu":
        return Fp16Linear(weight, bias)
    if fmt == "int8":
        if device.type == "cpu":
            return Int8Linear(weight, bias)
        return WeightOnlyInt8Linear(weight, None if bias is None else bias.detach().to(torch.bfloat16))
    dtype = activation_dtype(fmt, device)
    weight = weight.to(dtype).contiguous()
    bias = None if bias is None else bias.detach().to(dtype)
    if pack and device.type == "cpu" and prepack.available():
        return PackedLinear(weight, bias)
    return PlainLinear(weight, bias)
