"""What the observability rooms see of a call.

A `CallSession` reports to `CallObserver`s (the call store, the Prometheus metrics, the recorder). The
session calls them on the event loop, so an observer must be quick: anything slow (disk, SQLite) goes to
its own thread. An observer that raises is logged and never breaks the call (`Observers` fans out).

Times in events and turn timelines are seconds since the call started (`CallRecord.started_mono`), from
`time.monotonic()`.

Turn timeline keys (`TurnRecord.timeline`), in the order they normally happen:
  speech_start, speech_end        the VAD's segment (first start and last end of the caller's turn)
  end_of_turn                     the end-of-turn decision
  first_partial, stt_requested, final_transcript    the STT (an early reply requests its transcript at the
                                  speech end, and its events up to the first audio may precede end_of_turn)
  llm_queued, prefill_start, first_token    the engine request
  first_clause                    the first text chunk handed to TTS
  first_audio_synth, first_audio_sent       the first agent sample synthesized, then handed to the transport
  playout_end | interrupted       the reply played to the end, or the caller barged in
A keypad turn (DTMF) has dtmf_start and dtmf_end (the entry's first key and its end, also its end_of_turn) instead
of the speech keys; a reply that calls a tool has tool_call (the model's call complete) and tool_result (the
first tool's result back) after first_token.
Derived figures (`TurnRecord.timings_ms`): voice_to_voice, response, stt_final, queue, ttft,
tts_first_audio, send_delay, dtmf_response (keypad turns), tool (the first tool call's latency).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from voicepipe.observability.records import CallRecord, TurnRecord

log = logging.getLogger(__name__)


class CallObserver(Protocol):
    def call_started(self, call: CallRecord) -> None:
        """The call's start message was accepted; `call.metadata` holds what the caller sent."""

    def event(self, call: CallRecord, event: dict[str, Any]) -> None:
        """One JSON-able call event: {"t": seconds since start, "type": ..., ...}."""

    def audio(self, call: CallRecord, channel: str, samples: np.ndarray, rate: int, t: float) -> None:
        """int16 mono audio: channel "caller" as it arrived, "agent" as it was sent (t: when, since start)."""

    def turn_finished(self, call: CallRecord, turn: TurnRecord) -> None:
        """A turn is complete: its reply played out, was interrupted, or failed."""

    def call_ended(self, call: CallRecord) -> None:
        """The call is over; `call.outcome` and `call.end_reason` are set."""


class Observers:
    """Fans each report out to every observer; one observer's failure is logged, never raised."""

    def __init__(self, observers: list[CallObserver] | None = None) -> None:
        self.observers = list(observers or [])

    def add(self, observer: CallObserver) -> None:
        self.observers.append(observer)

    def _each(self, method: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, method)(*args)
            except Exception:
                log.exception("observer %s.%s failed", type(observer).__name__, method)

    def call_started(self, call: CallRecord) -> None:
        self._each("call_started", call)

    def event(self, call: CallRecord, event: dict[str, Any]) -> None:
        self._each("event", call, event)

    def audio(self, call: CallRecord, channel: str, samples: np.ndarray, rate: int, t: float) -> None:
        self._each("audio", call, channel, samples, rate, t)

    def turn_finished(self, call: CallRecord, turn: TurnRecord) -> None:
        self._each("turn_finished", call, turn)

    def call_ended(self, call: CallRecord) -> None:
        self._each("call_ended", call)
