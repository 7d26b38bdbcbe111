"""The connection a call travels on, chosen by the caller serializer's `link`: a WebSocket (the providers and the
native protocol), a TCP stream (AudioSocket), a WebRTC peer (caller/webrtc.py) or one signalled by SIP
(caller/sip.py). Each is an async context manager giving what the line uses: `send(frame)`, `async for frame in
it`, `close_code` and `close_reason`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from voicepipe.transports.serializers import CallerSerializer, caller_serializer_class

READ_BYTES = 65536


def open_link(wire: CallerSerializer, url: str) -> Any:
    """The link for `wire`'s call at `url`, not yet open."""
    if wire.link == "tcp":
        return TcpLink(url)
    if wire.link == "webrtc":
        from voicepipe.caller.webrtc import PeerClient  # aiortc loads for WebRTC calls only

        return PeerClient(url, wire.call_id, wire.params, wire.token)
    if wire.link == "sip":
        from voicepipe.caller.sip import SipPeerClient

        return SipPeerClient(url, wire.call_id, wire.params, wire.token)
    from websockets.asyncio.client import connect

    return connect(url, additional_headers=wire.headers(), max_size=8 << 20, open_timeout=30)


def http_url(wire: CallerSerializer, url: str, record_url: str | None) -> str | None:
    """Where the server's HTTP API is: `record_url`, else the call's own URL, unless that is a bare TCP address."""
    return record_url or (url if wire.link != "tcp" else None)


def endpoint_url(url: str, transport: str) -> str:
    """`url` as given when it has a path; otherwise the transport's endpoint on that server."""
    parts = urlsplit(url)
    path = caller_serializer_class(transport).path
    if parts.path not in ("", "/") or path is None:
        return url
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class TcpLink:
    """A TCP stream (tcp://host:port) as the line sees a WebSocket."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 9092
        self.close_code: int | None = None
        self.close_reason: str | None = None

    async def __aenter__(self) -> TcpLink:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.transport = self.writer.transport
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):  # already reset
            await self.writer.wait_closed()

    async def send(self, frame: bytes) -> None:
        self.writer.write(frame)
        await self.writer.drain()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            data = await self.reader.read(READ_BYTES)
            if not data:
                self.close_code = 1000
                return
            yield data
