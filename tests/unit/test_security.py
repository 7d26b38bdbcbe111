"""Every door of the HTTP and WebSocket surface: which credential each endpoint asks for (tested with and without
it), Twilio's request signature, call ids in paths, and the per-connection limits (frame size, messages a second,
connections per client address).

No models are loaded: an endpoint that needs them answers 503 once past its guard, which is what "with the
credential" checks (anything but 401). Where a call must run past its start, the models are the scripted
stand-ins of `tests/pipeline_fakes.py` (the real ones run in tests/e2e); the limits under test sit in the
transport, in front of the models.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
import wave
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from tests.pipeline_fakes import FakeDetector, fake_call_resources
from tests.unit.test_transport_webrtc import aiortc_offer, run
from voicepipe.auth import twilio_signature, twilio_signature_ok
from voicepipe.config import load_settings
from voicepipe.pipeline import CallSession
from voicepipe.replay.case import CaseError, load_case
from voicepipe.server import create_app
from voicepipe.transports import gateway
from voicepipe.transports.gateway import PROVIDERS
from voicepipe.transports.limits import ClientSlots, MessageRate, TooManyConnections
from voicepipe.transports.serializers import make_caller_serializer
from voicepipe.transports.serializers.audiosocket import KIND_HANGUP, KIND_UUID, encode_message

TOKEN, API_KEY = "call-s3cret", "v1-s3cret"
# Open to anyone: liveness for orchestrators, the API's own description, and the softphone's static page (it asks
# for the token itself, in the calls it makes).
PUBLIC = {"/health", "/ready", "/version", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/"}
# Behind calls.auth_token, besides what the OpenAPI schema lists under these prefixes.
TOKEN_PREFIXES = ("/api/", "/calls", "/dashboard", "/webrtc/", "/sip/")
UNLISTED = [("GET", "/metrics")]  # guarded, but kept out of the schema
SOCKETS = ["/ws", *(f"/ws/{p}" for p in PROVIDERS)]


def make_app(tmp_path: Path, **calls) -> object:
    return create_app(load_settings(overrides={
        "calls": {"auth_token": TOKEN, **calls}, "server": {"api_key": API_KEY},
        "paths": {"data_dir": str(tmp_path / "data"), "recordings_dir": str(tmp_path / "rec")}}), load_models=False)


@pytest.fixture
def client(tmp_path: Path):
    with TestClient(make_app(tmp_path)) as c:
        yield c


def schema_endpoints(client: TestClient) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, ops in client.app.openapi()["paths"].items() for method in ops]


def concrete(path: str) -> str:
    return path.replace("{call_id}", "call-1")


def test_every_endpoint_is_public_or_guarded(client) -> None:
    """A new endpoint fails here until it is classified: public, behind the call token, or /v1 behind the key."""
    for _, path in schema_endpoints(client):
        assert path in PUBLIC or path.startswith("/v1/") or path.startswith(TOKEN_PREFIXES), (
            f"{path} is neither public nor guarded: classify it here and guard it in the code")


def test_token_guarded_endpoints_refuse_without_the_token_and_serve_with_it(client) -> None:
    guarded = [(m, p) for m, p in schema_endpoints(client) if p.startswith(TOKEN_PREFIXES)] + UNLISTED
    assert len(guarded) >= 10
    for method, path in guarded:
        url = concrete(path)
        assert client.request(method, url).status_code == 401, (method, path)
        assert client.request(method, url, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
        assert client.request(method, url, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 401, (
            "the /v1 key must not open the call endpoints", path)
        for credentials in ({"headers": {"Authorization": f"Bearer {TOKEN}"}}, {"headers": {"x-voicepipe-token":
                                                                                             TOKEN}},
                            {"params": {"token": TOKEN}}):
            status = client.request(method, url, **credentials).status_code
            assert status != 401 and status < 500 or status == 503, (method, path, credentials, status)


def test_v1_endpoints_refuse_without_the_api_key_and_serve_with_it(client) -> None:
    v1 = [(m, p) for m, p in schema_endpoints(client) if p.startswith("/v1/")]
    assert {p for _, p in v1} >= {"/v1/models", "/v1/chat/completions", "/v1/completions"}
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    for method, path in v1:
        kwargs = {"json": body} if method == "POST" else {}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}"}):
            response = client.request(method, path, headers=headers, **kwargs)
            assert response.status_code == 401, (path, headers)
            assert response.json()["error"]["code"] == "invalid_api_key"
        response = client.request(method, path, headers={"Authorization": f"Bearer {API_KEY}"}, **kwargs)
        assert response.status_code != 401, (path, response.text)


def test_public_endpoints_stay_open_with_every_secret_set(client) -> None:
    for path in PUBLIC - {"/ready", "/docs/oauth2-redirect"}:
        assert client.get(path).status_code == 200, path
    assert client.get("/ready").status_code == 503  # open, but not ready: no models in this test


def test_call_sockets_refuse_without_the_token_and_accept_with_it(client) -> None:
    for path in SOCKETS:
        with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect(path) as ws:
            ws.receive_text()
        assert refused.value.code == 1008, path
        with pytest.raises(WebSocketDisconnect) as served, client.websocket_connect(f"{path}?token={TOKEN}") as ws:
            ws.receive_text()
        assert served.value.code == 1013 and "loading" in served.value.reason, path  # past the guard: no models


# -- Twilio's signature ------------------------------------------------------------------------------------------


def test_twilio_signature_matches_twilios_documented_example() -> None:
    """The example of twilio.com/docs/usage/security (auth token 12345)."""
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234", "From": "+12349013030",
              "To": "+18005551212"}
    assert twilio_signature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", params) == \
        "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


def test_twilio_signature_check_takes_the_url_as_twilio_saw_it() -> None:
    signed = twilio_signature("tok", "wss://voice.example.com/ws/twilio")
    headers = {"x-twilio-signature": signed}
    # behind a TLS proxy the server sees ws://, maybe with the port in Host
    for seen in ("wss://voice.example.com/ws/twilio", "ws://voice.example.com/ws/twilio",
                 "ws://voice.example.com:443/ws/twilio"):
        assert twilio_signature_ok("tok", seen, headers), seen
    assert not twilio_signature_ok("tok", "ws://voice.example.com/ws/twilio?x=1", headers)
    assert not twilio_signature_ok("tok", "ws://other.example.com/ws/twilio", headers)
    assert not twilio_signature_ok("other", "ws://voice.example.com/ws/twilio", headers)
    assert not twilio_signature_ok("tok", "ws://voice.example.com/ws/twilio", {})


def test_twilio_socket_needs_a_valid_signature_when_the_auth_token_is_set(tmp_path: Path) -> None:
    app = create_app(load_settings(overrides={"calls": {"twilio_auth_token": "AUTH"},
                                              "paths": {"data_dir": str(tmp_path)}}), load_models=False)
    client = TestClient(app)
    url = "ws://testserver/ws/twilio"
    for headers in ({}, {"X-Twilio-Signature": "bm90IGl0"}, {"X-Twilio-Signature": twilio_signature("x", url)}):
        with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/ws/twilio", headers=headers):
            pass
        assert refused.value.code == 1008, headers
    for signed in (url, "wss://testserver/ws/twilio"):
        headers = {"X-Twilio-Signature": twilio_signature("AUTH", signed)}
        with pytest.raises(WebSocketDisconnect) as served, client.websocket_connect("/ws/twilio", headers=headers) \
                as ws:
            ws.receive_text()
        assert served.value.code == 1013, signed  # accepted: refused later only for want of models
    with pytest.raises(WebSocketDisconnect) as other, client.websocket_connect("/ws/telnyx") as ws:
        ws.receive_text()
    assert other.value.code == 1013  # the signature guards Twilio's endpoint only


# -- call ids in paths ---------------------------------------------------------------------------------------------

BAD_IDS = {"..": 404, "../../etc/passwd": 404, "%2e%2e": 404, "%2Fetc%2Fpasswd": 404, "..%2F..%2Fdata": 404,
           "a%00b": 400, "%0a": 400, "x" * 129: 400, "x" * 5000: 400}
ID_ENDPOINTS = ["/api/calls/{id}", "/api/calls/{id}/recording.wav", "/calls/{id}", "/dashboard/calls/{id}"]


def write_recording(directory: Path) -> None:
    directory.mkdir(parents=True)
    with wave.open(str(directory / "call.wav"), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.zeros(320, np.int16).tobytes())


def test_call_ids_in_paths_cannot_leave_their_directories(tmp_path: Path, client) -> None:
    secret = tmp_path / "secret"
    write_recording(secret)  # outside the recordings directory
    write_recording(tmp_path / "rec" / "good-call")
    os.symlink(secret, tmp_path / "rec" / "linked")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/calls/good-call/recording.wav", headers=auth).status_code == 200  # the control
    assert client.get("/api/calls/linked/recording.wav", headers=auth).status_code == 404  # a link out of it
    for endpoint in ID_ENDPOINTS:
        for call_id, status in BAD_IDS.items():
            got, body = raw_get(client.app, endpoint.replace("{id}", call_id), TOKEN)
            assert got == status, (endpoint, call_id[:20], got)
            assert not body.startswith(b"RIFF")


def raw_get(app, path: str, token: str) -> tuple[int, bytes]:
    """GET `path` exactly as written (an HTTP client would resolve its `..` segments first; curl --path-as-is and
    attackers do not), straight into the app as uvicorn would hand it over: percent escapes decoded."""
    scope = {"type": "http", "method": "GET", "path": unquote(path), "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"authorization", f"Bearer {token}".encode())], "scheme": "http", "http_version": "1.1",
             "server": ("testserver", 80), "client": ("testclient", 1), "root_path": "", "app": app}
    status, body = [], []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    asyncio.run(app(scope, receive, send))
    return status[0], b"".join(body)


def test_a_replay_case_reads_its_audio_from_its_own_directory_only(tmp_path: Path) -> None:
    case = tmp_path / "case"
    case.mkdir()
    write_recording(tmp_path / "outside")
    for name in ("../outside/call.wav", str(tmp_path / "outside" / "call.wav"), "sub/../../outside/call.wav"):
        (case / "case.toml").write_text(f'[call]\ntransport = "twilio"\naudio = "{name}"\n')
        with pytest.raises(CaseError, match="inside the case directory"):
            load_case(case)
    write_recording(case / "sub")
    (case / "case.toml").write_text('[call]\ntransport = "twilio"\naudio = "sub/call.wav"\n')
    assert load_case(case).rate == 16000


def test_a_call_id_no_path_can_name_is_replaced_at_the_start(tmp_path: Path, monkeypatch) -> None:
    calls = serve_fake_calls(tmp_path, monkeypatch)
    for sent in ("x" * 300, "bad\x00id"):
        wire = make_caller_serializer("native", call_id=sent)
        with calls.websocket_connect("/ws") as ws:
            send(ws, wire.start())
            started = ws.receive_json()
        assert started["type"] == "started" and started["call_id"] != sent and len(started["call_id"]) <= 128


# -- per-connection limits ---------------------------------------------------------------------------------------


def serve_fake_calls(tmp_path: Path, monkeypatch, **calls) -> TestClient:
    """An app whose calls run on scripted models (see the module docstring)."""
    monkeypatch.setattr(gateway, "call_resources", lambda runtime: fake_call_resources())
    monkeypatch.setattr(CallSession, "_make_detector", lambda self: FakeDetector())
    calls = {"greeting": "", "idle_timeout_s": 5, **calls}  # a limit that fails to act fails the test in 5 s
    app = create_app(load_settings(overrides={"calls": calls, "observability": {"metrics": False},
                                              "paths": {"data_dir": str(tmp_path)}}), load_models=False)
    return TestClient(app)


def send(ws, frames: list[str | bytes]) -> None:
    for frame in frames:
        ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_text(frame)


def test_connections_per_client_address_are_limited(tmp_path: Path, monkeypatch) -> None:
    client = serve_fake_calls(tmp_path, monkeypatch, max_connections_per_client=2)
    wires = [make_caller_serializer("twilio") for _ in range(3)]
    with client.websocket_connect("/ws/twilio") as first, client.websocket_connect("/ws/telnyx") as second:
        for ws, wire in ((first, wires[0]), (second, make_caller_serializer("telnyx"))):
            send(ws, wire.start())
        with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/ws/twilio") as third:
            third.receive_text()
        assert refused.value.code == 1013 and "too many connections from testclient" in refused.value.reason
        assert client.app.state.client_slots.held("testclient") == 2
    with client.websocket_connect("/ws/twilio") as again:  # the slots came back with the hang-ups
        send(again, wires[2].start())
    assert client.app.state.client_slots.held("testclient") == 0


def test_webrtc_offers_and_audiosocket_connections_count_against_the_same_slots(tmp_path: Path) -> None:
    app = create_app(load_settings(overrides={"calls": {"max_connections_per_client": 1, "audiosocket_port": 0},
                                              "server": {"host": "127.0.0.1"},
                                              "paths": {"data_dir": str(tmp_path)}}), load_models=False)
    with TestClient(app) as client:
        offer = {"type": "offer", "sdp": run(aiortc_offer())}
        assert client.post("/webrtc/offer", json=offer).status_code == 503  # a free slot: on to the models
        assert app.state.client_slots.held("testclient") == 0  # ... and given back when the call cannot start
        with app.state.client_slots.slot("testclient"):
            refused = client.post("/webrtc/offer", json=offer)
        assert refused.status_code == 429 and "max_connections_per_client = 1" in refused.json()["detail"]
        with app.state.client_slots.slot("127.0.0.1"), socket.create_connection(
                ("127.0.0.1", app.state.audiosocket_port), timeout=5) as tcp:
            tcp.sendall(encode_message(KIND_UUID, uuid.uuid4().bytes))
            assert tcp.recv(16) == encode_message(KIND_HANGUP)  # hung up at once, before any model is asked
            with contextlib.suppress(ConnectionResetError):  # closed with our frame unread: a reset, or an end
                assert tcp.recv(16) == b""


def test_a_connection_over_its_message_rate_is_closed(tmp_path: Path, monkeypatch) -> None:
    client = serve_fake_calls(tmp_path, monkeypatch, max_messages_per_s=20)
    wire = make_caller_serializer("native")
    with client.websocket_connect("/ws") as ws:
        send(ws, wire.start())
        assert ws.receive_json()["type"] == "started"
        with pytest.raises(WebSocketDisconnect) as closed:  # 40 a second pass as a burst; then no more
            for _ in range(200):
                send(ws, wire.audio(np.zeros(160, np.int16)))
            while True:
                message = ws.receive_json()
                if message["type"] == "error":
                    assert message["code"] == "rate_limited"
    assert closed.value.code == 1008 and "too many messages" in closed.value.reason
    [record] = client.app.state.calls.ended.values()
    assert record.end_reason == "rate_limited"


def test_a_frame_over_the_size_bound_closes_the_connection(tmp_path: Path, monkeypatch) -> None:
    client = serve_fake_calls(tmp_path, monkeypatch, max_frame_bytes=4096)
    wire = make_caller_serializer("twilio")
    with client.websocket_connect("/ws/twilio") as ws:
        send(ws, wire.start())
        [small] = wire.audio(np.zeros(800, np.int16))
        ws.send_text(small)  # 800 samples of PCMU in base64: under 4 KiB
        big = json.loads(small)
        big["media"]["payload"] *= 8
        assert len(json.dumps(big)) > 4096
        ws.send_text(json.dumps(big))
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1009 and "oversize" in closed.value.reason


def test_client_slots_count_per_address_and_zero_is_no_limit() -> None:
    slots = ClientSlots(2)
    slots.acquire("a")
    with slots.slot("a"):
        with pytest.raises(TooManyConnections, match="max_connections_per_client = 2"):
            slots.acquire("a")
        slots.acquire("b")
    slots.acquire("a")
    assert (slots.held("a"), slots.held("b")) == (2, 1)
    unlimited = ClientSlots(0)
    for _ in range(1000):
        unlimited.acquire("a")
    assert unlimited.held("a") == 1000


def test_message_rate_allows_bursts_and_the_average() -> None:
    rate = MessageRate(50, now=0.0)
    assert sum(rate.allow(0.0) for _ in range(200)) == 100  # a 2 s burst
    assert not rate.allow(0.001)
    allowed = sum(rate.allow(1 + i / 100) for i in range(1000))  # 100 a second for 10 s
    assert 500 <= allowed <= 560
    off = MessageRate(0, now=0.0)
    assert all(off.allow(0.0) for _ in range(10_000))
