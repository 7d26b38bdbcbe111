"""Asterisk AudioSocket over TCP: 1-byte type, 2-byte big-endian payload length, payload.

Types: 0x00 hangup, 0x01 16-byte call UUID, 0x03 one ASCII DTMF digit, 0x10 signed-linear 16-bit LE
mono at 8 kHz (newer Asterisk: 0x11-0x18 for 12/16/24/32/44.1/48/96/192 kHz), 0xff error (optional
code; Asterisk's are bit flags: 0x01 caller hung up, 0x02 frame forwarding, 0x04 memory).
TCP has no frames, so `decode` is a stream parser: feed it any slice of bytes, it keeps the rest.
There is no mark and no clear; the playback controller paces on the local clock. Asterisk's end of the same
stream (what `voicepipe call --transport audiosocket` speaks) is `AudioSocketCallerSerializer`.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from voicepipe.transports.events import Dtmf, Event, Media, ProtocolError, Start, Stop, TransportError
from voicepipe.transports.serializers.base import (
    DEFAULT_MAX_FRAME_BYTES,
    CallerSerializer,
    Frame,
    Serializer,
    whole_frames,
)

KIND_HANGUP = 0x00
KIND_UUID = 0x01
KIND_DTMF = 0x03
KIND_SLIN = 0x10
KIND_ERROR = 0xFF
SLIN_RATES = {
    0x10: 8000,
    0x11: 12000,
    0x12: 16000,
    0x13: 24000,
    0x14: 32000,
    0x15: 44100,
    0x16: 48000,
    0x17: 96000,
    0x18: 192000,
}
_KIND_OF_RATE = {rate: kind for kind, rate in SLIN_RATES.items()}
HEADER = struct.Struct(">BH")
MAX_PAYLOAD = 0xFFFF
ERROR_FLAGS = {0x01: "caller hung up", 0x02: "frame forwarding error", 0x04: "memory allocation error"}


def encode_message(kind: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"AudioSocket payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    return HEADER.pack(kind, len(payload)) + payload


def read_messages(buffer: bytearray) -> Iterator[tuple[int, bytes]]:
    """Take each complete message off the front of `buffer`, one per step; an incomplete one stays for later."""
    while len(buffer) >= HEADER.size:
        kind, length = HEADER.unpack_from(buffer)
        if len(buffer) < HEADER.size + length:
            return
        payload = bytes(buffer[HEADER.size : HEADER.size + length])
        del buffer[: HEADER.size + length]
        yield kind, payload


class AudioSocketSerializer(Serializer):
    """Server side of one AudioSocket connection. `sample_rate` is the rate until audio says otherwise."""

    name = "audiosocket"
    supports_marks = False
    supports_clear = False
    _resumable = True

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, sample_rate: int = 8000) -> None:
        super().__init__(max_frame_bytes)
        if sample_rate not in _KIND_OF_RATE:
            raise ValueError(f"AudioSocket has no audio type for {sample_rate} Hz")
        self._rate = sample_rate
        self._buffer = bytearray()
        self._sequence = 0
        self.closed = False

    def decode(self, frame: Frame) -> list[Event]:
        """Feed received bytes; returns the events of every complete message in them."""
        if isinstance(frame, str):
            raise ProtocolError("wrong_frame_type", "AudioSocket is a byte stream, got text")
        if len(self._buffer) + len(frame) > self.max_frame_bytes + HEADER.size + MAX_PAYLOAD:
            self.closed = True
            raise ProtocolError("oversize", f"{len(self._buffer) + len(frame)} bytes buffered")
        self._buffer += frame
        events: list[Event] = []
        if self.closed:
            return events
        for kind, payload in read_messages(self._buffer):
            try:
                events.extend(self._message(kind, payload))
            except ProtocolError as exc:
                exc.events = events + exc.events
                if exc.fatal:  # the stream cannot be trusted after it: nothing more is read, as after a hangup
                    self.closed = True
                raise
            if self.closed:  # what follows a hangup stays unread
                break
        return events

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete message held for the next feed."""
        return len(self._buffer)

    def _message(self, kind: int, payload: bytes) -> list[Event]:
        if kind == KIND_HANGUP:
            self.closed = True
            return [Stop("hangup")]
        if kind == KIND_UUID:
            return self._on_uuid(payload)
        if kind == KIND_DTMF:
            if len(payload) != 1 or not payload.isascii():
                raise ProtocolError("bad_audio", f"DTMF payload must be one ASCII byte, got {len(payload)} bytes")
            return [Dtmf(payload.decode("ascii"))]
        if kind in SLIN_RATES:
            return self._on_audio(kind, payload)
        if kind == KIND_ERROR:
            code = payload[0] if payload else None
            flags = [text for bit, text in ERROR_FLAGS.items() if code is not None and code & bit]
            return [TransportError(None if code is None else f"0x{code:02x}", ", ".join(flags) or "error")]
        raise ProtocolError("unknown_frame_type", f"AudioSocket type 0x{kind:02x}")

    def _on_uuid(self, payload: bytes) -> list[Event]:
        if self.started:
            raise ProtocolError("duplicate_start", "second UUID message")
        if len(payload) != 16:
            raise ProtocolError("bad_start", f"UUID payload must be 16 bytes, got {len(payload)}")
        call_id = str(uuid.UUID(bytes=payload))
        return [self._set_start(Start(call_id=call_id, stream_id=call_id, codec="l16le", sample_rate=self._rate))]

    def _on_audio(self, kind: int, payload: bytes) -> list[Event]:
        if not self.started:
            raise ProtocolError("media_before_start", "audio before the UUID message")
        rate = SLIN_RATES[kind]
        if rate != self.start.sample_rate:  # Asterisk switched rate (channel driver): follow it both ways
            self._rate = rate
            self.start = Start(
                call_id=self.start.call_id,
                stream_id=self.start.stream_id,
                codec="l16le",
                sample_rate=rate,
                custom_parameters=self.start.custom_parameters,
            )
        self._sequence += 1
        return [Media(self._decode_pcm(payload), sequence=self._sequence)]

    # -- encode -----------------------------------------------------------------------------------
    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        """20 ms audio messages at the current rate (the last one padded with silence)."""
        frame = self.send_rate // 50
        if len(pcm16) == 0:
            return []
        data = self._encode_pcm(whole_frames(pcm16, frame))
        kind, step = _KIND_OF_RATE[self.send_rate], frame * 2
        return [encode_message(kind, data[i : i + step]) for i in range(0, len(data), step)]

    def encode_hangup(self) -> list[Frame]:
        return [encode_message(KIND_HANGUP)]


class AudioSocketCallerSerializer(CallerSerializer):
    """Asterisk's end: a UUID message, then 20 ms slin frames at 8 kHz; no marks, no clear. The call id is a
    UUID (a name that is not one becomes the UUID derived from it)."""

    link = "tcp"
    codec = "l16le"

    def __init__(self, call_id: str | None = None, params: dict[str, Any] | None = None,
                 token: str | None = None) -> None:
        super().__init__(call_id or str(uuid.uuid4()), params, token)
        try:
            self.uuid = uuid.UUID(self.call_id)
        except ValueError:
            self.uuid = uuid.uuid5(uuid.NAMESPACE_URL, self.call_id)
        self.call_id = str(self.uuid)
        self._buffer = bytearray()

    def start(self) -> list[Frame]:
        return [encode_message(KIND_UUID, self.uuid.bytes)]

    def audio(self, pcm16: np.ndarray) -> list[Frame]:
        return [encode_message(KIND_SLIN, self.encode(pcm16))]

    def dtmf(self, digit: str) -> list[Frame]:
        return [encode_message(KIND_DTMF, digit.encode("ascii"))]

    def stop(self) -> list[Frame]:
        return [encode_message(KIND_HANGUP)]

    def parse(self, frame: Frame) -> list[tuple[str, Any]]:
        self._buffer += frame
        out: list[tuple[str, Any]] = []
        for kind, payload in read_messages(self._buffer):
            if kind == KIND_SLIN:
                out.append(("audio", self.decode(payload)))
            elif kind == KIND_HANGUP:
                out.append(("hangup", None))
            else:
                out.append(("other", {"kind": kind}))
        return out
