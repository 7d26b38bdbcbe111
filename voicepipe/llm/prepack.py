"""CPU prefill matmuls from weights packed once in oneDNN's layout.

A prefill step multiplies a few dozen rows by every weight matrix. For more than one row MKL's GEMM repacks the
weight matrix on every call, which triples the weight traffic of a step that is bound by memory bandwidth on a
small CPU (measured here: the matmuls of a 19-token SmolLM2 prefill took 190 ms, three times a decode's). oneDNN's
linear reads a copy packed once, at load. A single row (a decode) keeps the plain GEMV, which packs nothing.

The packed copies cost the linear weights' memory once more. The output projection is left alone: it is
vocabulary-sized and the runner feeds it one row per sampled sequence.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _packed_forward(module: nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.numel() == x.shape[-1]:
        return F.linear(x, module.weight, module.bias)
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, module.bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


def is_packed(module: nn.Module) -> bool:
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _packed_forward


def prepack_linears(model: nn.Module) -> int:
    """Pack the float32 CPU linear layers of ``model`` (not its output projection) for multi-row inputs, in place;
    returns how many were packed (0 where oneDNN is unavailable). Packing twice is a no-op."""
    if not available():
        return 0
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    packed_bytes = 0
    count = 0
    for module in model.modules():
        if (not isinstance(module, nn.Linear) or module is output or is_packed(module)
                or module.weight.device.type != "cpu" or module.weight.dtype != torch.float32):
            continue
        packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None)
        module.forward = functools.partial(_packed_forward, module, packed)
        packed_bytes += module.weight.numel() * module.weight.element_size()
        count += 1
    if count:
        log.info("LLM: %d linear layers packed for oneDNN prefill matmuls (%.0f MiB more)", count,
                 packed_bytes / 2**20)
    return count
