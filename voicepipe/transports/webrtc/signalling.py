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
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription
from fastapi import APIRouter, FastAPI, HTTPException, Request

from voicepipe.auth import check_http_token
from voicepipe.pipeline import call_resources
from voicepipe.transports.connection import Connection
from voicepipe.transports.events import ProtocolError
from voicepipe.transports.serializers.native import NativeSerializer
from voicepipe.transports.webrtc import dtmf
from voicepipe.transports.webrtc.link import PeerLink

log = logging.getLogger(__name__)

MAX_OFFER_BYTES = 64 * 1024
START_FIELDS = ("call_id", "system_prompt", "greeting", "metadata", "turn_policy", "tools", "tool_choice")


class BadOffer(ValueError):
    """The offer cannot start a call; the message says why (sent back with HTTP 400)."""


def create_webrtc_router(app: FastAPI) -> APIRouter:
    """The WebRTC endpoints; live peer calls are kept on `app.state.webrtc_calls`."""
    app.state.webrtc_calls = {}  # task -> its PeerLink
    router = APIRouter()

    @router.get("/webrtc/config")
    async def config(request: Request) -> dict:
        """What a browser needs for its `RTCPeerConnection` (the same ICE servers the server uses)."""
        check_http_token(request)
        return {"iceServers": ice_servers_json(request.app.state.settings)}

    @router.post("/webrtc/offer")
    async def offer(request: Request) -> dict:
        check_http_token(request)
        try:
            body, start = parse_offer(await request.body())
        except BadOffer as exc:
            log.warning("webrtc: bad offer from %s: %s", request.client.host if request.client else "?", exc)
            raise HTTPException(400, str(exc)) from None
        try:
            resources = await asyncio.to_thread(call_resources, request.app.state.runtime)
        except Exception as exc:
            log.warning("webrtc: call refused: %s", exc)
            raise HTTPException(503, "not ready: models are loading") from None
        return await answer(request.app, body["sdp"], start, resources)

    return router


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


async def answer(app, sdp: str, start: dict[str, Any], resources) -> dict:
    """Apply the offer, start the call in the background, and return the answer."""
    pc = peer_connection(app.state.settings)
    label = f"webrtc {start['call_id']}"
    link = PeerLink(pc, start, label)
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        link.listen_for_keys(dtmf.telephone_event_types(pc.localDescription.sdp))
    except Exception as exc:  # SDP aiortc cannot apply: no usable codec, missing ICE credentials, ...
        await link.close()
        log.warning("webrtc: %s: offer rejected: %s", label, exc)
        raise HTTPException(400, f"cannot apply the SDP offer: {exc}"[:200]) from None
    conn = Connection(link, "webrtc", NativeSerializer(), app.state.settings, resources, app.state.calls,
                      app.state.observers)
    task = asyncio.create_task(_serve(conn, link), name=f"webrtc-{start['call_id']}")
    calls: dict = app.state.webrtc_calls
    calls[task] = link
    task.add_done_callback(lambda t: calls.pop(t, None))
    local = pc.localDescription
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


async def _serve(conn: Connection, link: PeerLink) -> None:
    try:
        await conn.run()
    except Exception:  # a bug in one call must not take the process (or other calls) down
        log.exception("%s: call failed", link.label)
    finally:
        await conn.cleanup()
        await link.close()
