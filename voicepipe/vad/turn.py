"""What a turn detector asks its end-of-turn policy, and the fixed-silence policy it runs alone.

A call hands its detector the end-of-turn policy of voicepipe/turns/ (through voicepipe/pipeline/turn_taking.py);
`SilenceEndOfTurn` is the default for a detector on its own (the speech bench, the VAD tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TurnView:
    """What a policy may look at: the VAD state now."""

    speech_seen: bool  # the turn has had speech since it began
    in_speech: bool  # the VAD is inside a speech segment now
    silence_ms: float  # time since the last speech_end (0 while in speech)
    speech_ms: float = 0.0  # total speech in this turn


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
