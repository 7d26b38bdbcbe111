"""voicepipe's own `/ws` protocol: JSON control messages (`type` field) and binary PCM16 LE mono frames.

Specified in docs/native-protocol.md. The client picks the sample rate in `start`; audio both ways uses
it. Marks are optional: a client that says `"marks": true` echoes each `mark` once the audio before it
has played; otherwise the server runs the playout cursor on its own clock.

A WebRTC call speaks this protocol too (webrtc/link.py turns the peer connection into these frames), so its
caller's end is here as well: `WebRtcCallerSerializer`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from voicepipe.config import MAX_REPLY_TOKENS
from voicepipe.transports.events import Dtmf, Event, Mark, Media, ProtocolError, Start, Stop
from voicepipe.transports.serializers.base import (
    DEFAULT_MAX_FRAME_BYTES,
    Frame,
    PcmCallerSerializer,
    Serializer,
    dumps,
    parse_json,
)

RATES = frozenset({8000, 16000, 24000, 48000})


@dataclass(frozen=True)
class KeyPress:
    """A key a WebRTC caller presses: not a frame, an RTP event its link sends (caller/webrtc.py)."""

    digit: str
START_FIELDS = ("system_prompt", "greeting", "metadata", "turn_policy", "tools", "tool_choice", "max_reply_tokens")
PROTOCOL_VERSION = 1


class NativeSerializer(Serializer):
    """Server side of `/ws`."""

    name = "native"
    supports_marks = False  # until the client's start says otherwise

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes)
        self._sequence = 0

    def decode(self, frame: Frame) -> list[Event]:
        self._check_size(frame)
        if isinstance(frame, bytes | bytearray):
            if not self.started:
                raise ProtocolError("media_before_start", "binary audio before start")
            self._sequence += 1
            return [Media(self._decode_pcm(bytes(frame)), sequence=self._sequence)]
        message = parse_json(frame)
        kind = message.get("type")
        if kind == "start":
            return [self._on_start(message)]
        if kind == "mark":
            return [Mark(mark_name(message))]
        if kind == "dtmf":
            digit = message.get("digit")
            if not isinstance(digit, str) or len(digit) != 1:
                raise ProtocolError("missing_field", "dtmf.digit must be one character")
            return [Dtmf(digit)]
        if kind == "stop":
            return [Stop(message.get("reason") if isinstance(message.get("reason"), str) else None)]
        raise ProtocolError("unknown_event", f"native message type {kind!r}"[:100])

    def _on_start(self, message: dict[str, Any]) -> Start:
        if self.started:
            raise ProtocolError("duplicate_start", "start received twice")
        rate = message.get("sample_rate", 16000)
        if isinstance(rate, bool) or not isinstance(rate, int) or rate not in RATES:
            raise ProtocolError("unsupported_codec", f"sample_rate {rate!r} not in {sorted(RATES)}"[:100])
        encoding = message.get("encoding", "pcm16")
        if encoding != "pcm16":
            raise ProtocolError("unsupported_codec", f"encoding {encoding!r} (only 'pcm16')"[:100])
        for key, kinds in (("system_prompt", str), ("greeting", (str, type(None))), ("metadata", dict),
                           ("turn_policy", str), ("tools", (str, list)), ("tool_choice", str)):
            if key in message and not isinstance(message[key], kinds):
                raise ProtocolError("bad_start", f"start.{key} has the wrong type")
        if isinstance(message.get("tools"), list) and not all(isinstance(t, str) for t in message["tools"]):
            raise ProtocolError("bad_start", "start.tools must name tools (strings)")
        budget = message.get("max_reply_tokens")
        if "max_reply_tokens" in message and (isinstance(budget, bool) or not isinstance(budget, int)
                                              or not 1 <= budget <= MAX_REPLY_TOKENS):
            raise ProtocolError("bad_start", f"start.max_reply_tokens must be an integer from 1 to {MAX_REPLY_TOKENS}")
        call_id = message.get("call_id")
        params = {k: message[k] for k in START_FIELDS if k in message}
        self.supports_marks = message.get("marks") is True
        return self._set_start(
            Start(
                call_id=call_id if isinstance(call_id, str) else None,
                stream_id=None,
                codec="l16le",
                sample_rate=rate,
                custom_parameters=params,
            )
        )

    # -- encode: audio, marks, clear -------------------------------------------------------------
    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        data = self._encode_pcm(pcm16)
        return [data] if data else []

    def encode_mark(self, name: str) -> list[Frame]:
        return [mark_message(name)] if self.supports_marks else []

    def encode_clear(self) -> list[Frame]:
        return [dumps({"type": "clear"})]

    # -- encode: what a client shows ---------------------------------------------------------------
    def encode_started(self, call_id: str) -> list[Frame]:
        return [
            dumps(
                {
                    "type": "started",
                    "call_id": call_id,
                    "sample_rate": self.send_rate,
                    "version": PROTOCOL_VERSION,
                    "marks": self.supports_marks,
                }
            )
        ]

    def encode_transcript(self, text: str, final: bool, turn: int) -> list[Frame]:
        """The caller's words: partials while they speak, one final per turn."""
        return [dumps({"type": "transcript", "role": "user", "text": text, "final": final, "turn": turn})]

    def encode_agent_text(self, text: str, turn: int, final: bool = False) -> list[Frame]:
        """The agent's words as they are generated (`final` once the reply is complete)."""
        return [dumps({"type": "agent_text", "text": text, "final": final, "turn": turn})]

    def encode_turn(self, turn: int, timings_ms: dict[str, float]) -> list[Frame]:
        """One turn's timeline (milliseconds, relative to the caller's speech end)."""
        timings = {k: round(float(v), 1) for k, v in timings_ms.items()}
        return [dumps({"type": "turn", "turn": turn, "timings_ms": timings})]

    def encode_error(self, code: str, message: str) -> list[Frame]:
        return [dumps({"type": "error", "code": code, "message": message})]

    def encode_dtmf(self, digits: str) -> list[Frame]:
        """Keys the agent presses (its send_dtmf tool), for the client to play on the line."""
        return [dumps({"type": "dtmf", "digits": digits})]

    def encode_transfer(self, target: str) -> list[Frame]:
        """The agent transfers the caller (its transfer_call tool); the server hangs up after it."""
        return [dumps({"type": "transfer", "target": target})]


class NativeCallerSerializer(PcmCallerSerializer):
    """A client of `/ws`: 16 kHz PCM16, marks on; the server's events come out of `parse` as ("event", message)."""

    path = "/ws"

    def start(self) -> list[Frame]:
        return [start_message(self.rate, {"call_id": self.call_id, "marks": True, **self.params})]

    def mark_ack(self, name: str) -> list[Frame]:
        return [mark_message(name)]

    def dtmf(self, digit: str) -> list[Frame]:
        return [dtmf_message(digit)]

    def stop(self) -> list[Frame]:
        return [stop_message("hangup")]

    def control(self, message: dict[str, Any]) -> tuple[str, Any]:
        kind = message.get("type")
        if kind == "mark":
            return "mark", mark_name(message)
        return ("clear", None) if kind == "clear" else ("event", message)


class WebRtcCallerSerializer(NativeCallerSerializer):
    """A WebRTC peer: 48 kHz mono PCM frames on the audio tracks, the native events on the data channel (the
    signalling happens when the link opens, so there is no start message; marks stay inside the server).

    The server's track never stops sending: frames of silence are not agent audio, except the short gaps
    inside a reply (up to `HANGOVER_S` after the last loud frame), which stay in the recording."""

    link = "webrtc"
    path = "/webrtc/offer"
    rate = 48000  # WebRTC's audio rate (webrtc/media.py), as int16 arrays: the link does the Opus
    SILENCE_PEAK = 64  # int16 peak below which a received frame is silence
    HANGOVER_S = 0.3

    def __init__(self, call_id: str | None = None, params: dict[str, Any] | None = None,
                 token: str | None = None) -> None:
        super().__init__(call_id, params, token)
        self._quiet: int | None = None  # samples of silence since the last loud frame (None: no agent audio yet)

    def start(self) -> list[Frame]:
        return []

    def audio(self, pcm16: np.ndarray) -> list[np.ndarray]:
        return [pcm16]

    def dtmf(self, digit: str) -> list[KeyPress]:
        return [KeyPress(digit)]  # the link sends it as RFC 4733 telephone events, as a browser does

    def parse(self, frame: str | np.ndarray) -> list[tuple[str, Any]]:
        if isinstance(frame, str):
            return [("event", json.loads(frame))]
        if len(frame) and int(np.abs(frame.astype(np.int32)).max()) > self.SILENCE_PEAK:
            self._quiet = 0
            return [("audio", frame)]
        if self._quiet is None or self._quiet >= self.HANGOVER_S * self.rate:
            return []
        self._quiet += len(frame)
        return [("audio", frame)]


class SipCallerSerializer(WebRtcCallerSerializer):
    """A SIP phone over WebSocket (caller/sip.py): the WebRTC peer's frames, signalled by SIP at `/sip`; the
    native `stop` it sends is the link's cue to hang up with a BYE. There is no data channel, so no events."""

    link = "sip"
    path = "/sip"


# -- the messages both ends build and read (webrtc/link.py builds them too) ---------------------------------


def start_message(sample_rate: int, fields: dict[str, Any]) -> str:
    """A client's `start`: PCM16 at `sample_rate` both ways, then `fields` (`call_id`, `marks`, `greeting`, ...)."""
    return dumps({"type": "start", "sample_rate": sample_rate, "encoding": "pcm16", **fields})


def dtmf_message(digit: str) -> str:
    """A key the caller pressed (one of 0-9, *, #, A-D; a WebRTC call's RFC 4733 event or a SIP INFO becomes one,
    webrtc/link.py)."""
    return dumps({"type": "dtmf", "digit": digit})


def stop_message(reason: str) -> str:
    return dumps({"type": "stop", "reason": reason})


def mark_message(name: str) -> str:
    """A mark, both ways: the server sends it behind the audio it follows, the client echoes it once played."""
    return dumps({"type": "mark", "name": name})


def mark_name(message: dict[str, Any]) -> str:
    if not isinstance(message.get("name"), str):
        raise ProtocolError("missing_field", "mark.name must be a string")
    return message["name"]
