"""Bad input raises only ProtocolError, with the documented reaction, and never breaks the call's state."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest

from voicepipe.transports.events import REACTIONS, Media, ProtocolError
from voicepipe.transports.serializers import SERIALIZERS, make_serializer

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "transports"
JSON_PROVIDERS = ["twilio", "telnyx", "exotel", "plivo"]
WS_PROVIDERS = [*JSON_PROVIDERS, "vonage", "native"]


def recorded(provider: str) -> list[dict]:
    return json.loads((FIXTURES / provider / "inbound.json").read_text())["frames"]


def raw(frame: dict) -> str | bytes:
    return json.dumps(frame["data"]) if frame["kind"] == "text" else base64.b64decode(frame["data"])


def start_frame(provider: str) -> dict:
    return next(f for f in recorded(provider) if f["kind"] == "text" and (f["data"].get("event") or f["data"].get(
        "type")) in ("start", "websocket:connected"))  # fmt: skip


def media_frame(provider: str) -> dict:
    return next(f for f in recorded(provider) if f["kind"] == "binary" or f["data"].get("event") == "media")


def started(provider: str, **options):
    serializer = make_serializer(provider, **options)
    serializer.decode(raw(start_frame(provider)))
    assert serializer.started
    return serializer


def reject(serializer, frame) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        serializer.decode(frame)
    return info.value


def still_healthy(serializer, provider: str) -> None:
    """After an ignored error the same serializer still decodes good media."""
    [event] = serializer.decode(raw(media_frame(provider)))
    assert isinstance(event, Media) and len(event.audio) > 0


@pytest.mark.parametrize("provider", WS_PROVIDERS)
@pytest.mark.parametrize("frame", ["{not json", '{"event": "media", ', "", "\x00\xff", '["a list"]', "42", "null"])
def test_malformed_json_is_ignored(provider, frame):
    serializer = started(provider)
    error = reject(serializer, frame)
    assert error.kind in ("malformed_json", "not_an_object")
    assert not error.fatal and error.close_code is None
    still_healthy(serializer, provider)


@pytest.mark.parametrize("provider", JSON_PROVIDERS)
@pytest.mark.parametrize("payload", ["not base64!!", "QUJD*", "QUJDRA=", 12345, None, ["QUJD"]])
def test_non_base64_payload_is_ignored(provider, payload):
    serializer = started(provider)
    bad = copy.deepcopy(media_frame(provider)["data"])
    bad["media"]["payload"] = payload
    error = reject(serializer, json.dumps(bad))
    assert (error.kind, error.fatal) == ("bad_base64", False)
    still_healthy(serializer, provider)


@pytest.mark.parametrize("provider", WS_PROVIDERS)
def test_unknown_event_is_ignored(provider):
    serializer = started(provider)
    key = "type" if provider == "native" else "event"
    error = reject(serializer, json.dumps({key: "teleport", "streamSid": "x"}))
    assert (error.kind, error.fatal) == ("unknown_event", False)
    assert "teleport" in error.reason
    error = reject(serializer, json.dumps({"no_event_field": 1}))
    assert error.kind == "unknown_event"
    still_healthy(serializer, provider)


@pytest.mark.parametrize("provider", WS_PROVIDERS)
def test_media_before_start_is_ignored(provider):
    serializer = make_serializer(provider)
    error = reject(serializer, raw(media_frame(provider)))
    assert (error.kind, error.fatal) == ("media_before_start", False)
    serializer.decode(raw(start_frame(provider)))
    still_healthy(serializer, provider)


@pytest.mark.parametrize("provider", JSON_PROVIDERS)
def test_binary_where_text_is_required_closes_with_1003(provider):
    serializer = started(provider)
    error = reject(serializer, json.dumps(media_frame(provider)["data"]).encode())
    assert (error.kind, error.close_code) == ("wrong_frame_type", 1003)
    assert error.fatal


def test_text_where_bytes_are_required_closes_audiosocket():
    error = reject(make_serializer("audiosocket"), '{"event": "start"}')
    assert (error.kind, error.close_code) == ("wrong_frame_type", 1003)


@pytest.mark.parametrize("provider", WS_PROVIDERS)
def test_a_2mb_frame_closes_with_1009(provider):
    serializer = started(provider)
    text = json.dumps({"event": "media", "type": "media", "pad": "x" * (2 << 20)})
    for frame in (text, text.encode()):
        error = reject(serializer, frame)
        assert (error.kind, error.close_code) == ("oversize", 1009)


@pytest.mark.parametrize("provider", sorted(SERIALIZERS))
def test_the_frame_limit_is_configurable(provider):
    serializer = make_serializer(provider, max_frame_bytes=2000)
    if provider == "audiosocket":
        frame = b"\x10\xff\xff" + bytes(70_000)  # more than one maximal message past the limit
    else:
        frame = json.dumps({"event": "x", "pad": "y" * 2000})
    assert reject(serializer, frame).kind == "oversize"
    small = make_serializer(provider, max_frame_bytes=2000)
    assert small.decode_safe(raw(start_frame(provider)) if provider != "audiosocket" else b"").fatal is None


def _wrong_codec_starts(provider: str) -> list[str]:
    start = start_frame(provider)["data"]
    variants = []
    if provider == "twilio":
        for encoding, rate in (("audio/x-alaw", 8000), ("audio/x-mulaw", 16000), (None, 8000)):
            s = copy.deepcopy(start)
            s["start"]["mediaFormat"].update(encoding=encoding, sampleRate=rate)
            variants.append(s)
    elif provider in ("telnyx", "exotel"):
        for encoding, rate in (("OPUS", 8000), ("G722", 8000), ("AMR-WB", 16000), ("audio/x-raw", 44100)):
            s = copy.deepcopy(start)
            s["start"]["media_format"].update(encoding=encoding, sample_rate=rate)
            variants.append(s)
    elif provider == "plivo":
        for encoding, rate in (("audio/x-opus", 8000), ("audio/x-l16", 44100), ("audio/x-mulaw", 16000)):
            s = copy.deepcopy(start)
            s["start"]["mediaFormat"].update(encoding=encoding, sampleRate=rate)
            variants.append(s)
    elif provider == "vonage":
        for content_type in ("audio/l24;rate=16000", "audio/l16;rate=11025", "audio/pcmu", None):
            variants.append({**start, "content-type": content_type})
    elif provider == "native":
        variants += [{**start, "sample_rate": 44100}, {**start, "encoding": "opus"}, {**start, "sample_rate": "16000"}]
    return [json.dumps(v) for v in variants]


@pytest.mark.parametrize("provider", WS_PROVIDERS)
def test_wrong_codec_in_start_closes_with_1003(provider):
    for frame in _wrong_codec_starts(provider):
        serializer = make_serializer(provider)
        error = reject(serializer, frame)
        assert (error.kind, error.close_code) == ("unsupported_codec", 1003), frame
        assert not serializer.started


@pytest.mark.parametrize("provider", JSON_PROVIDERS)
def test_unusable_start_closes_with_1002(provider):
    start = start_frame(provider)["data"]
    for body in (None, "text", {"callSid": "x"} if provider == "twilio" else {"media_format": "PCMU"}):
        if provider == "plivo" and isinstance(body, dict):
            body = {"mediaFormat": 7}
        error = reject(make_serializer(provider), json.dumps({**start, "start": body}))
        assert (error.kind, error.close_code) == ("bad_start", 1002), body


@pytest.mark.parametrize("provider", WS_PROVIDERS)
def test_a_second_start_is_ignored(provider):
    serializer = started(provider)
    error = reject(serializer, raw(start_frame(provider)))
    assert (error.kind, error.fatal) == ("duplicate_start", False)


@pytest.mark.parametrize("provider", ["exotel", "plivo", "vonage", "native"])
def test_odd_length_l16_is_ignored(provider):
    serializer = started(provider)
    if provider in ("vonage", "native"):
        frame: str | bytes = b"\x00\x01\x02"
    else:
        bad = copy.deepcopy(media_frame(provider)["data"])
        bad["media"]["payload"] = base64.b64encode(b"\x00\x01\x02").decode()
        frame = json.dumps(bad)
    assert (reject(serializer, frame).kind, reject(serializer, frame).fatal) == ("bad_audio", False)


@pytest.mark.parametrize("provider", WS_PROVIDERS)
def test_malformed_marks_and_dtmf_are_ignored(provider):
    serializer = started(provider)
    for message in _bad_controls(provider):
        error = reject(serializer, json.dumps(message))
        assert (error.kind, error.fatal) == ("missing_field", False), message


def _bad_controls(provider: str) -> list[dict]:
    if provider == "native":
        return [{"type": "mark"}, {"type": "mark", "name": 3}, {"type": "dtmf", "digit": "12"}]
    if provider == "vonage":
        return [
            {"event": "websocket:notify"},
            {"event": "websocket:notify", "payload": {}},
            {"event": "websocket:dtmf"},
        ]
    mark = {"event": "playedStream"} if provider == "plivo" else {"event": "mark", "mark": {}}
    return [mark, {"event": "dtmf", "dtmf": {"digit": ""}}, {"event": "dtmf"}, {"event": "media", "media": "x"}]


def test_decode_safe_collects_errors_without_raising():
    serializer = make_serializer("twilio")
    result = serializer.decode_safe("{oops")
    assert result.events == [] and [e.kind for e in result.errors] == ["malformed_json"] and result.fatal is None
    result = serializer.decode_safe(b"\x00binary")
    assert result.fatal is not None and result.fatal.close_code == 1003


def test_close_reasons_fit_a_close_frame():
    error = ProtocolError("unknown_event", "x" * 500)
    assert len(error.reason.encode()) <= 123
    assert str(error) == error.reason


@pytest.mark.parametrize("provider", sorted(SERIALIZERS))
def test_random_garbage_only_ever_raises_protocol_error(provider):
    """Mutated recordings and random bytes: nothing but ProtocolError escapes, state stays usable."""
    rng = np.random.default_rng(7)
    if provider == "audiosocket":
        stream = b"".join(bytes.fromhex(m["hex"]) for m in json.loads(
            (FIXTURES / "audiosocket" / "inbound.json").read_text())["messages"])  # fmt: skip
        frames = [stream[:-3]]  # drop the hangup so the parser keeps reading
        for _ in range(300):
            frames.append(rng.integers(0, 256, rng.integers(0, 400)).astype(np.uint8).tobytes())
    else:
        frames = [raw(f) for f in recorded(provider)]
        for _ in range(300):
            source = raw(recorded(provider)[rng.integers(len(recorded(provider)))])
            base = bytearray(source.encode() if isinstance(source, str) else source)
            for _ in range(rng.integers(1, 6)):
                if base:
                    base[rng.integers(len(base))] = rng.integers(0, 256)
            mutated = bytes(base)
            frames.append(mutated.decode("utf-8", "replace") if isinstance(source, str) else mutated)
    serializer = make_serializer(provider)
    for frame in frames:
        with contextlib.suppress(ProtocolError):
            serializer.decode(frame)


def test_every_error_kind_has_a_documented_reaction():
    """docs/native-protocol.md lists each kind with the reaction the code applies."""
    doc = (ROOT / "docs" / "native-protocol.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (ignore|close \d{4}) \|", doc, flags=re.MULTILINE))
    assert rows.keys() == REACTIONS.keys()
    for kind, code in REACTIONS.items():
        assert rows[kind] == ("ignore" if code is None else f"close {code}"), kind


# Found by fuzzing (voicepipe bench fuzz): numbers as text that str.isdigit() or \d accept but int() refuses (or
# that are thousands of digits long) escaped the serializers as ValueError.
@pytest.mark.parametrize("provider", JSON_PROVIDERS)
@pytest.mark.parametrize("number", ["²", "--1", "9" * 5000, "1_000", "١٢"])
def test_a_sequence_number_that_is_not_ascii_decimal_is_no_number(provider, number):
    serializer = started(provider)
    bad = copy.deepcopy(media_frame(provider)["data"])
    bad[serializer.dialect.sequence] = number
    bad["media"]["timestamp"] = number
    result = serializer.decode_safe(json.dumps(bad))
    assert result.errors == []
    [media] = result.events
    assert isinstance(media, Media) and (media.sequence, media.timestamp_ms) == (None, None)


@pytest.mark.parametrize("rate", ["²", "9" * 5000])
def test_a_plivo_rate_inside_the_content_type_that_is_no_number_refuses_the_start(rate):
    start = copy.deepcopy(start_frame("plivo")["data"])
    start["start"]["mediaFormat"] = {"encoding": f"audio/x-l16;rate={rate}"}
    result = make_serializer("plivo").decode_safe(json.dumps(start))
    assert [e.kind for e in result.errors] == ["bad_start"] and result.fatal is not None


@pytest.mark.parametrize("rate", ["9" * 5000, "٨٠٠٠"])
def test_a_vonage_rate_that_is_not_ascii_decimal_is_an_unsupported_codec(rate):
    start = {"event": "websocket:connected", "content-type": f"audio/l16;rate={rate}"}
    result = make_serializer("vonage").decode_safe(json.dumps(start))
    assert [e.kind for e in result.errors] == ["unsupported_codec"] and result.fatal is not None
