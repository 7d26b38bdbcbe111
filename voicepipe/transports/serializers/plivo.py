"""Plivo Audio Streams (`<Stream bidirectional="true">`).

Inbound is Twilio-like camelCase JSON (`start`, `media`, `dtmf`) plus `playedStream` (a checkpoint was
reached: our mark) and `clearedAudio`; outbound is `playAudio` (with `contentType` and `sampleRate`),
`checkpoint` and `clearAudio`. Codecs: `audio/x-l16` at 8 or 16 kHz, `audio/x-mulaw` at 8 kHz.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from voicepipe.transports.events import Cleared, Event, Mark, ProtocolError, Start
from voicepipe.transports.serializers.base import DEFAULT_MAX_FRAME_BYTES, Frame, dumps, opt_int
from voicepipe.transports.serializers.mediastream import (
    Dialect,
    MediaStreamCallerSerializer,
    MediaStreamSerializer,
    media_body,
)

PLIVO = Dialect(
    name="plivo",
    sequence="sequenceNumber",
    stream="streamId",
    call="callId",
    media_format="mediaFormat",
    sample_rate="sampleRate",
    custom_parameters="customParameters",
    encodings={"AUDIO/X-MULAW": "pcmu", "AUDIO/X-L16": "l16le"},
    rates={"pcmu": frozenset({8000}), "l16le": frozenset({8000, 16000})},
    extra_start_fields=("accountId",),
)

_CONTENT_TYPES = {"pcmu": "audio/x-mulaw", "l16le": "audio/x-l16"}


class PlivoSerializer(MediaStreamSerializer):
    """Plivo: marks are `checkpoint`s, answered by `playedStream`; clears by `clearAudio`/`clearedAudio`."""

    dialect = PLIVO

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes)
        # `played` is the name one Plivo support article gives the checkpoint ack; the reference says playedStream
        self._handlers.update(playedStream=self._on_played, played=self._on_played, clearedAudio=lambda _: [Cleared()])
        del self._handlers["connected"], self._handlers["error"]

    def _on_start(self, message: dict[str, Any]) -> list[Event]:
        # Plivo may spell the rate inside the content type ("audio/x-l16;rate=16000"): split it out.
        body = message.get("start")
        fmt = body.get("mediaFormat") if isinstance(body, dict) else None
        if isinstance(fmt, dict) and isinstance(fmt.get("encoding"), str) and ";" in fmt["encoding"]:
            encoding, _, rate = fmt["encoding"].partition(";")
            fmt = {**fmt, "encoding": encoding.strip(), "sampleRate": fmt.get("sampleRate") or _rate(rate)}
            message = {**message, "start": {**body, "mediaFormat": fmt}}
        [start] = super()._on_start(message)
        headers = _parse_headers(message.get("extra_headers"))
        if headers:
            start = replace(start, custom_parameters={**headers, **start.custom_parameters})
            self.start = start
        return [start]

    def _on_played(self, message: dict[str, Any]) -> list[Event]:
        return [Mark(checkpoint_name(message))]

    def _on_dtmf(self, message: dict[str, Any]) -> list[Event]:
        if "dtmf" not in message and isinstance(message.get("digit"), str):
            message = {**message, "dtmf": {"digit": message["digit"]}}
        return super()._on_dtmf(message)

    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        payload = self._encode_pcm(pcm16)
        if not payload:
            return []
        start: Start = self._require_start()
        media = media_body(payload, contentType=_CONTENT_TYPES[start.send_codec], sampleRate=start.send_rate)
        return [dumps({"event": "playAudio", **media})]

    def encode_mark(self, name: str) -> list[Frame]:
        self._require_start()
        return [dumps({"event": "checkpoint", "streamId": self.stream_id, "name": name})]

    def encode_clear(self) -> list[Frame]:
        self._require_start()
        return [dumps({"event": "clearAudio", "streamId": self.stream_id})]


class PlivoCallerSerializer(MediaStreamCallerSerializer):
    """Plivo's end: 16 kHz L16, numbers as numbers, no `connected` and no `stop` (the socket just closes);
    marks are answered with `playedStream`, clears with `clearedAudio`."""

    dialect = PLIVO
    path = "/ws/plivo"
    rate = 16000
    codec = "l16le"
    encoding = "audio/x-l16"
    connected = None
    numbers_as_text = False
    server_events = {"playAudio": "audio", "checkpoint": "mark", "clearAudio": "clear"}

    def media_format(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "sampleRate": self.rate}

    def start(self) -> list[Frame]:
        d = self.dialect
        body = {d.call: self.call_id, d.stream: self.stream_id, "accountId": "MA0000", "tracks": ["inbound"],
                d.custom_parameters: self.params, d.media_format: self.media_format()}
        return [self._message("start", {"start": body}, stream=False)]

    def mark_ack(self, name: str) -> list[Frame]:
        return [self._message("playedStream", {"name": name})]

    def clear_ack(self) -> list[Frame]:
        return [self._message("clearedAudio", {})]

    def stop(self) -> list[Frame]:
        return []

    def read_mark(self, message: dict[str, Any]) -> str:
        return checkpoint_name(message)


def checkpoint_name(message: dict[str, Any]) -> str:
    """The name of a `checkpoint` (the server's mark) or of the `playedStream` that answers it."""
    name = message.get("name")
    if not isinstance(name, str):
        raise ProtocolError("missing_field", f"{message.get('event')}.name must be a string"[:100])
    return name


def _rate(text: str) -> int | None:
    key, _, value = text.strip().partition("=")
    return opt_int(value) if key.strip().lower() == "rate" else None


def _parse_headers(raw: Any) -> dict[str, str]:
    """`extra_headers` arrives as "a=1;b=2" (or "a=1,b=2" as written in the XML attribute)."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if not isinstance(raw, str):
        return {}
    pairs = (p.partition("=") for p in raw.replace(",", ";").split(";"))
    return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip()}
