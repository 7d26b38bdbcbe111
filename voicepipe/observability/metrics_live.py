"""The metric families read at scrape time: active calls, errors by kind, the LLM engine's state and counters, what
the echo gate took out (the live calls' share too), and the calls the call store closed as lost.

Reading them when Prometheus scrapes (rather than updating gauges as things change) means they are never stale and
cost nothing between scrapes. Every family is yielded on every scrape, without samples while the engine is not
loaded, so the set of exported names does not depend on the app's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# engine.stats() key -> (family, help); gauges, then counters
ENGINE_GAUGES = {
    "blocks_used": ("voicepipe_kv_blocks_used", "KV cache blocks in use (held by a session or request)."),
    "blocks_free": ("voicepipe_kv_blocks_free", "KV cache blocks free (a free block may still serve a prefix hit)."),
    "blocks_total": ("voicepipe_kv_blocks_total", "KV cache blocks in the pool."),
    "sessions_pinned": ("voicepipe_sessions_pinned", "Open sessions holding KV blocks (pinned between turns)."),
    "sessions": ("voicepipe_sessions_open", "Open LLM sessions (one per call)."),
    "waiting": ("voicepipe_llm_requests_waiting", "LLM requests waiting for admission."),
    "running": ("voicepipe_llm_requests_running", "LLM requests admitted and running."),
}
ENGINE_COUNTERS = {
    "prompt_tokens": ("voicepipe_prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache."),
    "cached_prompt_tokens": ("voicepipe_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache."),
    "compactions": ("voicepipe_llm_compactions", "Sessions compacted to fit the context budget."),
    "unpinned_sessions": ("voicepipe_llm_sessions_unpinned", "Idle sessions unpinned under memory pressure."),
    "output_tokens": ("voicepipe_llm_output_tokens", "Tokens generated."),
    "draft_tokens": ("voicepipe_llm_spec_draft_tokens", "Speculative decoding: drafted tokens verified."),
    "accepted_tokens": ("voicepipe_llm_spec_accepted_tokens", "Speculative decoding: drafted tokens accepted."),
}
# a call's echo figure (`CallEcho.figures`) -> its counter family, by transport: the ended calls' and the live ones'
ECHO_GATED = {
    "gated_audio_s": ("voicepipe_echo_gated_audio_seconds", "Caller audio the echo gate silenced as echo (its level "
                      "gate), in calls that cancel echo; live calls count as of their last turn."),
    "gated_segments": ("voicepipe_echo_gated_segments", "Caller speech whose words the echo gate took for the "
                       "agent's own alone (its text gate); live calls count as of their last turn."),
    "gated_words": ("voicepipe_echo_gated_words", "The agent's own words the echo gate took out of the caller's "
                    "(its text gate); live calls count as of their last turn."),
    "gate_openings": ("voicepipe_echo_gate_openings", "Times the echo level gate opened for the caller's audio "
                      "over the agent's: a caller talking over it, or residual echo let through whole; live calls "
                      "count as of their last turn."),
}
ERROR_KINDS = {  # kind -> where it comes from
    "engine": "an LLM request failed in the engine (a failed model step, the engine stopped)",
    "overloaded": "an LLM request was not admitted in time (llm.admission_timeout_s)",
    "turn": "a call's turn failed",
    "call": "a call ended with an error",
    "store": "a call store write or commit failed (disk full, read-only): those records are lost",
}


class LiveCollector(Collector):
    """`snapshot()` gives the live calls by transport and the error counts by kind (`Metrics.snapshot`); `engine()`
    the LLM engine, or None while it is not loaded."""

    def __init__(self, snapshot: Callable[[], tuple[Any, Any]], engine: Callable[[], Any]) -> None:
        self._snapshot = snapshot
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        stats = engine.stats() if engine is not None else None
        transports, errors = self._snapshot()
        yield _active_calls(transports)
        yield _errors(errors, stats)
        ready = GaugeMetricFamily("voicepipe_llm_engine_ready", "1 once the LLM engine is loaded and running.")
        ready.add_metric([], 1.0 if stats is not None else 0.0)
        yield ready
        for key, (name, doc) in ENGINE_GAUGES.items():
            family = GaugeMetricFamily(name, doc)
            if stats is not None and key in stats:  # a remote engine (llm.backend) has no KV pool here
                family.add_metric([], stats[key])
            yield family
        for key, (name, doc) in ENGINE_COUNTERS.items():
            family = CounterMetricFamily(name, doc)
            if stats is not None and key in stats:
                family.add_metric([], stats[key])
            yield family
        preemptions = CounterMetricFamily("voicepipe_llm_preemptions", "Running LLM requests preempted (their KV "
                                          "recomputed later) under memory pressure, by tier.", labels=["tier"])
        for tier, count in sorted((stats or {}).get("preemptions_by_tier", {}).items()):
            preemptions.add_metric([tier], count)
        yield preemptions


def _active_calls(transports: list[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("voicepipe_active_calls", "Calls in progress, by transport.", labels=["transport"])
    for transport in sorted(set(transports)):
        family.add_metric([transport], transports.count(transport))
    return family


def _errors(counts: dict[str, int], stats: dict[str, Any] | None) -> CounterMetricFamily:
    family = CounterMetricFamily("voicepipe_errors", "Errors by kind: " + "; ".join(
        f"{kind}: {what}" for kind, what in ERROR_KINDS.items()) + ".", labels=["kind"])
    if stats is not None:  # the engine counts every failed request as an error, the overloaded ones included
        counts = {**counts, "engine": stats["errors"] - stats["overloaded"], "overloaded": stats["overloaded"]}
    for kind in ERROR_KINDS:
        family.add_metric([kind], counts.get(kind, 0))
    return family


class EchoGatedCollector(Collector):
    """What the echo gate took out, by transport (`ECHO_GATED`), read from ``totals()``: {(figure, transport): sum}."""

    def __init__(self, totals: Callable[[], dict[tuple[str, str], float]]) -> None:
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        totals = self._totals()
        for figure, (name, doc) in ECHO_GATED.items():
            family = CounterMetricFamily(name, doc, labels=["transport"])
            for (key, transport), value in sorted(totals.items()):
                if key == figure:
                    family.add_metric([transport], value)
            yield family


class AdmissionCollector(Collector):
    """Admission control (`pipeline/admission.py`), read at scrape time from ``snapshot()``: the calls refused by
    transport and reason, the limit, and whether the process is draining."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        state = self._snapshot()
        refused = CounterMetricFamily("voicepipe_calls_refused", "Calls refused at admission, by transport and "
                                      "reason (saturated: at calls.max_concurrent; draining: shutting down).",
                                      labels=["transport", "reason"])
        for (transport, reason), count in sorted(state["refused"].items()):
            refused.add_metric([transport, reason], count)
        yield refused
        limit = GaugeMetricFamily("voicepipe_calls_max_concurrent", "calls.max_concurrent (absent: no limit).")
        if state["max_concurrent"] is not None:
            limit.add_metric([], state["max_concurrent"])
        yield limit
        draining = GaugeMetricFamily("voicepipe_draining", "1 once SIGTERM started the drain: no new calls.")
        draining.add_metric([], 1.0 if state["draining"] else 0.0)
        yield draining


class LostCallsCollector(Collector):
    """The calls this process closed as lost (`CallStore.lost_calls`, read from ``counts()``)."""

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("voicepipe_calls_lost", "Calls this process closed as lost in the call store "
                                     "(the process serving them died), by transport and how it found them (at_start: "
                                     "its own, left live by its previous run; stale_heartbeat: another replica's, "
                                     "whose heartbeat stopped).", labels=["transport", "found"])
        for (transport, found), count in sorted(self._counts().items()):
            family.add_metric([transport, found], count)
        yield family
