"""The WebSocket gateway: `/ws` (voicepipe's own protocol) and `/ws/{twilio,telnyx,vonage,plivo,exotel}`.

One connection is one call, run by a `Connection` (connection.py) with the provider's serializer; with
`calls.audiosocket_port` set, the AudioSocket listener starts too.

Also `GET /calls` and `GET /calls/{call_id}`: the records of live and recently ended calls (transcripts,
per-turn timings and LLM cache figures), for clients such as `voicepipe call` and for tests.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, FastAPI, HTTPException, Request, WebSocket

from voicepipe.auth import CallIdPath, check_http_token, check_path_call_id, token_ok, twilio_signature_ok
from voicepipe.http_errors import error_responses
from voicepipe.pipeline import CallRegistry, call_resources
from voicepipe.pipeline.admission import Admission, CallRefused
from voicepipe.pipeline.resources import warm_up_in_background
from voicepipe.transports.audiosocket_server import start_audiosocket_listener
from voicepipe.transports.connection import CLOSE_INTERNAL, CLOSE_POLICY, CLOSE_TRY_AGAIN, Connection, close_socket
from voicepipe.transports.limits import ClientSlots, TooManyConnections, client_address
from voicepipe.transports.serializers import make_serializer

log = logging.getLogger(__name__)

PROVIDERS = ("twilio", "telnyx", "vonage", "plivo", "exotel")


def create_call_router(app: FastAPI) -> APIRouter:
    """The call endpoints; keeps a `CallRegistry` on `app.state.calls`."""
    app.state.calls = CallRegistry()
    app.state.admission = Admission(app.state.settings.calls.max_concurrent)  # every transport asks it first
    app.state.client_slots = ClientSlots(app.state.settings.calls.max_connections_per_client)  # every call link's
    warm_up_in_background(app.state.runtime)
    if app.state.settings.calls.audiosocket_port is not None:
        start_audiosocket_listener(app)
    router = APIRouter(responses=error_responses(400, 401, 404))

    @router.websocket("/ws")
    async def native(ws: WebSocket) -> None:
        await serve_call(ws, "native")

    for provider in PROVIDERS:
        router.add_api_websocket_route(f"/ws/{provider}", _endpoint(provider), name=f"ws_{provider}")

    @router.get("/calls")
    async def list_calls(request: Request) -> dict:
        check_http_token(request)
        return request.app.state.calls.summary()

    @router.get("/calls/{call_id}")
    async def get_call(call_id: CallIdPath, request: Request) -> dict:
        check_http_token(request)
        check_path_call_id(call_id)
        calls = request.app.state.calls
        record = calls.get(call_id)
        if record is None:
            raise HTTPException(404, f"no call {call_id!r}")
        live = calls.active.get(call_id)
        return {**record.as_dict(), "state": live.state.value if live is not None else "ended"}

    return router


def _endpoint(provider: str):
    async def endpoint(ws: WebSocket) -> None:
        await serve_call(ws, provider)

    endpoint.__name__ = f"ws_{provider}"
    return endpoint


async def serve_call(ws: WebSocket, transport: str) -> None:
    app = ws.app
    settings = app.state.settings
    if not token_ok(settings, ws.headers, ws.query_params):
        log.warning("%s: refused a connection with a missing or wrong token", transport)
        await ws.close(code=CLOSE_POLICY, reason="unauthorized")
        return
    twilio_token = settings.calls.twilio_auth_token
    if transport == "twilio" and twilio_token is not None and not twilio_signature_ok(
            twilio_token.get_secret_value(), str(ws.url), ws.headers):
        log.warning("twilio: refused a connection without a valid X-Twilio-Signature for %s", ws.url.path)
        await ws.close(code=CLOSE_POLICY, reason="bad signature")
        return
    try:
        slot = app.state.admission.admit(transport)
    except CallRefused as refused:  # at calls.max_concurrent, or draining: the provider tries elsewhere
        await ws.accept()
        await close_socket(ws, CLOSE_TRY_AGAIN, str(refused))
        return
    try:
        await _serve_admitted(ws, transport)
    finally:
        slot.release()


async def _serve_admitted(ws: WebSocket, transport: str) -> None:
    app = ws.app
    await ws.accept()
    address = client_address(ws.client)
    try:
        with app.state.client_slots.slot(address):
            await _serve_accepted(ws, transport)
    except TooManyConnections as exc:
        log.warning("%s: refused a connection: %s", transport, exc)
        await close_socket(ws, CLOSE_TRY_AGAIN, f"too many connections from {address}")


async def _serve_accepted(ws: WebSocket, transport: str) -> None:
    app = ws.app
    try:
        resources = await asyncio.to_thread(call_resources, app.state.runtime)
    except Exception as exc:
        log.warning("%s: call refused: %s", transport, exc)
        await close_socket(ws, CLOSE_TRY_AGAIN, "not ready: models are loading")
        return
    settings = app.state.settings
    serializer = make_serializer(transport, max_frame_bytes=settings.calls.max_frame_bytes)
    conn = Connection(ws, transport, serializer, settings, resources, app.state.calls, app.state.observers)
    try:
        await conn.run()
    except Exception:  # a bug in one call must not take the process (or other calls) down
        log.exception("%s: call failed", transport)
        await close_socket(ws, CLOSE_INTERNAL, "internal error")
    finally:
        await conn.cleanup()
