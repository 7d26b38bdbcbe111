"""Recorded inbound sessions (tests/fixtures/transports/<provider>/inbound.json) decode to the right events."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from voicepipe.transports.events import (
    Cleared,
    Connected,
    Dtmf,
    Mark,
    Media,
    ProtocolError,
    Start,
    Stop,
    TransportError,
)
from voicepipe.transports.serializers import make_serializer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transports"
# Worst-case G.711 quantization error for an 8000-amplitude tone (segment step 256/2 for mu-law,
# 256 for A-law halved, plus the reconstruction offset); L16 is exact.
TOLERANCE = {"pcmu": 260, "pcma": 260, "l16le": 0, "l16be": 0}


def load(provider: str, name: str = "inbound") -> dict:
    return json.loads((FIXTURES / provider / f"{name}.json").read_text())


def frames_of(recording: dict) -> list[str | bytes]:
    out: list[str | bytes] = []
    for frame in recording["frames"]:
        if frame["kind"] == "text":
            out.append(json.dumps(frame["data"]))
        else:
            out.append(base64.b64decode(frame["data"]))
    return out


def reference_tone(spec: dict, n: int) -> np.ndarray:
    t = np.arange(n) / spec["sample_rate"]
    return np.rint(spec["amplitude"] * np.sin(2 * np.pi * spec["hz"] * t)).astype(np.int16)


def decode_all(provider: str, frames: list[str | bytes]) -> list:
    serializer = make_serializer(provider)
    events = []
    for frame in frames:
        events.extend(serializer.decode(frame))
    return events


EXPECTED_KINDS = {
    "twilio": [Connected, Start, Media, Media, Media, Dtmf, Mark, Stop],
    "telnyx": [Connected, Start, Media, Media, Media, Dtmf, Mark, TransportError, Stop],
    "exotel": [Connected, Start, Media, Media, Media, Dtmf, Mark, Stop],
    "plivo": [Start, Media, Media, Media, Dtmf, Mark, Cleared],
    "vonage": [Connected, Start, Media, Media, Media, Dtmf, Mark, Cleared],
    "native": [Start, Media, Media, Media, Dtmf, Mark, Stop],
}
EXPECTED_START = {
    "twilio": ("CA2a1e5b0d9b8e4b3c8f7e6d5c4b3a2918", "MZ18ad3ab5a668481ce02b83e7395059f0", "pcmu", 8000),
    "telnyx": (
        "v2:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ",
        "32DE0DEA-53CB-4B21-89A4-9E1819C043BC",
        "pcma",
        8000,
    ),
    "exotel": ("CA0f1e2d3c4b5a69788796a5b4c3d2e1f0", "MZ4f5e6d7c8b9a0b1c2d3e4f5a6b7c8d9e", "l16le", 16000),
    "plivo": ("12345678-1234-1234-1234-123456789abc", "87654321-4321-4321-4321-cba987654321", "l16le", 16000),
    "vonage": ("aaaaaaaa-bbbb-cccc-dddd-0123456789ab", None, "l16le", 16000),
    "native": ("demo-call-1", None, "l16le", 16000),
}
EXPECTED_DIGIT = {"twilio": "1", "telnyx": "#", "exotel": "5", "plivo": "7", "vonage": "9", "native": "*"}


@pytest.mark.parametrize("provider", sorted(EXPECTED_KINDS))
def test_recorded_session_decodes_to_the_expected_events(provider):
    recording = load(provider)
    events = decode_all(provider, frames_of(recording))
    assert [type(e) for e in events] == EXPECTED_KINDS[provider]

    start = next(e for e in events if isinstance(e, Start))
    assert (start.call_id, start.stream_id, start.codec, start.sample_rate) == EXPECTED_START[provider]
    assert next(e for e in events if isinstance(e, Dtmf)).digit == EXPECTED_DIGIT[provider]
    assert next(e for e in events if isinstance(e, Mark)).name == "vp:0:0"


@pytest.mark.parametrize("provider", sorted(EXPECTED_KINDS))
def test_recorded_media_decodes_to_the_recorded_tone(provider):
    recording = load(provider)
    media = [e for e in decode_all(provider, frames_of(recording)) if isinstance(e, Media)]
    audio = np.concatenate([m.audio for m in media])
    spec = recording["tone"]
    assert audio.dtype == np.int16
    assert len(media) == spec["media_frames"]
    assert len(audio) == spec["media_frames"] * len(media[0].audio)
    error = np.abs(audio.astype(np.int32) - reference_tone(spec, len(audio)).astype(np.int32)).max()
    assert error <= TOLERANCE[spec["codec"]]
    assert np.abs(audio).max() > spec["amplitude"] * 0.9  # it is the tone, not silence


def test_start_carries_per_call_parameters():
    """The pipeline overrides prompt/greeting from these (Twilio customParameters, Telnyx client_state...)."""
    starts = {p: next(e for e in decode_all(p, frames_of(load(p))) if isinstance(e, Start)) for p in EXPECTED_KINDS}
    assert starts["twilio"].custom_parameters == {
        "system_prompt": "You are a terse assistant.",
        "greeting": "Hello there.",
    }
    assert starts["twilio"].tracks == ("inbound",)
    assert starts["telnyx"].custom_parameters["customer_id"] == "customer_123"
    assert starts["telnyx"].custom_parameters["client_state"] == "aGF2ZSBhIG5pY2UgZGF5ID1d"
    assert starts["exotel"].custom_parameters["key1"] == "value1"
    assert starts["plivo"].custom_parameters == {
        "userId": "12345",
        "sessionId": "abc-xyz",
        "accountId": "MAXXXXXXXXXXXXXXXXXX",
    }
    assert starts["vonage"].custom_parameters == {"uuid": "aaaaaaaa-bbbb-cccc-dddd-0123456789ab", "language": "en-GB"}
    assert starts["native"].custom_parameters == {
        "system_prompt": "You are a terse assistant.",
        "greeting": "Hello there.",
    }


def test_media_keeps_the_provider_sequence_and_timestamp():
    media = [e for e in decode_all("twilio", frames_of(load("twilio"))) if isinstance(e, Media)]
    assert [(m.sequence, m.timestamp_ms, m.track) for m in media] == [
        (2, 5, "inbound"),
        (3, 25, "inbound"),
        (4, 45, "inbound"),
    ]


def test_telnyx_error_and_exotel_stop_reason():
    events = decode_all("telnyx", frames_of(load("telnyx")))
    error = next(e for e in events if isinstance(e, TransportError))
    assert error.code == "100002" and error.message == "Unknown error An unknown error occurred"
    stop = decode_all("exotel", frames_of(load("exotel")))[-1]
    assert stop == Stop("callended")


def test_audiosocket_stream_decodes_to_the_expected_events():
    recording = load("audiosocket")
    stream = b"".join(bytes.fromhex(m["hex"]) for m in recording["messages"])
    events = make_serializer("audiosocket").decode(stream)
    assert [type(e) for e in events] == [Start, Media, Media, Media, Dtmf, TransportError, Stop]
    start = events[0]
    assert (start.call_id, start.codec, start.sample_rate) == (recording["uuid"], "l16le", 8000)
    audio = np.concatenate([e.audio for e in events if isinstance(e, Media)])
    np.testing.assert_array_equal(audio, reference_tone(recording["tone"], len(audio)))
    assert events[4] == Dtmf("4")
    assert events[5] == TransportError("0x02", "frame forwarding error")
    assert events[6] == Stop("hangup")


def test_a_native_start_may_pick_the_calls_turn_policy():
    start = make_serializer("native").decode(json.dumps({"type": "start", "turn_policy": "silence"}))[0]
    assert start.custom_parameters == {"turn_policy": "silence"}
    with pytest.raises(ProtocolError) as info:
        make_serializer("native").decode(json.dumps({"type": "start", "turn_policy": 3}))
    assert info.value.kind == "bad_start"


def test_a_native_start_may_set_the_calls_reply_budget():
    start = make_serializer("native").decode(json.dumps({"type": "start", "max_reply_tokens": 200}))[0]
    assert start.custom_parameters == {"max_reply_tokens": 200}
    for bad in (0, 4097, 2.5, "200", True, None):
        with pytest.raises(ProtocolError) as info:
            make_serializer("native").decode(json.dumps({"type": "start", "max_reply_tokens": bad}))
        assert info.value.kind == "bad_start" and "max_reply_tokens" in info.value.detail, bad
