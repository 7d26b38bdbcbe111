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
from voicepipe.transports.serializers.base import DEFAULT_MAX_FRAME_BYTES, Frame, b64encode, dumps
from voicepipe.transports.serializers.mediastream import Dialect, MediaStreamSerializer

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
        name = message.get("name")
        if not isinstance(name, str):
            raise ProtocolError("missing_field", "playedStream.name must be a string")
        return [Mark(name)]

    def _on_dtmf(self, message: dict[str, Any]) -> list[Event]:
        if "dtmf" not in message and isinstance(message.get("digit"), str):
            message = {**message, "dtmf": {"digit": message["digit"]}}
        return super()._on_dtmf(message)

    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        payload = self._encode_pcm(pcm16)
        if not payload:
            return []
        start: Start = self._require_start()
        media = {
            "contentType": _CONTENT_TYPES[start.send_codec],
            "sampleRate": start.send_rate,
            "payload": b64encode(payload),
        }
        return [dumps({"event": "playAudio", "media": media})]

    def encode_mark(self, name: str) -> list[Frame]:
        self._require_start()
        return [dumps({"event": "checkpoint", "streamId": self.stream_id, "name": name})]

    def encode_clear(self) -> list[Frame]:
        self._require_start()
        return [dumps({"event": "clearAudio", "streamId": self.stream_id})]


def _rate(text: str) -> int | None:
    key, _, value = text.strip().partition("=")
    return int(value) if key.strip().lower() == "rate" and value.strip().isdigit() else None


def _parse_headers(raw: Any) -> dict[str, str]:
    """`extra_headers` arrives as "a=1;b=2" (or "a=1,b=2" as written in the XML attribute)."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if not isinstance(raw, str):
        return {}
    pairs = (p.partition("=") for p in raw.replace(",", ";").split(";"))
    return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip()}
