"""One SIP call: the INVITE dialog (RFC 3261 sections 12-15) bound to a WebRTC peer and the call it carries.

`SipCall.answer` turns the INVITE's SDP offer into an aiortc peer connection (`webrtc.signalling.open_peer`),
answers 200 OK with the SDP answer and starts the call as a `Connection` over the peer's `PeerLink`, exactly
as `/webrtc/offer` does; the call's transport is `sip`. The 200 OK is retransmitted until the ACK comes (13.3.1.4;
no ACK in 32 s ends the call). A CANCEL before the answer gets the INVITE a 487. Then, in the dialog:

- BYE from the phone: 200 OK, and the call ends as a hang-up (`PeerLink.hang_up`);
- the call ending on the server's side (the idle timeout, the agent hanging up, a vanished peer, the server
  stopping): a BYE to the phone, with the reason (RFC 3326);
- INFO with a DTMF body: each key goes into the call as a `Dtmf` event (`PeerLink.key_pressed`);
- UPDATE or re-INVITE: a session refresh (RFC 4028: when the INVITE asked for session timers, the phone
  refreshes and a session not refreshed in time ends); the answer is the SDP already agreed (the peer
  connection is not renegotiated; an ICE restart gets 488).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from typing import Any

from voicepipe.pipeline import call_resources
from voicepipe.transports.connection import Connection
from voicepipe.transports.serializers.native import NativeSerializer
from voicepipe.transports.sip.dtmf import CONTENT_TYPES, BadDtmf, info_digit, media_type
from voicepipe.transports.sip.message import (
    Request,
    Response,
    parse_address,
    parse_count,
    parse_params,
    parse_uri,
    response_to,
)
from voicepipe.transports.sip.transactions import LINGER_S, T1_S, ServerTransaction, new_branch
from voicepipe.transports.webrtc.link import PeerLink
from voicepipe.transports.webrtc.signalling import BadOffer, open_peer, serve_peer_call

log = logging.getLogger(__name__)

T2_S = 4.0  # the longest gap between two retransmissions of the 200 OK
MIN_SESSION_EXPIRES_S = 90  # RFC 4028's Min-SE
CALL_ID = re.compile(r"[A-Za-z0-9._~@:+!%*-]{1,128}")
CALL_ID_HEADER = "X-Voicepipe-Call-Id"  # the call's id in the store and /calls (the SIP Call-ID when it fits)
ICE_CREDENTIALS = re.compile(r"^a=ice-(?:ufrag|pwd):(\S+)", re.MULTILINE)


def session_expires(request: Request) -> tuple[int, str] | None:
    """(interval, refresher) of RFC 4028 asked for by `request`; None when it asks for no session timer."""
    value = request.get("Session-Expires")
    if value is None:
        return None
    number, _, params = value.partition(";")
    interval = parse_count(number)
    if interval is None:
        return None
    return interval, parse_params(params).get("refresher") or "uac"


def wants_session_timer(request: Request) -> bool:
    extensions = {v.lower() for v in request.values("Supported") + request.values("Require")}
    return "timer" in extensions and session_expires(request) is not None


class SipCall:
    """One INVITE dialog on a `SipFlow` (flow.py: the WebSocket it came on), from the 100 Trying to the end of the
    call."""

    def __init__(self, flow, tx: ServerTransaction, agent: str, settings, parameters: dict[str, Any]) -> None:
        invite = tx.request
        self.flow = flow
        self.invite_tx = tx
        self.invite = invite
        self.agent = agent
        self.settings = settings
        self.call_id = invite.call_id if CALL_ID.fullmatch(invite.call_id) else f"sip-{uuid.uuid4().hex[:16]}"
        self.start = {"call_id": self.call_id, **parameters}
        # The dialog (RFC 3261 12.1.1): ids, the phone's address and its route, the CSeq spaces of both ends.
        self.local_tag = tx.to_tag
        self.remote_tag = invite.from_tag or ""
        self.local_address = f"{invite.get('To')};tag={self.local_tag}"
        self.remote_address = invite.get("From") or ""
        contact = parse_address(invite.get("Contact") or "")
        self.remote_target = contact.uri or invite.uri
        self.route_set = invite.values("Record-Route")
        self.remote_cseq = invite.cseq[0]
        self.local_cseq = 0
        self.timer = session_expires(invite) if wants_session_timer(invite) else None
        self.link: PeerLink | None = None
        self.task: asyncio.Task | None = None
        self.slot = None  # its place under calls.max_concurrent (`pipeline.admission.CallSlot`), given back at the end
        self.state = "answering"  # -> answered (200 sent) -> confirmed (ACK) -> ended
        self.ended_by_phone = False
        self._ack_wait: asyncio.TimerHandle | None = None
        self._session_wait: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    @property
    def dialog_id(self) -> tuple[str, str, str]:
        return (self.invite.call_id, self.local_tag, self.remote_tag)

    @property
    def label(self) -> str:
        return f"sip {self.call_id}"

    # -- setting up ---------------------------------------------------------------------------------------------
    async def answer(self) -> None:
        """After the 100 Trying: open the peer, send the 200 OK with the SDP answer, start the call."""
        app = self.flow.service.app
        try:
            resources = await asyncio.to_thread(call_resources, app.state.runtime)
        except Exception as exc:
            log.warning("%s: call refused: %s", self.label, exc)
            self._fail(503, "Service Unavailable (models are loading)", [("Retry-After", "5")])
            return
        if self.state != "answering":  # cancelled meanwhile
            return
        try:
            link = await open_peer(self.settings, self.invite.body, self.start, self.label)
        except BadOffer as exc:
            log.warning("%s: offer rejected: %s", self.label, exc)
            self._fail(488, f"Not Acceptable Here ({exc})"[:120])
            return
        if self.state != "answering":
            await link.close()
            return
        self.link = link
        conn = Connection(link, "sip", NativeSerializer(), self.settings, resources, app.state.calls,
                          app.state.observers)
        self.task = asyncio.create_task(self._serve(conn), name=f"sip-{self.call_id}")
        self.flow.service.track(self.task)
        self._send_ok()

    def _send_ok(self) -> None:
        headers = [("Contact", self.flow.contact(self.agent)), ("Allow", self.flow.ALLOW),
                   ("Supported", "timer"), ("Content-Type", "application/sdp"), (CALL_ID_HEADER, self.call_id)]
        headers += self._timer_headers()
        ok = response_to(self.invite, 200, to_tag=self.local_tag, headers=headers,
                         body=self.link.pc.localDescription.sdp)
        if self.flow.transactions.respond(self.invite_tx, ok):
            self.state = "answered"
            self._retransmit_ok(ok, T1_S, self._loop.time() + LINGER_S)
            self._arm_session_timer()
            log.info("%s: answered (agent %r)", self.label, self.agent)

    def _retransmit_ok(self, ok: Response, interval: float, give_up_at: float) -> None:
        """RFC 3261 13.3.1.4: the 200 OK again at T1, 2*T1, ... (at most T2 apart) until the ACK; none by 64*T1
        ends the call."""
        if self.state != "answered":
            return
        if self._loop.time() >= give_up_at:
            log.warning("%s: no ACK for the 200 OK in %.0f s; ending the call", self.label, LINGER_S)
            self.hang_up("no ACK")
            return
        self._ack_wait = self._loop.call_later(interval, self._resend_ok, ok, interval, give_up_at)

    def _resend_ok(self, ok: Response, interval: float, give_up_at: float) -> None:
        if self.state == "answered":
            self.flow.send(ok)
            self._retransmit_ok(ok, min(2 * interval, T2_S), give_up_at)

    def _fail(self, status: int, reason: str, headers: list[tuple[str, str]] | None = None) -> None:
        self.state = "ended"
        self.flow.transactions.respond(self.invite_tx, response_to(self.invite, status, reason, to_tag=self.local_tag,
                                                                   headers=headers))
        self.flow.forget(self)

    def cancel(self) -> None:
        """A CANCEL arrived before the final answer: 487 for the INVITE, and nothing is set up."""
        if self.state == "answering":
            log.info("%s: cancelled by the phone", self.label)
            self._fail(487, "Request Terminated")

    # -- in the dialog ------------------------------------------------------------------------------------------
    def on_request(self, tx: ServerTransaction) -> None:
        """A request inside this dialog (its To tag is ours); answers it."""
        request = tx.request
        cseq = request.cseq[0]
        if cseq < self.remote_cseq:  # RFC 3261 12.2.2: out of order
            self._respond(tx, 500, "Server Internal Error (CSeq out of order)")
            return
        self.remote_cseq = cseq
        method = request.method
        if method == "BYE":
            self._respond(tx, 200)
            self.ended_by_phone = True
            self.hang_up("hangup")
        elif method == "INFO":
            self._on_info(tx)
        elif method in ("UPDATE", "INVITE"):
            self._on_refresh(tx)
        elif method == "OPTIONS":
            self._respond(tx, 200, headers=[("Allow", self.flow.ALLOW)])
        else:
            self._respond(tx, 405, headers=[("Allow", self.flow.ALLOW)])

    def on_ack(self, ack: Request) -> None:
        if self.state == "answered" and ack.cseq[0] == self.remote_cseq:
            self.state = "confirmed"
            if self._ack_wait is not None:
                self._ack_wait.cancel()

    def _on_info(self, tx: ServerTransaction) -> None:
        request = tx.request
        if not request.body.strip():
            self._respond(tx, 200)  # an empty INFO is a keep-alive
            return
        if media_type(request.get("Content-Type")) not in CONTENT_TYPES:
            self._respond(tx, 415, headers=[("Accept", ", ".join(CONTENT_TYPES))])
            return
        try:
            digit = info_digit(request.get("Content-Type"), request.body)
        except BadDtmf as exc:
            log.info("%s: INFO refused: %s", self.label, exc)
            self._respond(tx, 400, f"Bad Request ({exc})")
            return
        self._respond(tx, 200)
        if self.link is not None:
            log.info("%s: DTMF %s", self.label, digit)
            self.link.key_pressed(digit)

    def _on_refresh(self, tx: ServerTransaction) -> None:
        """UPDATE or re-INVITE: keeps the session (and its timer) going; the media stays as agreed."""
        request = tx.request
        if request.body.strip() and self._ice_restart(request.body):
            self._respond(tx, 488, "Not Acceptable Here (an ICE restart is not supported)")
            return
        if wants_session_timer(request):
            interval, _ = session_expires(request)
            if interval < MIN_SESSION_EXPIRES_S:
                self._respond(tx, 422, headers=[("Min-SE", str(MIN_SESSION_EXPIRES_S))])
                return
            self.timer = (interval, "uac")
        headers = [("Contact", self.flow.contact(self.agent)), *self._timer_headers()]
        body = ""
        if request.body.strip() and self.link is not None:  # an offer: the answer is the SDP already agreed
            headers.append(("Content-Type", "application/sdp"))
            body = self.link.pc.localDescription.sdp
        ok = response_to(request, 200, to_tag=self.local_tag, headers=headers, body=body)
        self.flow.transactions.respond(tx, ok)
        self._arm_session_timer()

    def _ice_restart(self, sdp: str) -> bool:
        return set(ICE_CREDENTIALS.findall(sdp)) != set(ICE_CREDENTIALS.findall(self.invite.body))

    def _respond(self, tx: ServerTransaction, status: int, reason: str | None = None,
                 headers: list[tuple[str, str]] | None = None) -> None:
        self.flow.transactions.respond(tx, response_to(tx.request, status, reason, to_tag=self.local_tag,
                                                       headers=headers))

    # -- session timer (RFC 4028) ---------------------------------------------------------------------------------
    def _timer_headers(self) -> list[tuple[str, str]]:
        if self.timer is None:
            return []
        return [("Session-Expires", f"{self.timer[0]};refresher=uac"), ("Require", "timer")]

    def _arm_session_timer(self) -> None:
        if self._session_wait is not None:
            self._session_wait.cancel()
        if self.timer is not None:
            interval = self.timer[0]
            # The side that does not refresh ends the session shortly before it expires (RFC 4028 10).
            self._session_wait = self._loop.call_later(interval - min(32, interval / 3), self._session_expired)

    def _session_expired(self) -> None:
        log.warning("%s: the phone did not refresh the session in %d s; ending the call", self.label, self.timer[0])
        self.hang_up("session timer expired")

    # -- ending ---------------------------------------------------------------------------------------------------
    def hang_up(self, reason: str) -> None:
        """End the call from either side (a BYE from the phone, a timer, the server stopping)."""
        if self.link is not None:
            self.link.hang_up(reason)

    def connection_lost(self) -> None:
        """The WebSocket is gone: the call ends without a BYE (there is no way left to send one)."""
        if self.state == "answering":
            self.state = "ended"
            self.flow.forget(self)
        elif self.link is not None:
            self.link.hang_up("disconnected")

    async def _serve(self, conn: Connection) -> None:
        try:
            await serve_peer_call(conn, self.link, ended=lambda: self._call_ended(conn))
        finally:
            self._call_ended(conn)
            self.flow.forget(self)

    def _call_ended(self, conn: Connection) -> None:
        """The call is over: a BYE to the phone unless it hung up (sent before the peer connection closes, so the
        phone hears why before its media stops); after a REFER when the agent transferred the caller."""
        self._stop_timers()
        if not self.ended_by_phone and self.state in ("answered", "confirmed"):
            if conn.call is not None and conn.call.transfer_target:
                self._send_refer(conn.call.transfer_target)
            reason = conn.call.end_reason if conn.call is not None else "ended"
            self._send_bye(reason or "ended")
        self.state = "ended"

    def _send_refer(self, target: str) -> None:
        """A blind transfer (RFC 3515, RFC 5589 6): the phone calls `target`; this side hangs up right after."""
        refer_to = transfer_uri(target, self.flow.domain)
        log.info("%s: sending REFER to %s", self.label, refer_to)
        self._send_in_dialog("REFER", [("Refer-To", f"<{refer_to}>"), ("Referred-By", self.local_address)])

    def _send_bye(self, reason: str) -> None:
        """The call ended on this side: tell the phone (RFC 3261 15.1.1), with why (RFC 3326)."""
        text = reason.replace('"', "'")[:100]
        log.info("%s: sending BYE (%s)", self.label, reason)
        self._send_in_dialog("BYE", [("Reason", f'Q.850;cause=16;text="{text}"')])

    def _send_in_dialog(self, method: str, headers: list[tuple[str, str]]) -> None:
        if self.flow.closed:
            return
        self.local_cseq += 1
        head = [("Via", self.flow.via(new_branch())), ("Max-Forwards", "70"), ("From", self.local_address),
                ("To", self.remote_address), ("Call-ID", self.invite.call_id), ("CSeq", f"{self.local_cseq} {method}"),
                *[("Route", route) for route in self.route_set]]
        self.flow.send(Request(headers=head + headers, method=method, uri=self.remote_target))

    def _stop_timers(self) -> None:
        for handle in (self._ack_wait, self._session_wait):
            if handle is not None:
                handle.cancel()


def transfer_uri(target: str, host: str) -> str:
    """The SIP URI of a transfer target: a sip: or sips: URI as it is, else a user part at `host`: a phone number's
    digits, or a name such as "billing department" with its other characters as "-"."""
    target = target.strip()
    uri = parse_uri(target)
    if uri is not None and uri.scheme in ("sip", "sips") and not set(target) & set("<>\r\n"):
        return target
    if re.fullmatch(r"\+?[\d\s().-]+", target):  # a phone number as said: "+1 (555) 010-0100"
        user = re.sub(r"[^\d+]", "", target)
    else:
        user = re.sub(r"[^A-Za-z0-9+._-]+", "-", target).strip("-") or "operator"
    return f"sip:{user}@{host}"
