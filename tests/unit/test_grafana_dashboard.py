"""deploy/grafana/voicepipe.json only queries what the app exports at /metrics, with labels those metrics have."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.metrics_helpers import Scrape, StatsOnly
from tests.observability_helpers import decide
from voicepipe.config import Settings
from voicepipe.llm.request import Request, RequestStats
from voicepipe.llm.sampling import SamplingParams
from voicepipe.llm.session import Session
from voicepipe.observability.metrics import Metrics
from voicepipe.observability.metrics_live import AdmissionCollector
from voicepipe.observability.records import CallRecord, TurnRecord
from voicepipe.server import create_app

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "voicepipe.json"
METRIC = re.compile(r"\b(voicepipe_[a-z0-9_]+)")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\b(voicepipe_[a-z0-9_]+)\{([^}]*)\}")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, and the template variables' queries."""
    dash = dashboard()
    found = [(panel["title"], target["expr"]) for panel in dash["panels"] for target in panel["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            found.append((f"${var['name']}", var["query"]["query"]))
    return found


@pytest.fixture(scope="module")
def exported() -> Scrape:
    """The app's real /metrics (no models loaded: every family is declared all the same)."""
    with TestClient(create_app(Settings(observability={"store": False}), load_models=False)) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    return Scrape(response.text)


@pytest.fixture(scope="module")
def labelled() -> Scrape:
    """Metrics with a sample in every family (an interrupted and failed turn whose end was reopened once, a call,
    an API request and an engine), so each metric's label names can be seen."""
    metrics = Metrics(engine=StatsOnly)
    call = CallRecord("c-1", "twilio")
    metrics.call_started(call)
    metrics.turn_finished(call, decide(TurnRecord(1, interrupted=True, error="boom", timings_ms={
        "voice_to_voice": 500.0, "response": 400.0, "stt_final": 100.0, "tts_first_audio": 50.0, "send_delay": 1.0,
        "dtmf_response": 300.0}, tool_calls=[{"name": "end_call", "latency_ms": 0.2, "error": None}]), reopened=1))
    metrics.event(call, {"t": 1.0, "type": "barge_in", "turn": 1})
    metrics.call_started(CallRecord("c-2", "twilio"))
    call.outcome = "completed"
    metrics.call_ended(call)
    stats = RequestStats(arrival=1.0, first_scheduled=1.1, first_token=1.2, token_times=[1.2, 1.3])
    metrics.request_finished(Request(Session(ephemeral=True, requests=1), SamplingParams(), tier="default",
                                     stats=stats, finish_reason="stop"))
    metrics.registry.register(AdmissionCollector(lambda: {"refused": {("twilio", "saturated"): 1},
                                                          "max_concurrent": 4, "draining": False}))
    return Scrape(metrics.render()[0].decode())


def test_the_dashboard_has_the_panels_the_operators_need():
    titles = " | ".join(panel["title"] for panel in dashboard()["panels"]).lower()
    for needed in ("voice-to-voice p50 / p95 by transport", "ttft p95 by turn", "inter-token", "queue time",
                   "kv cache blocks", "calls", "prefix-cache hit rate", "barge-ins", "errors",
                   "end-of-turn wait p50 / p95 by policy", "reopened turns", "tool call latency", "keypad response",
                   "event loop lag"):
        assert needed in titles
    for panel in dashboard()["panels"]:
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == "${datasource}"  # imports onto any Prometheus data source


def test_every_metric_a_panel_queries_is_exported(exported):
    names = exported.names()
    for title, expr in queries():
        used = METRIC.findall(expr)
        assert used, f"{title!r} queries no voicepipe metric: {expr}"
        for name in used:
            assert name in names, f"{title!r} queries {name}, which /metrics does not export"


def test_every_label_a_panel_groups_or_filters_by_exists_on_its_metrics(labelled):
    for title, expr in queries():
        grouped = {label.strip() for group in BY.findall(expr) for label in group.split(",")} - {"le", ""}
        for name in set(METRIC.findall(expr)):
            have = labelled.label_names(name)
            assert grouped <= have, f"{title!r} groups {name} by {grouped - have}, which it does not have"
        for name, matchers in MATCHERS.findall(expr):
            for label in re.findall(r"(\w+)\s*=~?", matchers):
                assert label in labelled.label_names(name), f"{title!r} filters {name} on a missing {label!r}"
