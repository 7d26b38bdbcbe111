"""Exotel AgentStream (Voicebot applet): Twilio-like snake_case JSON, base64 16-bit PCM at 8/16/24 kHz.

Outbound chunks must be at least 100 ms, at most 100 kB, and a multiple of 320 bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from voicepipe.transports.serializers.base import DEFAULT_MAX_FRAME_BYTES, ChunkPolicy, Frame, pad_to
from voicepipe.transports.serializers.mediastream import Dialect, MediaStreamCallerSerializer, MediaStreamSerializer

EXOTEL = Dialect(
    name="exotel",
    sequence="sequence_number",
    stream="stream_sid",
    call="call_sid",
    media_format="media_format",
    sample_rate="sample_rate",
    custom_parameters="custom_parameters",
    encodings={"AUDIO/X-RAW": "l16le", "RAW/SLIN": "l16le"},
    rates={"l16le": frozenset({8000, 16000, 24000})},
    extra_start_fields=("account_sid", "from", "to"),
)

MULTIPLE_BYTES = 320
MAX_CHUNK_BYTES = 100_000


class ExotelSerializer(MediaStreamSerializer):
    """Exotel: outbound audio in chunks of `chunk_ms` (>= 100 ms), each a multiple of 320 bytes."""

    dialect = EXOTEL

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        chunk_ms: int = 100,
        min_chunk_ms: int = 100,
    ) -> None:
        super().__init__(max_frame_bytes)
        if min_chunk_ms < 100 or chunk_ms < min_chunk_ms:
            raise ValueError(f"Exotel chunks must be >= 100 ms, got chunk_ms={chunk_ms}, min_chunk_ms={min_chunk_ms}")
        self.chunk_ms = chunk_ms
        self.min_chunk_ms = min_chunk_ms

    def chunk_policy(self) -> ChunkPolicy:
        multiple = MULTIPLE_BYTES // 2  # samples
        rate = self.send_rate

        def whole(ms: int) -> int:
            return -(-(rate * ms // 1000) // multiple) * multiple

        chunk, minimum = whole(self.chunk_ms), whole(self.min_chunk_ms)
        if chunk * 2 > MAX_CHUNK_BYTES:
            raise ValueError(f"{self.chunk_ms} ms at {rate} Hz is over Exotel's {MAX_CHUNK_BYTES} bytes")
        return ChunkPolicy(chunk=chunk, minimum=minimum, multiple=multiple)

    def encode_audio(self, pcm16: np.ndarray) -> list[Frame]:
        """Pad to a valid size (silence at the end) and split anything over 100 kB into valid pieces."""
        policy = self.chunk_policy()
        if len(pcm16) == 0:
            return []
        size = policy.padded_size(len(pcm16))
        samples = pad_to(pcm16, size)
        limit = MAX_CHUNK_BYTES // 2 // policy.multiple * policy.multiple
        pieces = -(-size // limit)
        per = -(-size // pieces // policy.multiple) * policy.multiple
        encode = super().encode_audio
        return [frame for i in range(0, size, per) for frame in encode(samples[i : i + per])]


class ExotelCallerSerializer(MediaStreamCallerSerializer):
    """Exotel's end: 16 kHz slin; every number a string, the sample rate too; no media track."""

    dialect = EXOTEL
    path = "/ws/exotel"
    rate = 16000
    codec = "l16le"
    encoding = "raw/slin"
    track = None

    def media_format(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "sample_rate": str(self.rate), "bit_rate": "16"}

    def start_fields(self) -> dict[str, Any]:
        return {"stream_sid": self.stream_id, "account_sid": "voicepipe", "from": "+15550000001",
                "to": "+15550000002"}

    def stop_fields(self) -> dict[str, Any]:
        return {"call_sid": self.call_id, "reason": "callended"}
