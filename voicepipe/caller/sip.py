"""The SIP caller, for `voicepipe call --transport sip` and the benches: a SIP-over-WebSocket user agent client
(RFC 7118) whose media is an aiortc peer, so a call is the WebRTC caller (`PeerClient`) with SIP signalling.

Opening it connects to `/sip` (subprotocol `sip`), REGISTERs when asked, sends the INVITE with the SDP offer
(answering a 401 with digest credentials once), ACKs the 200 OK and waits for the media. `setup_ms` is the
first INVITE sent to its 200 OK. A native `stop` sent on it hangs up with a BYE; a BYE from the server ends the
call (its Reason text becomes `close_reason`). `send_dtmf` sends a key by INFO. There is no data channel: the
server's events are not seen here (the turn sync reads `/calls`).

Call parameters it reads: `to` (the dialled user part, default `agent`), `user` and `password` (the digest
credentials and the From user), `register` (REGISTER first). SIP carries no prompt or greeting: those come
from `sip.agents` on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from voicepipe.caller.webrtc import PeerClient
from voicepipe.transports.sip.digest import authorization
from voicepipe.transports.sip.message import Request, Response, SipError, parse, parse_address, response_to

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 30.0
BYE_GRACE_S = 2.0  # the media may close this long before the BYE that says why is read
MAX_MESSAGE_BYTES = 1 << 20


def sip_url(url: str) -> str:
    """`url` (ws(s):// or http(s)://) as the `/sip` WebSocket URL, unless it names a path."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else "/sip"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class SipPeerClient(PeerClient):
    """One outgoing call over SIP; an async context manager, like `PeerClient`."""

    events_channel = False

    def __init__(self, url: str, call_id: str, params: dict[str, Any], token: str | None = None) -> None:
        super().__init__(url, call_id, params, token)
        self.url = sip_url(url)
        self.domain = urlsplit(self.url).hostname or "voicepipe"
        self.agent = str(params.get("to", "agent"))
        self.user = str(params.get("user", "caller"))
        self.password = params.get("password")
        self.register_first = bool(params.get("register", False))
        self.host = f"{secrets.token_hex(6)}.invalid"
        self.scheme = "wss" if self.url.startswith("wss") else "ws"
        self.local_tag = secrets.token_hex(6)
        self.cseq = 0
        self.ws = None
        self.dialog: Response | None = None  # the INVITE's 200 OK
        self.server_call_id: str | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[str, asyncio.Future[Response]] = {}  # branch -> its final response
        self._ack: Request | None = None
        self.received_requests: list[Request] = []

    # -- signalling ----------------------------------------------------------------------------------------------
    async def exchange(self, offer: str) -> str:
        from websockets.asyncio.client import connect

        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        self.ws = await connect(self.url, subprotocols=["sip"], additional_headers=headers, open_timeout=30)
        self._reader = asyncio.create_task(self._read())
        if self.register_first:
            register = await self.request("REGISTER", f"sip:{self.domain}", to=self._aor(self.user),
                                          headers=[("Contact", self._contact() + ";expires=600")])
            if register.status != 200:
                raise ConnectionError(f"REGISTER answered {register.status} {register.reason}")
        ok = await self.request("INVITE", f"sip:{self.agent}@{self.domain}", to=self._aor(self.agent),
                                headers=[("Contact", self._contact()), ("Content-Type", "application/sdp")],
                                body=offer)
        if ok.status != 200:
            raise ConnectionError(f"INVITE answered {ok.status} {ok.reason}")
        self.dialog = ok
        self.server_call_id = ok.get("X-Voicepipe-Call-Id")
        self._ack = self._in_dialog("ACK", ok.cseq[0])
        await self._send(self._ack)
        return ok.body

    async def request(self, method: str, uri: str, *, to: str, headers: list[tuple[str, str]] | None = None,
                      body: str = "") -> Response:
        """Send a request outside the dialog and wait for its final response; a 401 is answered once."""
        response = await self._transact(self._outside(method, uri, to, headers, body))
        if response.status == 401 and self.password is not None:
            challenge = response.get("WWW-Authenticate") or ""
            credentials = authorization(challenge, method, uri, self.user, str(self.password))
            response = await self._transact(self._outside(method, uri, to, headers, body,
                                                          [("Authorization", credentials)]))
        return response

    async def send_dtmf(self, digit: str, content_type: str = "application/dtmf-relay") -> Response:
        body = f"Signal={digit}\r\nDuration=160\r\n" if content_type == "application/dtmf-relay" else digit
        return await self._transact(self._in_dialog("INFO", headers=[("Content-Type", content_type)], body=body))

    async def hang_up(self) -> None:
        """BYE; the call is over once it is answered (or after `ANSWER_TIMEOUT_S`)."""
        if self.dialog is None or self._closed.is_set():
            return
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(self._transact(self._in_dialog("BYE")), ANSWER_TIMEOUT_S)
        self._end(1000, "hangup")

    def _aor(self, user: str) -> str:
        return f"<sip:{user}@{self.domain}>"

    def _contact(self) -> str:
        return f"<sip:{self.user}@{self.host};transport={self.scheme}>"

    def _via(self) -> str:
        return f"SIP/2.0/{self.scheme.upper()} {self.host};branch=z9hG4bK{secrets.token_hex(10)}"

    def _outside(self, method: str, uri: str, to: str, headers: list[tuple[str, str]] | None, body: str,
                 extra: list[tuple[str, str]] | None = None) -> Request:
        self.cseq += 1
        head = [("Via", self._via()), ("Max-Forwards", "70"), ("To", to),
                ("From", f"{self._aor(self.user)};tag={self.local_tag}"), ("Call-ID", self.call_id),
                ("CSeq", f"{self.cseq} {method}"), ("Supported", "timer"), *(headers or []), *(extra or [])]
        return Request(headers=head, body=body, method=method, uri=uri)

    def _in_dialog(self, method: str, cseq: int | None = None, headers: list[tuple[str, str]] | None = None,
                   body: str = "") -> Request:
        ok = self.dialog
        if cseq is None:
            self.cseq += 1
            cseq = self.cseq
        target = parse_address(ok.get("Contact") or "").uri
        head = [("Via", self._via()), ("Max-Forwards", "70"), ("To", ok.get("To") or ""),
                ("From", ok.get("From") or ""), ("Call-ID", self.call_id), ("CSeq", f"{cseq} {method}"),
                *(headers or [])]
        return Request(headers=head, body=body, method=method, uri=target)

    async def _transact(self, request: Request) -> Response:
        branch = request.top_via.branch
        future = self._pending[branch] = asyncio.get_running_loop().create_future()
        try:
            await self._send(request)
            return await asyncio.wait_for(future, ANSWER_TIMEOUT_S)
        finally:
            self._pending.pop(branch, None)

    async def _send(self, message: Request | Response) -> None:
        if self.ws is None:
            raise ConnectionError("not connected")
        await self.ws.send(message.serialize())

    async def _read(self) -> None:
        try:
            async for text in self.ws:
                if isinstance(text, bytes):
                    text = text.decode("utf-8", errors="replace")
                if not text.strip("\r\n"):
                    continue
                try:
                    message = parse(text, MAX_MESSAGE_BYTES)
                except SipError as exc:
                    log.warning("sip caller: unreadable message from the server: %s", exc)
                    continue
                await self._on_message(message)
        except Exception as exc:  # the connection dropped
            log.info("sip caller: connection lost (%s)", type(exc).__name__)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("the SIP connection closed"))
            self._end(1006, "the SIP connection closed")

    async def _on_message(self, message: Request | Response) -> None:
        if isinstance(message, Response):
            if message.status < 200:
                return
            future = self._pending.get(message.top_via.branch if message.top_via else "")
            if future is not None and not future.done():
                future.set_result(message)
            elif message.cseq[1] == "INVITE" and self._ack is not None:  # a 200 OK retransmitted: ACK again
                await self._send(self._ack)
            return
        self.received_requests.append(message)
        if message.method == "ACK":
            return
        status = {"BYE": 200, "OPTIONS": 200, "INFO": 200, "REFER": 202}.get(message.method, 405)
        await self._send(response_to(message, status))  # a REFER is accepted, not followed: the test reads it
        if message.method == "BYE":
            reason = message.get("Reason") or ""
            text = reason.partition('text="')[2].rstrip('"') or "bye"
            self._end(1000, text)

    def _on_state(self) -> None:
        """Over SIP the call ends with the server's BYE, which says why. The server closes the peer connection right
        after sending it, and under load the media's close can be seen before the WebSocket's BYE is read: with
        the SIP connection up, that close ends the call only if no BYE comes within `BYE_GRACE_S`."""
        state = self.pc.connectionState
        if state in ("failed", "closed") and self.ws is not None and not self._closed.is_set():
            asyncio.get_running_loop().call_later(BYE_GRACE_S, self._end, *self._close_for(state))
            return
        super()._on_state()

    def _end(self, code: int, reason: str) -> None:
        if not self._closed.is_set():
            self.close_code, self.close_reason = code, reason
            self._closed.set()
            self._connected.set()
            self._inbox.put_nowait(None)

    # -- the line ------------------------------------------------------------------------------------------------
    async def send(self, frame: np.ndarray | str) -> None:
        """Audio frames go to the track; a native `stop` hangs up (BYE)."""
        if isinstance(frame, str):
            if json.loads(frame).get("type") == "stop":
                await self.hang_up()
            return
        await super().send(frame)

    async def _shutdown(self) -> None:
        await super()._shutdown()
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
