"""The Prometheus metrics (no models): the call observer, the engine's request listener and the live families,
read back through the text exposition exactly as Prometheus would see it."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from tests.metrics_helpers import Scrape, StatsOnly
from tests.observability_helpers import decide, decision
from voicepipe.llm.request import Request, RequestStats
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.session import Session
from voicepipe.observability.hooks import Observers
from voicepipe.observability.metrics import Metrics, turn_bucket
from voicepipe.observability.records import ECHO_METADATA, CallRecord, TurnRecord

V2V = "voicepipe_voice_to_voice_seconds"
TTFT = "voicepipe_llm_ttft_seconds"


def scrape(metrics: Metrics) -> Scrape:
    body, _ = metrics.render()
    return Scrape(body.decode())


def finished_request(session: Session, tier: str = "priority", token_times: tuple[float, ...] = (10.3, 10.35, 10.45),
                     reason: str = "stop") -> Request:
    """A request as the engine leaves it: it arrived at t=10 s, was scheduled at 10.1 s, tokens at token_times."""
    stats = RequestStats(arrival=10.0, first_scheduled=10.1 if token_times else None,
                         first_token=token_times[0] if token_times else None, token_times=list(token_times),
                         output_tokens=len(token_times))
    return Request(session=session, params=SamplingParams(), tier=tier, stats=stats, finish_reason=reason)


@pytest.mark.parametrize(("turn", "label"), [(0, "1"), (1, "1"), (2, "2-5"), (5, "2-5"), (6, "6-15"), (15, "6-15"),
                                             (16, "16-30"), (30, "16-30"), (31, "31+"), (500, "31+")])
def test_turn_buckets(turn, label):
    assert turn_bucket(turn) == label


def test_turn_latencies_in_seconds_labelled_with_the_calls_tier_and_transport():
    metrics = Metrics()
    call = CallRecord("c-1", "twilio")
    metrics.turn_finished(call, TurnRecord(1, timings_ms={"voice_to_voice": 450.0, "response": 300.0,
                                                          "stt_final": 120.0, "tts_first_audio": 80.0,
                                                          "send_delay": 3.0, "ttft": 90.0, "queue": 1.0}))
    metrics.turn_finished(call, TurnRecord(2, timings_ms={"voice_to_voice": 1200.0}))  # the others not measured
    s = scrape(metrics)
    labels = {"tier": "priority", "transport": "twilio"}
    assert s.value(V2V + "_count", **labels) == 2
    assert s.value(V2V + "_sum", **labels) == pytest.approx(1.65)
    assert s.bucket(V2V, 0.4, **labels) == 0
    assert s.bucket(V2V, 0.5, **labels) == 1
    assert s.bucket(V2V, 1.25, **labels) == 2
    assert s.value("voicepipe_response_seconds_count", **labels) == 1
    assert s.bucket("voicepipe_stt_final_seconds", 0.15, **labels) == 1
    assert s.bucket("voicepipe_tts_first_audio_seconds", 0.05, **labels) == 0
    assert s.value("voicepipe_tts_first_audio_seconds_count", **labels) == 1
    assert s.bucket("voicepipe_send_delay_seconds", 0.05, **labels) == 1
    assert s.value(TTFT + "_count") == 0  # the engine reports each request's TTFT and queue time (not twice)
    assert s.label_names(V2V + "_count") == {"tier", "transport"}


def test_end_of_turn_waits_by_policy_and_reopened_turns_by_transport():
    metrics = Metrics()
    twilio, native = CallRecord("c-1", "twilio"), CallRecord("c-2", "native")
    metrics.turn_finished(twilio, decide(TurnRecord(1), reopened=2))  # hybrid, 212 ms
    metrics.turn_finished(twilio, TurnRecord(2, decision=decision("silence", "silence", 640.0, 600.0, None, None)))
    metrics.turn_finished(twilio, TurnRecord(3))  # ended without a decision (end of stream): no wait
    metrics.turn_finished(native, decide(TurnRecord(1), reopened=1))
    s = scrape(metrics)
    wait = "voicepipe_end_of_turn_wait_seconds"
    assert s.value(wait + "_count", transport="twilio") == 2 and s.value(wait + "_count") == 3
    assert s.value(wait + "_sum", policy="hybrid", transport="twilio") == pytest.approx(0.212)
    assert s.bucket(wait, 0.2, policy="hybrid") == 0 and s.bucket(wait, 0.25, policy="hybrid") == 2
    assert s.bucket(wait, 0.6, policy="silence") == 0 and s.bucket(wait, 0.7, policy="silence") == 1
    assert s.label_names(wait + "_count") == {"policy", "transport"}
    assert s.value("voicepipe_turns_reopened_total", transport="twilio") == 2
    assert s.value("voicepipe_turns_reopened_total", transport="native") == 1
    assert s.label_names("voicepipe_turns_reopened_total") == {"transport"}


def test_tool_call_latency_by_tool_and_outcome_and_the_keypad_response():
    metrics = Metrics()
    call = CallRecord("c-1", "twilio")
    tools = [{"name": "lookup_order", "latency_ms": 120.0, "error": None},
             {"name": "lookup_order", "latency_ms": 2000.0, "error": "no answer within 2 s"},
             {"name": "end_call", "latency_ms": 0.2, "error": None}]
    metrics.turn_finished(call, TurnRecord(1, tool_calls=tools[:2], timings_ms={"dtmf_response": 420.0}))
    metrics.turn_finished(call, TurnRecord(2, tool_calls=tools[2:]))
    s = scrape(metrics)
    tool = "voicepipe_tool_call_seconds"
    assert s.value(tool + "_count", tool="lookup_order", outcome="ok") == 1
    assert s.value(tool + "_sum", tool="lookup_order", outcome="error") == pytest.approx(2.0)
    assert s.bucket(tool, 0.001, tool="end_call", outcome="ok") == 1
    assert s.bucket(tool, 0.1, tool="lookup_order", outcome="ok") == 0
    assert s.bucket(tool, 0.25, tool="lookup_order", outcome="ok") == 1
    assert s.label_names(tool + "_count") == {"tool", "outcome"}
    assert s.value("voicepipe_dtmf_response_seconds_sum", transport="twilio") == pytest.approx(0.42)


def test_barge_ins_and_turn_errors_are_counted():
    metrics = Metrics()
    telnyx, twilio = CallRecord("c-1", "telnyx"), CallRecord("c-2", "twilio")
    metrics.event(telnyx, {"t": 1.0, "type": "barge_in", "turn": 0, "heard_text": "Hi"})  # the greeting's
    metrics.event(twilio, {"t": 2.0, "type": "barge_in", "turn": 1, "heard_text": "Sure"})
    metrics.event(twilio, {"t": 2.1, "type": "inbound", "samples": 160})
    metrics.turn_finished(twilio, TurnRecord(1, interrupted=True))  # the same barge-in: counted once, above
    metrics.turn_finished(twilio, TurnRecord(2, error="RuntimeError: boom"))
    s = scrape(metrics)
    assert s.value("voicepipe_barge_ins_total", transport="telnyx") == 1
    assert s.value("voicepipe_barge_ins_total") == 2
    assert s.value("voicepipe_errors_total", kind="turn") == 1
    assert s.value("voicepipe_errors_total", kind="call") == 0


def test_active_calls_by_transport_and_ended_calls_by_outcome():
    metrics = Metrics()
    observers = Observers([metrics])  # as the app wires it
    calls = [CallRecord("a", "twilio"), CallRecord("b", "twilio"), CallRecord("c", "vonage")]
    for call in calls:
        observers.call_started(call)
    s = scrape(metrics)
    assert s.value("voicepipe_active_calls", transport="twilio") == 2
    assert s.value("voicepipe_active_calls", transport="vonage") == 1

    calls[0].outcome, calls[2].outcome, calls[2].error = "dropped", "error", "boom"
    observers.call_ended(calls[0])
    observers.call_ended(calls[2])
    observers.call_ended(CallRecord("never-started", "twilio", outcome="completed"))  # start failed: no gauge drift
    s = scrape(metrics)
    assert s.value("voicepipe_active_calls", transport="twilio") == 1
    assert s.samples("voicepipe_active_calls", transport="vonage") == []
    assert s.value("voicepipe_calls_total", transport="twilio", outcome="dropped") == 1
    assert s.value("voicepipe_calls_total", transport="vonage", outcome="error") == 1
    assert s.value("voicepipe_errors_total", kind="call") == 1


def test_api_request_counts_once_as_turn_1_over_http_with_its_tier():
    metrics = Metrics()
    session = Session(ephemeral=True, requests=1)
    metrics.request_finished(finished_request(session, tier="flex"))
    s = scrape(metrics)
    labels = {"tier": "flex", "transport": "http"}
    assert s.value(TTFT + "_count", **labels, turn="1") == 1
    assert s.value(TTFT + "_sum", **labels) == pytest.approx(0.3)
    assert s.value("voicepipe_llm_queue_seconds_count", **labels) == 1
    assert s.value("voicepipe_llm_queue_seconds_sum", **labels) == pytest.approx(0.1)
    assert s.value("voicepipe_llm_itl_seconds_count", **labels) == 2  # three tokens, two gaps
    assert s.value("voicepipe_llm_itl_seconds_sum", **labels) == pytest.approx(0.15)
    assert s.bucket("voicepipe_llm_itl_seconds", 0.05, **labels) == 1
    assert s.value("voicepipe_llm_requests_total", **labels, reason="stop") == 1
    assert s.label_names(TTFT + "_count") == {"tier", "transport", "turn"}


def test_call_request_labelled_with_its_calls_transport_and_turn_bucket():
    call_session, orphan = Session(requests=7), Session(requests=31)
    metrics = Metrics(call_session={"c-1": call_session}.get)
    call = CallRecord("c-1", "twilio", outcome="dropped")
    metrics.call_started(call)
    metrics.request_finished(finished_request(call_session))
    metrics.call_ended(call)
    metrics.request_finished(finished_request(call_session, reason="cancelled"))  # ends after its call did
    metrics.request_finished(finished_request(orphan))  # a session no call was seen to start with
    s = scrape(metrics)
    assert s.value(TTFT + "_count", tier="priority", transport="twilio", turn="6-15") == 2
    assert s.value("voicepipe_llm_requests_total", transport="twilio", reason="cancelled") == 1
    assert s.value(TTFT + "_count", tier="priority", transport="call", turn="31+") == 1
    assert s.value(TTFT + "_count") == 3


def test_request_cancelled_before_its_first_token_has_no_ttft():
    metrics = Metrics()
    metrics.request_finished(finished_request(Session(ephemeral=True, requests=1), token_times=(), reason="cancelled"))
    s = scrape(metrics)
    assert s.value(TTFT + "_count") == 0
    assert s.value("voicepipe_llm_queue_seconds_count") == 0
    assert s.value("voicepipe_llm_requests_total", reason="cancelled", transport="http") == 1


def test_engine_state_is_read_at_scrape_time():
    engine = StatsOnly()
    metrics = Metrics(engine=lambda: engine)
    metrics.count_error("turn")
    s = scrape(metrics)
    assert s.value("voicepipe_llm_engine_ready") == 1
    assert s.value("voicepipe_kv_blocks_used") == 10
    assert s.value("voicepipe_kv_blocks_free") == 54
    assert s.value("voicepipe_sessions_pinned") == 2
    assert s.value("voicepipe_prefix_cache_query_tokens_total") == 900
    assert s.value("voicepipe_prefix_cache_hit_tokens_total") == 600
    assert s.value("voicepipe_llm_compactions_total") == 1
    assert s.value("voicepipe_llm_spec_draft_tokens_total") == 40
    assert s.value("voicepipe_llm_spec_accepted_tokens_total") == 25
    assert s.value("voicepipe_llm_preemptions_total", tier="flex") == 3
    assert s.value("voicepipe_llm_preemptions_total") == 4
    assert s.value("voicepipe_errors_total", kind="engine") == 3
    assert s.value("voicepipe_errors_total", kind="overloaded") == 2
    assert s.value("voicepipe_errors_total", kind="turn") == 1

    engine._stats["blocks_used"] = 20  # never stale
    assert scrape(metrics).value("voicepipe_kv_blocks_used") == 20


def test_every_family_is_declared_before_the_engine_loads():
    before, after = scrape(Metrics()), scrape(Metrics(engine=StatsOnly))
    assert before.value("voicepipe_llm_engine_ready") == 0
    assert before.samples("voicepipe_kv_blocks_used") == []
    assert before.names() == after.names()


def test_apps_metrics_do_not_collide_nor_touch_the_global_registry():
    first, second = Metrics(), Metrics()
    first.turn_finished(CallRecord("c-1", "twilio"), TurnRecord(1, timings_ms={"voice_to_voice": 500.0}))
    assert scrape(first).value(V2V + "_count") == 1
    assert scrape(second).value(V2V + "_count") == 0
    assert REGISTRY.get_sample_value(V2V + "_count", {"tier": "priority", "transport": "twilio"}) is None


def test_openmetrics_on_request():
    body, content_type = Metrics().render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    assert Metrics().render()[1].startswith("text/plain; version=0.0.4")


def test_each_drafting_request_adds_its_acceptance_rate():
    metrics = Metrics()
    drafted = finished_request(Session(ephemeral=True, requests=1))
    drafted.stats.draft_tokens, drafted.stats.accepted_tokens = 8, 6
    metrics.request_finished(drafted)
    metrics.request_finished(finished_request(Session(ephemeral=True, requests=1)))  # drafted nothing: no sample
    s = scrape(metrics)
    assert s.value("voicepipe_llm_spec_acceptance_ratio_count", tier="priority", transport="http") == 1
    assert s.value("voicepipe_llm_spec_acceptance_ratio_sum", tier="priority", transport="http") == 0.75


def test_a_calls_echo_delay_and_erle_are_observed_when_it_ends():
    metrics = Metrics()
    cancelled = CallRecord("a", "twilio", metadata={ECHO_METADATA: {"delay_ms": 150.0, "erle_db": 18.5}})
    no_echo_found = CallRecord("b", "twilio", metadata={ECHO_METADATA: {"delay_ms": None, "erle_db": None}})
    said_by_the_caller = CallRecord("c", "twilio", metadata={ECHO_METADATA: "on"})
    for call in (cancelled, no_echo_found, said_by_the_caller, CallRecord("d", "vonage")):
        metrics.call_ended(call)
    s = scrape(metrics)
    assert s.value("voicepipe_echo_delay_seconds_count", transport="twilio") == 1
    assert s.value("voicepipe_echo_delay_seconds_sum", transport="twilio") == pytest.approx(0.15)
    assert s.value("voicepipe_echo_erle_db_sum", transport="twilio") == pytest.approx(18.5)
    assert s.samples("voicepipe_echo_erle_db_count", transport="vonage") == []


def test_a_calls_echo_gate_moves_the_gated_counters_and_its_erl_is_observed_when_it_ends():
    metrics = Metrics()
    found = {"delay_ms": 150.0, "erle_db": 18.5, "erl_db": 11.2, "gated_audio_s": 4.5, "gated_segments": 2,
             "gated_words": 9, "gate_openings": 6, "gated_speech": []}
    not_found = {**found, "delay_ms": None, "erle_db": None, "erl_db": None, "gated_audio_s": 0.25,
                 "gated_segments": 0, "gated_words": 1, "gate_openings": 1}
    for call in (CallRecord("a", "twilio", metadata={ECHO_METADATA: found}),
                 CallRecord("b", "twilio", metadata={ECHO_METADATA: not_found}), CallRecord("c", "vonage")):
        metrics.call_ended(call)
    s = scrape(metrics)
    assert s.value("voicepipe_echo_gated_audio_seconds_total", transport="twilio") == pytest.approx(4.75)
    assert s.value("voicepipe_echo_gated_segments_total", transport="twilio") == 2
    assert s.value("voicepipe_echo_gated_words_total", transport="twilio") == 10
    assert s.value("voicepipe_echo_gate_openings_total", transport="twilio") == 7
    assert s.value("voicepipe_echo_erl_db_count", transport="twilio") == 1  # the call that found no echo: none
    assert s.value("voicepipe_echo_erl_db_sum", transport="twilio") == pytest.approx(11.2)
    assert s.samples("voicepipe_echo_gated_words_total", transport="vonage") == []  # no echo cancelling: no series


def test_the_gated_counters_count_a_live_calls_echo_figures_as_its_record_holds_them_and_never_fall() -> None:
    metrics = Metrics()
    figures = {"delay_ms": 150.0, "erle_db": 18.5, "erl_db": 11.2, "gated_audio_s": 1.5, "gated_segments": 1,
               "gated_words": 3, "gated_speech": []}
    live = CallRecord("a", "twilio", metadata={ECHO_METADATA: figures})
    metrics.call_started(live)
    metrics.call_started(CallRecord("b", "twilio", metadata={ECHO_METADATA: "a caller's value"}))
    assert scrape(metrics).value("voicepipe_echo_gated_audio_seconds_total", transport="twilio") == 1.5
    live.metadata[ECHO_METADATA] = {**figures, "gated_audio_s": 2.0, "gated_words": 5}  # the session, a turn later
    s = scrape(metrics)
    assert s.value("voicepipe_echo_gated_audio_seconds_total", transport="twilio") == 2.0
    assert s.value("voicepipe_echo_gated_words_total", transport="twilio") == 5
    live.metadata[ECHO_METADATA] = {**figures, "gated_audio_s": 2.25, "gated_words": 5}  # as it ended
    metrics.call_ended(live)
    s = scrape(metrics)
    assert s.value("voicepipe_echo_gated_audio_seconds_total", transport="twilio") == 2.25  # counted once
    assert s.value("voicepipe_echo_gated_segments_total", transport="twilio") == 1
    assert s.value("voicepipe_echo_delay_seconds_count", transport="twilio") == 1  # the histograms: at the end
