"""What a serializer decodes from the wire: small, provider-neutral events, and the one error it may raise.

Audio in `Media` is always int16 mono at the transport's wire rate (`Start.sample_rate`); resampling to
the pipeline's rate is the gateway's job. A serializer never raises anything but `ProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Connected:
    """The socket is up (Twilio/Telnyx/Exotel `connected`, Vonage `websocket:connected`)."""

    protocol: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Start:
    """The stream's metadata: ids, inbound and outbound codec and rate, and per-call parameters.

    `codec` is an `voicepipe.audio` codec name ("pcmu", "pcma", "l16le", "l16be"). `custom_parameters`
    holds the provider's per-call key/values (Twilio `customParameters`, Telnyx `custom_parameters` plus
    `client_state`, Vonage extra headers, Plivo `extra_headers`, native `system_prompt`/`greeting`...).
    """

    call_id: str | None
    stream_id: str | None
    codec: str
    sample_rate: int
    custom_parameters: dict[str, Any] = field(default_factory=dict)
    outbound_codec: str | None = None
    outbound_sample_rate: int | None = None
    tracks: tuple[str, ...] = ()

    @property
    def send_codec(self) -> str:
        """The codec outbound audio must use (the inbound one unless the provider said otherwise)."""
        return self.outbound_codec or self.codec

    @property
    def send_rate(self) -> int:
        """The sample rate outbound audio must use."""
        return self.outbound_sample_rate or self.sample_rate


@dataclass(frozen=True, eq=False)
class Media:
    """Caller audio: int16 mono samples at the wire rate; `sequence`/`timestamp_ms` as the provider gave them."""

    audio: np.ndarray
    sequence: int | None = None
    timestamp_ms: int | None = None
    track: str | None = None


@dataclass(frozen=True)
class Mark:
    """The provider echoed a mark we sent (Twilio/Telnyx/Exotel `mark`, Vonage `websocket:notify`,
    Plivo `playedStream`, native `mark`). Whether it means "heard" is the playback controller's call."""

    name: str


@dataclass(frozen=True)
class Cleared:
    """The provider confirmed a clear (Vonage `websocket:cleared`, Plivo `clearedAudio`)."""


@dataclass(frozen=True)
class Dtmf:
    """A key press: one of 0-9, *, #, A-D."""

    digit: str


@dataclass(frozen=True)
class Stop:
    """The stream ended (provider `stop`, AudioSocket hangup, native `stop`)."""

    reason: str | None = None


@dataclass(frozen=True)
class TransportError:
    """The provider reported an error on the stream (Telnyx `error`, AudioSocket 0xff)."""

    code: str | None
    message: str


Event = Connected | Start | Media | Mark | Cleared | Dtmf | Stop | TransportError


class ProtocolError(Exception):
    """Bad input from the network, and what the gateway should do about it.

    `close_code` is None when the frame is dropped with a log line and the call carries on; otherwise the
    gateway closes the socket with that WebSocket close code and `reason` (kept under 123 bytes, the
    limit of a close frame). `events` holds what was decoded before the bad part (stream parsers only).
    See docs/native-protocol.md for the table of kinds and reactions.
    """

    def __init__(self, kind: str, detail: str, events: list[Event] | None = None) -> None:
        self.kind = kind
        self.detail = detail
        self.close_code = REACTIONS.get(kind, CLOSE_PROTOCOL_ERROR)
        self.reason = f"{kind}: {detail}".encode()[:120].decode(errors="ignore")
        self.events: list[Event] = events or []
        super().__init__(self.reason)

    @property
    def fatal(self) -> bool:
        """True when the socket should be closed."""
        return self.close_code is not None


# WebSocket close codes (RFC 6455 section 7.4.1).
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_INVALID_PAYLOAD = 1007
CLOSE_POLICY_VIOLATION = 1008
CLOSE_TOO_BIG = 1009

# kind -> close code (None: ignore the frame, log, carry on). One table, so every serializer reacts alike.
REACTIONS: dict[str, int | None] = {
    "malformed_json": None,  # one garbled frame should not end a call
    "not_an_object": None,
    "bad_base64": None,  # drop that audio frame
    "bad_audio": None,  # e.g. odd byte count for L16
    "unknown_event": None,  # providers add events; stay forward compatible
    "missing_field": None,  # a non-start message without a field we need
    "media_before_start": None,  # we do not know the codec yet; drop it
    "duplicate_start": None,
    "unknown_frame_type": None,  # AudioSocket type byte we do not know
    "bad_start": CLOSE_PROTOCOL_ERROR,  # a start we cannot use: nothing that follows can be decoded
    "wrong_frame_type": CLOSE_UNSUPPORTED_DATA,  # binary where text is required, or text where binary is
    "unsupported_codec": CLOSE_UNSUPPORTED_DATA,
    "oversize": CLOSE_TOO_BIG,
}
