"""Twilio Media Streams (bidirectional `<Connect><Stream>`): JSON text frames, base64 PCMU at 8 kHz."""

from __future__ import annotations

from typing import Any

from voicepipe.transports.serializers.mediastream import Dialect, MediaStreamCallerSerializer, MediaStreamSerializer

TWILIO = Dialect(
    name="twilio",
    sequence="sequenceNumber",
    stream="streamSid",
    call="callSid",
    media_format="mediaFormat",
    sample_rate="sampleRate",
    custom_parameters="customParameters",
    encodings={"AUDIO/X-MULAW": "pcmu"},
    rates={"pcmu": frozenset({8000})},
    extra_start_fields=(),
)
ACCOUNT_SID = "AC" + "0" * 32  # what the caller side sends as its account


class TwilioSerializer(MediaStreamSerializer):
    """Twilio: every outbound message names the `streamSid`; marks are echoed, `clear` echoes pending marks."""

    dialect = TWILIO


class TwilioCallerSerializer(MediaStreamCallerSerializer):
    """Twilio's end: `connected`, then `start` with the `streamSid` in the body too."""

    dialect = TWILIO
    path = "/ws/twilio"
    encoding = "audio/x-mulaw"
    connected = {"protocol": "Call", "version": "1.0.0"}

    def start_fields(self) -> dict[str, Any]:
        return {"streamSid": self.stream_id, "accountSid": ACCOUNT_SID, "tracks": ["inbound"]}

    def stop_fields(self) -> dict[str, Any]:
        return {"accountSid": ACCOUNT_SID, "callSid": self.call_id}
