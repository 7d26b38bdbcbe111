"""RFC 4733 telephone events on WebRTC calls (voicepipe/transports/webrtc/dtmf.py), without a peer: the packets a
sender makes read back as one key each, however often the end packet is repeated; other packets pass through; the
SDP's telephone-event types are found. A peer sends them for real in tests/e2e/test_call_tools.py."""

from __future__ import annotations

import asyncio

from aiortc.codecs import CODECS
from aiortc.rtp import RtpPacket

from voicepipe.transports.webrtc import dtmf


class Receiver:
    """Stands in for aiortc's RTCRtpReceiver: keeps what its packet handler is given."""

    def __init__(self) -> None:
        self.handled: list[RtpPacket] = []

    async def _handle_rtp_packet(self, packet: RtpPacket, arrival_time_ms: int) -> None:
        self.handled.append(packet)


def test_each_key_is_reported_once_at_its_end_and_audio_passes_through() -> None:
    receiver, keys = Receiver(), []
    dtmf.tap(receiver, {101: 48000}, keys.append)
    packets = [p for i, key in enumerate("1#9D*") for p in dtmf.event_packets(key, 101, 7, 100 * i, 960 * 10 * i)]
    audio = RtpPacket(payload_type=111, sequence_number=1, timestamp=5, ssrc=8, payload=b"\x00" * 40)

    async def main():
        for packet in [audio, *packets, packets[-1]]:  # a late duplicate of the last end packet
            await receiver._handle_rtp_packet(RtpPacket.parse(packet.serialize()), arrival_time_ms=0)

    asyncio.run(main())
    assert keys == list("1#9D*")
    assert [p.payload_type for p in receiver.handled] == [111]  # aiortc's jitter buffer never sees an event
    first = dtmf.event_packets("5", 101, 1, 65534, 0, rate=8000)
    assert first[0].marker == 1 and not any(p.marker for p in first[1:])
    assert [p.sequence_number for p in first[:3]] == [65534, 65535, 0]
    assert [dtmf.parse_event(p.payload)[1] for p in first] == [False] * 4 + [True] * 3


def test_events_that_are_not_keys_and_short_payloads_are_ignored() -> None:
    assert dtmf.parse_event(b"\x10\x80\x00\x10") is None  # event 16: a tone, not a key
    assert dtmf.parse_event(b"\x01\x80") is None
    assert dtmf.parse_event(b"\x0b\x80\x03\x20") == ("#", True)


def test_the_sdp_types_and_negotiation() -> None:
    sdp = ("v=0\r\na=rtpmap:111 opus/48000/2\r\na=rtpmap:110 telephone-event/48000\r\n"
           "a=rtpmap:126 telephone-event/8000\r\n")
    assert dtmf.telephone_event_types(sdp) == {110: 48000, 126: 8000}
    dtmf.negotiate()
    dtmf.negotiate()
    events = [c for c in CODECS["audio"] if c.mimeType.lower() == dtmf.MIME]
    assert sorted(c.clockRate for c in events) == [8000, 48000]  # once each, however often it is called
    assert CODECS["audio"][0].mimeType == "audio/opus"  # what a call sends stays first
