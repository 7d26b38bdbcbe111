"""Prometheus metrics of one app: latency histograms, call and error counters, and the engine's live state.

Every app owns its `Metrics` with its own `CollectorRegistry` (never the global one), so several apps in one
process do not collide. Four sources feed it:

- the calls, as a `CallObserver` (`turn_finished`: voice-to-voice, response, STT final, TTS first audio, send
  delay, DTMF response, the end-of-turn wait, reopened turns, tool call latency, turn errors; `event` "barge_in"
  (the greeting's too);
  `call_started`/`call_ended`: active calls, calls by outcome, call errors, and from the call's echo figures the
  echo delay, ERLE and ERL; what the echo gate gated counts the live calls too, as of their last turn);
- the LLM engine, as a request listener (`request_finished`: TTFT, ITL and queue time of every request, calls'
  and API requests' alike, so each request is counted once);
- the app's event loop, through `loop_lag.watch_loop_lag` (`loop_lag`: how late the loop runs, no labels);
- the call store, read at scrape time (its failed writes; the calls it closed as lost, by transport and ``found``).

Labels: ``tier`` and ``transport`` (a call's turns: tier "priority" and the call's transport; a sessionless
request, i.e. the OpenAI API: its tier and "http"). TTFT also has ``turn``, the request's turn-number bucket
(`turn_bucket`), so a TTFT that stays flat over a long call shows on a graph; the end-of-turn wait has ``policy``
and ``transport``; tool calls have ``tool`` (the tool's name: only tools the settings declare) and ``outcome`` (ok,
error). Gauges and engine counters (`metrics_live.LiveCollector`) are read at scrape time, so they are
never stale.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter as Tally
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder

from voicepipe.observability.loop_lag import INTERVAL_S
from voicepipe.observability.metrics_live import ECHO_GATED, EchoGatedCollector, LiveCollector, LostCallsCollector
from voicepipe.observability.records import ECHO_METADATA

if TYPE_CHECKING:
    from voicepipe.llm.request import Request
    from voicepipe.llm.session import Session
    from voicepipe.observability.records import CallRecord, TurnRecord

CALL_TIER = "priority"  # the tier every call's LLM requests use
API_TRANSPORT = "http"  # the transport label of sessionless requests (the OpenAI API)
UNKNOWN_CALL_TRANSPORT = "call"  # a request on a session no call was seen to start with

# Seconds. Voice-to-voice and response latency live around 0.3-3 s; the engine's figures are finer.
SPEECH_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0,
                  7.5, 10.0, 15.0, 30.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
               2.0)
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The caller's silence when the end-of-turn decision ends a turn: turn.*_wait_ms puts it at 0.2 s (complete),
# 0.7 s (unsure) and 2.5 s (mid-thought) by default, a little more as the decision waits for its evidence.
END_OF_TURN_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0,
                       4.0, 6.0, 10.0)

# A tool call: a built-in takes microseconds, a webhook tens of ms to its timeout (calls.webhook_tools[].timeout_s).
TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)

# A healthy loop wakes a timer well under a millisecond late; a loop held by a blocking call, tens of ms to seconds.
LOOP_LAG = "voicepipe_event_loop_lag_seconds"
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# A call's echo canceller (docs/echo.md): the echo path's delay (0-500 ms searched), the echo it took out (ERLE)
# and how much quieter the echo came back (ERL: 8-38 dB on the simulated echo at -6 to -40 dB, echo/level_gate.py).
ECHO_DELAY_BUCKETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
ECHO_DB_BUCKETS = (0.0, 3.0, 6.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0)

ACCEPTANCE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

TURN_BUCKETS = ((1, "1"), (5, "2-5"), (15, "6-15"), (30, "16-30"))
LAST_TURN_BUCKET = "31+"

# TurnRecord.timings_ms key -> (metric name, help)
TURN_HISTOGRAMS = {
    "voice_to_voice": ("voicepipe_voice_to_voice_seconds", "Caller stops speaking to the first agent audio sent."),
    "response": ("voicepipe_response_seconds", "End-of-turn decision to the first agent audio sent."),
    "stt_final": ("voicepipe_stt_final_seconds", "End-of-turn decision to the final transcript."),
    "tts_first_audio": ("voicepipe_tts_first_audio_seconds", "First clause to TTS to its first audio sample."),
    "send_delay": ("voicepipe_send_delay_seconds", "First agent audio synthesized to handed to the transport."),
    "dtmf_response": ("voicepipe_dtmf_response_seconds", "A keypad entry's end to the first agent audio sent."),
}


def turn_bucket(turn: int) -> str:
    """The TTFT ``turn`` label: "1", "2-5", "6-15", "16-30" or "31+" (anything below 1 counts as turn 1)."""
    for upper, label in TURN_BUCKETS:
        if turn <= upper:
            return label
    return LAST_TURN_BUCKET


class Metrics:
    """The metrics of one app. Register it as a call observer and as the engine's request listener; serve
    `render()` at /metrics. ``engine`` returns the LLM engine or None (not loaded yet); ``call_session`` returns the
    LLM session of a live call by its id (None if unknown), so the call's requests get its transport; ``call_store``
    the call store or None (its failed writes are the `store` errors; the calls it closed as lost,
    `voicepipe_calls_lost_total`)."""

    def __init__(self, engine: Callable[[], Any] = lambda: None,
                 call_session: Callable[[str], Session | None] = lambda call_id: None,
                 call_store: Callable[[], Any] = lambda: None) -> None:
        self.registry = CollectorRegistry()
        self._call_session = call_session
        self._call_store = call_store
        # LLM session -> its call's transport, noted as the call starts: a request still ending after its call did
        # (cancelled by the hang-up) keeps the label. Entries go with the sessions.
        self._session_transports: weakref.WeakKeyDictionary[Session, str] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.active_calls: dict[str, CallRecord] = {}  # call id -> its record, as the session keeps it
        self._echo_gated_ended: Tally[tuple[str, str]] = Tally()  # (figure, transport) -> the ended calls' sum
        self.errors: Tally[str] = Tally()  # kind -> count, for the kinds the calls report (the engine's: live)
        labels = ["tier", "transport"]
        self.turn_latency = {key: Histogram(name, doc, labels, buckets=SPEECH_BUCKETS, registry=self.registry)
                             for key, (name, doc) in TURN_HISTOGRAMS.items()}
        self.ttft = Histogram("voicepipe_llm_ttft_seconds", "LLM time to first token: arrival in the engine to the "
                              "first token.", [*labels, "turn"], buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("voicepipe_llm_itl_seconds", "LLM inter-token latency, one sample per token after the "
                             "first.", labels, buckets=ITL_BUCKETS, registry=self.registry)
        self.queue = Histogram("voicepipe_llm_queue_seconds", "LLM queue time: arrival in the engine to the first "
                               "scheduled step.", labels, buckets=QUEUE_BUCKETS, registry=self.registry)
        self.acceptance = Histogram("voicepipe_llm_spec_acceptance_ratio", "Speculative decoding: the share of a "
                                    "request's drafted tokens the model accepted, one sample per request that drafted.",
                                    labels, buckets=ACCEPTANCE_BUCKETS, registry=self.registry)
        self.requests = Counter("voicepipe_llm_requests", "LLM requests ended, by finish reason (stop, length, "
                                "cancelled, error).", [*labels, "reason"], registry=self.registry)
        self.end_of_turn_wait = Histogram("voicepipe_end_of_turn_wait_seconds", "The caller's silence when the "
                                          "end-of-turn decision ended the turn, by policy.", ["policy", "transport"],
                                          buckets=END_OF_TURN_BUCKETS, registry=self.registry)
        self.reopens = Counter("voicepipe_turns_reopened", "End-of-turn decisions the caller's speech reopened "
                               "(the turn went on).", ["transport"], registry=self.registry)
        self.barge_ins = Counter("voicepipe_barge_ins", "Agent replies (the greeting too) the caller interrupted.",
                                 ["transport"], registry=self.registry)
        self.calls = Counter("voicepipe_calls", "Calls ended, by outcome.", ["transport", "outcome"],
                             registry=self.registry)
        self.tool_calls = Histogram("voicepipe_tool_call_seconds", "A call's tool calls: the model's call to its "
                                    "result (a webhook's answer, an error or a timeout).", ["tool", "outcome"],
                                    buckets=TOOL_BUCKETS, registry=self.registry)
        self.echo_delay = Histogram("voicepipe_echo_delay_seconds", "The echo path's delay a call's echo canceller "
                                    "estimated (calls that found an echo).", ["transport"],
                                    buckets=ECHO_DELAY_BUCKETS, registry=self.registry)
        self.echo_erle = Histogram("voicepipe_echo_erle_db", "The echo a call's echo canceller took out (echo return "
                                   "loss enhancement, dB; calls that found an echo).", ["transport"],
                                   buckets=ECHO_DB_BUCKETS, registry=self.registry)
        self.echo_erl = Histogram("voicepipe_echo_erl_db", "How much quieter a call's echo came back than the agent's "
                                  "audio, before the canceller (echo return loss, dB; calls that found an echo).",
                                  ["transport"], buckets=ECHO_DB_BUCKETS, registry=self.registry)
        self.loop_lag = Histogram(LOOP_LAG, f"How late the event loop woke a {INTERVAL_S * 1000:.0f} ms timer: "
                                  "every call's audio and turn-taking waited as long.",
                                  buckets=LOOP_LAG_BUCKETS, registry=self.registry)
        self.registry.register(LiveCollector(self.snapshot, engine))
        self.registry.register(EchoGatedCollector(self.echo_gated))
        self.registry.register(LostCallsCollector(self._lost_calls))

    # -- serving --------------------------------------------------------------------------------------------------
    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """Everything above in the exposition format the scraper's Accept header asks for (Prometheus text
        0.0.4 unless it asks for OpenMetrics), and its content type."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def snapshot(self) -> tuple[list[str], dict[str, int]]:
        """The transports of the calls in progress, and the errors the calls reported (for `LiveCollector`)."""
        store = self._call_store()
        with self._lock:
            errors = {**self.errors, "store": store.write_failures} if store is not None else dict(self.errors)
            return [call.transport for call in self.active_calls.values()], errors

    def echo_gated(self) -> dict[tuple[str, str], float]:
        """What the echo gate took out (`ECHO_GATED`'s figures) by transport: the ended calls', and the live calls'
        so far, as their records hold it (the session refreshes their echo figures at each turn)."""
        with self._lock:
            totals = Tally(self._echo_gated_ended)
            for call in self.active_calls.values():
                _add_echo_gated(totals, call)
        return dict(totals)

    def _lost_calls(self) -> dict[tuple[str, str], int]:
        store = self._call_store()
        return store.lost_calls if store is not None else {}

    def count_error(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1

    # -- the engine (its thread, under its lock: be quick) ---------------------------------------------------------
    def request_finished(self, request: Request) -> None:
        session = request.session
        if session.ephemeral:
            transport = API_TRANSPORT
        else:
            transport = self._session_transports.get(session, UNKNOWN_CALL_TRANSPORT)
        tier = request.tier
        stats = request.stats
        self.requests.labels(tier, transport, request.finish_reason or "unknown").inc()
        if stats.queue_time is not None:
            self.queue.labels(tier, transport).observe(stats.queue_time)
        if stats.ttft is not None:
            self.ttft.labels(tier, transport, turn_bucket(session.requests)).observe(stats.ttft)
        itl = self.itl.labels(tier, transport)
        for gap in stats.itls:
            itl.observe(gap)
        if stats.acceptance_rate is not None:
            self.acceptance.labels(tier, transport).observe(stats.acceptance_rate)

    # -- CallObserver (the event loop: be quick) -------------------------------------------------------------------
    def call_started(self, call: CallRecord) -> None:
        with self._lock:
            self.active_calls[call.call_id] = call
        session = self._call_session(call.call_id)
        if session is not None:
            self._session_transports[session] = call.transport

    def event(self, call: CallRecord, event: dict[str, Any]) -> None:
        if event.get("type") == "barge_in":
            self.barge_ins.labels(call.transport).inc()

    def audio(self, call: CallRecord, channel: str, samples: np.ndarray, rate: int, t: float) -> None:
        pass

    def turn_finished(self, call: CallRecord, turn: TurnRecord) -> None:
        for key, histogram in self.turn_latency.items():
            ms = turn.timings_ms.get(key)
            if ms is not None:
                histogram.labels(CALL_TIER, call.transport).observe(ms / 1000.0)
        silence_ms = turn.decision.get("silence_ms")
        if silence_ms is not None:
            policy = turn.decision.get("policy") or "unknown"
            self.end_of_turn_wait.labels(policy, call.transport).observe(silence_ms / 1000.0)
        self.reopens.labels(call.transport).inc(len(turn.reopened))
        for tool in turn.tool_calls:
            if tool.get("latency_ms") is not None:
                outcome = "error" if tool.get("error") else "ok"
                self.tool_calls.labels(tool["name"], outcome).observe(tool["latency_ms"] / 1000.0)
        if turn.error:
            self.count_error("turn")

    def call_ended(self, call: CallRecord) -> None:
        with self._lock:  # one step: a scrape between the two would see the gated counters fall
            self.active_calls.pop(call.call_id, None)
            _add_echo_gated(self._echo_gated_ended, call)
        self.calls.labels(call.transport, call.outcome or "unknown").inc()
        if call.outcome == "error":
            self.count_error("call")
        echo = call.metadata.get(ECHO_METADATA)
        if isinstance(echo, dict):
            self._echo_ended(call.transport, echo)

    def _echo_ended(self, transport: str, echo: dict[str, Any]) -> None:
        """A call that cancelled echo ended with these figures (`CallEcho.figures`)."""
        if echo.get("delay_ms") is not None and echo.get("erle_db") is not None:
            self.echo_delay.labels(transport).observe(echo["delay_ms"] / 1000.0)
            self.echo_erle.labels(transport).observe(echo["erle_db"])
        if echo.get("erl_db") is not None:
            self.echo_erl.labels(transport).observe(echo["erl_db"])


def _add_echo_gated(totals: Tally[tuple[str, str]], call: CallRecord) -> None:
    """`call`'s echo gate figures (`ECHO_GATED`) into `totals`, where the call cancels echo."""
    echo = call.metadata.get(ECHO_METADATA)
    if isinstance(echo, dict):
        for figure in ECHO_GATED:
            totals[figure, call.transport] += echo.get(figure, 0)
