"""The caller side (`voicepipe call`'s wire formats) against the server's pure serializers, with no I/O."""

from __future__ import annotations

import numpy as np
import pytest

from voicepipe.caller import endpoint_url, http_base, split_utterances, voiced_span
from voicepipe.transports import Cleared, Dtmf, Mark, Media, Start, make_serializer
from voicepipe.transports.serializers import make_caller_serializer

TRANSPORTS = ("twilio", "telnyx", "vonage", "plivo", "exotel", "native")


def tone(rate: int, seconds: float, hz: float = 300.0, amplitude: int = 6000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def decode_all(ser, frames) -> list:
    events = []
    for frame in frames:
        result = ser.decode_safe(frame)
        assert not result.errors, result.errors
        events += result.events
    return events


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_client_frames_decode_on_the_server(transport: str) -> None:
    params = {"system_prompt": "Be brief.", "greeting": "Hey."}
    wire = make_caller_serializer(transport, "call-1", params)
    ser = make_serializer(transport)
    starts = [e for e in decode_all(ser, wire.start()) if isinstance(e, Start)]
    assert len(starts) == 1
    start = starts[0]
    assert start.sample_rate == wire.rate
    assert start.call_id == "call-1"
    assert start.custom_parameters.get("system_prompt") == "Be brief."
    assert start.custom_parameters.get("greeting") == "Hey."

    audio = tone(wire.rate, 0.02)
    [media] = decode_all(ser, wire.audio(audio))
    assert isinstance(media, Media) and len(media.audio) == len(audio)
    assert np.corrcoef(media.audio.astype(float), audio.astype(float))[0, 1] > 0.99

    [mark] = decode_all(ser, wire.mark_ack("vp:0:3"))
    assert mark == Mark("vp:0:3")
    keys = [e for d in "09*#AD" for e in decode_all(ser, wire.dtmf(d))]
    assert keys == [Dtmf(d) for d in "09*#AD"]
    if transport in ("plivo", "vonage"):
        assert decode_all(ser, wire.clear_ack()) == [Cleared()]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_server_frames_parse_on_the_client(transport: str) -> None:
    wire = make_caller_serializer(transport, "call-2", {})
    ser = make_serializer(transport)
    decode_all(ser, wire.start())
    audio = tone(ser.send_rate, 0.1)
    parsed = [item for frame in ser.encode_audio(audio) for item in wire.parse(frame)]
    got = np.concatenate([v for k, v in parsed if k == "audio"])
    assert len(got) >= len(audio)
    assert np.corrcoef(got[: len(audio)].astype(float), audio.astype(float))[0, 1] > 0.99
    if ser.supports_marks:
        assert [item for f in ser.encode_mark("vp:1:2") for item in wire.parse(f)] == [("mark", "vp:1:2")]
    assert [item for f in ser.encode_clear() for item in wire.parse(f)] == [("clear", None)]


def test_split_utterances_and_voiced_span() -> None:
    rate = 16000
    silence = np.zeros(rate, np.int16)
    audio = np.concatenate([silence[:4000], tone(rate, 0.5), silence, tone(rate, 0.3), silence[:8000]])
    utts = split_utterances(audio, rate)
    assert len(utts) == 2
    for utt, seconds in zip(utts, (0.5, 0.3), strict=True):
        start, end = utt.voiced_start, utt.voiced_end
        assert abs((end - start) / rate - seconds) < 0.03
        assert start > 0  # the padding before the speech is kept, and not counted as voiced
    assert voiced_span(silence, rate) == (0, 0)
    # Pauses shorter than the gap stay inside one utterance.
    assert len(split_utterances(np.concatenate([tone(rate, 0.3), silence[:3200], tone(rate, 0.3)]), rate)) == 1


def test_urls() -> None:
    assert endpoint_url("ws://h:1", "twilio") == "ws://h:1/ws/twilio"
    assert endpoint_url("ws://h:1/", "native") == "ws://h:1/ws"
    assert endpoint_url("wss://h/custom/path?token=x", "telnyx") == "wss://h/custom/path?token=x"
    assert http_base("ws://127.0.0.1:8000/ws/twilio") == "http://127.0.0.1:8000"
    assert http_base("wss://example.com/ws") == "https://example.com"


def test_audiosocket_wire_against_the_serializer() -> None:
    wire = make_caller_serializer("audiosocket", "not-a-uuid", {})
    ser = make_serializer("audiosocket")
    [start] = decode_all(ser, wire.start())
    assert isinstance(start, Start) and start.call_id == wire.call_id and start.sample_rate == 8000
    audio = tone(8000, 0.02)
    [media] = decode_all(ser, wire.audio(audio))
    assert np.array_equal(media.audio, audio)
    assert decode_all(ser, wire.dtmf("5") + wire.dtmf("#")) == [Dtmf("5"), Dtmf("#")]
    # The server's 20 ms messages, split at arbitrary TCP boundaries, come back whole.
    stream = b"".join(ser.encode_audio(tone(8000, 0.1)))
    parsed = [item for i in range(0, len(stream), 77) for item in wire.parse(stream[i: i + 77])]
    assert [k for k, _ in parsed] == ["audio"] * 5
    assert decode_all(ser, wire.stop())[0].reason == "hangup"
