"""Telnyx media streaming (`stream_bidirectional_mode: "rtp"`): the Twilio shape in snake_case.

Frames may arrive out of order, so media passes a small reorder buffer keyed by `sequence_number`.
The inbound codec comes from `start.media_format`; the outbound one is set on the Call Control command
(`stream_bidirectional_codec`), so the gateway passes it here when it differs.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any, Literal

from voicepipe.auth import TELNYX_AUTH_HEADER
from voicepipe.transports.serializers.base import DEFAULT_MAX_FRAME_BYTES
from voicepipe.transports.serializers.mediastream import Dialect, MediaStreamCallerSerializer, MediaStreamSerializer

_8K, _8K_16K = frozenset({8000}), frozenset({8000, 16000})

TELNYX = Dialect(
    name="telnyx",
    sequence="sequence_number",
    stream="stream_id",
    call="call_control_id",
    media_format="media_format",
    sample_rate="sample_rate",
    custom_parameters="custom_parameters",
    # L16 inside RTP is network byte order (RFC 3551 section 4.5.11); see `l16_byteorder`.
    encodings={"PCMU": "pcmu", "PCMA": "pcma", "L16": "l16be"},
    rates={"pcmu": _8K, "pcma": _8K, "l16be": _8K_16K, "l16le": _8K_16K},
    stream_in_outbound=False,
    extra_start_fields=("client_state", "call_session_id", "from", "to"),
)

class TelnyxSerializer(MediaStreamSerializer):
    """Telnyx: reorders media by `sequence_number` (window of `reorder_window` frames, 0 to disable)."""

    dialect = TELNYX

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        reorder_window: int = 5,
        outbound_encoding: str | None = None,
        outbound_sample_rate: int | None = None,
        l16_byteorder: Literal["big", "little"] = "big",
    ) -> None:
        if l16_byteorder == "little":
            self.dialect = replace(TELNYX, encodings={**TELNYX.encodings, "L16": "l16le"})
        super().__init__(max_frame_bytes, reorder_window, outbound_encoding, outbound_sample_rate)


class TelnyxCallerSerializer(MediaStreamCallerSerializer):
    """Telnyx's end: the shared secret goes in Telnyx's own header, not as a bearer token."""

    dialect = TELNYX
    path = "/ws/telnyx"
    encoding = "PCMU"
    connected = {"version": "1.0.0"}

    def headers(self) -> dict[str, str]:
        return {TELNYX_AUTH_HEADER: self.token} if self.token else {}

    def start_fields(self) -> dict[str, Any]:
        return {"call_session_id": str(uuid.uuid4()), "from": "+15550000001", "to": "+15550000002"}

    def stop_fields(self) -> dict[str, Any]:
        return {"call_control_id": self.call_id}
