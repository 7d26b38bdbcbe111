"""Server transactions (RFC 3261 section 17.2, with RFC 6026's Accepted state) for one SIP connection.

A request is matched to a transaction by its top Via's branch and sent-by and its method (an ACK matches the
INVITE it acknowledges). A retransmitted request never reaches the user agent above: the transaction answers
it with its latest response where the RFC says so (an INVITE before its final answer gets the provisional
again, a non-INVITE after its final answer gets that answer again) and swallows it otherwise (an INVITE
already answered 2xx: retransmitting the 200 until the ACK is the dialog's job). The ACK of a non-2xx answer
ends its INVITE transaction here too.

WebSocket is a reliable transport, so a well-behaved client never retransmits; finished transactions are
still kept for 64*T1 (32 s, the unreliable-transport linger) so that a client or proxy that does is absorbed.
The table is bounded. Pure apart from the `send` callback; the clock is injected.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from voicepipe.transports.sip.message import Request, Response

T1_S = 0.5
LINGER_S = 64 * T1_S
MAX_TRANSACTIONS = 512  # per connection: finished ones are dropped first, oldest first
MAGIC_COOKIE = "z9hG4bK"  # RFC 3261 branches start with it


def new_tag() -> str:
    return secrets.token_hex(6)


def new_branch() -> str:
    return MAGIC_COOKIE + secrets.token_hex(10)


@dataclass
class ServerTransaction:
    request: Request
    key: tuple[str, str, str]
    to_tag: str  # the tag this transaction's responses put on To (the request's own when it has one)
    state: str = "proceeding"  # proceeding -> completed (final non-2xx) | accepted (INVITE 2xx) -> confirmed (ACK)
    last_response: Response | None = None
    expires_at: float | None = None
    stored: bool = True  # False for an ACK that matched nothing: it is passed up, never answered

    @property
    def method(self) -> str:
        return self.request.method

    @property
    def answered(self) -> bool:
        return self.state != "proceeding"


class TransactionTable:
    """The server transactions of one connection; `send` writes a response to it."""

    def __init__(self, send: Callable[[Response], None], clock: Callable[[], float] = time.monotonic,
                 limit: int = MAX_TRANSACTIONS) -> None:
        self.send = send
        self.clock = clock
        self.limit = limit
        self._table: OrderedDict[tuple[str, str, str], ServerTransaction] = OrderedDict()
        self.absorbed = 0  # retransmissions the user agent never saw (for tests and logs)

    def receive(self, request: Request) -> ServerTransaction | None:
        """The transaction a new request opens, for the user agent to answer; None when it was absorbed here.
        An ACK that matches no transaction comes back as an unstored one (the ACK of a 2xx, for the dialog).
        The request's top Via must have a branch (`parse` checked that the Via is there)."""
        self._expire()
        key = transaction_key(request)
        existing = self._table.get(key)
        if request.method == "ACK":
            if existing is not None and existing.state == "completed":
                existing.state = "confirmed"
                return None
            if existing is not None and existing.state == "confirmed":
                self.absorbed += 1
                return None
            return ServerTransaction(request, key, request.to_tag or "", stored=False)
        if existing is not None:
            self.absorbed += 1
            if existing.state in ("proceeding", "completed") and existing.last_response is not None:
                self.send(existing.last_response)
            return None
        tx = ServerTransaction(request, key, request.to_tag or new_tag())
        self._table[key] = tx
        self._bound()
        return tx

    def respond(self, tx: ServerTransaction, response: Response) -> bool:
        """Send `response` on `tx`; False (nothing sent) once `tx` has its final answer or for an ACK."""
        if tx.answered or not tx.stored:
            return False
        tx.last_response = response
        if response.status >= 200:
            tx.state = "accepted" if tx.method == "INVITE" and response.status < 300 else "completed"
            tx.expires_at = self.clock() + LINGER_S
        self.send(response)
        return True

    def invite_for(self, cancel: Request) -> ServerTransaction | None:
        """The INVITE transaction a CANCEL names (same branch and sent-by, RFC 3261 9.2)."""
        branch, sent_by, _ = transaction_key(cancel)
        return self._table.get((branch, sent_by, "INVITE"))

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, tx in self._table.items() if tx.expires_at is not None and tx.expires_at <= now]:
            del self._table[key]

    def _bound(self) -> None:
        if len(self._table) <= self.limit:
            return
        finished = [k for k, tx in self._table.items() if tx.answered]
        for key in finished[: len(self._table) - self.limit]:
            del self._table[key]
        while len(self._table) > self.limit:  # all in progress: the oldest stops absorbing retransmissions
            self._table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._table)


def transaction_key(request: Request) -> tuple[str, str, str]:
    via = request.top_via
    branch = via.branch if via is not None else None
    method = "INVITE" if request.method == "ACK" else request.method
    return (branch or "", via.sent_by if via is not None else "", method)


def has_rfc3261_branch(request: Request) -> bool:
    via = request.top_via
    return via is not None and (via.branch or "").startswith(MAGIC_COOKIE) and len(via.branch) > len(MAGIC_COOKIE)
