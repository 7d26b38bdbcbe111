"""A SIP-over-WebSocket test client that writes its requests by hand (so it can write broken ones, retransmit and
cancel at will) and reads the server's messages with a parser of its own, not the server's; and an app served
on loopback without models, for the tests of the SIP endpoint that need no call media."""

from __future__ import annotations

import hashlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

WS_TIMEOUT_S = 5.0


@dataclass
class Message:
    """What the server sent: a response (`status` set) or a request (`method` set), its header fields and body."""

    text: str
    status: int | None
    reason: str
    method: str | None
    headers: list[tuple[str, str]]
    body: str

    def header(self, name: str) -> str | None:
        values = self.all(name)
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name.lower()]

    @property
    def to_tag(self) -> str | None:
        to = self.header("To") or ""
        return to.split(";tag=", 1)[1].split(";")[0] if ";tag=" in to else None


def read(text: str) -> Message:
    head, _, body = text.partition("\r\n\r\n")
    start, *lines = head.split("\r\n")
    headers = [(n.strip(), v.strip()) for n, _, v in (line.partition(":") for line in lines)]
    if start.startswith("SIP/2.0 "):
        _, code, reason = start.split(" ", 2)
        return Message(text, int(code), reason, None, headers, body)
    return Message(text, None, "", start.split(" ", 1)[0], headers, body)


def request(method: str, uri: str = "sip:agent@127.0.0.1", *, call_id: str | None = None, branch: str | None = None,
            from_tag: str = "caller1", to_tag: str | None = None, cseq: int = 1, headers: tuple = (),
            body: str = "", user: str = "alice") -> str:
    """A request written out by hand: RFC 3261's mandatory fields, then `headers` (name, value) and `body`."""
    lines = [f"{method} {uri} SIP/2.0",
             f"Via: SIP/2.0/WS test.invalid;branch={branch or new_branch()}",
             "Max-Forwards: 70",
             f"From: <sip:{user}@127.0.0.1>;tag={from_tag}",
             f"To: <{uri}>" + (f";tag={to_tag}" if to_tag else ""),
             f"Call-ID: {call_id or secrets.token_hex(8)}",
             f"CSeq: {cseq} {method}",
             *(f"{n}: {v}" for n, v in headers),
             f"Content-Length: {len(body.encode())}"]
    return "\r\n".join(lines) + "\r\n\r\n" + body


def new_branch() -> str:
    return "z9hG4bK" + secrets.token_hex(8)


def digest_credentials(challenge: str, method: str, uri: str, user: str, password: str, nc: int = 1) -> str:
    """An `Authorization` value for a `WWW-Authenticate` challenge, computed here (RFC 2617, MD5, qop=auth)."""
    fields = dict(part.strip().split("=", 1) for part in challenge.removeprefix("Digest ").split(","))
    realm, nonce = fields["realm"].strip('"'), fields["nonce"].strip('"')
    md5 = lambda text: hashlib.md5(text.encode()).hexdigest()  # noqa: E731
    cnonce, count = secrets.token_hex(4), f"{nc:08x}"
    response = md5(f"{md5(f'{user}:{realm}:{password}')}:{nonce}:{count}:{cnonce}:auth:{md5(f'{method}:{uri}')}")
    return (f'Digest username="{user}", realm="{realm}", nonce="{nonce}", uri="{uri}", response="{response}", '
            f'qop=auth, nc={count}, cnonce="{cnonce}", algorithm=MD5')


class SipSocket:
    """One WebSocket to `/sip` (subprotocol sip): send text, receive what the server sends."""

    def __init__(self, base: str, token: str | None = None) -> None:
        from websockets.sync.client import connect

        url = base.replace("http://", "ws://") + "/sip" + (f"?token={token}" if token else "")
        self._connection = connect(url, subprotocols=["sip"], max_size=None, open_timeout=10)
        self.ws = self._connection.__enter__()

    def send(self, text: str) -> None:
        self.ws.send(text)

    def receive(self, timeout: float = WS_TIMEOUT_S) -> Message:
        return read(self.ws.recv(timeout=timeout))

    def receive_raw(self, timeout: float = WS_TIMEOUT_S) -> str:
        return self.ws.recv(timeout=timeout)

    def final(self, timeout: float = WS_TIMEOUT_S) -> Message:
        """The next response that is not provisional."""
        while True:
            message = self.receive(timeout)
            if message.status is None or message.status >= 200:
                return message

    def quiet(self, seconds: float) -> list[Message]:
        """Everything the server sends within `seconds` (a test of silence expects none)."""
        got, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                got.append(self.receive(left))
            except TimeoutError:
                break
        return got

    def close(self) -> None:
        self._connection.__exit__(None, None, None)

    def __enter__(self) -> SipSocket:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def app_on_loopback(app) -> Iterator[str]:
    """`app` under uvicorn in a thread on a free port (no waiting for models: for apps built without them)."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)
