"""The shape Twilio, Telnyx, Exotel (and, mostly, Plivo) share: JSON text frames with an `event` field and base64
media, both ways.

Each provider is a `Dialect` (its key spellings, encodings, rates and outbound envelope) handed to one
`MediaStreamSerializer` (the server's end) and one `MediaStreamCallerSerializer` (the provider's end); the
provider modules declare their dialect and what their own messages add. Media and marks have the same shape in
both directions, so both ends build and read them with the functions at the bottom of this module.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from voicepipe.transports.events import (
    Connected,
    Dtmf,
    Event,
    Mark,
    Media,
    ProtocolError,
    Start,
    Stop,
    TransportError,
)
from voicepipe.transports.reorder import ReorderBuffer
from voicepipe.transports.serializers.base import (
    DEFAULT_MAX_FRAME_BYTES,
    CallerSerializer,
    Frame,
    Serializer,
    as_int,
    b64decode,
    b64encode,
    dumps,
    get_obj,
    opt_int,
    parse_json,
)


@dataclass(frozen=True)
class Dialect:
    """One provider's spelling of the Twilio-style media stream protocol."""

    name: str
    sequence: str  # "sequenceNumber" / "sequence_number"
    stream: str  # top-level stream id key
    call: str  # call id key inside `start`
    media_format: str  # "mediaFormat" / "media_format"
    sample_rate: str  # "sampleRate" / "sample_rate"
    custom_parameters: str  # "customParameters" / "custom_parameters"
    encodings: dict[str, str]  # provider encoding name (upper-cased) -> voicepipe codec name
    rates: dict[str, frozenset[int]]  # voicepipe codec name -> sample rates the provider allows with it
    stream_in_outbound: bool = True  # whether outbound media/mark/clear carry the stream id
    extra_start_fields: tuple[str, ...] = ()  # copied from `start` into custom_parameters
    default_format: dict[str, Any] | None = None  # used when `start` has no media format (Twilio: fixed)


class MediaStreamSerializer(Serializer):
    """Twilio-style JSON media stream. Subclasses set `dialect` (and optionally a reorder window)."""

    dialect: Dialect

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        reorder_window: int = 0,
        outbound_encoding: str | None = None,
        outbound_sample_rate: int | None = None,
    ) -> None:
        super().__init__(max_frame_bytes)
        self.name = self.dialect.name
        self.stream_id: str | None = None
        self._outbound = (outbound_encoding, outbound_sample_rate)
        self._reorder: ReorderBuffer[Media] | None = ReorderBuffer(reorder_window) if reorder_window else None
        self._handlers = {
            "connected": self._on_connected,
            "start": self._on_start,
            "media": self._on_media,
            "mark": self._on_mark,
            "dtmf": self._on_dtmf,
            "stop": self._on_stop,
            "error": self._on_error,
        }

    # -- decode -----------------------------------------------------------------------------------
    def decode(self, frame: Frame) -> list[Event]:
        self._check_size(frame)
        message = parse_json(self._require_text(frame))
        event = message.get("event")
        handler = self._handlers.get(event) if isinstance(event, str) else None
        if handler is None:
            raise ProtocolError("unknown_event", f"{self.name} event {event!r}"[:100])
        events = handler(message)
        if self._reorder is None or event in ("start", "connected"):
            return events
        return self._through_reorder(event, message, events)

    def _through_reorder(self, event: str, message: dict[str, Any], events: list[Event]) -> list[Event]:
        """Media waits for its turn by sequence number; other events pass at once but take their number."""
        seq = opt_int(message.get(self.dialect.sequence))
        if event == "stop":
            return [*self._reorder.drain(), *events]
        if event == "media":
            return self._reorder.push(seq, events[0]) if seq is not None else events
        return [*events, *(self._reorder.skip(seq) if seq is not None else [])]

    def _on_connected(self, message: dict[str, Any]) -> list[Event]:
        return [Connected(_str(message.get("protocol")), _str(message.get("version")))]

    def _on_start(self, message: dict[str, Any]) -> list[Event]:
        if self.started:
            raise ProtocolError("duplicate_start", "start received twice")
        d = self.dialect
        body = get_obj(message, "start", "bad_start")
        fmt = body.get(d.media_format, d.default_format)
        if not isinstance(fmt, dict):
            raise ProtocolError("bad_start", f"start.{d.media_format} must be an object")
        codec, rate = self._resolve_format(fmt.get("encoding"), fmt.get(d.sample_rate))
        out_codec, out_rate = codec, rate
        if self._outbound != (None, None):
            encoding, out_rate = self._outbound[0] or _key_of(d, codec), self._outbound[1] or rate
            out_codec, out_rate = self._resolve_format(encoding, out_rate)
        params = body.get(d.custom_parameters)
        params = dict(params) if isinstance(params, dict) else {}
        params.update({k: body[k] for k in d.extra_start_fields if k in body})
        stream_id = _str(message.get(d.stream)) or _str(body.get(d.stream))
        tracks = body.get("tracks")
        start = Start(
            call_id=_str(body.get(d.call)),
            stream_id=stream_id,
            codec=codec,
            sample_rate=rate,
            custom_parameters=params,
            outbound_codec=out_codec,
            outbound_sample_rate=out_rate,
            tracks=tuple(t for t in tracks if isinstance(t, str)) if isinstance(tracks, list) else (),
        )
        self.stream_id = stream_id
        self._set_start(start)
        if self._reorder is not None:
            seq = opt_int(message.get(d.sequence))
            if seq is not None:
                self._reorder.reset(seq + 1)
        return [start]

    def _resolve_format(self, encoding: Any, rate: Any) -> tuple[str, int]:
        d = self.dialect
        codec = d.encodings.get(encoding.upper()) if isinstance(encoding, str) else None
        if codec is None:
            raise ProtocolError("unsupported_codec", f"{d.name} encoding {encoding!r}"[:100])
        sample_rate = as_int(rate, "sample rate", "bad_start")
        if sample_rate not in d.rates.get(codec, ()):
            raise ProtocolError("unsupported_codec", f"{d.name} {encoding} at {sample_rate} Hz")
        return codec, sample_rate

    def _on_media(self, message: dict[str, Any]) -> list[Event]:
        if not self.started:
            raise ProtocolError("media_before_start", "media received before start")
        media = get_obj(message, "media")
        audio = self._decode_pcm(media_payload(message))
        return [
            Media(
                audio=audio,
                sequence=opt_int(message.get(self.dialect.sequence)),
                timestamp_ms=opt_int(media.get("timestamp")),
                track=_str(media.get("track")),
            )
        ]

    def _on_mark(self, message: dict[str, Any]) -> list[Event]:
        return [Mark(mark_name(message))]

    def _on_dtmf(self, message: dict[str, Any]) -> list[Event]:
        digit = get_obj(message, "dtmf").get("digit")
        if not isinstance(digit, str) or len(digit) != 1:
            raise ProtocolError("missing_field", "dtmf.digit must be one character")
        return [Dtmf(digit)]

    def _on_stop(self, message: dict[str, Any]) -> list[Event]:
        stop = message.get("stop")
        reason = stop.get("reason") if isinstance(stop, dict) else None
        return [Stop(_str(reason))]

    def _on_error(self, message: dict[str, Any]) -> list[Event]:
        payload = message.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        detail = " ".join(str(payload[k]) for k in ("title", "detail") if payload.get(k))
        return [TransportError(_str(payload.get("code")), detail or "error")]

    # -- encode -----------------------------------------------------------------------------------
    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        payload = self._encode_pcm(pcm16)
        if not payload:
            return []
        return [self._envelope("media", media_body(payload))]

    def encode_mark(self, name: str) -> list[Frame]:
        return [self._envelope("mark", mark_body(name))]

    def encode_clear(self) -> list[Frame]:
        return [self._envelope("clear", {})]

    def _envelope(self, event: str, body: dict[str, Any]) -> str:
        self._require_start()  # the envelope needs the stream id; Twilio rejects missing fields
        message: dict[str, Any] = {"event": event}
        if self.dialect.stream_in_outbound:
            message[self.dialect.stream] = self.stream_id
        message.update(body)
        return dumps(message)


class MediaStreamCallerSerializer(CallerSerializer):
    """The provider's end of a Twilio-style media stream. Subclasses set `dialect` and say what their own
    `connected`, `start` and `stop` messages carry."""

    dialect: Dialect
    encoding: str  # the provider's name for `codec`, as its start message spells it
    connected: dict[str, Any] | None = {}  # the fields of the `connected` message before `start` (None: none)
    track: str | None = "inbound"  # media.track of the audio sent (None: the provider sends none)
    numbers_as_text = True  # sequence numbers and chunk counters are decimal strings (Twilio, Telnyx, Exotel)
    server_events = {"media": "audio", "mark": "mark", "clear": "clear"}  # what the server's events are

    def __init__(self, call_id: str | None = None, params: dict[str, Any] | None = None,
                 token: str | None = None) -> None:
        super().__init__(call_id, params, token)
        self.stream_id = f"MZ{uuid.uuid4().hex}"
        self._sequence = 0
        self._chunk = 0

    def start(self) -> list[Frame]:
        d = self.dialect
        body = {d.call: self.call_id, d.custom_parameters: self.params, d.media_format: self.media_format(),
                **self.start_fields()}
        connected = [] if self.connected is None else [dumps({"event": "connected", **self.connected})]
        return [*connected, self._message("start", {"start": body})]

    def media_format(self) -> dict[str, Any]:
        return {"encoding": self.encoding, self.dialect.sample_rate: self.rate, "channels": 1}

    def start_fields(self) -> dict[str, Any]:
        """What the provider's `start` body carries besides the call id, parameters and media format."""
        return {}

    def stop_fields(self) -> dict[str, Any]:
        """The provider's `stop` body."""
        return {}

    def audio(self, pcm16: np.ndarray) -> list[Frame]:
        self._chunk += 1
        fields = {"track": self.track} if self.track is not None else {}
        fields.update(chunk=self._number(self._chunk), timestamp=str(self._chunk * 20))
        return [self._message("media", media_body(self.encode(pcm16), **fields))]

    def mark_ack(self, name: str) -> list[Frame]:
        return [self._message("mark", mark_body(name))]

    def dtmf(self, digit: str) -> list[Frame]:
        return [self._message("dtmf", {"dtmf": {"track": "inbound_track", "digit": digit}})]

    def stop(self) -> list[Frame]:
        return [self._message("stop", {"stop": self.stop_fields()})]

    def parse(self, frame: Frame) -> list[tuple[str, Any]]:
        message = parse_json(frame)
        kind = self.server_events.get(message.get("event"))
        if kind == "audio":
            return [("audio", self.decode(media_payload(message)))]
        if kind == "mark":
            return [("mark", self.read_mark(message))]
        return [("clear", None)] if kind == "clear" else [("other", message)]

    def read_mark(self, message: dict[str, Any]) -> str:
        return mark_name(message)

    def _message(self, event: str, body: dict[str, Any], stream: bool = True) -> str:
        """`event` numbered in sequence, with the stream id unless `stream` is False, then `body`."""
        self._sequence += 1
        message: dict[str, Any] = {"event": event, self.dialect.sequence: self._number(self._sequence)}
        if stream:
            message[self.dialect.stream] = self.stream_id
        return dumps({**message, **body})

    def _number(self, n: int) -> int | str:
        return str(n) if self.numbers_as_text else n


# -- the messages both ends build and read ------------------------------------------------------------------


def media_body(payload: bytes, **fields: Any) -> dict[str, Any]:
    """A `media` message's body: the audio payload (base64) and any other `media` fields."""
    return {"media": {**fields, "payload": b64encode(payload)}}


def media_payload(message: dict[str, Any]) -> bytes:
    """The audio of a `media` (or Plivo `playAudio`) message."""
    return b64decode(get_obj(message, "media").get("payload"))


def mark_body(name: str) -> dict[str, Any]:
    return {"mark": {"name": name}}


def mark_name(message: dict[str, Any]) -> str:
    name = get_obj(message, "mark").get("name")
    if not isinstance(name, str):
        raise ProtocolError("missing_field", "mark.name must be a string")
    return name


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else (str(value) if isinstance(value, int | float) else None)


def _key_of(dialect: Dialect, codec: str) -> str:
    """The provider's name for a voicepipe codec (for an outbound override that only gives a rate)."""
    return next(k for k, v in dialect.encodings.items() if v == codec)
