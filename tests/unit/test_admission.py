"""Admission control (calls.max_concurrent) and the drain's refusals: the counting, and how each transport refuses
(no models: a refused call never needs them)."""

from __future__ import annotations

import socket

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.unit.test_transport_webrtc import AUDIO_SDP
from voicepipe.config import load_settings
from voicepipe.pipeline.admission import Admission, CallRefused
from voicepipe.server import create_app


def test_places_are_counted_given_back_once_and_refusals_tallied() -> None:
    admission = Admission(2)
    first, second = admission.admit("native"), admission.admit("twilio")
    assert admission.check() == "saturated"
    with pytest.raises(CallRefused) as refused:
        admission.admit("webrtc")
    assert refused.value.reason == "saturated" and refused.value.sip_status == 486
    first.release()
    first.release()  # twice is once
    assert admission.active == 1 and admission.check() is None
    third = admission.admit("sip")
    assert admission.snapshot()["saturated"]
    second.release()
    third.release()
    assert admission.active == 0
    assert admission.refused == {("webrtc", "saturated"): 1}


def test_a_draining_process_refuses_every_call_and_no_limit_means_none() -> None:
    admission = Admission(None)
    slots = [admission.admit("native") for _ in range(50)]
    assert admission.check() is None
    admission.drain()
    with pytest.raises(CallRefused) as refused:
        admission.admit("audiosocket")
    assert refused.value.reason == "draining" and refused.value.sip_status == 503
    assert "shutting down" in str(refused.value)
    for slot in slots:  # the calls in progress go on and give their places back
        slot.release()
    assert admission.snapshot() == {"active_calls": 0, "max_concurrent": None, "draining": True, "saturated": False,
                                    "refused": {("audiosocket", "draining"): 1}}


@pytest.fixture
def full_app():
    """An app at calls.max_concurrent = 1 whose one place is taken (no models are loaded)."""
    settings = load_settings(overrides={"calls": {"max_concurrent": 1, "audiosocket_port": 0}})
    with TestClient(create_app(settings, load_models=False)) as client:
        slot = client.app.state.admission.admit("native")
        yield client
        slot.release()


def refused_ws(client: TestClient, path: str) -> WebSocketDisconnect:
    with client.websocket_connect(path) as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    return closed.value


def test_each_transport_refuses_the_call_over_the_limit(full_app: TestClient) -> None:
    for path in ("/ws", "/ws/twilio"):
        closed = refused_ws(full_app, path)
        assert closed.code == 1013 and "calls.max_concurrent" in closed.reason
    offer = full_app.post("/webrtc/offer", json={"type": "offer", "sdp": AUDIO_SDP})
    assert offer.status_code == 503 and "max_concurrent" in offer.json()["detail"]
    with socket.create_connection(("127.0.0.1", full_app.app.state.audiosocket_port), timeout=5) as tcp:
        assert tcp.recv(16) == b"\x00\x00\x00"  # AudioSocket's hangup message
        assert tcp.recv(16) == b""  # then the close (a line left open would raise the socket's timeout)
    ready = full_app.get("/ready")
    assert ready.status_code == 503
    assert ready.json() | {"load_seconds": {}} == {"ready": False, "models_loaded": False, "load_seconds": {},
                                                  "active_calls": 1, "max_concurrent": 1, "saturated": True,
                                                  "draining": False}
    metrics = full_app.get("/metrics").text
    for transport in ("native", "twilio", "webrtc", "audiosocket"):
        assert f'voicepipe_calls_refused_total{{reason="saturated",transport="{transport}"}} 1.0' in metrics
    assert "voicepipe_calls_max_concurrent 1.0" in metrics and "voicepipe_draining 0.0" in metrics


def test_a_draining_app_refuses_calls_and_says_so_on_ready(full_app: TestClient) -> None:
    full_app.app.state.admission.drain()
    closed = refused_ws(full_app, "/ws")
    assert closed.code == 1013 and "shutting down" in closed.reason
    assert full_app.get("/ready").json()["draining"] is True
    assert "voicepipe_draining 1.0" in full_app.get("/metrics").text
