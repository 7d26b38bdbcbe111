"""The end-of-turn decision, kept in one small policy object so a semantic turn model can replace it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TurnView:
    """What a policy may look at: the VAD state now, and the transcript so far when the caller has one."""

    speech_seen: bool  # the turn has had speech since it began
    in_speech: bool  # the VAD is inside a speech segment now
    silence_ms: float  # time since the last speech_end (0 while in speech)
    speech_ms: float = 0.0  # total speech in this turn
    transcript: str | None = None  # the latest partial transcript, for semantic policies


class EndOfTurnPolicy(Protocol):
    def decide(self, view: TurnView) -> bool:
        """True when the caller's turn is over and the agent may answer."""
        ...


@dataclass(frozen=True)
class SilenceEndOfTurn:
    """The turn ends after `silence_ms` of silence following speech (and at least `min_speech_ms` of speech)."""

    silence_ms: float = 600.0
    min_speech_ms: float = 0.0

    def decide(self, view: TurnView) -> bool:
        return (view.speech_seen and not view.in_speech and view.silence_ms >= self.silence_ms
                and view.speech_ms >= self.min_speech_ms)
