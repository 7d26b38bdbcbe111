"""WebRTC signalling: `POST /webrtc/offer` (SDP offer in, SDP answer out) and `GET /webrtc/config`.

The client POSTs `{"sdp", "type": "offer"}` once its ICE gathering is complete (aiortc has no trickle
ICE), optionally with the call's `call_id`, `system_prompt`, `greeting` and `metadata` (as in the native
protocol's `start`), and gets `{"sdp", "type": "answer", "call_id"}` back. The call itself runs in the
background as a `Connection` over a `PeerLink` until the peer hangs up, fails, or the call ends.

A bad offer (not JSON, no SDP, no audio section, SDP aiortc cannot apply) gets HTTP 400 with the reason
and a log line; a missing or wrong token gets 401, as on the other call endpoints.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription
from fastapi import APIRouter, FastAPI, HTTPException, Request

from voicepipe.auth import check_http_token
from voicepipe.http_errors import error_responses
from voicepipe.pipeline import call_resources
from voicepipe.pipeline.admission import CallRefused
from voicepipe.transports.connection import Connection
from voicepipe.transports.events import ProtocolError
from voicepipe.transports.limits import TooManyConnections, client_address
from voicepipe.transports.serializers.native import NativeSerializer
from voicepipe.transports.webrtc import dtmf
from voicepipe.transports.webrtc.link import PeerLink

log = logging.getLogger(__name__)

MAX_OFFER_BYTES = 64 * 1024
START_FIELDS = ("call_id", "system_prompt", "greeting", "metadata", "turn_policy", "tools", "tool_choice",
                "max_reply_tokens")
# The body, for the OpenAPI description (parse_offer reads it itself: its checks are the ones that count)
OFFER_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["sdp", "type"], "properties": {
        "sdp": {"type": "string"}, "type": {"type": "string", "enum": ["offer"]},
        "call_id": {"type": "string", "maxLength": 128}, "system_prompt": {"type": "string"},
        "greeting": {"type": ["string", "null"]}, "metadata": {"type": "object"},
        "turn_policy": {"type": "string"}, "tools": {"type": "array"}, "tool_choice": {"type": "string"}}}}}}}


class BadOffer(ValueError):
    """The offer cannot start a call; the message says why (sent back with HTTP 400)."""


def create_webrtc_router(app: FastAPI) -> APIRouter:
    """The WebRTC endpoints; live peer calls are kept on `app.state.webrtc_calls`."""
    app.state.webrtc_calls = {}  # task -> its PeerLink
    router = APIRouter(responses=error_responses(400, 401, 429, 503))

    @router.get("/webrtc/config")
    async def config(request: Request) -> dict:
        """What a browser needs for its `RTCPeerConnection` (the same ICE servers the server uses)."""
        check_http_token(request)
        return {"iceServers": ice_servers_json(request.app.state.settings)}

    @router.post("/webrtc/offer", openapi_extra=OFFER_BODY)
    async def offer(request: Request) -> dict:
        check_http_token(request)
        try:
            body, start = parse_offer(await request.body())
        except BadOffer as exc:
            log.warning("webrtc: bad offer from %s: %s", request.client.host if request.client else "?", exc)
            raise HTTPException(400, str(exc)) from None
        try:
            slot = request.app.state.admission.admit("webrtc")
        except CallRefused as refused:  # at calls.max_concurrent, or draining
            raise HTTPException(503, str(refused)) from None
        slots, address = request.app.state.client_slots, client_address(request.client)
        try:
            slots.acquire(address)  # held until the peer call ends
        except TooManyConnections as exc:
            slot.release()
            log.warning("webrtc: refused an offer: %s", exc)
            raise HTTPException(429, str(exc)) from None

        def release() -> None:
            slots.release(address)
            slot.release()

        try:
            return await _start_call(request.app, body["sdp"], start, release)
        except BaseException:
            release()
            raise

    return router


async def _start_call(app, sdp: str, start: dict[str, Any], on_end) -> dict:
    """The call's resources (503 while the models load), then `answer`."""
    try:
        resources = await asyncio.to_thread(call_resources, app.state.runtime)
    except Exception as exc:
        log.warning("webrtc: call refused: %s", exc)
        raise HTTPException(503, "not ready: models are loading") from None
    return await answer(app, sdp, start, resources, on_end)


def ice_servers_json(settings) -> list[dict[str, Any]]:
    out = []
    for server in settings.calls.ice_servers:
        entry: dict[str, Any] = {"urls": list(server.urls)}
        if server.username is not None:
            entry["username"] = server.username
        if server.credential is not None:
            entry["credential"] = server.credential.get_secret_value()
        out.append(entry)
    return out


def parse_offer(raw: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The offer's JSON body and its native `start` fields, checked; `BadOffer` says what is wrong."""
    if len(raw) > MAX_OFFER_BYTES:
        raise BadOffer(f"offer too large ({len(raw)} bytes > {MAX_OFFER_BYTES})")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadOffer("the body is not JSON: expected {\"sdp\": ..., \"type\": \"offer\"}") from None
    if not isinstance(body, dict):
        raise BadOffer("expected a JSON object {\"sdp\": ..., \"type\": \"offer\"}")
    if body.get("type") != "offer":
        raise BadOffer(f"type must be 'offer', got {body.get('type')!r}"[:100])
    check_sdp(body.get("sdp"))
    return body, start_fields(body)


def check_sdp(sdp: Any) -> None:
    """Raise `BadOffer` unless `sdp` parses and offers audio with ICE credentials."""
    if not isinstance(sdp, str) or not sdp.strip():
        raise BadOffer("sdp must be a non-empty string")
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # the parser raises whatever it trips on
        raise BadOffer(f"unparsable SDP ({type(exc).__name__})") from None
    audio = [m for m in parsed.media if m.kind == "audio"]
    if not audio:
        raise BadOffer("the SDP offers no audio section")
    if not any(m.rtp.codecs for m in audio):
        raise BadOffer("the SDP's audio section lists no codec")


def start_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The native `start` fields of the offer, checked as the native protocol checks them."""
    start = {k: body[k] for k in START_FIELDS if k in body}
    if not isinstance(start.get("call_id", ""), str) or len(start.get("call_id", "")) > 128:
        raise BadOffer("call_id must be a string of at most 128 characters")
    start.setdefault("call_id", f"rtc-{uuid.uuid4().hex[:16]}")
    try:
        NativeSerializer().decode(json.dumps({"type": "start", **start}))
    except ProtocolError as exc:
        raise BadOffer(exc.reason) from None
    return start


def peer_connection(settings) -> RTCPeerConnection:
    dtmf.negotiate()
    servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
               for s in ice_servers_json(settings)]
    return RTCPeerConnection(RTCConfiguration(iceServers=servers))


async def open_peer(settings, sdp: str, start: dict[str, Any], label: str) -> PeerLink:
    """A peer connection that has answered the offer `sdp`, as the link its call will run on (the SIP endpoint
    opens its calls' peers here too). Raises `BadOffer` when aiortc cannot apply the offer."""
    link = PeerLink(peer_connection(settings), start, label)
    try:
        await link.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await link.pc.setLocalDescription(await link.pc.createAnswer())
        link.listen_for_keys(dtmf.telephone_event_types(link.pc.localDescription.sdp))
    except Exception as exc:  # SDP aiortc cannot apply: no usable codec, missing ICE credentials, ...
        await link.close()
        raise BadOffer(f"cannot apply the SDP offer: {exc}"[:200]) from None
    return link


async def answer(app, sdp: str, start: dict[str, Any], resources, on_end: Callable[[], None]) -> dict:
    """Apply the offer, start the call in the background, and return the answer; `on_end()` runs once the call
    has ended (only when this returns: on an error the caller still owns what `on_end` releases)."""
    label = f"webrtc {start['call_id']}"
    try:
        link = await open_peer(app.state.settings, sdp, start, label)
    except BadOffer as exc:
        log.warning("webrtc: %s: offer rejected: %s", label, exc)
        raise HTTPException(400, str(exc)) from None
    settings = app.state.settings
    conn = Connection(link, "webrtc", NativeSerializer(max_frame_bytes=settings.calls.max_frame_bytes), settings,
                      resources, app.state.calls, app.state.observers)
    task = asyncio.create_task(serve_peer_call(conn, link), name=f"webrtc-{start['call_id']}")
    calls: dict = app.state.webrtc_calls
    calls[task] = link

    def ended(t: asyncio.Task) -> None:
        calls.pop(t, None)
        on_end()

    task.add_done_callback(ended)
    local = link.pc.localDescription
    return {"sdp": local.sdp, "type": local.type, "call_id": start["call_id"]}


async def hang_up_webrtc_calls(app, reason: str = "shutdown", timeout_s: float = 5.0) -> None:
    """End every live WebRTC call as a hang-up would (the server is stopping), then cancel any that lingers."""
    calls: dict = getattr(app.state, "webrtc_calls", {})
    if not calls:
        return
    log.info("webrtc: hanging up %d call(s): %s", len(calls), reason)
    for link in list(calls.values()):
        link.hang_up(reason)
    tasks = list(calls)
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def serve_peer_call(conn: Connection, link: PeerLink, ended: Callable[[], None] | None = None) -> None:
    """Run the call on `link` until it ends, then release the call and the peer connection. `ended` is called
    between the two (the SIP dialog sends its BYE there, before the media goes)."""
    try:
        await conn.run()
    except Exception:  # a bug in one call must not take the process (or other calls) down
        log.exception("%s: call failed", link.label)
    finally:
        await conn.cleanup()
        if ended is not None:
            ended()
        await link.close()
