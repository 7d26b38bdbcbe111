"""One call's connection, whatever it travels on: a WebSocket (gateway.py), an AudioSocket TCP stream
(audiosocket_server.py) or a WebRTC peer (webrtc/link.py), each seen through the WebSocket interface.

Frames go through the provider's pure serializer (`decode_safe` never raises: a `ProtocolError` is either
ignored with a log line or closes this socket with its code and reason); the `Start` event opens a
`CallSession`; agent audio is paced out by a `PlaybackController` (marks where the provider echoes them, a
local clock otherwise). Nothing one client sends can affect another call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

import numpy as np
from fastapi import WebSocket
from starlette.websockets import WebSocketState

from voicepipe.auth import MAX_CALL_ID_CHARS, is_call_id
from voicepipe.echo.playout import PlayedAudio
from voicepipe.echo.reference import FarEndReference
from voicepipe.observability.hooks import Observers
from voicepipe.pipeline import CallRegistry, CallSession
from voicepipe.transports.events import Dtmf, Mark, Media, Start, Stop, TransportError
from voicepipe.transports.limits import MessageRate
from voicepipe.transports.playback import Heard, MarkStatus, PlaybackController
from voicepipe.transports.serializers import Serializer
from voicepipe.transports.serializers.native import NativeSerializer

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN = 1013
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
START_TIMEOUT_S = 30.0


async def close_socket(ws, code: int, reason: str) -> None:
    """Close `ws` with `code` and `reason` unless either side has already gone."""
    disconnected = WebSocketState.DISCONNECTED
    if getattr(ws, "application_state", None) == disconnected or getattr(ws, "client_state", None) == disconnected:
        return
    with contextlib.suppress(Exception):  # already gone
        await ws.close(code=code, reason=reason[:120])


class Connection:
    """One call: reads frames, runs the call, paces agent audio out, writes frames in order."""

    def __init__(self, ws: WebSocket, transport: str, ser: Serializer, settings, resources, registry,
                 observers: Observers | None = None) -> None:
        self.ws = ws
        self.transport = transport
        self.ser = ser
        self.settings = settings
        self.resources = resources
        self.registry: CallRegistry = registry
        self.observers = observers
        self.call: CallSession | None = None
        self.pb: PlaybackController | None = None
        self.sample_rate = 0  # outbound (agent audio) rate
        self._out: asyncio.Queue[Any] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._dead = False
        self._close_code: int | None = None
        self._close_reason = ""
        self._last_lead = 0.0
        self._held = False  # AgentOutput.hold: no agent audio goes out
        self._released: dict[object, int] = {}  # turn -> end of its audio heard and released (this generation)
        self.clock = time.monotonic
        self._rate: MessageRate | None = None  # calls.max_messages_per_s, from the first message on
        self._played: PlayedAudio | None = None  # what the caller heard, for the call's echo canceller

    # -- the read loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        self._tasks.append(asyncio.create_task(self._writer(), name=f"ws-writer-{self.transport}"))
        started = self.clock()
        self._rate = MessageRate(self.settings.calls.max_messages_per_s, started)
        receive: asyncio.Future | None = None
        try:
            while not self._dead:
                if receive is None:
                    receive = asyncio.ensure_future(self.ws.receive())
                done, _ = await asyncio.wait({receive}, timeout=0.5)
                if self.call is not None and self.call.ended.is_set():
                    await self._hangup(self.call.end_reason or "ended")
                    return
                if self.call is None and self.clock() - started > START_TIMEOUT_S:
                    await self._fail(CLOSE_POLICY, "no start message")
                    return
                if not done:
                    continue
                message, receive = receive.result(), None
                if message["type"] == "websocket.disconnect":
                    self._dead = True
                    return
                if not self._rate.allow(self.clock()):
                    await self._over_rate()
                    return
                if not await self._on_frame(message):
                    return
        finally:
            if receive is not None and not receive.done():
                receive.cancel()

    async def _over_rate(self) -> None:
        limit = self._rate.per_s
        log.warning("%s: closing a connection that sent over %d messages a second (calls.max_messages_per_s)",
                    self.transport, limit)
        self._send_error("rate_limited", f"over {limit} messages a second")
        if self.call is not None:
            await self._end_call("rate_limited")
        await self._fail(CLOSE_POLICY, f"too many messages: over {limit} a second")

    async def _on_frame(self, message: dict) -> bool:
        """Decode and handle one frame; False ends the connection."""
        frame = message.get("text")
        if frame is None:
            frame = message.get("bytes")
        if frame is None:
            return True
        result = self.ser.decode_safe(frame)
        for error in result.errors:
            if not error.fatal:
                self._send_error(error.kind, error.reason)
        for event in result.events:
            if not await self._on_event(event):
                return False
        fatal = result.fatal
        if fatal is not None:
            self._send_error(fatal.kind, fatal.reason)
            await self._fail(fatal.close_code, fatal.reason)
            return False
        return True

    async def _on_event(self, event) -> bool:
        """Handle one decoded event; False ends the call."""
        if isinstance(event, Media):
            if self.call is not None:
                self.call.push_audio(event.audio)
                if self._played is not None:
                    self._played.arrived(self.clock())
        elif isinstance(event, Mark):
            if self.pb is not None:
                played = self.pb.on_mark(event.name) is MarkStatus.PLAYED
                if played and self._played is not None:
                    self._played.played(event.name, self.clock())
                self._wake.set()
            if self.call is not None:
                self.call.note("mark", name=event.name)
        elif isinstance(event, Dtmf):
            if self.call is not None:
                self.call.push_dtmf(event.digit)
        elif isinstance(event, Start):
            await self._on_start(event)
        elif isinstance(event, Stop):
            await self._hangup(event.reason or "stop")
            return False
        elif isinstance(event, TransportError):
            log.warning("%s: provider error %s: %s", self.transport, event.code, event.message)
        return True

    async def _on_start(self, start: Start) -> None:
        ser = self.ser
        self.sample_rate = ser.send_rate
        self.pb = PlaybackController(ser.send_rate, ser.chunk_policy(), max_lead_ms=self.settings.calls.max_lead_ms,
                                     uses_marks=ser.supports_marks, provider_clears=ser.supports_clear)
        params = dict(start.custom_parameters)
        if self.transport == "telnyx" and "client_state" in params:
            params = {**_telnyx_client_state(params["client_state"]), **params}
        call_id = start.call_id or start.stream_id
        if call_id is not None and not is_call_id(call_id):  # it names the call in paths: /api/calls/{id}
            log.warning("%s: the call id %r... is not printable or over %d characters; the call gets its own",
                        self.transport, call_id[:40], MAX_CALL_ID_CHARS)
            call_id = None
        call = CallSession(self.resources, self.settings, self, input_rate=ser.sample_rate,
                           transport=self.transport, call_id=call_id, parameters=params, observers=self.observers)
        if call.call_id in self.registry.active:
            call.call_id = call.record.call_id = f"{call.call_id[:MAX_CALL_ID_CHARS - 20]}-{id(call):x}"
        self.call = call
        self.registry.add(call)
        if isinstance(ser, NativeSerializer):
            self._send(ser.encode_started(call.call_id))
        self._tasks.append(asyncio.create_task(self._pacer(), name=f"ws-pacer-{self.transport}"))
        await call.start()
        log.info("%s: call %s started (%s at %d Hz in, %d Hz out)", self.transport, call.call_id, start.codec,
                 ser.sample_rate, ser.send_rate)

    async def _hangup(self, reason: str) -> None:
        await self._end_call(reason)
        await self._flush_and_close(1000, reason)

    async def _end_call(self, reason: str) -> None:
        """Close the call and move it to the registry's ended calls at once: flushing the socket afterwards can
        take seconds, and a record that says `ended` must never belong to a call still listed as active."""
        if self.call is not None:
            await self.call.close(reason)
            self.registry.finish(self.call)

    async def _fail(self, code: int, reason: str) -> None:
        await self._flush_and_close(code, reason)

    async def _flush_and_close(self, code: int, reason: str) -> None:
        self._close_code, self._close_reason = code, reason
        hangup = getattr(self.ser, "encode_hangup", None)
        if hangup is not None and self.ser.started:  # AudioSocket: say goodbye in-band
            self._send(hangup())
        self._out.put_nowait(None)  # the writer closes after the frames queued before this
        writer = self._tasks[0] if self._tasks else None
        if writer is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(writer), 2.0)
        self._dead = True
        await close_socket(self.ws, code, reason)

    async def cleanup(self) -> None:
        self._dead = True
        if self.call is not None:
            await self._end_call(self.call.end_reason or "disconnected")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self.pb = None

    # -- writing ------------------------------------------------------------------------------------
    def _send(self, frames: list) -> None:
        if not self._dead:
            for frame in frames:
                self._out.put_nowait(frame)

    def _send_error(self, code: str, message: str) -> None:
        if isinstance(self.ser, NativeSerializer):
            self._send(self.ser.encode_error(code, message))

    async def _writer(self) -> None:
        try:
            while True:
                frame = await self._out.get()
                if frame is None:
                    return
                if callable(frame):
                    frame()
                elif isinstance(frame, str):
                    await self.ws.send_text(frame)
                else:
                    await self.ws.send_bytes(frame)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client vanished: end the call
            log.info("%s: send failed (%s); ending the call", self.transport, type(exc).__name__)
            self._dead = True
            if self.call is not None:
                self.call.end_reason = self.call.end_reason or "disconnected"
                self.call.ended.set()

    async def _pacer(self) -> None:
        """Release agent audio at real time (at most max_lead ahead), each chunk then its mark."""
        ser = self.ser
        while not self._dead:
            self._wake.clear()
            pb = self.pb
            if pb is None:
                return
            now = self.clock()
            self._release_heard(pb, now)
            lead = pb.lead(now)
            for chunk in [] if self._held else pb.poll(now):
                if self._played is not None:
                    self._played.sent(chunk.audio, now, lead, chunk.mark)
                frames = ser.encode_audio(chunk.audio)
                if chunk.mark is not None:
                    frames += ser.encode_mark(chunk.mark)
                self._send(frames)
                if not self._dead:  # report the audio to the call once the writer has put it on the wire
                    self._out.put_nowait(functools.partial(self._report_sent, chunk))
            due = None if self._held else pb.next_send_time(now)
            timeout = None if due is None else max(0.0, due - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _report_sent(self, chunk) -> None:
        origin = chunk.origins[0] if chunk.origins else None
        if self.call is not None and isinstance(origin, tuple) and len(origin) == 3:
            self.call.agent_audio_sent(origin[0], chunk.audio, self.sample_rate)

    def _release_heard(self, pb: PlaybackController, now: float) -> None:
        """Drop the pieces heard completely (memory stays flat over a long call), remembering how far each
        turn's audio was heard, so a later barge-in still knows."""
        for h in pb.release_heard(now):
            origin = h.origin
            if isinstance(origin, tuple) and len(origin) == 3:
                turn, start, length = origin
                self._released[turn] = max(self._released.get(turn, 0), start + length)

    # -- AgentOutput (what the CallSession sees) --------------------------------------------------------
    def play(self, audio: np.ndarray, origin: object) -> None:
        if self.pb is not None:
            self.pb.enqueue(audio, origin)
            self._wake.set()

    def end_of_reply(self) -> None:
        if self.pb is not None:
            self.pb.end_of_audio()
            self._wake.set()

    def is_playing(self) -> bool:
        pb = self.pb
        if pb is None or self._dead:
            return False
        now = self.clock()
        if pb.lead(now) > 0 or self._held:
            self._last_lead = now
        # A provider that never echoes the last marks must not hold the call in SPEAKING forever.
        return pb.is_playing(now) and (pb.lead(now) > 0 or now - self._last_lead < 1.0)

    def heard(self) -> list:
        return self.pb.heard(self.clock()) if self.pb is not None else []

    def clear(self) -> list:
        if self.pb is None:
            return []
        now = self.clock()
        self._release_heard(self.pb, now)
        released = [Heard((turn, 0, end), end, end) for turn, end in self._released.items()]
        self._released = {}
        result = self.pb.clear(now)
        if self._played is not None:
            self._played.cleared(now)
        self._send(self.ser.encode_clear())
        if self.call is not None:
            self.call.note("clear")
        self._wake.set()
        return released + result.heard

    def far_end_reference(self, rate: int) -> FarEndReference:
        if self._played is None:
            self._played = PlayedAudio(FarEndReference(rate), self.sample_rate, clears=self.ser.supports_clear)
        return self._played.reference

    def hold(self, on: bool) -> None:
        if on == self._held:
            return
        self._held = on
        # A link that plays out locally (WebRTC's track) holds its queue too, in order with the frames
        # already written (a clear before a release must reach it first).
        hold_playout = getattr(self.ws, "hold_playout", None)
        if hold_playout is not None:
            self._out.put_nowait(functools.partial(hold_playout, on))
        self._wake.set()

    @property
    def can_send_dtmf(self) -> bool:
        """Whether the agent can press keys on this line: the native protocol (and WebRTC, which speaks it) passes
        them to the client; the providers' media streams take no keys (their REST APIs do)."""
        return isinstance(self.ser, NativeSerializer)

    def send_dtmf(self, digits: str) -> None:
        if isinstance(self.ser, NativeSerializer):
            self._send(self.ser.encode_dtmf(digits))

    def event(self, kind: str, **data: Any) -> None:
        ser = self.ser
        if not isinstance(ser, NativeSerializer):
            return
        if kind == "transfer":
            self._send(ser.encode_transfer(data["target"]))
        elif kind == "transcript":
            self._send(ser.encode_transcript(data["text"], data["final"], data["turn"]))
        elif kind == "agent_text":
            self._send(ser.encode_agent_text(data["text"], data["turn"], data.get("final", False)))
        elif kind == "turn":
            self._send(ser.encode_turn(data["turn"], data["timings_ms"]))


def _telnyx_client_state(value: Any) -> dict[str, Any]:
    """Telnyx `client_state` is base64 of whatever the app set; a JSON object there may carry overrides."""
    import base64
    import binascii
    import json

    if not isinstance(value, str):
        return {}
    try:
        decoded = json.loads(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        return {}
    return decoded if isinstance(decoded, dict) else {}
