"""Outbound frames match each provider's documented shape, and audio survives every codec both ways."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from voicepipe.audio import get_codec
from voicepipe.transports.events import Media, Start
from voicepipe.transports.serializers import (
    AudioSocketSerializer,
    NativeSerializer,
    TelnyxSerializer,
    VonageSerializer,
    make_serializer,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transports"
JSON_PROVIDERS = ["twilio", "telnyx", "exotel", "plivo"]


def load(provider: str, name: str) -> dict:
    return json.loads((FIXTURES / provider / f"{name}.json").read_text())


def started(provider: str, **options):
    """A serializer that has read the recorded session's start message."""
    serializer = make_serializer(provider, **options)
    for frame in load(provider, "inbound")["frames"]:
        data = json.dumps(frame["data"]) if frame["kind"] == "text" else base64.b64decode(frame["data"])
        if any(isinstance(e, Start) for e in serializer.decode(data)):
            return serializer
    raise AssertionError("no start in fixture")


def ramp(n: int) -> np.ndarray:
    return np.linspace(-20000, 20000, n).astype(np.int16)


def matches(shape, value) -> bool:
    """`value` has exactly the documented keys; '<...>' placeholders accept any string."""
    if isinstance(shape, dict):
        return (
            isinstance(value, dict) and shape.keys() == value.keys() and all(matches(shape[k], value[k]) for k in shape)
        )
    if isinstance(shape, str) and shape.startswith("<"):
        return isinstance(value, str)
    return shape == value


@pytest.mark.parametrize("provider", JSON_PROVIDERS + ["vonage", "native"])
def test_mark_and_clear_have_the_documented_shape(provider):
    serializer = started(provider)
    documented = load(provider, "outbound")
    [mark] = serializer.encode_mark("vp:3:7")
    [clear] = serializer.encode_clear()
    assert isinstance(mark, str) and isinstance(clear, str)
    assert matches(documented["mark"], json.loads(mark)), mark
    assert "vp:3:7" in mark
    assert matches(documented["clear"], json.loads(clear)), clear


@pytest.mark.parametrize("provider", JSON_PROVIDERS)
def test_media_has_the_documented_shape_and_carries_the_audio(provider):
    serializer = started(provider)
    audio = ramp(serializer.chunk_policy().chunk)
    frames = serializer.encode_audio(audio)
    assert frames and all(isinstance(f, str) for f in frames)
    payload = b""
    for frame in frames:
        message = json.loads(frame)
        assert matches(load(provider, "outbound")["media"], message), frame
        payload += base64.b64decode(message["media"]["payload"], validate=True)
    codec = get_codec(serializer.start.send_codec)
    assert payload == codec.encode(audio)


@pytest.mark.parametrize("provider", ["vonage", "native"])
def test_binary_audio_frames(provider):
    serializer = started(provider)
    audio = ramp(700)  # 43.75 ms at 16 kHz: not a whole number of 20 ms frames
    frames = serializer.encode_audio(audio)
    assert all(isinstance(f, bytes) for f in frames)
    size = load(provider, "outbound")["media"]["binary_bytes"]
    if size:  # Vonage: exact 20 ms frames, the last padded with silence
        assert [len(f) for f in frames] == [size] * 3
    pcm = np.frombuffer(b"".join(frames), dtype="<i2")
    np.testing.assert_array_equal(pcm[:700], audio)
    assert not pcm[700:].any()


def test_vonage_frames_are_320_bytes_at_8k_and_notify_is_optional():
    serializer = VonageSerializer(use_notify=False)
    serializer.decode(json.dumps({"event": "websocket:connected", "content-type": "audio/l16;rate=8000"}))
    assert [len(f) for f in serializer.encode_audio(ramp(320))] == [320, 320]
    assert serializer.supports_marks is False and serializer.encode_mark("vp:0:0") == []
    assert serializer.encode_clear() == ['{"action":"clear"}']


@pytest.mark.parametrize(
    ("encoding", "rate", "codec"),
    [("PCMU", 8000, "pcmu"), ("PCMA", 8000, "pcma"), ("L16", 8000, "l16be"), ("L16", 16000, "l16be")],
)
def test_audio_round_trips_through_each_telnyx_codec(encoding, rate, codec):
    serializer = TelnyxSerializer()
    start = {"event": "start", "sequence_number": "1", "stream_id": "s", "start": {"call_control_id": "c",
             "media_format": {"encoding": encoding, "sample_rate": rate, "channels": 1}}}  # fmt: skip
    [event] = serializer.decode(json.dumps(start))
    assert (event.codec, event.sample_rate) == (codec, rate)
    audio = ramp(rate // 50)
    [frame] = serializer.encode_audio(audio)
    echoed = json.loads(frame) | {"sequence_number": "2", "stream_id": "s"}  # our media, as if Telnyx echoed it
    [media] = serializer.decode(json.dumps(echoed))
    assert isinstance(media, Media)
    if codec.startswith("l16"):
        np.testing.assert_array_equal(media.audio, audio)
        assert base64.b64decode(json.loads(frame)["media"]["payload"])[:2] == int(audio[0]).to_bytes(
            2, "big", signed=True
        )
    else:
        lossy = get_codec(codec).decode(get_codec(codec).encode(audio))
        np.testing.assert_array_equal(media.audio, lossy)
        assert np.abs(media.audio.astype(int) - audio).max() < 700  # G.711 keeps the shape


def test_telnyx_l16_byte_order_can_be_little_endian():
    serializer = TelnyxSerializer(l16_byteorder="little")
    start = {"event": "start", "sequence_number": "1", "stream_id": "s",
             "start": {"media_format": {"encoding": "L16", "sample_rate": 16000}}}  # fmt: skip
    assert serializer.decode(json.dumps(start))[0].codec == "l16le"


def test_telnyx_outbound_codec_may_differ_from_inbound():
    serializer = TelnyxSerializer(outbound_encoding="L16", outbound_sample_rate=16000)
    start = {"event": "start", "sequence_number": "1", "stream_id": "s",
             "start": {"media_format": {"encoding": "PCMU", "sample_rate": 8000}}}  # fmt: skip
    [event] = serializer.decode(json.dumps(start))
    assert (event.codec, event.sample_rate, event.send_codec, event.send_rate) == ("pcmu", 8000, "l16be", 16000)
    assert serializer.send_rate == 16000 and serializer.chunk_policy().chunk == 320
    [frame] = serializer.encode_audio(ramp(320))
    assert len(base64.b64decode(json.loads(frame)["media"]["payload"])) == 640


def test_plivo_content_type_follows_the_start_codec():
    serializer = make_serializer("plivo")
    start = {"event": "start", "sequenceNumber": 1, "start": {"callId": "c", "streamId": "s",
             "mediaFormat": {"encoding": "audio/x-mulaw;rate=8000"}}}  # fmt: skip
    assert serializer.decode(json.dumps(start))[0].codec == "pcmu"
    [frame] = serializer.encode_audio(ramp(160))
    media = json.loads(frame)["media"]
    assert (media["contentType"], media["sampleRate"]) == ("audio/x-mulaw", 8000)
    assert len(base64.b64decode(media["payload"])) == 160


def test_audiosocket_audio_round_trips_through_its_framing():
    uuid_msg = bytes([0x01, 0x00, 0x10]) + bytes(range(16))
    server = AudioSocketSerializer()
    server.decode(uuid_msg)
    audio = ramp(400)  # 50 ms: two full 20 ms messages and a padded third
    frames = server.encode_audio(audio)
    assert [f[:3] for f in frames] == [bytes([0x10, 0x01, 0x40])] * 3  # type 0x10, length 320 big-endian
    peer = AudioSocketSerializer()
    events = peer.decode(uuid_msg + b"".join(frames))
    pcm = np.concatenate([e.audio for e in events[1:]])
    np.testing.assert_array_equal(pcm[:400], audio)
    assert not pcm[400:].any()
    assert server.encode_mark("x") == [] and server.encode_clear() == []
    assert server.encode_hangup() == [b"\x00\x00\x00"]


def test_native_events_for_a_live_transcript():
    serializer = NativeSerializer()
    serializer.decode(json.dumps({"type": "start", "sample_rate": 24000}))
    assert serializer.supports_marks is False and serializer.encode_mark("vp:0:0") == []
    assert json.loads(serializer.encode_started("call-1")[0]) == {
        "type": "started", "call_id": "call-1", "sample_rate": 24000, "version": 1, "marks": False}  # fmt: skip
    assert json.loads(serializer.encode_transcript("hello", final=False, turn=2)[0]) == {
        "type": "transcript", "role": "user", "text": "hello", "final": False, "turn": 2}  # fmt: skip
    assert json.loads(serializer.encode_agent_text("Hi!", turn=2)[0]) == {
        "type": "agent_text", "text": "Hi!", "final": False, "turn": 2}  # fmt: skip
    assert json.loads(serializer.encode_turn(2, {"voice_to_voice": 412.345})[0]) == {
        "type": "turn", "turn": 2, "timings_ms": {"voice_to_voice": 412.3}}  # fmt: skip
    assert json.loads(serializer.encode_error("bad_start", "nope")[0]) == {
        "type": "error", "code": "bad_start", "message": "nope"}  # fmt: skip


def test_encoding_needs_int16_mono():
    serializer = started("twilio")
    with pytest.raises(TypeError):
        serializer.encode_audio(np.zeros(160, dtype=np.float32))
    with pytest.raises(ValueError):
        serializer.encode_audio(np.zeros((160, 2), dtype=np.int16))
    assert serializer.encode_audio(np.zeros(0, dtype=np.int16)) == []


@pytest.mark.parametrize("provider", ["twilio", "telnyx", "exotel", "plivo"])
def test_nothing_is_encoded_before_start(provider):
    """The envelopes need the stream id and codec from start; encoding earlier is a programming error."""
    serializer = make_serializer(provider)
    for encode in (
        serializer.encode_clear,
        lambda: serializer.encode_mark("m"),
        lambda: serializer.encode_audio(ramp(8)),
    ):
        with pytest.raises(RuntimeError, match="no start"):
            encode()


def test_plivo_checkpoint_ack_under_either_documented_name():
    serializer = started("plivo")
    for event in ("playedStream", "played"):
        message = {"event": event, "streamId": "87654321-4321-4321-4321-cba987654321", "name": "vp:0:3"}
        assert [e.name for e in serializer.decode(json.dumps(message))] == ["vp:0:3"]
