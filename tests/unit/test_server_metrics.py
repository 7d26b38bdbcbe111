"""GET /metrics on the app (no models): mounted when settings say so, one registry per app, observers wired."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from tests.metrics_helpers import Scrape
from voicepipe.config import Settings
from voicepipe.observability.metrics import Metrics
from voicepipe.observability.records import CallRecord, TurnRecord
from voicepipe.server import create_app

NO_STORE = {"store": False}  # these apps only serve /metrics: no call store file


def make_app(**observability):
    return create_app(Settings(observability={**NO_STORE, **observability}), load_models=False)


def test_metrics_endpoint_serves_prometheus_text_and_the_app_wires_its_observers():
    app = make_app()
    metrics = app.state.metrics
    assert isinstance(metrics, Metrics)
    assert metrics in app.state.observers.observers
    assert metrics.request_finished in app.state.runtime.request_listeners  # the engine gets it when it loads
    call = CallRecord("c-1", "twilio")
    app.state.observers.turn_finished(call, TurnRecord(1, timings_ms={"voice_to_voice": 700.0}))
    with TestClient(app) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    scrape = Scrape(response.text)
    assert scrape.value("voicepipe_voice_to_voice_seconds_count", tier="priority", transport="twilio") == 1
    assert scrape.value("voicepipe_llm_engine_ready") == 0


def test_two_apps_keep_separate_metrics():
    first, second = make_app(), make_app()
    first.state.observers.call_started(CallRecord("c-1", "vonage"))
    with TestClient(first) as a, TestClient(second) as b:
        assert Scrape(a.get("/metrics").text).value("voicepipe_active_calls", transport="vonage") == 1
        assert Scrape(b.get("/metrics").text).value("voicepipe_active_calls") == 0


def test_metrics_switched_off():
    app = make_app(metrics=False)
    assert not hasattr(app.state, "metrics")
    assert app.state.runtime.request_listeners == []
    with TestClient(app) as client:
        assert client.get("/metrics").status_code == 404


def test_the_app_watches_its_event_loop_while_it_runs():
    app = make_app()
    with TestClient(app) as client:
        time.sleep(0.35)  # the app's loop runs in the client's thread and wakes its 100 ms timer meanwhile
        scrape = Scrape(client.get("/metrics").text)
    assert scrape.value("voicepipe_event_loop_lag_seconds_count") >= 2
