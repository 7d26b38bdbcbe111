"""The WebRTC caller, for `voicepipe call --transport webrtc`: an aiortc peer connection seen as the link the
line drives (`send`, `async for`, `close_code`); what its frames mean is `WebRtcCallerSerializer`'s business.

Opening it does the signalling (offer with every ICE candidate and telephone events, POST to `/webrtc/offer`,
answer) and waits until the peer is connected and the "events" data channel is open. `send` feeds 20 ms PCM frames
(48 kHz mono int16) to the outbound track, text to the data channel, or a `KeyPress` as RFC 4733 telephone events
(as a browser's `RTCDTMFSender` does); iterating yields the agent's audio (mono int16 at 48 kHz, every frame the
server sends, silence included) and the server's events (JSON text).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from voicepipe.transports.serializers.native import KeyPress
from voicepipe.transports.webrtc import dtmf
from voicepipe.transports.webrtc.media import FedTrack, drain

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0
HANGUP_WAIT_S = 2.0  # after a stop: how long to wait for the server to close the connection


def offer_url(url: str) -> str:
    """`url` (http(s):// or ws(s)://) as the offer endpoint: `/webrtc/offer` unless it names a path."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else "/webrtc/offer"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class PeerClient:
    """One outgoing WebRTC call; an async context manager. `setup_ms` is how long the signalling took (the offer
    sent to the answer back), once open."""

    events_channel = True  # open the "events" data channel (the server's events and the hang-up go there)

    def __init__(self, url: str, call_id: str, params: dict[str, Any], token: str | None = None) -> None:
        self.url = offer_url(url)
        self.call_id = call_id
        self.params = params
        self.token = token
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.pc: RTCPeerConnection | None = None
        self.track = FedTrack()
        self.channel = None
        self._inbox: asyncio.Queue[np.ndarray | str | None] = asyncio.Queue()
        self._connected = asyncio.Event()
        self._closed = asyncio.Event()
        self._drains: list[asyncio.Task] = []
        self._stop_sent = False
        self.setup_ms: float | None = None
        self._key_types: dict[int, int] = {}  # the telephone-event payload types the answer accepted -> rate
        self._key_ssrc = random.getrandbits(32)  # the key presses' own RTP stream: its sequence numbers and clock
        self._key_sequence = random.getrandbits(16)
        self._key_clock = random.getrandbits(31)

    async def __aenter__(self) -> PeerClient:
        dtmf.negotiate()
        pc = self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTrack(self.track)
        channel_open = asyncio.Event()
        if self.events_channel:
            self.channel = pc.createDataChannel("events")
            self.channel.on("message", self._inbox.put_nowait)
            self.channel.on("open", channel_open.set)
        pc.on("track", lambda track: self._drains.append(asyncio.ensure_future(drain(track, self._inbox.put_nowait))))
        pc.on("connectionstatechange", self._on_state)
        try:
            await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers every candidate first
            asked = time.monotonic()
            answer = await self.exchange(pc.localDescription.sdp)
            self.setup_ms = (time.monotonic() - asked) * 1000
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            self._key_types = dtmf.telephone_event_types(answer)
            await asyncio.wait_for(self._connected.wait(), CONNECT_TIMEOUT_S)
            if pc.connectionState != "connected":
                raise ConnectionError(f"the WebRTC connection to {self.url} {pc.connectionState}")
            if self.channel is not None:
                # The events (and the hang-up message) need the data channel, which opens just after the media.
                await asyncio.wait_for(channel_open.wait(), CONNECT_TIMEOUT_S)
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def exchange(self, offer: str) -> str:
        """The signalling: the SDP offer out, the answer back (here `POST /webrtc/offer`)."""
        import httpx

        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        body = {"sdp": offer, "type": "offer", "call_id": self.call_id, **self.params}
        # Over plain http no certificates are loaded (that alone takes 0.1-0.4 s of CPU; see server_api.http_client).
        async with httpx.AsyncClient(timeout=30, verify=self.url.startswith("https:")) as http:
            resp = await http.post(self.url, json=body, headers=headers)
        if resp.status_code != 200:
            raise ConnectionError(f"{self.url} refused the offer: {resp.status_code} {resp.text[:200]}")
        return resp.json()["sdp"]

    async def __aexit__(self, *exc) -> None:
        if self._stop_sent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), HANGUP_WAIT_S)
        await self._shutdown()

    @staticmethod
    def _close_for(state: str) -> tuple[int, str]:
        """The close code and reason of a peer connection that ended in ``state`` ("closed" or "failed")."""
        return (1000, "closed") if state == "closed" else (1006, state)

    def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self._connected.set()
        elif state in ("failed", "closed"):
            if self.close_code is None:
                self.close_code, self.close_reason = self._close_for(state)
            self._closed.set()
            self._connected.set()  # wakes a caller still waiting to connect; it checks the state
            self._inbox.put_nowait(None)

    async def send(self, frame: np.ndarray | str | KeyPress) -> None:
        if self._closed.is_set():
            raise ConnectionError("the call has ended")
        if isinstance(frame, KeyPress):
            await self._press(frame.digit)
        elif isinstance(frame, str):
            if self.channel.readyState == "open":
                self.channel.send(frame)
                self._stop_sent = self._stop_sent or json.loads(frame).get("type") == "stop"
        else:
            self.track.feed(frame)

    async def _press(self, key: str) -> None:
        """One key as telephone events on the audio transport, 20 ms apart (their own SSRC: the audio sender keeps
        its sequence numbers to itself)."""
        if not self._key_types:
            raise ConnectionError("the server did not accept telephone events")
        payload_type, rate = max(self._key_types.items(), key=lambda item: item[1])
        transport = next(t.sender.transport for t in self.pc.getTransceivers() if t.kind == "audio")
        packets = dtmf.event_packets(key, payload_type, self._key_ssrc, self._key_sequence, self._key_clock, rate)
        self._key_sequence = (self._key_sequence + len(packets)) % 65536
        self._key_clock = (self._key_clock + rate) % 2**32  # the next key starts a second of its clock later
        for packet in packets:
            await transport._send_rtp(packet.serialize())  # SRTP-protected with the audio's keys
            await asyncio.sleep(0.02)

    def __aiter__(self):
        return self._received()

    async def _received(self):
        if self.pc is not None and self.pc.connectionState != "connected":
            return
        while True:
            item = await self._inbox.get()
            if item is None:
                return
            if isinstance(item, str):
                with contextlib.suppress(ValueError, AttributeError):
                    message = json.loads(item)
                    if message.get("type") == "closed":  # the server ended the call with a reason
                        self.close_code, self.close_reason = message.get("code"), message.get("reason")
            yield item

    async def _shutdown(self) -> None:
        if self.pc is not None:
            await self.pc.close()
        for task in self._drains:
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        self._drains.clear()
