"""What is kept of a call and of each of its turns: text and numbers only, no audio, no KV.

The pipeline fills these records as a call goes on; the observers (store, metrics, recorder) read them. They live
here, not in the pipeline, so that both rooms can import them without importing each other.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

# A call's metadata key for its echo canceller's figures (`pipeline/call_echo.py`, `CallEcho.figures`), set when the
# call ends: "delay_ms" the estimated echo delay, "erle_db" the echo return loss enhancement, "erl_db" the echo
# return loss (each None: no echo found), "clock_skew_ppm" how much faster the caller's loudspeaker played than its
# microphone sampled (0 until the delay readings pin it; `echo/skew.py`), "gated_audio_s", "gated_segments",
# "gated_words" (what the echo gate took), "gated_speech" (each caller speech the text gate took words from: t, turn,
# text, kept).
ECHO_METADATA = "echo_canceller"


@dataclass
class TurnRecord:
    """One caller turn and the agent's answer, as the server saw them."""

    turn: int
    user_text: str = ""
    agent_text: str = ""  # everything generated
    heard_text: str | None = None  # set when the reply was interrupted: what the caller heard
    interrupted: bool = False
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0
    timings_ms: dict[str, float] = field(default_factory=dict)  # derived figures (observability/hooks.py)
    timeline: dict[str, float] = field(default_factory=dict)  # event -> seconds since the call started
    error: str | None = None
    # The end-of-turn decision (voicepipe/turns/policy.py): policy, action, reason, silence_ms (the caller's
    # silence when it was taken), wait_ms (the silence its evidence asked for), text_prob, acoustic_prob.
    decision: dict[str, Any] = field(default_factory=dict)
    # Earlier decisions that ended this turn before the caller went on speaking (each with "t", seconds since the
    # call started); the agent had sent no audio for them.
    reopened: list[dict[str, Any]] = field(default_factory=list)
    backchannels: list[str] = field(default_factory=list)  # what the caller said over this reply without stopping it
    dtmf: str | None = None  # a keypad turn: the keys of its entry (its user_text is "[keypad: 4 2 1 7]")
    # Each tool call of the reply: name, arguments (JSON text), t (seconds since the call started), latency_ms,
    # result_chars, error (None when it succeeded), in order.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CallRecord:
    """What is kept of a call once it has ended (text and numbers only; no audio, no KV)."""

    call_id: str
    transport: str
    started: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)  # the zero of every timeline
    ended: float | None = None
    end_reason: str | None = None
    outcome: str | None = None  # "completed", "dropped" (the client vanished), "idle_timeout", "error"
    # What the caller's start message carried, and at the end, under ECHO_METADATA, the echo canceller's figures
    metadata: dict[str, Any] = field(default_factory=dict)
    system_prompt: str = ""
    greeting: str | None = None
    greeting_heard: str | None = None
    turns: list[TurnRecord] = field(default_factory=list)
    history: list[dict[str, str]] = field(default_factory=list)
    barge_ins: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
