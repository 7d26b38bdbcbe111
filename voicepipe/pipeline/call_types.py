"""What a call is made of besides CallSession itself: its states (`CallState`), what a transport offers it
(`AgentOutput`), and one agent utterance in flight (`_Reply`)."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from voicepipe.observability.records import TurnRecord


class CallState(enum.Enum):
    LISTENING = "listening"
    THINKING = "thinking"
    SPEAKING = "speaking"
    ENDED = "ended"


class AgentOutput(Protocol):
    """What a transport offers a call: paced playout of agent audio, a clear, and a playout cursor."""

    sample_rate: int  # the rate agent audio is handed over at (the wire's send rate)

    def play(self, audio: np.ndarray, origin: object) -> None:
        """Queue int16 agent audio; `origin` comes back from `heard()` / `clear()`."""

    def end_of_reply(self) -> None:
        """The reply's audio is complete (flush any held tail)."""

    def is_playing(self) -> bool:
        """Agent audio is queued or not yet (confirmed) played."""

    def heard(self) -> list[Any]:
        """`Heard(origin, heard, total)` for each queued piece of the current generation."""

    def clear(self) -> list[Any]:
        """Drop all unplayed agent audio (and tell the provider); returns `heard()` as it was."""

    def hold(self, on: bool) -> None:
        """Stop sending agent audio (True) or go on where it stopped (False); the playout cursor stays right. A
        transport that plays out locally (WebRTC) stops its queued audio too, after anything sent before."""

    def event(self, kind: str, **data: Any) -> None:
        """A call event for clients that show them (native protocol): transcript, agent_text, turn, transfer."""

    # A transport that can send keys on the line also has `can_send_dtmf = True` and `send_dtmf(digits)`.
    # A transport that keeps what it played for the echo canceller also has `far_end_reference(rate)`: from then on
    # it keeps its played audio at `rate` in an `echo.reference.FarEndReference` on the call's input timeline (the
    # call advances its `received` as it takes the caller's audio), and returns it.

    # A transport also reports back to the call: `CallSession.agent_audio_sent(turn, samples, rate)` as it sends
    # agent audio, and `CallSession.note(event_type, **data)` for its own events (marks, clears).


@dataclass
class _Reply:
    """One agent utterance in flight (a reply, or the greeting)."""

    turn: int
    stream: Any  # tts SpeechStream
    greeting: bool = False
    task: asyncio.Task | None = None
    generation: Any = None  # llm Generation (None for the greeting / before the LLM starts)
    llm_started: bool = False
    text: str = ""
    pieces: list[tuple[int, int]] = field(default_factory=list)  # (text end, tokens so far) per piece
    tokens: int = 0
    first_audio: float | None = None
    record: TurnRecord | None = None
    finished: bool = False  # turn_finished was reported
    transcript: Any = None  # the STT's final for this turn (a concurrent Future)
    release: asyncio.Event | None = None  # an early reply: its audio and client events wait for this
    held_events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    turns_before: int = 0  # LLM session turns before this reply's (what dropping an early reply goes back to)
    segment: int = 0  # an early reply: the caller's speech segment it answers (TurnTaking.segment)
    consumed: tuple[str | None, str | None] = (None, None)  # the greeting / unanswered words its prompt took
    after: tuple[str, str | None] | None = None  # once played, a tool's action: (end_call | transfer_call, target)
    sent_samples: int = 0  # its audio the transport has sent
    words_sent: int = 0  # its words whose audio has begun to go out (the echo gate's record of what it said)
    wordless: bool = False  # it had no caller words to answer (none heard, or all the agent's own): no turn

    @property
    def held(self) -> bool:
        return self.release is not None and not self.release.is_set()
