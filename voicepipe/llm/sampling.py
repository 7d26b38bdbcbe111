"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, with a per-request seed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from voicepipe.llm.errors import InvalidSamplingError

MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How to pick each token. ``temperature == 0`` is greedy (the default)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)  # added to the model's own end-of-turn ids
    stop: list[str] = field(default_factory=list)  # stop strings (the reply ends with the first one)
    ignore_eos: bool = False  # for benchmarks: run to max_tokens
    constraint: Any = None  # e.g. a JsonConstraint: masks the logits, then is told the token picked
    # each token's log-probability and the `logprobs` most likely tokens' (None: none); at most MAX_LOGPROBS
    logprobs: int | None = None

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise InvalidSamplingError(f"max_tokens must be a non-negative integer, got {self.max_tokens!r}.",
                                       "pass max_tokens >= 0.")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise InvalidSamplingError(f"temperature must be >= 0, got {self.temperature!r}.",
                                       "pass 0 for greedy or a positive temperature.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidSamplingError(f"top_k must be >= 0, got {self.top_k!r}.", "pass 0 to turn top-k off.")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise InvalidSamplingError(f"top_p must be in (0, 1], got {self.top_p!r}.", "pass 1.0 to turn it off.")
        if self.logprobs is not None and not (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise InvalidSamplingError(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs!r}.",
                                       f"ask for at most {MAX_LOGPROBS} alternatives.")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidSamplingError("stop strings must be non-empty strings.", "remove the empty stop string.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(params: SamplingParams, device: str | torch.device) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed if params.seed is not None else torch.seed())
    return gen


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of ``logits`` ([n, vocab]); rows with greedy params take the argmax."""
    constrained = [row for row, p in enumerate(params) if p.constraint is not None]
    if constrained:
        logits = logits.clone()  # the model's output is an inference tensor; mask a copy
    for row in constrained:
        allowed = params[row].constraint.allowed(logits.shape[-1]).to(logits.device)
        logits[row].masked_fill_(~allowed, float("-inf"))
    out = logits.argmax(dim=-1).tolist()
    for row, p in enumerate(params):
        if p.greedy:
            continue
        out[row] = _sample_row(logits[row].float(), p, generators[row])
    for row in constrained:
        params[row].constraint.accept(out[row])
    return out


def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.numel():
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) > p.top_p  # keep the smallest set reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())


def token_logprobs(logits: torch.Tensor, tokens: list[int], params: list[SamplingParams]) -> list[Any]:
    """For each row whose params ask for logprobs: ``(log P(its token), [(id, log P) of the most likely
    params.logprobs tokens])`` from the model's distribution (before any constraint or temperature); None for the
    other rows."""
    out: list[Any] = [None] * len(params)
    for row, p in enumerate(params):
        if p.logprobs is None:
            continue
        logp = torch.log_softmax(logits[row].float(), dim=-1)
        top = torch.topk(logp, p.logprobs) if p.logprobs else None
        alternatives = list(zip(top.indices.tolist(), top.values.tolist(), strict=True)) if top is not None else []
        out[row] = (float(logp[tokens[row]]), alternatives)
    return out
