"""Asterisk AudioSocket: a TCP listener where each connection is one call (Asterisk connects to us).

The listener runs its own asyncio loop in a thread, so it needs nothing from the web server's lifespan;
each connection goes through the same `Connection` as the WebSocket transports (the serializer is the
stream parser `AudioSocketSerializer`; no marks and no clear, so playback is paced on the local clock).
`calls.audiosocket_port` turns it on (0: any free port; the bound port is `app.state.audiosocket_port`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from voicepipe.pipeline import call_resources
from voicepipe.pipeline.admission import CallRefused
from voicepipe.transports.connection import Connection
from voicepipe.transports.limits import TooManyConnections
from voicepipe.transports.serializers import make_serializer
from voicepipe.transports.serializers.audiosocket import KIND_HANGUP, encode_message

log = logging.getLogger(__name__)

READ_BYTES = 65536


class TCPLink:
    """The slice of the WebSocket interface `Connection` uses, over an asyncio TCP stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.closed = False

    async def receive(self) -> dict:
        try:
            data = await self.reader.read(READ_BYTES)
        except (ConnectionError, OSError):
            data = b""
        if not data:
            return {"type": "websocket.disconnect"}
        return {"type": "websocket.receive", "bytes": data}

    async def send_bytes(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.writer.write(data)
        await self.writer.drain()

    async def send_text(self, text: str) -> None:
        raise TypeError("AudioSocket carries no text")

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


async def handle_audiosocket(app, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    link = TCPLink(reader, writer)
    peer = writer.get_extra_info("peername")
    address = peer[0] if isinstance(peer, tuple) and peer else "unknown"
    try:
        with app.state.client_slots.slot(address):
            await _serve(app, link)
    except TooManyConnections as exc:
        log.warning("audiosocket: refused a connection: %s", exc)
        await _refuse(link)


async def _refuse(link: TCPLink) -> None:
    with contextlib.suppress(Exception):
        await link.send_bytes(encode_message(KIND_HANGUP))
    await link.close()


async def _serve(app, link: TCPLink) -> None:
    try:
        slot = app.state.admission.admit("audiosocket")
    except CallRefused:  # at calls.max_concurrent, or draining: Asterisk gets a hangup at once
        await _refuse(link)
        return
    try:
        await _serve_admitted(app, link)
    finally:
        slot.release()


async def _serve_admitted(app, link: TCPLink) -> None:
    try:
        resources = await asyncio.to_thread(call_resources, app.state.runtime)
    except Exception as exc:
        log.warning("audiosocket: call refused: %s", exc)
        await _refuse(link)
        return
    settings = app.state.settings
    serializer = make_serializer("audiosocket", max_frame_bytes=settings.calls.max_frame_bytes)
    conn = Connection(link, "audiosocket", serializer, settings, resources, app.state.calls, app.state.observers)
    try:
        await conn.run()
    except Exception:
        log.exception("audiosocket: call failed")
    finally:
        await conn.cleanup()
        await link.close()


def start_audiosocket_listener(app) -> threading.Thread:
    """Listen on (server.host, calls.audiosocket_port) in a thread with its own event loop."""
    settings = app.state.settings
    ready = threading.Event()

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        app.state.audiosocket_loop = loop

        async def main() -> None:
            server = await asyncio.start_server(lambda r, w: handle_audiosocket(app, r, w), settings.server.host,
                                                settings.calls.audiosocket_port)
            app.state.audiosocket_port = server.sockets[0].getsockname()[1]
            log.info("AudioSocket listening on %s:%d", settings.server.host, app.state.audiosocket_port)
            ready.set()
            async with server:
                await server.serve_forever()

        try:
            loop.run_until_complete(main())
        except Exception:
            log.exception("AudioSocket listener failed")
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="audiosocket", daemon=True)
    thread.start()
    ready.wait(10)
    return thread
