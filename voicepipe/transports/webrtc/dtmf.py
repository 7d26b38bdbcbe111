"""Key presses on a WebRTC call: RFC 4733 telephone events, the way a browser's `RTCDTMFSender` sends them.

aiortc neither negotiates nor reads telephone events, so this module does both from outside it: `negotiate()` adds
`telephone-event` (48 and 8 kHz) to the audio codecs aiortc answers with (a peer that offers none gets none), and
`tap(receiver, on_key)` takes the telephone-event packets off an `RTCRtpReceiver` before its jitter buffer and
decoder see them. An event is reported once, at its first packet with the end bit (the sender repeats that packet,
and the whole event shares one RTP timestamp). `event_packets` builds them for the caller's side.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable

from aiortc.codecs import CODECS
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtp import RtpPacket

log = logging.getLogger(__name__)

MIME = "audio/telephone-event"
KEYS = "0123456789*#ABCD"  # event codes 0-15 (RFC 4733 section 3.2)
_CODECS = (RTCRtpCodecParameters(mimeType=MIME, clockRate=48000, channels=1, payloadType=110),
           RTCRtpCodecParameters(mimeType=MIME, clockRate=8000, channels=1, payloadType=126))


def negotiate() -> None:
    """Let aiortc accept telephone events in the answers (and offers) it makes; safe to call again."""
    audio = CODECS["audio"]
    for codec in _CODECS:
        if not any(c.mimeType.lower() == MIME and c.clockRate == codec.clockRate for c in audio):
            audio.append(codec)


def parse_event(payload: bytes) -> tuple[str, bool] | None:
    """(key, end of the event) from a telephone-event payload; None for an event that is not a key."""
    if len(payload) < 4:
        return None
    event, flags, _duration = struct.unpack("!BBH", payload[:4])
    if event >= len(KEYS):
        return None
    return KEYS[event], bool(flags & 0x80)


class _Tap:
    def __init__(self, receiver, on_key: Callable[[str], None]) -> None:
        self._handle = receiver._handle_rtp_packet
        self._on_key = on_key
        self._reported: set[tuple[int, int]] = set()  # (ssrc, timestamp) of the events reported
        self.types: set[int] = set()

    async def __call__(self, packet: RtpPacket, arrival_time_ms: int) -> None:
        if packet.payload_type not in self.types:
            await self._handle(packet, arrival_time_ms=arrival_time_ms)
            return
        event = parse_event(packet.payload)
        key = (packet.ssrc, packet.timestamp)
        if event is None or not event[1] or key in self._reported:
            return
        if len(self._reported) > 256:  # the end packets of an event come together: old ones are never needed
            self._reported.clear()
        self._reported.add(key)
        self._on_key(event[0])


def tap(receiver, payload_types: set[int] | dict[int, int], on_key: Callable[[str], None]) -> None:
    """Report the keys of `receiver`'s telephone-event packets (of `payload_types`) to `on_key`; every other packet
    goes on to aiortc as before."""
    if not payload_types:
        return
    hook = _Tap(receiver, on_key)
    hook.types = set(payload_types)
    receiver._handle_rtp_packet = hook


def telephone_event_types(sdp: str) -> dict[int, int]:
    """The payload types an SDP gives telephone-event (`a=rtpmap:<pt> telephone-event/<rate>`), with their rates."""
    types = {}
    for line in sdp.splitlines():
        pt, _, codec = line.removeprefix("a=rtpmap:").partition(" ")
        name, _, rate = codec.strip().partition("/")
        if line.startswith("a=rtpmap:") and name.lower() == "telephone-event" and pt.isdigit():
            types[int(pt)] = int(rate.split("/")[0]) if rate.split("/")[0].isdigit() else 8000
    return types


def event_packets(key: str, payload_type: int, ssrc: int, sequence: int, timestamp: int, rate: int = 48000,
                  duration_ms: int = 100) -> list[RtpPacket]:
    """One key press as a sender puts it on the wire: a packet every 20 ms while it lasts (the first marked), then
    the end packet three times."""
    event = KEYS.index(key.upper())
    step = rate // 50
    total = rate * duration_ms // 1000
    packets = []
    for i, duration in enumerate([*range(step, total, step), total, total, total]):
        end = duration == total
        payload = struct.pack("!BBH", event, (0x80 if end else 0) | 10, min(duration, 0xFFFF))
        packets.append(RtpPacket(payload_type=payload_type, marker=int(i == 0), sequence_number=(sequence + i) % 65536,
                                 timestamp=timestamp, ssrc=ssrc, payload=payload))
    return packets
