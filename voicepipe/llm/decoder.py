"""Our own forward of Llama-family decoders over the paged KV pool: the engine's fast path.

transformers' modules spend about 40 tensor ops and a dozen Python calls per layer on a decode step (measured here:
12 of a 52 ms SmolLM2 step were neither a matmul nor attention). This forward does the same arithmetic in about 15
ops a layer: q, k and v in one matmul, gate and up in one, RMSNorm as one op, the rotary embedding as one complex
multiply, residuals added in place. For the rotary multiply the rows of q and k are permuted at load so that each
rotated pair of dimensions sits side by side (transformers rotates dimension ``i`` with ``i + head_dim / 2``);
q and k are permuted alike, so their dot products, the attention, are unchanged. The weights are multiplied by the
kernels of the chosen weight format (``weights.py``).

Supported: the model types in ``SUPPORTED`` with a SiLU MLP and a static RoPE (default, linear, llama3, yarn:
anything whose ``inv_freq`` does not change at run time). Others run through transformers' modules (``runner.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from voicepipe.llm import blockq
from voicepipe.llm.attention import PagedKVCache, StepAborted, StepLayout, attend
from voicepipe.llm.blockq import BlockLinear
from voicepipe.llm.weights import activation_dtype, make_linear, smoothing, smoothing_from

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def unsupported_reason(model) -> str | None:
    """Why ``Decoder`` cannot run ``model``, or None."""
    cfg = _text_config(model)
    if cfg.model_type not in SUPPORTED:
        return f"model type {cfg.model_type!r} (the fast decoder knows {', '.join(SUPPORTED)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "no rotary embedding module"
    rope_type = getattr(rotary, "rope_type", "default")
    if not isinstance(rope_type, str) or "dynamic" in rope_type or rope_type == "longrope":
        return f"RoPE type {rope_type!r} changes with the sequence length"
    return None


def rotary_permutation(head_dim: int) -> torch.Tensor:
    """Row order within a head that puts dimension ``i`` next to ``i + head_dim / 2``."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)


@dataclass
class _Layer:
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    qkv: Any
    o: Any
    gate_up: Any
    down: Any
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def _cat_bias(*linears) -> torch.Tensor | None:
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else torch.zeros(lin.out_features, device=lin.weight.device)
                      for b, lin in zip(biases, linears, strict=True)])


class Decoder:
    """A Llama-family decoder's weights in one format and the forward over the paged pool.

    ``act_max`` maps each ``nn.Linear`` of the model to its input channels' maxima (``quality.calibrate``): given,
    the weights are smoothed for int8 activations (``_smooth_layer``); ``pack``: float weights on the CPU are packed
    for oneDNN."""

    def __init__(self, model, fmt: str, act_max: dict | None = None, pack: bool = True) -> None:
        cfg = _text_config(model)
        act_max = act_max or {}
        inner = model.model
        self.format = fmt
        self.dtype = dtype = activation_dtype(fmt, inner.embed_tokens.weight.device)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        attn0 = inner.layers[0].self_attn
        self.head_dim = attn0.head_dim
        self.scale = attn0.scaling
        self.eps = cfg.rms_norm_eps
        self.hidden = cfg.hidden_size
        self.intermediate = cfg.intermediate_size
        self.embed = inner.embed_tokens.weight.detach().to(dtype)
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float()
        self.rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        perm = rotary_permutation(self.head_dim).to(self.embed.device)

        def permuted(w: torch.Tensor | None, heads: int) -> torch.Tensor | None:
            if w is None:
                return None
            return w.detach().view(heads, self.head_dim, *w.shape[1:])[:, perm].reshape(w.shape)

        self.layers: list[_Layer] = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            w = {"qkv": torch.cat([permuted(a.q_proj.weight, self.num_heads),
                                   permuted(a.k_proj.weight, self.num_kv_heads), a.v_proj.weight.detach()]),
                 "qkv_b": _cat_bias(a.q_proj, a.k_proj, a.v_proj), "o": a.o_proj.weight.detach(),
                 "o_b": a.o_proj.bias, "gate_up": torch.cat([m.gate_proj.weight.detach(), m.up_proj.weight.detach()]),
                 "gate_up_b": _cat_bias(m.gate_proj, m.up_proj), "down": m.down_proj.weight.detach(),
                 "down_b": m.down_proj.bias, "norm_in": layer.input_layernorm.weight.detach(),
                 "norm_post": layer.post_attention_layernorm.weight.detach()}
            if w["qkv_b"] is not None:
                nq, nk = a.q_proj.out_features, a.k_proj.out_features
                b = w["qkv_b"]
                w["qkv_b"] = torch.cat([permuted(b[:nq], self.num_heads), permuted(b[nq:nq + nk], self.num_kv_heads),
                                        b[nq + nk:]])
            if act_max:
                self._smooth_layer(w, act_max[a.q_proj], act_max[a.o_proj], act_max[m.gate_proj],
                                   act_max[m.down_proj])
            q_norm = getattr(a, "q_norm", None)
            k_norm = getattr(a, "k_norm", None)
            self.layers.append(_Layer(
                norm_in=w["norm_in"].to(dtype), norm_post=w["norm_post"].to(dtype),
                qkv=make_linear(fmt, w["qkv"], w["qkv_b"], pack),
                o=make_linear(fmt, w["o"], w["o_b"], pack),
                gate_up=make_linear(fmt, w["gate_up"], w["gate_up_b"], pack),
                down=make_linear(fmt, w["down"], w["down_b"], pack),
                q_norm=None if q_norm is None else q_norm.weight.detach()[perm].to(dtype),
                k_norm=None if k_norm is None else k_norm.weight.detach()[perm].to(dtype)))
        head = model.get_output_embeddings()
        norm, head_w = inner.norm.weight.detach(), head.weight.detach()
        if act_max:
            s = smoothing(head_w, act_max[head])
            norm, head_w = norm / s, head_w * s
        self.norm = norm.to(dtype)
        self.lm_head = make_linear(fmt, head_w, head.bias, pack, output=True)
        self.fused = fmt == "q4" and all(isinstance(lin, BlockLinear) and lin.bias is None for layer in self.layers
                                         for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)) \
            and all(layer.q_norm is None for layer in self.layers) and self.head_dim % 16 == 0 and self.head_dim <= 128

    def _smooth_layer(self, w: dict, qkv_in: torch.Tensor, o_in: torch.Tensor, gate_up_in: torch.Tensor,
                      down_in: torch.Tensor) -> None:
        """SmoothQuant, folded into the layer: each linear's input channel ``j`` is divided by ``s_j`` where it is
        made (the RMSNorm weight before qkv and gate-up; the v rows before o, as attention only mixes positions;
        the up rows before down, as ``silu(gate) * up`` is linear in up) and its weight column multiplied by it.
        o's channels come from the kv head their query head reads, so its ``s`` is taken per kv head (the largest
        input of the group)."""
        s = smoothing(w["qkv"], qkv_in)
        w["qkv"], w["norm_in"] = w["qkv"] * s, w["norm_in"] / s
        s = smoothing(w["gate_up"], gate_up_in)
        w["gate_up"], w["norm_post"] = w["gate_up"] * s, w["norm_post"] / s
        kvh, group, hd = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        o_cols = w["o"].abs().amax(dim=0).view(kvh, group, hd).amax(dim=1)
        s_kv = smoothing_from(o_cols, o_in.view(kvh, group, hd).amax(dim=1)).reshape(-1)
        w["o"] = w["o"] * s_kv.view(kvh, 1, hd).expand(kvh, group, hd).reshape(-1)
        v_rows = slice(w["qkv"].shape[0] - kvh * hd, None)
        w["qkv"][v_rows] /= s_kv[:, None]
        if w["qkv_b"] is not None:
            w["qkv_b"] = w["qkv_b"].clone()
            w["qkv_b"][v_rows] /= s_kv
        s = smoothing(w["down"], down_in)
        w["down"] = w["down"] * s
        up_rows = slice(self.intermediate, None)
        w["gate_up"][up_rows] /= s[:, None]
        if w["gate_up_b"] is not None:
            w["gate_up_b"] = w["gate_up_b"].clone()
            w["gate_up_b"][up_rows] /= s

    def rotation(self, positions: torch.Tensor) -> torch.Tensor:
        """[T, 1, head_dim / 2] complex: each position's rotation of each dimension pair."""
        angles = positions.float()[:, None] * self.inv_freq.to(positions.device)
        return torch.polar(torch.full_like(angles, self.rope_scaling), angles)[:, None]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, layout: StepLayout, keep: torch.Tensor | None,
                cache: PagedKVCache) -> torch.Tensor | None:
        """``ids``, ``positions`` [T] (the packed batch); writes each layer's new K/V to ``layout.slots`` of
        ``cache`` and returns float32 logits of the rows ``keep`` (None: no logits)."""
        t = ids.shape[0]
        heads, kv_heads, hd = self.num_heads, self.num_kv_heads, self.head_dim
        n_rot = (heads + kv_heads) * hd
        x = F.embedding(ids, self.embed)
        rot = self.rotation(positions)
        if layout.row_history is not None:
            return self._fused(x, rot, layout, keep, cache)
        for i, layer in enumerate(self.layers):
            if cache.abort_requested:
                raise StepAborted
            qkv = layer.qkv(F.rms_norm(x, (self.hidden,), layer.norm_in, self.eps))
            qk = qkv[:, :n_rot].view(t, heads + kv_heads, hd)
            if layer.q_norm is not None:
                qk = torch.cat([F.rms_norm(qk[:, :heads], (hd,), layer.q_norm, self.eps),
                                F.rms_norm(qk[:, heads:], (hd,), layer.k_norm, self.eps)], dim=1)
            pairs = torch.view_as_complex(qk.float().reshape(t, heads + kv_heads, hd // 2, 2))
            qk = torch.view_as_real(pairs * rot).view(t, heads + kv_heads, hd).to(self.dtype)
            k = qk[:, heads:].transpose(0, 1)
            v = qkv[:, n_rot:].view(t, kv_heads, hd).transpose(0, 1)
            kp, vp = cache.k[i], cache.v[i]
            kp.index_copy_(1, layout.slots, k)
            vp.index_copy_(1, layout.slots, v)
            o = attend(qk[:, :heads], kp, vp, layout, self.scale)
            x.add_(layer.o(o.reshape(t, heads * hd)))
            gu = layer.gate_up(F.rms_norm(x, (self.hidden,), layer.norm_post, self.eps))
            x.add_(layer.down(F.silu(gu[:, :self.intermediate]) * gu[:, self.intermediate:]))
        return self._logits(x, keep)

    def _logits(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor | None:
        if keep is None:
            return None
        x = x.index_select(0, keep)
        return self.lm_head(F.rms_norm(x, (self.hidden,), self.norm, self.eps)).float()

    def fuses(self, rows: int, reread: int) -> bool:
        """Whether a step of ``rows`` rows runs fused (``_fused``): the runner then builds each row's history.
        ``reread``: the most history slots a prompt span's rows read again after its first row (a fused step
        attends row by row, where op by op the span reads its history once)."""
        return self.fused and rows <= blockq.FUSED_ROWS and reread <= blockq.FUSED_REREAD

    def _fused(self, x: torch.Tensor, rot: torch.Tensor, layout: StepLayout, keep: torch.Tensor | None,
               cache: PagedKVCache) -> torch.Tensor | None:
        """A step of up to ``blockq.FUSED_ROWS`` rows (decodes, drafted tokens, a short prefill), each layer in one
        native call (``blockq.fused_layer``): the arithmetic of the loop in ``forward`` without its ~40 tensor ops
        a layer. Every row attends to its own history (``layout.row_history``), so a row's result is the same
        whatever else the step holds: a drafted token's logits are bit for bit the ones a plain decode step gives
        it."""
        rot = torch.view_as_real(rot).contiguous()
        kernels = blockq.native()
        for i, layer in enumerate(self.layers):
            if cache.abort_requested:
                raise StepAborted
            kernels.fused_layer(x, layer.norm_in, layer.norm_post, layer.qkv.blocks, layer.o.blocks,
                                 layer.gate_up.blocks, layer.down.blocks, rot, cache.k[i], cache.v[i], layout.slots,
                                 layout.row_history, layout.row_lengths, self.num_heads, self.eps, self.scale)
        return self._logits(x, keep)
