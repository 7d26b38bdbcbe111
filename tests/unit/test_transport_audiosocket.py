"""AudioSocket framing: a stream parser that works however TCP slices the bytes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from voicepipe.transports.events import Dtmf, Media, ProtocolError, Start, Stop, TransportError
from voicepipe.transports.serializers import AudioSocketSerializer
from voicepipe.transports.serializers.audiosocket import encode_message

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "transports" / "audiosocket" / "inbound.json"
CALL = uuid.UUID("40325ec2-5efd-4bd3-805f-53576e581d13")


def recorded_stream() -> bytes:
    return b"".join(bytes.fromhex(m["hex"]) for m in json.loads(FIXTURE.read_text())["messages"])


def summary(events: list) -> list:
    return [(type(e).__name__, e.audio.tobytes() if isinstance(e, Media) else e) for e in events]


def test_byte_by_byte_gives_the_same_events_as_one_read():
    stream = recorded_stream()
    whole = AudioSocketSerializer().decode(stream)
    parser = AudioSocketSerializer()
    trickled = []
    for i in range(len(stream)):
        trickled.extend(parser.decode(stream[i : i + 1]))
    assert summary(trickled) == summary(whole)
    assert [type(e) for e in whole] == [Start, Media, Media, Media, Dtmf, TransportError, Stop]


@pytest.mark.parametrize("cut", [1, 2, 3, 10, 19, 20, 21, 200])
def test_any_split_point_works_and_partial_messages_wait(cut):
    stream = recorded_stream()
    parser = AudioSocketSerializer()
    first = parser.decode(stream[:cut])
    boundaries = np.cumsum([len(bytes.fromhex(m["hex"])) for m in json.loads(FIXTURE.read_text())["messages"]])
    assert parser.pending_bytes == cut - max([0, *(b for b in boundaries if b <= cut)])
    rest = parser.decode(stream[cut:])
    assert summary(first + rest) == summary(AudioSocketSerializer().decode(stream))
    assert parser.pending_bytes == 0


def test_a_split_header_is_held():
    parser = AudioSocketSerializer()
    message = encode_message(0x01, CALL.bytes)
    assert parser.decode(message[:2]) == [] and parser.pending_bytes == 2
    [start] = parser.decode(message[2:])
    assert start.call_id == str(CALL)


def test_nothing_is_read_after_hangup():
    parser = AudioSocketSerializer()
    events = parser.decode(encode_message(0x01, CALL.bytes) + b"\x00\x00\x00" + encode_message(0x10, bytes(320)))
    assert [type(e) for e in events] == [Start, Stop] and parser.closed


def test_nothing_is_read_after_a_fatal_error_wherever_the_stream_is_cut():
    """Found by `voicepipe bench fuzz` (audiosocket.stream, 100,000 examples): a UUID message of the wrong size (fatal)
    fed on its own, then a hangup in the next read, gave a Stop that the same bytes in one read did not."""
    data = encode_message(0x01) + b"\x00\x00\x00" + encode_message(0x01, CALL.bytes)
    whole = AudioSocketSerializer().decode_safe(data)
    parser = AudioSocketSerializer()
    first, rest = parser.decode_safe(data[:3]), parser.decode_safe(data[3:])
    assert [e.kind for e in whole.errors] == [e.kind for e in first.errors] == ["bad_start"] and parser.closed
    assert whole.events == first.events == rest.events == [] and not rest.errors


def test_a_higher_rate_type_switches_both_directions():
    parser = AudioSocketSerializer()
    parser.decode(encode_message(0x01, CALL.bytes))
    [media] = parser.decode(encode_message(0x12, np.arange(320, dtype="<i2").tobytes()))  # 0x12: 16 kHz
    assert len(media.audio) == 320 and parser.sample_rate == 16000 and parser.send_rate == 16000
    frames = parser.encode_audio(np.zeros(640, dtype=np.int16))
    assert [f[:3] for f in frames] == [b"\x12\x02\x80"] * 2  # 20 ms at 16 kHz = 640 bytes


def test_error_codes_are_named():
    parser = AudioSocketSerializer()
    assert parser.decode(b"\xff\x00\x01\x05") == [TransportError("0x05", "caller hung up, memory allocation error")]
    assert parser.decode(b"\xff\x00\x00") == [TransportError(None, "error")]


@pytest.mark.parametrize(
    ("stream", "kind", "fatal"),
    [
        (encode_message(0x01, b"short"), "bad_start", True),
        (encode_message(0x10, bytes(320)), "media_before_start", False),
        (encode_message(0x07, b"??"), "unknown_frame_type", False),
        (encode_message(0x03, b"12"), "bad_audio", False),
    ],
)
def test_bad_messages(stream, kind, fatal):
    with pytest.raises(ProtocolError) as info:
        AudioSocketSerializer().decode(stream)
    assert (info.value.kind, info.value.fatal) == (kind, fatal)


def test_decode_safe_continues_past_a_bad_message_in_the_middle():
    good_audio = encode_message(0x10, np.full(160, 7, dtype="<i2").tobytes())
    stream = encode_message(0x01, CALL.bytes) + good_audio + encode_message(0x07, b"x") + good_audio + b"\x03\x00\x01#"
    result = AudioSocketSerializer().decode_safe(stream)
    assert [type(e) for e in result.events] == [Start, Media, Media, Dtmf]
    assert [e.kind for e in result.errors] == ["unknown_frame_type"] and result.fatal is None


def test_odd_audio_and_second_uuid():
    parser = AudioSocketSerializer()
    parser.decode(encode_message(0x01, CALL.bytes))
    with pytest.raises(ProtocolError, match="bad_audio"):
        parser.decode(encode_message(0x10, b"\x00\x01\x02"))
    with pytest.raises(ProtocolError, match="duplicate_start"):
        parser.decode(encode_message(0x01, CALL.bytes))


def test_encode_limits():
    with pytest.raises(ValueError):
        encode_message(0x10, bytes(70_000))
    with pytest.raises(ValueError):
        AudioSocketSerializer(sample_rate=11025)
    assert encode_message(0x03, b"5") == b"\x03\x00\x015"
