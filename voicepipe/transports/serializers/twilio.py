"""Twilio Media Streams (bidirectional `<Connect><Stream>`): JSON text frames, base64 PCMU at 8 kHz."""

from __future__ import annotations

from voicepipe.transports.serializers.mediastream import Dialect, MediaStreamSerializer

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


class TwilioSerializer(MediaStreamSerializer):
    """Twilio: every outbound message names the `streamSid`; marks are echoed, `clear` echoes pending marks."""

    dialect = TWILIO
