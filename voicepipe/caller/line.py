"""One call in progress at the caller's end: the sender paces the caller's audio out, the receiver plays the
agent's audio, echoes marks once played (and at once on a clear, as the providers do) and measures. Every frame
is the provider's caller serializer's (`wire`): nothing here knows a provider."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from voicepipe.caller.echo import SpeakerEcho
from voicepipe.caller.pacing import Pacer
from voicepipe.caller.playout import JITTER_TARGET_S, Playout
from voicepipe.caller.report import CallResult, ClientTurn
from voicepipe.transports.serializers import CallerSerializer

log = logging.getLogger(__name__)

RTP_LINKS = ("webrtc", "sip")  # links whose far end plays through an adaptive jitter buffer


class Line:
    def __init__(self, link: Any, wire: CallerSerializer, result: CallResult, echo: SpeakerEcho | None = None) -> None:
        self.link = link
        self.echo = echo  # the agent's audio as the caller's microphone picks it up
        self.wire = wire
        self.result = result
        self.pacer = Pacer(wire.rate)
        self.playout = Playout(wire.rate, JITTER_TARGET_S if wire.link in RTP_LINKS else None)
        self.current: ClientTurn | None = None  # the turn whose reply is expected (None: the greeting)
        self.closed = asyncio.Event()
        self._send_lock = asyncio.Lock()

    def agent_quiet(self, quiet_s: float) -> bool:
        return self.playout.quiet(quiet_s, time.monotonic())

    async def send(self, frames: list) -> None:
        async with self._send_lock:
            for frame in frames:
                await self.link.send(frame)

    # -- sending ----------------------------------------------------------------------------------------------
    async def sender(self) -> None:
        await self.pacer.run(self._send_audio, self.result.send_lag_ms)

    async def _send_audio(self, pcm16: np.ndarray) -> bool:
        if self.closed.is_set():
            return False
        try:
            for key in self.pacer.keys_due:
                await self.send(self.wire.dtmf(key))
            if self.echo is not None:
                pcm16 = self.echo.mix(pcm16, time.monotonic())
            await self.send(self.wire.audio(pcm16))
        except Exception as exc:
            log.info("the call's line failed to send (%s: %s): hanging up", type(exc).__name__, exc)
            self.closed.set()
            return False
        self._ack_due_marks()
        return True

    def _ack_due_marks(self) -> None:
        for name in self.playout.due_marks(time.monotonic()):
            self.result.marks_acked += 1
            asyncio.ensure_future(self._safe_send(self.wire.mark_ack(name)))

    async def _safe_send(self, frames: list) -> None:
        try:
            await self.send(frames)
        except Exception:
            self.closed.set()

    # -- receiving --------------------------------------------------------------------------------------------
    async def receiver(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for frame in self.link:
                for kind, value in self.wire.parse(frame):
                    await self._on(kind, value)
        except (ConnectionClosed, ConnectionError):
            pass
        finally:
            self.result.close_code = getattr(self.link, "close_code", None)
            self.result.close_reason = getattr(self.link, "close_reason", None)
            self.closed.set()

    async def _on(self, kind: str, value: Any) -> None:
        now = time.monotonic()
        if kind == "audio":
            start, played = self.playout.play(value, now)
            if self.echo is not None:
                self.echo.played(played, start)
            self.result.note_audio(now, len(played) / self.wire.rate, self.current)
        elif kind == "mark":
            self.playout.mark(value)
            self._ack_due_marks()
        elif kind == "clear":
            self.result.note_clear(now, self.pacer.speaking)
            pending = self.playout.clear(now)
            if self.echo is not None:
                self.echo.cleared(now)
            frames = [f for name in pending for f in self.wire.mark_ack(name)] + self.wire.clear_ack()
            self.result.marks_acked += len(pending)
            if frames:
                await self._safe_send(frames)
        elif kind == "event":
            self.result.events.append(value)
        elif kind == "hangup":  # AudioSocket: the server hangs up in-band before it closes
            self.result.server_hangup = now
