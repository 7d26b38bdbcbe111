"""CPU matmuls from linear weights packed once in oneDNN's layout.

A prefill step multiplies a few dozen rows by every weight matrix. For more than one row MKL's GEMM repacks the
weight matrix on every call, which triples the weight traffic of a step that is bound by memory bandwidth on a
small CPU (measured here: the matmuls of a 19-token SmolLM2 prefill took 190 ms, three times a decode's). oneDNN's
linear reads a copy packed once, at load.

A decode's single row is a matrix-vector product, bound by memory bandwidth alone, and MKL's GEMV runs it on one
thread: on the 2-core CPU here it read SmolLM2's layer weights at 10.9 GB/s with 1 or 2 threads, oneDNN's packed
linear at 15.3 GB/s, and the vocabulary-sized output projection at 11.1 against 21.6 GB/s. So every row count, and
the output projection too, reads the packed copy.

The packed copies cost the linear weights' memory once more.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

log = logging.getLogger(__name__)


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] (float32 or bfloat16) in oneDNN's packed layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` from ``pack(weight)``; ``x`` [..., in]."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


def _packed_forward(module: nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return packed_linear(x, packed, module.bias)


def is_packed(module: nn.Module) -> bool:
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _packed_forward


def prepack_linears(model: nn.Module) -> int:
    """Pack the float32 CPU linear layers of ``model`` for oneDNN, in place; returns how many were packed (0 where
    oneDNN is unavailable). Packing twice is a no-op."""
    if not available():
        return 0
    packed_bytes = 0
    count = 0
    for module in model.modules():
        if (not isinstance(module, nn.Linear) or is_packed(module)
                or module.weight.device.type != "cpu" or module.weight.dtype != torch.float32):
            continue
        packed = pack(module.weight)
        module.forward = functools.partial(_packed_forward, module, packed)
        packed_bytes += module.weight.numel() * module.weight.element_size()
        count += 1
    if count:
        log.info("LLM: %d linear layers packed for oneDNN matmuls (%.0f MiB more)", count,
                 packed_bytes / 2**20)
    return count
