"""Measurement: what the caller saw of each turn (client clock), the call's result, and its report.

The client clock is `time.monotonic()` on the caller's machine. Voice-to-voice is the caller's last voiced
sample sent -> the first agent audio received after it. The server's transcripts and timings come from its
call record (`GET /calls/{id}`) or, over the native protocol, from its events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class ClientTurn:
    index: int
    audio_start: float | None = None  # client clock: the utterance's first sample sent
    speech_start: float | None = None  # client clock: first voiced sample sent
    speech_end: float | None = None  # last voiced sample sent
    first_audio: float | None = None  # first agent audio received after speech_end
    last_audio: float | None = None
    audio_s: float = 0.0  # agent audio received for this turn
    clear_at: float | None = None  # a clear received while this utterance was being spoken
    user_text: str | None = None  # what the server heard (from the call record or native events)
    agent_text: str | None = None
    server_timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def voice_to_voice_ms(self) -> float | None:
        if self.first_audio is None or self.speech_end is None:
            return None
        return (self.first_audio - self.speech_end) * 1000


@dataclass
class CallResult:
    transport: str
    call_id: str
    turns: list[ClientTurn] = field(default_factory=list)
    greeting_audio_s: float = 0.0
    agent_audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))  # 16 kHz, as played
    audio_chunks: list[tuple[float, float]] = field(default_factory=list)  # (client time received, seconds)
    clears: list[float] = field(default_factory=list)
    marks_acked: int = 0
    events: list[dict] = field(default_factory=list)  # native protocol events
    close_code: int | None = None
    close_reason: str | None = None
    record: dict | None = None  # the server's call record (GET /calls/{id})
    started: float = 0.0
    setup_ms: float | None = None  # WebRTC and SIP: the offer sent to the answer back (SIP: INVITE to 200 OK)
    send_lag_ms: list[float] = field(default_factory=list)  # per 20 ms frame: actual send time - real-time schedule
    server_hangup: float | None = None  # client clock: the server's in-band hang-up (AudioSocket), if it sent one

    def note_audio(self, now: float, seconds: float, turn: ClientTurn | None) -> None:
        """Agent audio received at `now`, for `turn` (None: the greeting)."""
        self.audio_chunks.append((now, seconds))
        if turn is None:
            self.greeting_audio_s += seconds
            return
        if turn.first_audio is None:
            turn.first_audio = now
        turn.last_audio = now
        turn.audio_s += seconds

    def note_clear(self, now: float, speaking: ClientTurn | None) -> None:
        """A clear received at `now`, while `speaking`'s utterance went out (None: between utterances)."""
        self.clears.append(now)
        if speaking is not None and speaking.clear_at is None:
            speaking.clear_at = now


def merge_record(result: CallResult) -> None:
    """Each turn's transcripts and server timings from the server's call record."""
    if not result.record:
        return
    by_turn = {t["turn"]: t for t in result.record.get("turns", [])}
    for turn in result.turns:
        server = by_turn.get(turn.index)
        if server is not None:
            turn.user_text = server.get("user_text")
            turn.agent_text = server.get("heard_text") if server.get("interrupted") else server.get("agent_text")
            turn.server_timings_ms = server.get("timings_ms", {})


def merge_events(result: CallResult) -> None:
    """What the record did not give, from the native protocol's events."""
    for ev in result.events:
        index = ev.get("turn")
        if not isinstance(index, int) or not 1 <= index <= len(result.turns):
            continue
        turn = result.turns[index - 1]
        if ev.get("type") == "transcript" and ev.get("final") and turn.user_text is None:
            turn.user_text = ev.get("text")
        elif ev.get("type") == "agent_text" and ev.get("final") and turn.agent_text is None:
            turn.agent_text = ev.get("text")
        elif ev.get("type") == "turn" and not turn.server_timings_ms:
            turn.server_timings_ms = ev.get("timings_ms", {})


def format_report(result: CallResult) -> str:
    lines = [f"call {result.call_id} over {result.transport}: {len(result.turns)} turns, "
             f"greeting {result.greeting_audio_s:.1f} s of audio, {len(result.clears)} clears, "
             f"{result.marks_acked} marks acknowledged, closed with {result.close_code}"]
    for t in result.turns:
        v2v = f"{t.voice_to_voice_ms:.0f} ms" if t.voice_to_voice_ms is not None else "-"
        lines.append(f"turn {t.index}: caller (as heard by the server): {t.user_text!r}")
        lines.append(f"        agent: {t.agent_text!r}")
        lines.append(f"        voice-to-voice at the client {v2v}, agent audio {t.audio_s:.1f} s"
                     + (f", clear {1000 * (t.clear_at - t.speech_start):.0f} ms after speech start"
                        if t.clear_at and t.speech_start else "")
                     + (f", server {t.server_timings_ms}" if t.server_timings_ms else ""))
    return "\n".join(lines)


def result_summary(result: CallResult) -> dict[str, Any]:
    """The call as plain data (for --json)."""
    return {
        "call_id": result.call_id, "transport": result.transport, "close_code": result.close_code,
        "greeting_audio_s": round(result.greeting_audio_s, 3), "clears": len(result.clears),
        "marks_acked": result.marks_acked,
        "turns": [{"turn": t.index, "user_text": t.user_text, "agent_text": t.agent_text,
                   "voice_to_voice_ms": None if t.voice_to_voice_ms is None else round(t.voice_to_voice_ms, 1),
                   "agent_audio_s": round(t.audio_s, 3), "server_timings_ms": t.server_timings_ms,
                   "clear_after_speech_start_ms": None if not (t.clear_at and t.speech_start)
                   else round((t.clear_at - t.speech_start) * 1000, 1)} for t in result.turns],
    }
