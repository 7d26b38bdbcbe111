"""The two ends of a wire format (`Serializer`: the server's; `CallerSerializer`: the provider's or client app's),
the chunk policy the playback controller follows, and the helpers both ends share."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from voicepipe.audio import Codec, get_codec
from voicepipe.audio.l16 import require_dtype
from voicepipe.transports.events import Event, ProtocolError, Start

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME_BYTES = 1 << 20  # 1 MiB
_DECIMAL = re.compile(r"-?[0-9]{1,18}")  # a number as text: ASCII digits only, within int64
Frame = str | bytes


@dataclass(frozen=True)
class ChunkPolicy:
    """How outbound audio must be cut, in samples at the wire rate.

    `chunk` is the nominal size; `minimum` the smallest chunk the provider accepts (the tail of an
    utterance is padded with silence up to it); every chunk is a multiple of `multiple`.
    """

    chunk: int
    minimum: int = 1
    multiple: int = 1

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.minimum < 1 or self.multiple < 1:
            raise ValueError(f"chunk policy sizes must be positive, got {self}")
        if self.chunk % self.multiple or self.chunk < self.minimum:
            raise ValueError(f"chunk must be a multiple of `multiple` and >= `minimum`, got {self}")

    def padded_size(self, n: int) -> int:
        """The smallest allowed size that holds `n` samples."""
        n = max(n, self.minimum)
        return -(-n // self.multiple) * self.multiple

    @classmethod
    def millis(cls, sample_rate: int, chunk_ms: int = 20, minimum_ms: int = 0, multiple: int = 1) -> ChunkPolicy:
        chunk = sample_rate * chunk_ms // 1000
        return cls(chunk=chunk, minimum=max(1, sample_rate * minimum_ms // 1000), multiple=multiple)


@dataclass
class DecodeResult:
    """Everything one frame produced: events in order, and the errors met on the way (see `decode_safe`)."""

    events: list[Event]
    errors: list[ProtocolError]

    @property
    def fatal(self) -> ProtocolError | None:
        return next((e for e in self.errors if e.fatal), None)


class Serializer(ABC):
    """One provider's wire format. Pure: no I/O, no clock. One instance per call.

    `decode` turns one received frame into events; the `encode_*` methods return the frames to send
    (a list, possibly empty: a provider without marks encodes a mark as nothing). Outbound audio is
    int16 mono at `send_rate`, cut by the playback controller according to `chunk_policy()`.
    """

    name: str = "base"
    #: Whether the provider echoes marks; without them the playout cursor runs on the local clock.
    supports_marks: bool = True
    #: Whether the provider can flush its playout buffer (AudioSocket cannot).
    supports_clear: bool = True

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.start: Start | None = None
        self._in_codec: Codec | None = None
        self._out_codec: Codec | None = None

    # -- what the gateway reads -------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self.start is not None

    @property
    def sample_rate(self) -> int:
        """Inbound wire rate (valid once started)."""
        return self._require_start().sample_rate

    @property
    def send_rate(self) -> int:
        """Outbound wire rate (valid once started)."""
        return self._require_start().send_rate

    @property
    def codec(self) -> str:
        """Inbound codec name (valid once started)."""
        return self._require_start().codec

    def chunk_policy(self) -> ChunkPolicy:
        """How the playback controller must cut audio for this provider (valid once started)."""
        return ChunkPolicy.millis(self.send_rate, 20)

    # -- decode -----------------------------------------------------------------------------------
    @abstractmethod
    def decode(self, frame: Frame) -> list[Event]:
        """Decode one received frame; raises only ProtocolError."""

    def decode_safe(self, frame: Frame) -> DecodeResult:
        """Decode without raising: errors are logged and collected; stream parsers continue past them."""
        events: list[Event] = []
        errors: list[ProtocolError] = []
        data: Frame = frame
        while True:
            try:
                events.extend(self.decode(data))
                return DecodeResult(events, errors)
            except ProtocolError as exc:
                events.extend(exc.events)
                errors.append(exc)
                log.warning("%s: %s (%s)", self.name, exc.reason, "closing" if exc.fatal else "ignored")
                if exc.fatal or not self._resumable:
                    return DecodeResult(events, errors)
                data = b""

    _resumable = False  # stream parsers keep the unread bytes and can continue after an error

    # -- encode -----------------------------------------------------------------------------------
    @abstractmethod
    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        """Frames that carry these samples (int16 mono at `send_rate`)."""

    def encode_mark(self, name: str) -> list[Frame]:
        """Frames for a mark the provider echoes once the audio before it has played."""
        return []

    def encode_clear(self) -> list[Frame]:
        """Frames that make the provider drop the audio it has buffered."""
        return []

    # -- helpers for subclasses ---------------------------------------------------------------------
    def _require_start(self) -> Start:
        if self.start is None:
            raise RuntimeError(f"{self.name}: no start message yet")
        return self.start

    def _set_start(self, start: Start) -> Start:
        """Record the start message and resolve its codecs (raises unsupported_codec)."""
        self._in_codec = _codec(start.codec)
        self._out_codec = _codec(start.send_codec)
        self.start = start
        return start

    def _encode_pcm(self, pcm16: np.ndarray) -> bytes:
        self._require_start()
        samples = require_dtype(pcm16, np.int16)
        if samples.ndim != 1:
            raise ValueError(f"expected 1-D int16 samples, got shape {samples.shape}")
        return self._out_codec.encode(np.ascontiguousarray(samples))

    def _decode_pcm(self, data: bytes) -> np.ndarray:
        try:
            return self._in_codec.decode(data)
        except ValueError as exc:
            raise ProtocolError("bad_audio", str(exc)) from None

    def _check_size(self, frame: Frame) -> None:
        size = len(frame) if isinstance(frame, bytes | bytearray) else len(frame.encode("utf-8", "replace"))
        if size > self.max_frame_bytes:
            raise ProtocolError("oversize", f"{size} bytes > {self.max_frame_bytes}")

    def _require_text(self, frame: Frame) -> str:
        if not isinstance(frame, str):
            raise ProtocolError("wrong_frame_type", f"{self.name} sends text frames only, got binary")
        return frame


class CallerSerializer(ABC):
    """The far end of one provider's wire format: what the provider (or a client app) sends a voicepipe server,
    and what it makes of the server's frames. What `voicepipe call`, the benches and the tests speak. Pure, like
    `Serializer`; one instance per call.

    `parse` turns one received frame into (kind, value) items: ("audio", int16 samples at `rate`), ("mark",
    name) to echo once the audio before it has played, ("clear", None), ("event", message) for the native
    protocol's events, ("hangup", None), and ("other", anything else).
    """

    rate: int = 8000  # caller audio, both ways
    codec: str = "pcmu"
    link: str = "websocket"  # what the call travels on: "websocket", "tcp", "webrtc" or "sip"
    path: str | None = None  # the server's endpoint for this transport

    def __init__(self, call_id: str | None = None, params: dict[str, Any] | None = None,
                 token: str | None = None) -> None:
        self.call_id = call_id or f"CA{uuid.uuid4().hex}"
        self.params = dict(params or {})
        self.token = token
        self._codec = get_codec(self.codec)

    def headers(self) -> dict[str, str]:
        """Headers of the connection request: the shared secret, where the server expects it."""
        return {"authorization": f"Bearer {self.token}"} if self.token else {}

    @abstractmethod
    def start(self) -> list[Frame]:
        """The frames that open the call."""

    @abstractmethod
    def audio(self, pcm16: np.ndarray) -> list[Frame]:
        """Frames that carry caller audio (int16 mono at `rate`, 20 ms at a time)."""

    def mark_ack(self, name: str) -> list[Frame]:
        """The echo of the server's mark `name`, once the audio before it has played."""
        return []

    def clear_ack(self) -> list[Frame]:
        """The answer to a clear (after the echoes of the marks it dropped)."""
        return []

    def dtmf(self, digit: str) -> list[Frame]:
        """The frames of one key press (0-9, *, #, A-D) as the provider reports it."""
        raise NotImplementedError(f"{type(self).__name__} sends no keys")

    def stop(self) -> list[Frame]:
        """The frames that hang up."""
        return []

    @abstractmethod
    def parse(self, frame: Frame) -> list[tuple[str, Any]]:
        """One received frame as (kind, value) items."""

    def encode(self, pcm16: np.ndarray) -> bytes:
        return self._codec.encode(pcm16)

    def decode(self, data: bytes) -> np.ndarray:
        return self._codec.decode(data)


class PcmCallerSerializer(CallerSerializer):
    """A caller's end whose audio is binary 16-bit PCM frames and whose control messages are JSON text."""

    rate = 16000
    codec = "l16le"

    def audio(self, pcm16: np.ndarray) -> list[Frame]:
        return [self.encode(pcm16)]

    def parse(self, frame: Frame) -> list[tuple[str, Any]]:
        if isinstance(frame, bytes):
            return [("audio", self.decode(frame))]
        return [self.control(parse_json(frame))]

    @abstractmethod
    def control(self, message: dict[str, Any]) -> tuple[str, Any]:
        """One JSON control message from the server as a (kind, value) item."""


def pad_to(samples: np.ndarray, size: int) -> np.ndarray:
    """`samples` followed by silence up to `size` samples."""
    if len(samples) >= size:
        return samples
    return np.concatenate([samples, np.zeros(size - len(samples), dtype=samples.dtype)])


def whole_frames(samples: np.ndarray, frame: int) -> np.ndarray:
    """`samples` padded with silence to a whole number of `frame`-sample frames."""
    return pad_to(samples, -(-len(samples) // frame) * frame)


def parse_json(frame: str) -> dict[str, Any]:
    """Parse one JSON text frame into an object."""
    try:
        message = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("malformed_json", str(exc)[:80]) from None
    if not isinstance(message, dict):
        raise ProtocolError("not_an_object", f"expected a JSON object, got {type(message).__name__}")
    return message


def b64decode(payload: Any) -> bytes:
    """Strict base64 (RFC 4648 alphabet, padding checked)."""
    if not isinstance(payload, str):
        raise ProtocolError("bad_base64", f"payload must be a base64 string, got {type(payload).__name__}")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError("bad_base64", str(exc)[:80]) from None


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"))


def get_obj(message: dict[str, Any], key: str, kind: str = "missing_field") -> dict[str, Any]:
    """message[key] as an object, or ProtocolError(kind)."""
    value = message.get(key)
    if not isinstance(value, dict):
        raise ProtocolError(kind, f"'{key}' must be an object")
    return value


def as_int(value: Any, what: str, kind: str = "missing_field") -> int:
    """An int from an int or a decimal string (Twilio/Telnyx/Exotel send numbers as strings)."""
    if isinstance(value, bool):
        raise ProtocolError(kind, f"{what} must be a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        return int(value)
    raise ProtocolError(kind, f"{what} must be a number, got {value!r}"[:100])


def opt_int(value: Any) -> int | None:
    try:
        return as_int(value, "value") if value is not None else None
    except ProtocolError:
        return None


def _codec(name: str) -> Codec:
    try:
        return get_codec(name)
    except ValueError:
        raise ProtocolError("unsupported_codec", name) from None
