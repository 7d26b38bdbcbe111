"""One WebRTC peer connection seen as the socket that the gateway's `Connection` drives.

A WebRTC call speaks voicepipe's native protocol (`NativeSerializer`) over a virtual socket, so the call
logic (the `CallSession`, the playback controller, marks, clear, the registry, the ending) is the one
every WebSocket transport uses:

- `receive()` yields, as WebSocket messages: a native `start` (48 kHz PCM16, marks on) once the peer
  connection is up, the caller's audio (every received audio track is drained; the first one is the
  caller, downmixed to mono), the caller's key presses as native `dtmf` messages (RFC 4733 telephone
  events, `dtmf.py`; or `key_pressed`: SIP INFO), the marks the agent track echoes as it plays, a `stop`
  when the page hangs up over the data channel (or `hang_up` is called: a SIP BYE), and a disconnect when
  the connection closes or fails, or when the caller's audio stops arriving for `MEDIA_TIMEOUT_S` (the peer
  vanished).
- `send_bytes()` queues agent audio on the paced outbound track; `send_text()` applies the native
  `mark` and `clear` messages to that track and forwards everything else (transcripts, agent text, turn
  timings, errors) to the data channel, if the client opened one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection

from voicepipe.transports.serializers.native import dtmf_message, mark_message, start_message, stop_message
from voicepipe.transports.webrtc import dtmf
from voicepipe.transports.webrtc.media import RATE, PacedTrack, drain

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0  # from the answer to a connected peer
# Browsers and aiortc send audio frames all the time (silence too), so a connected peer that sends none for
# this long has vanished; ICE consent checks alone would take about 30 s to notice.
MEDIA_TIMEOUT_S = 10.0
MAX_INBOX = 1500  # 30 s of 20 ms frames: a call this far behind drops its oldest input
MAX_PENDING_TEXT = 200  # events kept for a data channel that has not opened yet
DISCONNECT = {"type": "websocket.disconnect"}


class PeerLink:
    """The slice of the WebSocket interface `Connection` uses, over one `RTCPeerConnection`."""

    def __init__(self, pc: RTCPeerConnection, start: dict[str, Any], label: str = "webrtc") -> None:
        self.pc = pc
        self.label = label
        self.track = PacedTrack(self._played)
        pc.addTrack(self.track)
        self._start = start_message(RATE, {"marks": True, **start})
        self._inbox: asyncio.Queue[dict] = asyncio.Queue()
        self._started = False
        self._ended = False
        self._caller_track = None
        self._drains: list[asyncio.Task] = []
        self.channel: RTCDataChannel | None = None
        self._pending_text: list[str] = []
        self.closed = False
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_state)
        self._loop = asyncio.get_running_loop()
        self._connect_timer = self._loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)
        self._media_timer: asyncio.TimerHandle | None = None
        self._last_audio = 0.0

    # -- peer events ------------------------------------------------------------------------------
    def _on_track(self, track) -> None:
        sink = None
        if track.kind == "audio" and self._caller_track is None:
            self._caller_track = track
            sink = self._caller_audio
            track.on("ended", lambda: self._end("the caller's track ended"))
        self._drains.append(asyncio.ensure_future(drain(track, sink)))

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self.channel is not None:
            log.info("%s: ignoring a second data channel %r", self.label, channel.label)
            return
        self.channel = channel
        channel.on("open", self._flush_text)
        channel.on("message", self._on_message)
        if channel.readyState == "open":
            self._flush_text()

    def _on_state(self) -> None:
        state = self.pc.connectionState
        log.info("%s: connection %s", self.label, state)
        if state == "connected" and not self._started:
            self._started = True
            self._connect_timer.cancel()
            self._inbox.put_nowait({"type": "websocket.receive", "text": self._start})
            self._last_audio = self._loop.time()
            self._check_media()
        elif state in ("failed", "closed"):
            self._end(f"connection {state}")

    def listen_for_keys(self, payload_types: dict[int, int]) -> None:
        """The answer accepted telephone events of `payload_types`: the caller's keys become `dtmf` messages."""
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio":
                dtmf.tap(transceiver.receiver, payload_types, self.key_pressed)

    def _connect_timeout(self) -> None:
        if not self._started:
            log.warning("%s: no connection within %.0f s (ICE or DTLS failed)", self.label, CONNECT_TIMEOUT_S)
            self._end("never connected")

    def _check_media(self) -> None:
        silent = self._loop.time() - self._last_audio
        if silent >= MEDIA_TIMEOUT_S:
            self._end(f"no audio from the caller for {silent:.0f} s")
        elif not self._ended and not self.closed:
            self._media_timer = self._loop.call_later(1.0, self._check_media)

    def _end(self, why: str) -> None:
        if not self._ended:
            self._ended = True
            log.info("%s: ending the call: %s", self.label, why)
            self._inbox.put_nowait(DISCONNECT)

    def _caller_audio(self, samples: np.ndarray) -> None:
        if not self._started or self._ended:
            return
        self._last_audio = self._loop.time()
        if self._inbox.qsize() >= MAX_INBOX:
            log.warning("%s: the call is %d frames behind its audio; dropping the oldest", self.label, MAX_INBOX)
            with contextlib.suppress(asyncio.QueueEmpty):
                self._inbox.get_nowait()
        self._inbox.put_nowait({"type": "websocket.receive", "bytes": samples.astype("<i2").tobytes()})

    def _on_message(self, message) -> None:
        """The page may hang up over the data channel; nothing else it sends there reaches the call."""
        try:
            kind = json.loads(message).get("type") if isinstance(message, str) and len(message) < 4096 else None
        except (ValueError, AttributeError):
            kind = None
        if kind == "stop" and self._started and not self._ended:
            self._inbox.put_nowait({"type": "websocket.receive", "text": stop_message("hangup")})
        else:
            log.info("%s: ignoring a data channel message (%s)", self.label, kind or "not a JSON object")

    def hang_up(self, reason: str) -> None:
        """End the call from this side, as the caller's hang-up would (e.g. the server is stopping)."""
        if self._started and not self._ended:
            self._inbox.put_nowait({"type": "websocket.receive", "text": stop_message(reason)})
        else:
            self._end(reason)

    def key_pressed(self, digit: str) -> None:
        """A keypad digit the caller pressed (an RFC 4733 event, or SIP INFO): the call gets it as a native `dtmf`."""
        if self._started and not self._ended:
            self._inbox.put_nowait({"type": "websocket.receive", "text": dtmf_message(digit)})

    def _played(self, mark: str) -> None:
        if not self._ended:
            self._inbox.put_nowait({"type": "websocket.receive", "text": mark_message(mark)})

    # -- what Connection calls ------------------------------------------------------------------------
    async def receive(self) -> dict:
        return await self._inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.track.push_audio(np.frombuffer(data, dtype="<i2").astype(np.int16))

    def hold_playout(self, on: bool) -> None:
        self.track.hold(on)

    async def send_text(self, text: str) -> None:
        if self.closed:
            raise ConnectionError("closed")
        message = json.loads(text)  # the native serializer's own frames
        kind = message.get("type")
        if kind == "mark":
            self.track.push_mark(message["name"])
        elif kind == "clear":
            self.track.clear()
        else:
            self._to_channel(text)

    def _to_channel(self, text: str) -> None:
        channel = self.channel
        if channel is not None and channel.readyState == "open":
            with contextlib.suppress(Exception):  # closing under us: the events are a courtesy
                channel.send(text)
        elif len(self._pending_text) < MAX_PENDING_TEXT and not self._ended:
            self._pending_text.append(text)

    def _flush_text(self) -> None:
        pending, self._pending_text = self._pending_text, []
        for text in pending:
            self._to_channel(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Hang up: close the peer connection and stop reading its tracks."""
        if self.closed:
            return
        self.closed = True
        self._connect_timer.cancel()
        if self._media_timer is not None:
            self._media_timer.cancel()
        if self.channel is not None and self.channel.readyState == "open" and code != 1000:
            with contextlib.suppress(Exception):
                self.channel.send(json.dumps({"type": "closed", "code": code, "reason": reason}))
        with contextlib.suppress(Exception):
            await self.pc.close()
        for task in self._drains:
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        self._drains.clear()
        self._pending_text.clear()
