"""Choosing the weight format at load: calibrate, build the decoder, and check a lossy format against the model.

The check runs a held-out conversation through the model's own weights (transformers' forward, the reference) and
through the candidate decoder, teacher-forced, and compares the two: the candidate's next-token argmax must agree
with the reference's on at least ``MIN_AGREEMENT`` of the positions and its perplexity of the text must rise by at
most ``MAX_PPL_RISE``. It costs two forwards of ~300 tokens, once per loaded model (the result is remembered).

The bar is high because greedy decoding compounds: a reply follows the candidate's own tokens, so one flipped
argmax changes the rest of it. The issue's bound (greedy replies agreeing with fp32 on >= 90 % of their first 32
tokens, tests/e2e/test_llm_weights.py) needs flips below ~0.5 % a token. Measured on SmolLM2 (teacher-forced
agreement here -> greedy agreement over 32 tokens): fp16 weights 100 % -> 100 %; int8 with per-row activations
94.3 % -> 29 %; bf16 97.7 %; weight-only int8 per channel (simulated) 95 % -> 72 %, per group of 32 -> 88 %.

int8 on the CPU is calibrated first: the largest magnitude of each linear layer's input channels over a
calibration conversation (not the held-out one) sets its smoothing (``weights.smoothing``).
"""

from __future__ import annotations

import logging
import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voicepipe.llm.attention import PagedKVCache, PrefillSpan, StepLayout
from voicepipe.llm.decoder import Decoder, unsupported_reason
from voicepipe.llm.weights import FORMATS, WeightChoice, activation_dtype, auto_candidates
from voicepipe.llm.weights import unsupported_reason as format_unsupported

log = logging.getLogger(__name__)

MIN_AGREEMENT = 0.99
MAX_PPL_RISE = 0.03

CALIBRATION = [
    {"role": "system", "content": "You are the phone assistant of a dental practice. Answer in one or two short, "
                                  "friendly sentences that are easy to say out loud."},
    {"role": "user", "content": "Hi, um, I'd like to move my cleaning appointment from Tuesday to later this week."},
    {"role": "assistant", "content": "Of course! Could you tell me your name and date of birth, please?"},
    {"role": "user", "content": "Sure, it's Maria Gonzalez, March 3rd, 1985. Do you have Thursday afternoon?"},
    {"role": "assistant", "content": "Thanks, Maria. We have Thursday at 2:30 or 4:15. Which one works for you?"},
    {"role": "user", "content": "4:15 is great. Also, how much is the whitening treatment? My card ends in 4417."},
    {"role": "assistant", "content": "You're booked for Thursday at 4:15. Whitening costs $250, and we can add it "
                                     "to that visit if you like."},
    {"role": "user", "content": "Hmm, let me think about it. What's your address again, and is there parking?"},
]
HELD_OUT = [
    {"role": "system", "content": "You are a helpful voice assistant for Riverside Bike Rentals. Keep answers short."},
    {"role": "user", "content": "Hello! Can I rent two bikes for Saturday morning, around nine o'clock?"},
    {"role": "assistant", "content": "Yes, we have bikes available on Saturday at nine. Would you like city bikes "
                                     "or mountain bikes?"},
    {"role": "user", "content": "City bikes, please. How much is it for four hours, and do you provide helmets?"},
    {"role": "assistant", "content": "City bikes are fifteen dollars for four hours each, and helmets are free. "
                                     "Shall I put the booking under your name?"},
    {"role": "user", "content": "Yes, it's Daniel Okafor. My number is 555 0192. Can we pay when we pick them up?"},
    {"role": "assistant", "content": "Thank you, Daniel. Two city bikes for Saturday at nine, and you can pay by "
                                     "card or cash at pickup. Is there anything else I can help with?"},
    {"role": "user", "content": "What happens if it rains? And where exactly is the shop, near the old bridge?"},
    {"role": "assistant", "content": "If it rains, you can move the booking to another day for free. We are on "
                                     "River Street, right next to the old stone bridge, across from the bakery."},
]


@dataclass(frozen=True)
class QualityReport:
    agreement: float  # fraction of positions whose argmax matches the reference's
    ppl_ratio: float  # candidate perplexity / reference perplexity of the held-out text

    @property
    def passed(self) -> bool:
        return self.agreement >= MIN_AGREEMENT and self.ppl_ratio <= 1 + MAX_PPL_RISE

    def __str__(self) -> str:
        return (f"argmax agreement {self.agreement:.1%} (>= {MIN_AGREEMENT:.0%}), perplexity "
                f"{(self.ppl_ratio - 1) * 100:+.2f} % (<= +{MAX_PPL_RISE:.0%})")


def _ids(tokenizer, messages, device) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(messages, return_dict=False)
    return torch.tensor(ids, dtype=torch.long, device=device)


@torch.inference_mode()
def calibrate(model, ids: torch.Tensor) -> dict[nn.Linear, torch.Tensor]:
    """The largest magnitude of each linear layer's input channels over ``ids`` (transformers' forward)."""
    maxima: dict[nn.Linear, torch.Tensor] = {}

    def record(module, args):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0).float()
        maxima[module] = torch.maximum(maxima[module], x) if module in maxima else x

    hooks = [m.register_forward_pre_hook(record) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        model(input_ids=ids[None])
    finally:
        for hook in hooks:
            hook.remove()
    return maxima


@torch.inference_mode()
def score(decoder: Decoder, ids: torch.Tensor) -> torch.Tensor:
    """The decoder's float32 logits of every position of ``ids`` (one causal prefill on a scratch pool)."""
    n = ids.shape[0]
    cache = PagedKVCache(len(decoder.layers), 1, n, decoder.num_kv_heads, decoder.head_dim, decoder.dtype,
                         ids.device)
    slots = torch.arange(n, device=ids.device)
    layout = StepLayout(slots=slots, prefills=[PrefillSpan(0, n, slice(0, n), None)], single_prefill=True)
    return decoder.forward(ids, slots, layout, slots, cache)


def compare(reference: torch.Tensor, candidate: torch.Tensor, ids: torch.Tensor) -> QualityReport:
    agreement = (reference.argmax(-1) == candidate.argmax(-1)).float().mean().item()
    nll_ref = F.cross_entropy(reference[:-1].float(), ids[1:]).item()
    nll = F.cross_entropy(candidate[:-1].float(), ids[1:]).item()
    return QualityReport(agreement, math.exp(nll - nll_ref))


# per model: its calibration, its reference logits, and each checked format's report
_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _memo_of(model) -> dict:
    return _memo.setdefault(model, {})


def check(model, tokenizer, decoder: Decoder) -> QualityReport:
    """``decoder`` against the model's own weights on the held-out conversation (remembered per model)."""
    memo = _memo_of(model)
    if ("report", decoder.format) not in memo:
        device = next(model.parameters()).device
        ids = _ids(tokenizer, HELD_OUT, device)
        if "reference" not in memo:
            with torch.inference_mode():
                memo["reference"] = model(input_ids=ids[None]).logits[0].float()
        memo[("report", decoder.format)] = compare(memo["reference"], score(decoder, ids), ids)
    return memo[("report", decoder.format)]


def _activation_maxima(model, tokenizer) -> dict:
    memo = _memo_of(model)
    if "act_max" not in memo:
        memo["act_max"] = calibrate(model, _ids(tokenizer, CALIBRATION, next(model.parameters()).device))
    return memo["act_max"]


def build_decoder(model, tokenizer, fmt: str, pack: bool = True) -> Decoder:
    """The model's decoder in ``fmt`` (built once per model and format: a decoder holds no per-engine state, so
    engines on one model, and a model drafting for itself, share its weights)."""
    memo = _memo_of(model)
    key = ("decoder", fmt, pack)
    if key not in memo:
        device = next(model.parameters()).device
        act_max = _activation_maxima(model, tokenizer) if fmt == "int8" and device.type == "cpu" else None
        memo[key] = Decoder(model, fmt, act_max, pack=pack)
    return memo[key]


def _decoder_or_reason(model, tokenizer, fmt: str, pack: bool) -> tuple[Decoder | None, str | None]:
    """The decoder in ``fmt``, or why it cannot be built here (the machine, or the model's shapes: q4's blocks
    need widths in multiples of 32)."""
    why = format_unsupported(fmt, next(model.parameters()).device)
    if why is not None:
        return None, why
    try:
        return build_decoder(model, tokenizer, fmt, pack), None
    except ValueError as exc:
        return None, str(exc)


def choose_weights(model, tokenizer, requested: str, pack: bool = True,
                   fast_decoder: bool = True) -> tuple[WeightChoice, Decoder | None]:
    """The format to run (``llm.weights``) and its decoder; None for a model the decoder cannot run (or with
    ``fast_decoder`` off), which runs through transformers' modules in its own dtype. A format that cannot run
    here, or (under ``auto``) fails the quality check, is logged with the reason and the next candidate is tried."""
    device = next(model.parameters()).device
    own_dtype = next(model.parameters()).dtype
    own = "bf16" if own_dtype == torch.bfloat16 else "fp32"
    if requested not in FORMATS:
        raise ValueError(f"unknown weight format {requested!r}")
    why = unsupported_reason(model) if fast_decoder else "llm.fast_decoder is off"
    if why is not None:
        if requested not in ("auto", own):
            log.warning("llm.weights = %s needs voicepipe's decoder, which cannot run this model (%s); running its "
                        "own %s weights through transformers", requested, why, own)
        return WeightChoice(own, own_dtype, f"transformers' modules ({why})"), None
    candidates = auto_candidates(device)
    if requested != "auto":
        decoder, why = _decoder_or_reason(model, tokenizer, requested, pack)
        if decoder is not None:
            return WeightChoice(requested, activation_dtype(requested, device), "set by llm.weights"), decoder
        log.warning("llm.weights = %s is not available: %s; choosing as 'auto' does", requested, why)
    passed_over = []
    for i, fmt in enumerate(candidates):
        decoder, why = _decoder_or_reason(model, tokenizer, fmt, pack)
        if decoder is None:
            passed_over.append(f"{fmt}: {why}")
            continue
        if i == len(candidates) - 1:
            reason = "; ".join(passed_over) or "the only candidate"
            return WeightChoice(fmt, activation_dtype(fmt, device), f"auto on {device.type} ({reason})"), decoder
        report = check(model, tokenizer, decoder)
        if report.passed:
            passed_over.append(f"{fmt}: {report}")
            return WeightChoice(fmt, activation_dtype(fmt, device),
                                f"auto on {device.type}: " + "; ".join(passed_over)), decoder
        passed_over.append(f"{fmt} fails the quality check: {report}")
    raise AssertionError("the last auto candidate is always taken")  # pragma: no cover
