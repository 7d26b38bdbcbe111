"""The `/sip` WebSocket endpoint (subprotocol `sip`) and what its connections share: the settings of each
dialled agent, the digest checker, and the live SIP calls (for `sip.max_calls` and the server's shutdown)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request, WebSocket

from voicepipe.auth import check_http_token, token_ok
from voicepipe.transports.connection import CLOSE_POLICY, CLOSE_TRY_AGAIN
from voicepipe.transports.limits import TooManyConnections, client_address
from voicepipe.transports.sip.digest import DigestServer
from voicepipe.transports.sip.flow import SipFlow
from voicepipe.transports.sip.message import Request as SipRequest
from voicepipe.transports.sip.message import parse_address
from voicepipe.transports.webrtc.signalling import ice_servers_json

log = logging.getLogger(__name__)

SUBPROTOCOL = "sip"  # RFC 7118 section 4
DEFAULT_REALM = "voicepipe"


class SipService:
    """Kept on `app.state.sip`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.settings = app.state.settings
        sip = self.settings.sip
        users = {user: password.get_secret_value() for user, password in sip.users.items()}
        self.digest = DigestServer(sip.domain or DEFAULT_REALM, users) if users else None
        self.calls: set = set()  # live SipCalls, from the 100 Trying on
        self.tasks: set[asyncio.Task] = set()  # calls being answered or running
        self._agents = {name: self._agent_settings(agent) for name, agent in sip.agents.items()}

    def _agent_settings(self, agent) -> Any:
        calls = self.settings.calls.model_copy(update=agent.overrides())  # checked with the settings (config.py)
        return self.settings.model_copy(update={"calls": calls})

    def call_settings(self, agent: str) -> Any:
        """The settings a call to `agent` (the dialled user part) runs with: `sip.agents` over `calls`."""
        return self._agents.get(agent, self.settings)

    @staticmethod
    def start_fields(invite: SipRequest, agent: str) -> dict[str, Any]:
        """What the call's record keeps of the INVITE (its metadata)."""
        caller = parse_address(invite.get("From") or "")
        return {"metadata": {"sip_to": agent[:64], "sip_from": caller.uri[:200],
                             "sip_name": caller.display.strip('"')[:100]}}

    def track(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


def create_sip_router(app: FastAPI) -> APIRouter:
    """`/sip` (the WebSocket) and `/sip/config` (for the web phone); an empty router when `sip.enabled` is off."""
    router = APIRouter()
    if not app.state.settings.sip.enabled:
        return router
    app.state.sip = SipService(app)

    @router.websocket("/sip")
    async def sip(ws: WebSocket) -> None:
        service: SipService = ws.app.state.sip
        if not token_ok(service.settings, ws.headers, ws.query_params):
            log.warning("sip: refused a connection with a missing or wrong token")
            await ws.close(code=CLOSE_POLICY, reason="unauthorized")
            return
        if SUBPROTOCOL not in ws.scope.get("subprotocols", []):
            log.warning("sip: refused a connection that did not ask for the 'sip' subprotocol")
            await ws.close(code=CLOSE_POLICY, reason="the WebSocket subprotocol must be 'sip' (RFC 7118)")
            return
        await ws.accept(subprotocol=SUBPROTOCOL)
        address = client_address(ws.client)
        try:
            with ws.app.state.client_slots.slot(address):  # calls.max_connections_per_client, as on every link
                await SipFlow(ws, service).run()
        except TooManyConnections as exc:
            log.warning("sip: refused a connection: %s", exc)
            await ws.close(code=CLOSE_TRY_AGAIN, reason=f"too many connections from {address}")

    @router.get("/sip/config")
    async def config(request: Request) -> dict:
        """What the SIP web phone needs: the domain (None: any, use the page's host), whether digest credentials
        are asked for, the agents configured by name, and the ICE servers for the peer connection."""
        check_http_token(request)
        sip = request.app.state.settings.sip
        return {"domain": sip.domain, "auth": bool(sip.users), "agents": sorted(sip.agents) or ["agent"],
                "iceServers": ice_servers_json(request.app.state.settings)}

    return router


async def hang_up_sip_calls(app: FastAPI, reason: str = "shutdown", timeout_s: float = 5.0) -> None:
    """End every live SIP call as a hang-up would (with a BYE where its WebSocket is still open), then cancel any
    that lingers."""
    service: SipService | None = getattr(app.state, "sip", None)
    if service is None or not service.tasks:
        return
    log.info("sip: hanging up %d call(s): %s", len(service.calls), reason)
    for call in list(service.calls):
        call.hang_up(reason)
    tasks = list(service.tasks)
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
