"""Vonage Voice API WebSocket (NCCO `connect` to a `websocket` endpoint).

The first frame is JSON text (`websocket:connected`, with the `content-type` and any headers from the
NCCO); after that audio is binary 16-bit little-endian mono PCM in 20 ms frames (640 bytes at 16 kHz,
320 at 8 kHz) both ways, and control is JSON text: `{"action":"clear"}` -> `websocket:cleared`,
`{"action":"notify","payload":...}` -> `websocket:notify` (our mark), and `websocket:dtmf`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from voicepipe.transports.events import Cleared, Connected, Dtmf, Event, Mark, Media, ProtocolError, Start, Stop
from voicepipe.transports.serializers.base import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    PcmCallerSerializer,
    Serializer,
    dumps,
    parse_json,
    whole_frames,
)

_CONTENT_TYPE = re.compile(r"^\s*audio/l16\s*;\s*rate\s*=\s*([0-9]{1,6})\s*$", re.IGNORECASE)
RATES = frozenset({8000, 16000, 24000})
_NOT_PARAMETERS = frozenset({"event", "content-type"})


class VonageSerializer(Serializer):
    """Vonage: binary L16 in exact 20 ms frames. With `use_notify` marks go out as `notify` actions;
    without it the provider has no marks and the playout cursor runs on the local clock."""

    name = "vonage"

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, use_notify: bool = True) -> None:
        super().__init__(max_frame_bytes)
        self.supports_marks = use_notify
        self._sequence = 0

    def decode(self, frame: Frame) -> list[Event]:
        self._check_size(frame)
        if isinstance(frame, bytes | bytearray):
            if not self.started:
                raise ProtocolError("media_before_start", "binary audio before websocket:connected")
            self._sequence += 1
            return [Media(self._decode_pcm(bytes(frame)), sequence=self._sequence)]
        message = parse_json(frame)
        event = message.get("event")
        if event == "websocket:connected":
            return self._on_connected(message)
        if event == "websocket:cleared":
            return [Cleared()]
        if event == "websocket:notify":
            return [Mark(notify_name(message))]
        if event == "websocket:dtmf":
            digit = message.get("digit")
            if not isinstance(digit, str) or len(digit) != 1:
                raise ProtocolError("missing_field", "websocket:dtmf digit must be one character")
            return [Dtmf(digit)]
        if event in ("websocket:disconnected", "websocket:closed"):
            return [Stop(str(event))]
        raise ProtocolError("unknown_event", f"vonage event {event!r}"[:100])

    def _on_connected(self, message: dict[str, Any]) -> list[Event]:
        if self.started:
            raise ProtocolError("duplicate_start", "websocket:connected received twice")
        content_type = message.get("content-type")
        match = _CONTENT_TYPE.match(content_type) if isinstance(content_type, str) else None
        if match is None or int(match.group(1)) not in RATES:
            raise ProtocolError("unsupported_codec", f"vonage content-type {content_type!r}"[:100])
        params = {k: v for k, v in message.items() if k not in _NOT_PARAMETERS}
        call_id = params.get("uuid") if isinstance(params.get("uuid"), str) else None
        start = Start(
            call_id=call_id, stream_id=None, codec="l16le", sample_rate=int(match.group(1)), custom_parameters=params
        )
        self._set_start(start)
        return [Connected(protocol="vonage"), start]

    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        """Exact 20 ms binary frames; the last one padded with silence."""
        frame = self.send_rate // 50
        if len(pcm16) == 0:
            return []
        data = self._encode_pcm(whole_frames(pcm16, frame))
        step = frame * 2
        return [data[i : i + step] for i in range(0, len(data), step)]

    def encode_mark(self, name: str) -> list[Frame]:
        return [dumps({"action": "notify", **notify_body(name)})] if self.supports_marks else []

    def encode_clear(self) -> list[Frame]:
        return [dumps({"action": "clear"})]


class VonageCallerSerializer(PcmCallerSerializer):
    """Vonage's end: `websocket:connected` with the NCCO's headers, then binary 16 kHz L16."""

    path = "/ws/vonage"

    def start(self) -> list[Frame]:
        return [dumps({"event": "websocket:connected", "content-type": f"audio/l16;rate={self.rate}",
                       "uuid": self.call_id, **self.params})]

    def mark_ack(self, name: str) -> list[Frame]:
        return [dumps({"event": "websocket:notify", **notify_body(name)})]

    def dtmf(self, digit: str) -> list[Frame]:
        return [dumps({"event": "websocket:dtmf", "digit": digit, "duration": 100})]

    def clear_ack(self) -> list[Frame]:
        return [dumps({"event": "websocket:cleared"})]

    def control(self, message: dict[str, Any]) -> tuple[str, Any]:
        action = message.get("action")
        if action == "notify":
            return "mark", notify_name(message)
        return ("clear", None) if action == "clear" else ("other", message)


# -- a mark, both ways: the server's `notify` action and Vonage's `websocket:notify` answer carry the same payload


def notify_body(name: str) -> dict[str, Any]:
    return {"payload": {"name": name}}


def notify_name(message: dict[str, Any]) -> str:
    payload = message.get("payload")
    name = payload.get("name") if isinstance(payload, dict) else None
    if not isinstance(name, str):
        raise ProtocolError("missing_field", "websocket:notify payload has no name")
    return name
