"""One generation request as the scheduler and the engine see it, and its per-request stats."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from voicepipe.llm.errors import UnknownTierError
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.session import Session

TIERS = ("priority", "default", "flex")
TIER_RANK = {name: rank for rank, name in enumerate(TIERS)}

_seq = itertools.count()


def tier_rank(tier: str) -> int:
    try:
        return TIER_RANK[tier]
    except (KeyError, TypeError):
        raise UnknownTierError(f"unknown tier {tier!r}.", f"use one of {', '.join(TIERS)}.") from None


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestStats:
    """Per-request figures; times are ``time.monotonic()`` seconds."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    compacted: bool = False
    end_prob: float | None = None  # P(the user message ends here), when the request asked for it (end_probe)
    draft_tokens: int = 0  # speculative decoding: tokens proposed for this request, and how many were accepted
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled is None else self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    def as_dict(self) -> dict[str, Any]:
        return {"queue_time": self.queue_time, "ttft": self.ttft, "itls": self.itls,
                "prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
                "output_tokens": self.output_tokens, "preemptions": self.preemptions, "compacted": self.compacted,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens}


@dataclass(eq=False)
class Request:
    session: Session
    params: SamplingParams
    tier: str = "default"
    stop_ids: frozenset[int] = frozenset()
    id: int = field(default_factory=lambda: next(_seq))
    seq: int = field(default_factory=lambda: next(_seq))  # arrival order (ties broken by it)
    state: State = State.WAITING
    output_ids: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    enqueued_step: int = 0
    admitted: bool = False  # got its first prefill chunk at least once
    last_decode: int = 0  # the scheduler's decode count when it last decoded (decodes take turns by it)
    cancelled: bool = False
    paused_until: float = 0.0  # monotonic time: its decodes sit out the steps planned before it (Generation.pause)
    keep_output: int | None = None  # set by a stop string: keep this many output tokens
    finish_reason: str | None = None
    # The index in the session's ids whose next-token distribution gives ``stats.end_prob`` (None: not asked, or
    # already computed)
    probe_at: int | None = None
    end_prob_future: Any = None  # an asyncio future on the caller's loop, resolved with ``stats.end_prob``
    generator: Any = None
    speculate: bool = False  # its decodes may verify drafted tokens (greedy, unconstrained, speculation on)
    lookup: Any = None  # the prompt-lookup proposer's index of its sequence (speculative.py)
    sink: Any = None  # the engine's hand-off to the asyncio side

    @property
    def rank(self) -> int:
        return TIER_RANK[self.tier]
