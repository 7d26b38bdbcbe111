"""/metrics on the real app with the real models: an OpenAI API request and a call move the figures by exactly what
they did, with the right labels, and the engine's live gauges are there and consistent.

One server serves the module (the models load once); every test compares a scrape before and after what it does.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.call_helpers import call_settings
from tests.metrics_helpers import Scrape
from tests.net_helpers import in_process_server
from voicepipe.bench.call import loop_lag_counts, loop_lag_summary
from voicepipe.caller import read_wav, run_call, utterance

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
TTFT, ITL, QUEUE = "voicepipe_llm_ttft_seconds", "voicepipe_llm_itl_seconds", "voicepipe_llm_queue_seconds"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "voicepipe.json"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = call_settings(tmp_path_factory.mktemp("metrics"), calls={"max_reply_tokens": 12, "greeting": None})
    with in_process_server(settings) as (base, app):
        yield base, app


def scrape(base: str) -> Scrape:
    response = httpx.get(f"{base}/metrics", timeout=30)
    assert response.status_code == 200
    return Scrape(response.text)


def chat(base: str, content: str, tier: str) -> dict:
    response = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 10, "temperature": 0,
        "service_tier": tier})
    assert response.status_code == 200, response.text
    return response.json()


def test_api_request_moves_the_engine_histograms_by_exactly_one_request(server):
    base, _ = server
    labels = {"tier": "flex", "transport": "http"}
    before = scrape(base)
    usage = chat(base, "Name a color of the sky.", "flex")["usage"]
    after = scrape(base)

    def moved(sample: str, **sample_labels: str) -> float:
        return after.value(sample, **sample_labels) - before.value(sample, **sample_labels)

    assert moved(TTFT + "_count", **labels, turn="1") == 1
    assert moved(TTFT + "_count") == 1  # nothing else was counted: no other tier, transport or turn bucket
    assert moved(TTFT + "_sum", **labels) > 0
    assert moved(QUEUE + "_count", **labels) == 1
    assert moved(ITL + "_count", **labels) == usage["completion_tokens"] - 1
    assert moved("voicepipe_llm_requests_total", **labels) == 1
    assert moved("voicepipe_prefix_cache_query_tokens_total") == usage["prompt_tokens"]
    assert moved("voicepipe_prefix_cache_hit_tokens_total") == usage["prompt_tokens_details"]["cached_tokens"]
    assert moved("voicepipe_llm_output_tokens_total") == usage["completion_tokens"]
    assert moved("voicepipe_errors_total") == 0


def test_engine_gauges_are_present_and_consistent(server):
    base, app = server
    s = scrape(base)
    total = s.value("voicepipe_kv_blocks_total")
    assert s.value("voicepipe_llm_engine_ready") == 1
    assert total == app.state.runtime.engine.blocks.num_blocks > 0
    assert s.value("voicepipe_kv_blocks_used") + s.value("voicepipe_kv_blocks_free") == total
    assert s.value("voicepipe_kv_blocks_used") >= 0 and s.value("voicepipe_kv_blocks_free") > 0
    assert s.value("voicepipe_sessions_pinned") == 0  # no call holds a session
    assert s.value("voicepipe_llm_requests_running") == 0 and s.value("voicepipe_llm_requests_waiting") == 0
    assert s.samples("voicepipe_kv_blocks_used") and s.samples("voicepipe_sessions_pinned")


def test_call_request_is_labelled_with_the_calls_transport(server, tmp_path):
    base, _ = server
    wav = tmp_path / "caller.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "What is the capital of France?"], check=True, capture_output=True)
    before, lag_before = scrape(base), asyncio.run(loop_lag_counts(base))
    result = asyncio.run(run_call(base.replace("http://", "ws://") + "/ws/twilio", "twilio",
                                  [utterance(*read_wav(wav))], quiet_s=0.6, record_url=base))
    assert len(result.turns) == 1
    # The server ends its side just after the client's stop, and a reply still generating then is cancelled and
    # ends in the engine a step later: wait for both.
    counted = (("voicepipe_calls_total", {"transport": "twilio"}),
               ("voicepipe_llm_requests_total", {"tier": "priority", "transport": "twilio"}))
    deadline = time.monotonic() + 30
    while True:
        after = scrape(base)
        if all(after.value(name, **labels) > before.value(name, **labels) for name, labels in counted) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    def moved(sample: str, **labels: str) -> float:
        return after.value(sample, **labels) - before.value(sample, **labels)

    assert moved("voicepipe_calls_total", transport="twilio") == 1
    timings = result.record["turns"][0]["timings_ms"]  # the server's own turn timeline
    call = {"tier": "priority", "transport": "twilio"}
    for figure in ("voice_to_voice", "response", "stt_final", "tts_first_audio"):
        assert moved(f"voicepipe_{figure}_seconds_count", **call) == 1, figure
        assert moved(f"voicepipe_{figure}_seconds_sum", **call) == pytest.approx(timings[figure] / 1000, abs=1e-3)
    ttfts = [(s.labels, s.value) for s in after.samples(TTFT + "_count")]
    assert moved(TTFT + "_count", tier="priority", transport="twilio", turn="1") == 1, ttfts
    assert moved(TTFT + "_count") == 1, ttfts
    assert moved(QUEUE + "_count", tier="priority", transport="twilio") == 1
    assert moved("voicepipe_llm_requests_total", tier="priority", transport="twilio") == 1
    assert after.value("voicepipe_active_calls") == 0
    assert after.value("voicepipe_sessions_pinned") == 0  # the call's session was closed with the call
    # the loop kept waking its lag timer through the call; `bench call` reads the same figures
    lag = loop_lag_summary(lag_before, asyncio.run(loop_lag_counts(base)))
    assert moved("voicepipe_event_loop_lag_seconds_count") >= 1 and lag["samples"] >= 1


def test_the_grafana_dashboard_queries_only_what_the_loaded_app_exports(server):
    names = scrape(server[0]).names()
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b(voicepipe_[a-z0-9_]+)", expr)}
    assert used and used <= names, used - names
