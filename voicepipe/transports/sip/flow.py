"""One SIP-over-WebSocket connection (RFC 7118; a "flow" in RFC 5626's words): reads SIP messages, runs them
through its transaction table, and answers as a user agent server.

Outside a dialog: REGISTER (200 OK echoing each Contact with its `expires`, its `reg-id` and `+sip.instance`
kept as sent; voicepipe never calls out, so the binding is only remembered for this connection), OPTIONS, and
INVITE (a new `SipCall`); REGISTER and INVITE need digest credentials when `sip.users` is set. Inside one: the
call's dialog answers (dialog.py). CANCEL finds its INVITE by transaction. What cannot be taken gets the
answer a real UAS gives: 400 (malformed, with what is wrong), 513 (too large), 481 (no such dialog or
transaction), 405 (a method voicepipe does not serve), 416, 420, 483, 486 (over `sip.max_calls`), 488 (an SDP it
cannot answer), 404 (another domain). A message too broken to answer is dropped with a log line. A CRLF CRLF
keep-alive gets its CRLF (RFC 5626 4.4.1).

Nothing one connection sends reaches another's calls; an unexpected error answers 500 and the connection
carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import WebSocket

from voicepipe.pipeline.admission import CallRefused
from voicepipe.transports.sip.dialog import MIN_SESSION_EXPIRES_S, SipCall, session_expires, wants_session_timer
from voicepipe.transports.sip.message import (
    REASONS,
    Request,
    Response,
    SipError,
    parse,
    parse_address,
    parse_count,
    parse_uri,
    response_to,
)
from voicepipe.transports.sip.transactions import ServerTransaction, TransactionTable, has_rfc3261_branch, new_tag
from voicepipe.transports.webrtc.signalling import BadOffer, check_sdp

log = logging.getLogger(__name__)

KEEPALIVE_PING = "\r\n\r\n"
SUPPORTED_EXTENSIONS = frozenset({"timer"})
MAX_BINDINGS = 16  # registered contacts remembered per connection
DIALOG_METHODS = frozenset({"BYE", "INFO", "UPDATE", "PRACK"})  # never outside a dialog: 481 there
DEFAULT_REGISTER_EXPIRES_S = 3600  # RFC 3261 10.2.1.1, when the phone names none


class SipFlow:
    """The user agent server of one WebSocket connection; `service` is what every connection shares (service.py)."""

    ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, UPDATE, REGISTER"

    def __init__(self, ws: WebSocket, service) -> None:
        self.ws = ws
        self.service = service
        self.settings = service.settings
        client = ws.client
        self.peer = f"{client.host}:{client.port}" if client else "?"
        self.transport = "WSS" if ws.url.scheme == "wss" else "WS"
        self.host = ws.url.hostname or "voicepipe.invalid"
        self.transactions = TransactionTable(self.send)
        self.dialogs: dict[tuple[str, str, str], SipCall] = {}
        self.bindings: dict[str, tuple[str, float]] = {}  # contact URI -> (Contact as sent, when it expires)
        self.closed = False
        self._out: asyncio.Queue[str | None] = asyncio.Queue()

    # -- the connection -------------------------------------------------------------------------------------------
    async def run(self) -> None:
        writer = asyncio.create_task(self._writer(), name=f"sip-writer-{self.peer}")
        log.info("sip: %s connected", self.peer)
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                text = message.get("text")
                if text is None:
                    data = message.get("bytes") or b""
                    text = data.decode("utf-8", errors="replace")  # RFC 7118 allows binary frames of UTF-8
                self.on_text(text)
        finally:
            self.closed = True
            log.info("sip: %s disconnected (%d call(s) on it)", self.peer, len(self.dialogs))
            for call in list(self.dialogs.values()):
                call.connection_lost()
            self._out.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer, 2.0)

    async def _writer(self) -> None:
        while (text := await self._out.get()) is not None:
            try:
                await self.ws.send_text(text)
            except Exception as exc:  # the phone went away; the read loop sees the disconnect
                log.info("sip: %s: send failed (%s)", self.peer, type(exc).__name__)
                self.closed = True
                return

    def send(self, message: Request | Response | str) -> None:
        if not self.closed:
            self._out.put_nowait(message if isinstance(message, str) else message.serialize())

    def via(self, branch: str) -> str:
        return f"SIP/2.0/{self.transport} {self.host};branch={branch}"

    @property
    def domain(self) -> str:
        """The host of voicepipe's own SIP URIs: `sip.domain`, else the host the phone connected to."""
        return self.settings.sip.domain or self.host

    def contact(self, user: str) -> str:
        return f"<sip:{user}@{self.domain};transport={self.transport.lower()}>"

    def forget(self, call: SipCall) -> None:
        if self.dialogs.get(call.dialog_id) is call:
            del self.dialogs[call.dialog_id]
        self.service.calls.discard(call)
        if call.slot is not None:
            call.slot.release()

    # -- one message ----------------------------------------------------------------------------------------------
    def on_text(self, text: str) -> None:
        if not text.strip("\r\n"):
            if KEEPALIVE_PING in text:
                self.send("\r\n")
            return
        message = None
        try:
            message = parse(text, self.settings.sip.max_message_bytes)
            if isinstance(message, Response):
                self._on_response(message)
            else:
                self._on_request(message)
        except SipError as exc:
            self._refuse(exc)
        except Exception:  # a bug must cost this message, not the connection or its calls
            log.exception("sip: %s: failed on %r", self.peer, text[:80])
            if isinstance(message, Request) and message.method != "ACK":
                self.send(response_to(message, 500, to_tag=new_tag()))

    def _refuse(self, exc: SipError) -> None:
        """A message `parse` refused: answered outside any transaction when it is a request we can answer."""
        request = exc.request
        if request is None or request.method == "ACK" or not request.has("Via"):  # nothing a response could match
            log.warning("sip: %s: dropped a message: %s", self.peer, exc.reason)
            return
        log.warning("sip: %s: %s %s refused: %d %s", self.peer, request.method, request.uri[:60], exc.status,
                    exc.reason)
        self.send(response_to(request, exc.status, exc.reason, to_tag=new_tag()))

    def _on_response(self, response: Response) -> None:
        """Responses to the BYEs we send: nothing more to do than note them."""
        method = response.cseq[1]
        level = logging.INFO if response.status < 300 else logging.WARNING
        log.log(level, "sip: %s: %s answered %d %s", self.peer, method, response.status, response.reason[:60])

    def _on_request(self, request: Request) -> None:
        if not has_rfc3261_branch(request):
            if request.method != "ACK":
                self.send(response_to(request, 400, "Bad Request (the Via has no z9hG4bK branch)", to_tag=new_tag()))
            return
        tx = self.transactions.receive(request)
        if tx is None:
            return  # a retransmission, absorbed
        if request.method == "ACK":
            call = self.dialogs.get((request.call_id, request.to_tag or "", request.from_tag or ""))
            if call is not None:
                call.on_ack(request)
            return
        refusal = self._precheck(request)
        if refusal is not None:
            self._respond(tx, *refusal)
        elif request.method == "CANCEL":
            self._on_cancel(tx)
        elif request.to_tag:
            call = self.dialogs.get((request.call_id, request.to_tag, request.from_tag or ""))
            if call is None:
                self._respond(tx, 481)
            else:
                call.on_request(tx)
        elif request.method == "REGISTER":
            self._on_register(tx)
        elif request.method == "OPTIONS":
            self._respond(tx, 200, headers=[("Allow", self.ALLOW), ("Accept", "application/sdp"),
                                            ("Supported", "timer")])
        elif request.method == "INVITE":
            self._on_invite(tx)
        elif request.method in DIALOG_METHODS:
            self._respond(tx, 481)
        else:
            self._respond(tx, 405, headers=[("Allow", self.ALLOW)])

    def _precheck(self, request: Request) -> tuple[int, str | None, list[tuple[str, str]]] | None:
        """What every request must pass first (RFC 3261 8.2.1-8.2.2 and 16.3): (status, reason, headers) or None."""
        uri = parse_uri(request.uri)
        if uri is None or uri.scheme not in ("sip", "sips"):
            return 416, None, []
        if request.get("Max-Forwards") == "0" and request.method != "OPTIONS":
            return 483, None, []
        unsupported = [e for e in request.values("Require") if e.lower() not in SUPPORTED_EXTENSIONS]
        if unsupported and request.method != "CANCEL":
            return 420, None, [("Unsupported", ", ".join(unsupported))]
        domain = self.settings.sip.domain
        if domain and not request.to_tag and request.method in ("REGISTER", "INVITE") and uri.host != domain.lower():
            return 404, f"Not Found (this is {domain})", []
        return None

    def _respond(self, tx: ServerTransaction, status: int, reason: str | None = None,
                 headers: list[tuple[str, str]] | None = None, body: str = "") -> None:
        self.transactions.respond(tx, response_to(tx.request, status, reason, to_tag=tx.to_tag, headers=headers,
                                                  body=body))

    def _authorized(self, tx: ServerTransaction) -> bool:
        """True when digest auth is off or the request's credentials hold; otherwise it is answered 401."""
        digest = self.service.digest
        if digest is None:
            return True
        result = digest.check(tx.request)
        if result.user is not None:
            return True
        log.info("sip: %s: %s challenged: %s", self.peer, tx.request.method, result.why)
        self._respond(tx, 401, headers=[("WWW-Authenticate", digest.challenge(stale=result.stale))])
        return False

    # -- outside dialogs ------------------------------------------------------------------------------------------
    def _on_register(self, tx: ServerTransaction) -> None:
        if not self._authorized(tx):
            return
        request = tx.request
        default = parse_count(request.get("Expires"))
        default = DEFAULT_REGISTER_EXPIRES_S if default is None else default
        longest = self.settings.sip.register_expires_s
        now = time.monotonic()
        for value in request.values("Contact"):
            address = parse_address(value)
            if address.uri == "*":
                if default != 0:
                    self._respond(tx, 400, "Bad Request (Contact: * needs Expires: 0)")
                    return
                self.bindings.clear()
                continue
            seconds = parse_count(address.params.get("expires"))
            seconds = default if seconds is None else seconds
            if seconds == 0:
                self.bindings.pop(address.uri, None)
            elif address.uri and (address.uri in self.bindings or len(self.bindings) < MAX_BINDINGS):
                self.bindings[address.uri] = (value, now + min(seconds, longest))
        for uri in [u for u, (_, until) in self.bindings.items() if until <= now]:
            del self.bindings[uri]
        contacts = [("Contact", parse_address(value).with_params(expires=str(max(1, round(until - now)))))
                    for value, until in self.bindings.values()]
        log.info("sip: %s: REGISTER %s: %d binding(s)", self.peer, request.get("To", "")[:80], len(contacts))
        self._respond(tx, 200, headers=contacts)

    def _on_invite(self, tx: ServerTransaction) -> None:
        request = tx.request
        if not self._authorized(tx):
            return
        sip = self.settings.sip
        if sip.max_calls is not None and len(self.service.calls) >= sip.max_calls:
            log.warning("sip: %s: INVITE refused: %d SIP call(s) live (sip.max_calls)", self.peer, sip.max_calls)
            self._respond(tx, 486, "Busy Here (no more calls)")
            return
        content_type = (request.get("Content-Type") or "").partition(";")[0].strip().lower()
        if not request.body.strip():
            self._respond(tx, 488, "Not Acceptable Here (an INVITE without an SDP offer)")
            return
        if content_type != "application/sdp":
            self._respond(tx, 415, headers=[("Accept", "application/sdp")])
            return
        try:
            check_sdp(request.body)
        except BadOffer as exc:
            self._respond(tx, 488, f"Not Acceptable Here ({exc})")
            return
        if wants_session_timer(request) and session_expires(request)[0] < MIN_SESSION_EXPIRES_S:
            self._respond(tx, 422, headers=[("Min-SE", str(MIN_SESSION_EXPIRES_S))])
            return
        try:
            slot = self.service.app.state.admission.admit("sip")  # calls.max_concurrent, or a draining server
        except CallRefused as refused:
            self._respond(tx, refused.sip_status, f"{REASONS[refused.sip_status]} ({refused})")
            return
        agent = parse_uri(request.uri).user or "agent"
        call = SipCall(self, tx, agent, self.service.call_settings(agent), self.service.start_fields(request, agent))
        call.slot = slot
        self._respond(tx, 100)
        self.dialogs[call.dialog_id] = call
        self.service.calls.add(call)
        self.service.track(asyncio.create_task(call.answer(), name=f"sip-answer-{call.call_id}"))

    def _on_cancel(self, tx: ServerTransaction) -> None:
        invite = self.transactions.invite_for(tx.request)
        if invite is None:
            self._respond(tx, 481)
            return
        tx.to_tag = invite.to_tag  # RFC 3261 9.2: the CANCEL's answer carries the INVITE's To tag
        self._respond(tx, 200)
        call = self.dialogs.get((invite.request.call_id, invite.to_tag, invite.request.from_tag or ""))
        if call is not None:
            call.cancel()
