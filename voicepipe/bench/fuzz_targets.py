"""The fuzz targets: for every parser of untrusted input, a hypothesis strategy of inputs and the property each
input must satisfy (`check` raises `AssertionError`, or whatever the parser let escape, when it does not).

The properties: any input gives events (or a value) or the parser's typed error, never another exception; what
one end encodes the other decodes back (the caller-side serializers build the provider's frames); and no input
makes a parser allocate more than `MEMORY_FACTOR` times the frame it was given (plus `MEMORY_SLACK_BYTES`), nor
buffer more than its frame bound. `voicepipe.bench.fuzz` runs them (the unit tests a few hundred examples each,
`voicepipe bench fuzz` as many as asked).

Needs hypothesis (a dev dependency: `pip install -e '.[dev]'`).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import tracemalloc
import uuid
import wave
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from voicepipe.config import Settings, load_settings, masked_dump
from voicepipe.errors import SettingsError
from voicepipe.replay.case import CaseError, load_case
from voicepipe.transports.events import (
    REACTIONS,
    Cleared,
    Connected,
    Dtmf,
    Event,
    Mark,
    Media,
    ProtocolError,
    Start,
    Stop,
    TransportError,
)
from voicepipe.transports.serializers import make_caller_serializer, make_serializer
from voicepipe.transports.serializers.audiosocket import (
    HEADER,
    KIND_DTMF,
    KIND_ERROR,
    KIND_HANGUP,
    KIND_UUID,
    MAX_PAYLOAD,
    SLIN_RATES,
    AudioSocketSerializer,
    encode_message,
)
from voicepipe.transports.serializers.base import DEFAULT_MAX_FRAME_BYTES, Serializer
from voicepipe.transports.sip.digest import DigestServer, authorization
from voicepipe.transports.sip.dtmf import BadDtmf, info_digit
from voicepipe.transports.sip.message import Request, SipError, response_to
from voicepipe.transports.sip.message import parse as parse_sip
from voicepipe.transports.webrtc.signalling import MAX_OFFER_BYTES, BadOffer, parse_offer

MEMORY_FACTOR = 64  # a parser may hold this many bytes per byte of its input (JSON objects cost ~20x their text)
MEMORY_SLACK_BYTES = 256 * 1024
WS_PROVIDERS = ("twilio", "telnyx", "plivo", "vonage", "exotel", "native")
SMALL_FRAME_BYTES = 4096  # the frame bound of the serializers that are fed oversize frames


@dataclass(frozen=True)
class Target:
    """One fuzz target: `check(example)` holds for every example `strategy` draws."""

    name: str
    strategy: st.SearchStrategy
    check: Callable[[Any], None]
    about: str


# -- shared strategies ----------------------------------------------------------------------------------------

# Scalars that trip number and text handling: unicode digits, signs, huge digit runs, blanks, non-finite floats.
TRICKY = st.sampled_from([
    "", " ", "0", "-0", "--1", "+1", "1_000", "²", "١٢", "8000", " 8000 ", "8000.0", "1e3", "9" * 5000,
    "-" + "9" * 40, "NaN", "\x00", "\ud800", 0, -1, 8000, 16000, 2**63, -(2**70), 10**300, 0.5, 8000.0,
    float("nan"), float("inf"), True, False, None, [], {}, [None], {"": None},
])
NUMBER_TEXT = st.one_of(st.text("0123456789-+ .e_²١٢", max_size=8), st.just("9" * 5000))
# Format strings of the providers with a number spliced in ("audio/l16;rate=²").
SPLICED = st.builds(str.__add__, st.sampled_from(["audio/l16;rate=", "audio/x-l16;rate=", "audio/x-l16; rate = ",
                                                  "audio/x-mulaw;rate=", "audio/L16;RATE="]), NUMBER_TEXT)
JSON_SCALARS = st.one_of(TRICKY, SPLICED, NUMBER_TEXT, st.none(), st.booleans(), st.integers(), st.floats(),
                         st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)
NAMES = st.text(max_size=40)
PCM = arrays(np.int16, st.integers(0, 480))


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


def _set_path(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _set_path(value[head], rest, new)}
    return [_set_path(item, rest, new) if i == head else item for i, item in enumerate(value)]


def _delete_path(value: Any, path: tuple) -> Any:
    if len(path) == 1:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != path[0]}
        return [item for i, item in enumerate(value) if i != path[0]]
    head = path[0]
    if isinstance(value, dict):
        return {**value, head: _delete_path(value[head], path[1:])}
    return [_delete_path(item, path[1:]) if i == head else item for i, item in enumerate(value)]


@st.composite
def mutated(draw: st.DrawFn, value: Any, max_mutations: int = 3, values: st.SearchStrategy = JSON_VALUES) -> Any:
    """`value` (nested dicts and lists) with up to `max_mutations` fields replaced by `values`, deleted or added."""
    for _ in range(draw(st.integers(0, max_mutations))):
        path = draw(st.sampled_from(list(_paths(value))))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and path:
            value = _delete_path(value, path)
        elif action == "add" and path:
            parent = path[:-1]
            key = draw(st.one_of(st.text(max_size=12), st.sampled_from(_keys_in(value))))
            target = _get_path(value, parent)
            if isinstance(target, dict):
                value = _set_path(value, parent, {**target, key: draw(values)})
        else:
            value = _set_path(value, path, draw(values))
    return value


def _get_path(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


def _keys_in(value: Any) -> list[str]:
    keys = [p[-1] for p in _paths(value) if p and isinstance(p[-1], str)]
    return keys or ["event"]


@contextmanager
def memory_bound(input_bytes: int) -> Iterator[None]:
    """Fail unless the block's peak allocation stays within MEMORY_FACTOR * input + MEMORY_SLACK_BYTES."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield
    finally:
        peak = tracemalloc.get_traced_memory()[1] - base
        if not was_tracing:
            tracemalloc.stop()
    bound = MEMORY_FACTOR * input_bytes + MEMORY_SLACK_BYTES
    assert peak <= bound, f"parser allocated {peak} bytes for a {input_bytes}-byte input (bound {bound})"


def _size(frame: str | bytes) -> int:
    return len(frame) if isinstance(frame, bytes) else len(frame.encode("utf-8", "surrogatepass"))


# -- the WebSocket protocols: every frame decodes to events or a ProtocolError ----------------------------------


def _caller_frames(provider: str, call_id: str, pcm: np.ndarray, name: str) -> list[str | bytes]:
    """One well-formed call from the provider's end: its start, one audio frame, a mark's echo, its stop."""
    caller = make_caller_serializer(provider, call_id=call_id, params={"k": "v"})
    return [*caller.start(), *caller.audio(pcm), *caller.mark_ack(name), *caller.clear_ack(), *caller.stop()]


@st.composite
def ws_frame(draw: st.DrawFn, provider: str, valid: list[str | bytes]) -> str | bytes:
    """A frame of the provider's protocol: a mutated real one most of the time, else text, bytes or any JSON."""
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "json", "text", "bytes", "big", "nested"]))
    if kind == "mutated":
        frame = draw(st.sampled_from(valid))
        if isinstance(frame, bytes):
            return draw(st.one_of(st.just(frame), st.binary(max_size=700), st.just(frame[:-1])))
        return json.dumps(draw(mutated(json.loads(frame))))
    if kind == "json":
        return json.dumps(draw(JSON_VALUES))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "bytes":
        return draw(st.binary(max_size=700))
    if kind == "nested":  # deeper than Python's recursion limit, within the frame bound
        depth = draw(st.integers(900, 2000))
        return draw(st.sampled_from(["[" * depth, '{"a":' * depth, '{"event": "media", "media": ' + "[" * depth]))
    # a frame over the small bound: the serializer must refuse it before parsing it
    size = draw(st.integers(SMALL_FRAME_BYTES + 1, 4 * SMALL_FRAME_BYTES))
    return draw(st.sampled_from([b"\x00" * size, json.dumps({"event": "media", "media": {"payload": "A" * size}})]))


def ws_frames(provider: str) -> st.SearchStrategy:
    @st.composite
    def frames(draw: st.DrawFn) -> tuple[int, list[str | bytes]]:
        valid = _caller_frames(provider, draw(NAMES), draw(PCM), draw(NAMES))
        start = [f for f in valid if isinstance(f, str) and '"start"' in f or "websocket:connected" in str(f)]
        head = draw(st.sampled_from([start, [json.dumps(draw(mutated(json.loads(f), 2))) for f in start], []]))
        body = draw(st.lists(ws_frame(provider, valid), max_size=8))
        return draw(st.sampled_from([DEFAULT_MAX_FRAME_BYTES, SMALL_FRAME_BYTES])), [*head, *body]

    return frames()


def _check_event(event: Any, serializer: Serializer) -> None:
    assert isinstance(event, Connected | Start | Media | Mark | Cleared | Dtmf | Stop | TransportError), event
    if isinstance(event, Media):
        assert event.audio.dtype == np.int16 and event.audio.ndim == 1, (event.audio.dtype, event.audio.shape)
        assert event.sequence is None or isinstance(event.sequence, int)
        assert event.timestamp_ms is None or isinstance(event.timestamp_ms, int)
    elif isinstance(event, Start):
        assert isinstance(event.sample_rate, int) and event.sample_rate > 0
        assert serializer.started
    elif isinstance(event, Mark):
        assert isinstance(event.name, str)
    elif isinstance(event, Dtmf):
        assert isinstance(event.digit, str) and len(event.digit) == 1


def decode_frames(serializer: Serializer, frames: list[str | bytes]) -> list[tuple[list[Event], list[str]]]:
    """Feed every frame through `decode_safe` (what the connection calls), holding each to the memory bound;
    returns each frame's events and error kinds."""
    out = []
    for frame in frames:
        with memory_bound(_size(frame)):
            result = serializer.decode_safe(frame)
        for error in result.errors:
            assert isinstance(error, ProtocolError) and error.kind in REACTIONS, error
            assert len(error.reason.encode()) <= 123, error.reason
        for event in result.events:
            _check_event(event, serializer)
        if _size(frame) > serializer.max_frame_bytes and not isinstance(serializer, AudioSocketSerializer):
            assert [e.kind for e in result.errors] == ["oversize"] and not result.events, result
        out.append((result.events, [e.kind for e in result.errors]))
    return out


def check_ws_decode(provider: str) -> Callable[[tuple[int, list]], None]:
    def check(example: tuple[int, list[str | bytes]]) -> None:
        max_frame_bytes, frames = example
        decode_frames(make_serializer(provider, max_frame_bytes=max_frame_bytes), frames)

    return check


# -- round trips: what one end encodes, the other decodes ---------------------------------------------------------

_PARAM_KEYS = st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=12).map("x_".__add__)
_NATIVE_PARAMS = st.fixed_dictionaries({}, optional={
    "system_prompt": st.text(max_size=60), "greeting": st.one_of(st.none(), st.text(max_size=60)),
    "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "turn_policy": st.text(max_size=10),
    "tools": st.one_of(st.text(max_size=20), st.lists(st.text(max_size=10), max_size=3)),
    "tool_choice": st.text(max_size=12)})


def roundtrip_calls(provider: str) -> st.SearchStrategy:
    params = _NATIVE_PARAMS if provider == "native" else st.dictionaries(_PARAM_KEYS, st.text(max_size=20), max_size=4)
    return st.fixed_dictionaries({
        "call_id": st.text(min_size=1, max_size=40), "params": params, "caller_audio": st.lists(PCM, max_size=4),
        "marks": st.lists(NAMES, max_size=3), "server_audio": st.lists(PCM, max_size=3),
        "keys": st.text(st.sampled_from("0123456789*#ABCD"), max_size=4),
        "chunks": st.lists(st.integers(1, 700), max_size=6)})


def _expected(codec: Any, pcm: np.ndarray) -> np.ndarray:
    return codec.decode(codec.encode(pcm))


def _only(events: list[Event], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def _rechunk(data: bytes, sizes: list[int]) -> list[bytes]:
    """A byte stream cut where a TCP peer might cut it."""
    out, i = [], 0
    for size in sizes:
        out.append(data[i:i + size])
        i += size
    return [*out, data[i:]]


def check_roundtrip(provider: str) -> Callable[[dict], None]:
    def check(call: dict[str, Any]) -> None:
        caller = make_caller_serializer(provider, call_id=call["call_id"], params=call["params"])
        server = make_serializer(provider)
        stream = provider == "audiosocket"

        def feed(frames: list[str | bytes]) -> list[Event]:
            if stream:
                frames = _rechunk(b"".join(frames), call["chunks"])
            results = decode_frames(server, frames)
            for _, errors in results:
                assert not errors, errors
            return [e for events, _ in results for e in events]

        [start] = _only(feed(caller.start()), Start)
        expected_id = call["call_id"] if provider != "audiosocket" else caller.call_id
        assert start.call_id == expected_id, (start.call_id, expected_id)
        parameters = {"uuid": call["call_id"], **call["params"]} if provider == "vonage" else call["params"]
        if provider == "audiosocket":
            assert start.custom_parameters == {}  # the protocol carries none
        elif provider == "native":
            assert start.custom_parameters == parameters, start.custom_parameters
        else:
            for key, value in parameters.items():
                assert start.custom_parameters.get(key) == value, (key, start.custom_parameters)
        for pcm in call["caller_audio"]:
            media = _only(feed(caller.audio(pcm)), Media)
            got = np.concatenate([m.audio for m in media]) if media else np.zeros(0, np.int16)
            assert np.array_equal(got, _expected(caller._codec, pcm)), (len(got), len(pcm))
        assert [e.digit for e in _only(feed([f for key in call["keys"] for f in caller.dtmf(key)]), Dtmf)] == \
            list(call["keys"])
        for name in call["marks"]:
            ack = caller.mark_ack(name)
            if ack:
                assert [e.name for e in _only(feed(ack), Mark)] == [name]
            sent = server.encode_mark(name)
            items = [item for frame in sent for item in caller.parse(frame)]
            assert items == ([("mark", name)] if server.supports_marks else []), items
        for pcm in call["server_audio"]:
            items = [item for frame in server.encode_audio(pcm) for item in caller.parse(frame)]
            assert all(kind == "audio" for kind, _ in items), items
            got = np.concatenate([a for _, a in items]) if items else np.zeros(0, np.int16)
            want = _expected(caller._codec, pcm)
            assert len(got) >= len(want) and np.array_equal(got[:len(want)], want), (len(got), len(want))
            assert not np.any(got[len(want):]), "padding must be silence"
        if server.supports_clear:
            assert [kind for frame in server.encode_clear() for kind, _ in caller.parse(frame)] == ["clear"]
        stop = caller.stop()
        if stop:
            assert len(_only(feed(stop), Stop)) == 1

    return check


# -- AudioSocket: a byte stream, cut anywhere --------------------------------------------------------------------

_AS_KINDS = st.one_of(st.sampled_from([KIND_HANGUP, KIND_UUID, KIND_DTMF, KIND_ERROR, *SLIN_RATES]),
                      st.integers(0, 255))


@st.composite
def audiosocket_streams(draw: st.DrawFn) -> tuple[int, bytes, list[int]]:
    parts = [encode_message(KIND_UUID, uuid.UUID(int=draw(st.integers(0, 2**128 - 1))).bytes)]
    for _ in range(draw(st.integers(0, 8))):
        choice = draw(st.sampled_from(["message", "message", "garbage", "header"]))
        if choice == "message":
            payload = draw(st.one_of(st.binary(max_size=400), PCM.map(np.ndarray.tobytes)))
            parts.append(encode_message(draw(_AS_KINDS), payload))
        elif choice == "garbage":
            parts.append(draw(st.binary(max_size=40)))
        else:  # a header that promises more than follows
            parts.append(HEADER.pack(draw(_AS_KINDS), draw(st.integers(0, MAX_PAYLOAD))))
    data = b"".join(draw(st.permutations(parts)) if draw(st.booleans()) else parts)
    bound = draw(st.sampled_from([DEFAULT_MAX_FRAME_BYTES, SMALL_FRAME_BYTES]))
    return bound, data, draw(st.lists(st.integers(1, 300), max_size=12))


def _normal(events: list[Event]) -> list[Any]:
    return [(type(e).__name__, e.audio.tobytes()) if isinstance(e, Media) else e for e in events]


def check_audiosocket(example: tuple[int, bytes, list[int]]) -> None:
    """Events and errors do not depend on where the stream is cut; the unread buffer stays under its bound."""
    bound, data, cuts = example
    whole, cut = AudioSocketSerializer(max_frame_bytes=bound), AudioSocketSerializer(max_frame_bytes=bound)
    at_once = decode_frames(whole, [data])
    pieces = decode_frames(cut, _rechunk(data, cuts))
    limit = bound + HEADER.size + MAX_PAYLOAD
    assert whole.pending_bytes <= limit and cut.pending_bytes <= limit
    if "oversize" in at_once[0][1] or any("oversize" in errors for _, errors in pieces):
        return  # refused at a different byte count, by design
    assert _normal([e for events, _ in pieces for e in events]) == _normal(at_once[0][0])
    assert [k for _, errors in pieces for k in errors] == at_once[0][1]


# -- SDP offers, as POST /webrtc/offer takes them ------------------------------------------------------------------

OFFER_SDP = """v=0
o=- 4005308492 4005308492 IN IP4 0.0.0.0
s=-
t=0 0
a=group:BUNDLE 0 1
a=msid-semantic:WMS *
m=audio 51600 UDP/TLS/RTP/SAVPF 96 9 0 8
c=IN IP4 192.0.2.2
a=sendrecv
a=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid
a=mid:0
a=msid:32fcaa3c-a3ee-44c0-b2fc-badceff97b8d d260b80f-97cd-4fb5-9512-642764b409ab
a=rtcp:9 IN IP4 0.0.0.0
a=rtcp-mux
a=ssrc:592256146 cname:410b493d-6b1b-4dc4-aa2f-257ccbb530dc
a=rtpmap:96 opus/48000/2
a=rtpmap:9 G722/8000
a=rtpmap:0 PCMU/8000
a=rtpmap:8 PCMA/8000
a=candidate:f957a2332b1715da3b0ef8ba684454eb 1 udp 2130706431 192.0.2.2 51600 typ host
a=end-of-candidates
a=ice-ufrag:fFmV
a=ice-pwd:xXgMSKALMIG6yKHSUEgJzc
a=fingerprint:sha-256 FD:4B:35:78:78:E8:0A:7B:C2:35:94:7C:C3:8D:EC:6C:1A:0A:6B:DB:13:59:05:C5:8F:FB:86:02:3A:36:80:73
a=setup:actpass
m=application 60464 UDP/DTLS/SCTP webrtc-datachannel
c=IN IP4 192.0.2.2
a=mid:1
a=sctp-port:5000
a=max-message-size:262144
a=ice-ufrag:fFmV
a=ice-pwd:xXgMSKALMIG6yKHSUEgJzc
a=setup:actpass
""".replace("\n", "\r\n")
_SDP_LINES = OFFER_SDP.split("\r\n")


def mutate_lines(draw: st.DrawFn, lines: list[str], inserts: list[str]) -> list[str]:
    """`lines` with a few of them dropped, repeated, cut, a field rewritten, or a line that starts with one of
    `inserts` put in."""
    lines = list(lines)
    for _ in range(draw(st.integers(0, 6))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "repeat", "cut", "field", "insert"]))
        if action == "drop":
            del lines[i]
        elif action == "repeat":
            lines.insert(i, lines[i])
        elif action == "cut":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
        elif action == "field":
            words = lines[i].split(" ")
            j = draw(st.integers(0, len(words) - 1))
            words[j] = draw(st.one_of(st.text(max_size=12), TRICKY.map(str)))
            lines[i] = " ".join(words)
        else:
            lines.insert(i, draw(st.sampled_from(inserts)) + draw(st.text(max_size=30)))
    return lines


@st.composite
def sdp_texts(draw: st.DrawFn) -> str:
    """The browser-shaped offer with lines dropped, repeated, cut or rewritten, or any text."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=300))
    lines = mutate_lines(draw, _SDP_LINES, ["a=", "m=", "c=", "o=", "b="])
    return draw(st.sampled_from(["\r\n", "\n"])).join(lines)


@st.composite
def offer_bodies(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    body = {"type": "offer", "sdp": draw(sdp_texts()), "call_id": draw(st.text(max_size=20)),
            "system_prompt": draw(st.text(max_size=20)), "greeting": None, "metadata": {"k": "v"}}
    return json.dumps(draw(mutated(body, 2))).encode()


def check_offer(raw: bytes) -> None:
    """An offer gives the checked body and start fields or `BadOffer`; what it accepts aiortc parsed."""
    with memory_bound(len(raw)):
        try:
            body, start = parse_offer(raw)
        except BadOffer as exc:
            assert str(exc)
            return
    assert isinstance(body["sdp"], str) and body["type"] == "offer"
    assert isinstance(start["call_id"], str) and len(start["call_id"]) <= 128


def check_big_offer(size: int) -> None:
    raw = json.dumps({"type": "offer", "sdp": "a" * size}).encode()
    try:
        parse_offer(raw)
    except BadOffer as exc:
        assert len(raw) <= MAX_OFFER_BYTES or "too large" in str(exc), exc


@st.composite
def good_offers(draw: st.DrawFn) -> dict[str, Any]:
    ice = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/"), min_size=4,
                  max_size=32)
    codecs = draw(st.lists(st.sampled_from(["96 opus/48000/2", "9 G722/8000", "0 PCMU/8000", "8 PCMA/8000"]),
                           min_size=1, max_size=4, unique=True))
    lines = []
    for line in _SDP_LINES:
        if line.startswith("m=audio"):
            line = f"m=audio {draw(st.integers(1, 65535))} UDP/TLS/RTP/SAVPF " + " ".join(c.split()[0] for c in codecs)
        elif line.startswith("a=rtpmap:"):
            if line != "a=rtpmap:96 opus/48000/2":
                continue
            lines.extend(f"a=rtpmap:{c}" for c in codecs)
            continue
        lines.append(line)
    sdp = "\r\n".join(lines).replace("fFmV", draw(ice)).replace("xXgMSKALMIG6yKHSUEgJzc", draw(ice) + "x" * 22)
    start = draw(st.fixed_dictionaries({"call_id": st.text(min_size=1, max_size=128)}, optional={
        "system_prompt": st.text(max_size=40), "greeting": st.one_of(st.none(), st.text(max_size=40)),
        "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)}))
    return {"type": "offer", "sdp": sdp, **start}


def check_good_offer(body: dict[str, Any]) -> None:
    parsed, start = parse_offer(json.dumps(body).encode())
    assert parsed == body
    assert start == {k: v for k, v in body.items() if k not in ("sdp", "type")}, start


# -- SIP over WebSocket, as /sip reads it ------------------------------------------------------------------------

SIP_MAX_BYTES = 65536
SIP_INVITE = "\r\n".join([
    "INVITE sip:agent@voicepipe.test SIP/2.0",
    "Via: SIP/2.0/WSS 4k0ahcrb5mt6.invalid;branch=z9hG4bK2961574",
    "Max-Forwards: 69",
    "To: <sip:agent@voicepipe.test>",
    'From: "Alice" <sip:alice@voicepipe.test>;tag=jr5mo59m8b',
    "Call-ID: gf9kgqks7qarrmi5kba7",
    "CSeq: 7424 INVITE",
    "Contact: <sip:u8bmkl9l@4k0ahcrb5mt6.invalid;transport=ws;ob>",
    "Content-Type: application/sdp",
    "Session-Expires: 90",
    "Allow: INVITE,ACK,CANCEL,BYE,UPDATE,MESSAGE,OPTIONS,REFER,INFO,NOTIFY",
    "Supported: timer,ice,replaces,outbound",
    "User-Agent: JsSIP 3.13.8",
    "Content-Length: 9",
    "",
    "v=0\r\no=-",
])
_SIP_LINES = SIP_INVITE.split("\r\n")
SIP_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)  # what a WebSocket text frame holds


@st.composite
def sip_texts(draw: st.DrawFn) -> str:
    """A JsSIP-shaped INVITE (or its start line turned into a response's) with lines dropped, repeated, cut or
    rewritten, or any text."""
    if draw(st.integers(0, 9)) == 0:
        return draw(SIP_TEXT)
    lines = list(_SIP_LINES)
    if draw(st.booleans()):
        lines[0] = draw(st.sampled_from(["SIP/2.0 200 OK", "SIP/2.0 100 Trying", "SIP/2.0 699 x", "SIP/2.0 1000"]))
    lines = mutate_lines(draw, lines, ["Via: ", "CSeq: ", "To: ", "Content-Length: ", " ", "v: ", "l: ", "x: "])
    text = draw(st.sampled_from(["\r\n", "\n"])).join(lines)
    return text.replace("x", "x" * draw(st.sampled_from([1, 1, 1, 5000]))).replace("\ud800", "")


def check_sip_message(text: str) -> None:
    """A SIP message parses, or `SipError` says why; what is accepted writes back to the same message, and the
    refusal of a request that can be answered is itself a message that parses."""
    with memory_bound(len(text.encode())):
        try:
            message = parse_sip(text, SIP_MAX_BYTES)
        except SipError as exc:
            assert exc.status in (400, 513) and exc.reason
            if exc.request is not None:
                answer = parse_sip(response_to(exc.request, exc.status, exc.reason, to_tag="t").serialize(),
                                   10 * SIP_MAX_BYTES)
                assert answer.status == exc.status and answer.values("Via") == exc.request.values("Via")
            return
    again = parse_sip(message.serialize(), 10 * SIP_MAX_BYTES)
    assert type(again) is type(message) and again.body == message.body
    strip = lambda m: [(n, v) for n, v in m.headers if n.lower() != "content-length"]  # noqa: E731
    assert strip(again) == strip(message)


@st.composite
def dtmf_infos(draw: st.DrawFn) -> tuple[str, str]:
    content_type = draw(st.one_of(st.sampled_from(["application/dtmf-relay", "application/dtmf",
                                                   "Application/DTMF-Relay; x=1"]), SIP_TEXT))
    body = draw(st.one_of(st.builds("Signal={}\r\nDuration={}".format, st.one_of(TRICKY.map(str), SIP_TEXT),
                                    NUMBER_TEXT), SIP_TEXT))
    return content_type, body


def check_dtmf_info(info: tuple[str, str]) -> None:
    try:
        assert info_digit(*info) in "0123456789*#ABCD"
    except BadDtmf as exc:
        assert str(exc)


_DIGEST = DigestServer("voicepipe.test", {"alice": "wonderland"})


@st.composite
def digest_requests(draw: st.DrawFn) -> Request:
    """A REGISTER with right credentials, then cut, rewritten or replaced by any text."""
    credentials = authorization(_DIGEST.challenge(), "REGISTER", "sip:voicepipe.test", "alice", "wonderland")
    parts = mutate_lines(draw, credentials.split(", "), ["nc=", "nonce=", 'uri="', "qop="])
    value = draw(st.one_of(st.just(", ".join(parts)), SIP_TEXT))
    headers = [("Via", "SIP/2.0/WS h.invalid;branch=z9hG4bK1"), ("Authorization", value)]
    return Request(headers=headers, method="REGISTER", uri=draw(st.sampled_from(["sip:voicepipe.test", "sip:x"])))


def check_digest(request: Request) -> None:
    result = _DIGEST.check(request)
    assert result.user in (None, "alice") and (result.user is not None or result.why)


# -- TOML documents (the replay case format and the settings file) ------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):  # a TOML basic string: JSON's escapes, but no surrogate pairs, and DEL escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_value(key)


def toml_text(document: dict[str, Any]) -> str:
    """A TOML document: scalars first, then `[table]`s and `[[array of tables]]`."""
    plain = [f"{toml_key(k)} = {toml_value(v)}" for k, v in document.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v and all(isinstance(t, dict) for t in v))]
    out = [*plain]
    for key, value in document.items():
        if isinstance(value, dict):
            out.append(f"[{toml_key(key)}]")
            out.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        elif isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
            for table in value:
                out.append(f"[[{toml_key(key)}]]")
                out.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(out) + "\n"


_TOML_SCALARS = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(),
                          st.text(st.characters(exclude_categories=("Cs",)), max_size=30))
_TOML_VALUES = st.one_of(_TOML_SCALARS, st.lists(_TOML_SCALARS, max_size=3), st.sampled_from(
    [math.nan, math.inf, -math.inf, -1, 0, 2**63 - 1]), st.sampled_from(
    ["twilio", "native", "(", "a{99999999999}", "(?", "x" * 3, "((((((((((a))))))))))" * 20]),
    st.lists(st.sampled_from(["sorry", "", "(?i)when", "[", "a" * 2000]), max_size=3))

_CALL_KEYS = ["transport", "system_prompt", "greeting", "deterministic", "audio"]
_REPLY_KEYS = ["contains", "not_contains", "regex", "max_chars"]
_EXPECT_KEYS = ["turns", "voice_to_voice_p95_ms", "response_p95_ms", *_REPLY_KEYS]
_TURN_KEYS = ["transcript", "max_wer", "golden", "golden_max_wer", "barge_in", "barge_in_stop_ms", *_REPLY_KEYS]


def _table(keys: list[str]) -> st.SearchStrategy:
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=6)), _TOML_VALUES, max_size=5)


@st.composite
def case_documents(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    call = {"transport": draw(st.sampled_from(["twilio", "native", "sip"])), **draw(_table(_CALL_KEYS))}
    if draw(st.booleans()):
        call["audio"] = draw(st.sampled_from(["caller.wav", "missing.wav", "../caller.wav", "/", "\x00", "a" * 300,
                                              "nul\x00.wav", ""]))
    document = {"call": call, "expect": draw(_table(_EXPECT_KEYS)),
                "turn": draw(st.lists(_table(_TURN_KEYS), max_size=3))}
    document = draw(mutated(document, 2, _TOML_VALUES))
    return toml_text(document if isinstance(document, dict) else {"call": document})


_case_dir: Path | None = None


def _scratch_case_dir() -> Path:
    """One directory for all examples (a caller.wav written once; case.toml rewritten per example)."""
    global _case_dir
    if _case_dir is None or not _case_dir.is_dir():
        _case_dir = Path(tempfile.mkdtemp(prefix="voicepipe-fuzz-case-"))
        with wave.open(str(_case_dir / "caller.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000)
            w.writeframes(np.arange(160, dtype=np.int16).tobytes())
    return _case_dir


def check_case(text: str) -> None:
    """case.toml gives a case or a `CaseError`; a loaded case holds no NaN."""
    directory = _scratch_case_dir()
    (directory / "case.toml").write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        case = load_case(directory)
    except CaseError as exc:
        assert exc.problem and str(exc).startswith(str(directory))
        return
    numbers = [case.voice_to_voice_p95_ms, case.response_p95_ms, case.reply.max_chars]
    for turn in case.expected_turns:
        numbers += [turn.max_wer, turn.golden_max_wer, turn.barge_in_stop_ms, turn.reply.max_chars]
    assert not any(isinstance(n, float) and math.isnan(n) for n in numbers), numbers
    assert case.transport in ("twilio", "native") and case.turns >= len(case.expected_turns)


_CASE_TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30)
_WER = st.floats(0, 10, allow_nan=False)


def good_cases() -> st.SearchStrategy:
    reply = {"contains": st.lists(_CASE_TEXT, max_size=2), "not_contains": st.lists(_CASE_TEXT, max_size=2),
             "max_chars": st.integers(1, 10_000)}
    turn = st.fixed_dictionaries({"transcript": _CASE_TEXT}, optional={
        "max_wer": _WER, "golden": _CASE_TEXT, "golden_max_wer": _WER, "barge_in": st.booleans(), **reply})
    return st.fixed_dictionaries({
        "call": st.fixed_dictionaries({"transport": st.sampled_from(["twilio", "telnyx", "vonage", "plivo", "exotel",
                                                                     "native"])},
                                      optional={"system_prompt": _CASE_TEXT, "greeting": _CASE_TEXT,
                                                "deterministic": st.booleans()}),
        "expect": st.fixed_dictionaries({}, optional={"voice_to_voice_p95_ms": st.floats(0, 1e6), **reply}),
        "turn": st.lists(turn, max_size=3)})


def check_good_case(document: dict[str, Any]) -> None:
    """A valid case.toml loads to exactly what it says."""
    directory = _scratch_case_dir()
    (directory / "case.toml").write_text(toml_text(document), encoding="utf-8")
    case = load_case(directory)
    call, expect = document["call"], document["expect"]
    assert (case.transport, case.system_prompt, case.greeting, case.deterministic) == (
        call["transport"], call.get("system_prompt"), call.get("greeting"), call.get("deterministic", True))
    assert case.voice_to_voice_p95_ms == expect.get("voice_to_voice_p95_ms")
    assert (case.reply.contains, case.reply.max_chars) == (expect.get("contains", []), expect.get("max_chars"))
    assert [t.transcript for t in case.expected_turns] == [t["transcript"] for t in document["turn"]]
    for got, want in zip(case.expected_turns, document["turn"], strict=True):
        assert (got.max_wer, got.golden, got.barge_in) == (want.get("max_wer", 0.25), want.get("golden"),
                                                           want.get("barge_in"))


# -- the settings loader: a TOML file, --set pairs and VOICEPIPE_* variables ---------------------------------------


def _setting_paths(model: type, prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            out.extend(_setting_paths(annotation, f"{prefix}{name}."))
        else:
            out.append(f"{prefix}{name}")
    return out


SETTING_PATHS = _setting_paths(Settings)
_SETTING_VALUES = st.one_of(_TOML_SCALARS, st.sampled_from(["auto", "cpu", "info", "0", "-1", "65536", "1e400",
                                                            "nan", "[]", "{}", "true", "x" * 300]))


@st.composite
def settings_inputs(draw: st.DrawFn) -> dict[str, Any]:
    keys = st.one_of(st.sampled_from(SETTING_PATHS), st.sampled_from(SETTING_PATHS).map(lambda p: p.split(".")[0]),
                     st.text(max_size=12))
    pairs = [f"{k}{draw(st.sampled_from(['=', '', '==']))}{v}"
             for k, v in draw(st.lists(st.tuples(keys, st.text(max_size=12)), max_size=4))]
    document: dict[str, Any] = {}
    for path, value in draw(st.lists(st.tuples(keys, _SETTING_VALUES), max_size=5)):
        *parents, leaf = path.split(".")
        node = document
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[leaf] = value
    text = draw(st.one_of(st.just(toml_text(document)), st.text(max_size=80)))
    env = draw(st.dictionaries(st.sampled_from(SETTING_PATHS).map(
        lambda p: "VOICEPIPE_" + p.upper().replace(".", "__")), st.text(st.characters(codec="utf-8",
                                                                                      exclude_characters="\x00"),
                                                                        max_size=12), max_size=2))
    return {"pairs": pairs, "toml": text, "env": env}


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _scratch_file(text: str) -> Path:
    path = _scratch_case_dir() / "voicepipe.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def check_settings(inputs: dict[str, Any]) -> None:
    """Any file, flags and environment give settings or one `SettingsError` line."""
    with _environment(inputs["env"]):
        try:
            settings = load_settings(_scratch_file(inputs["toml"]), set_pairs=inputs["pairs"])
        except SettingsError as exc:
            assert str(exc) and "\n" not in str(exc).strip(), str(exc)
            return
    assert isinstance(settings, Settings)


def good_settings() -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={
        "server": st.fixed_dictionaries({"port": st.integers(0, 65535)},
                                        optional={"log_level": st.sampled_from(["debug", "info", "warning"])}),
        "vad": st.fixed_dictionaries({"threshold": st.floats(0.01, 0.99)}),
        "calls": st.fixed_dictionaries({"greeting": _CASE_TEXT, "max_reply_tokens": st.integers(1, 4096)}),
        "llm": st.fixed_dictionaries({"block_size": st.integers(1, 1024)}),
    })


def check_good_settings(document: dict[str, Any]) -> None:
    """A settings file, the same values as --set pairs, and the dump of either all load to the same tree."""
    from_file = load_settings(_scratch_file(toml_text(document)))
    pairs = [f"{section}.{key}={value}" for section, table in document.items() for key, value in table.items()]
    from_pairs = load_settings(_scratch_file(""), set_pairs=pairs)
    dumped = masked_dump(from_file)
    assert dumped == masked_dump(from_pairs)
    for section, table in document.items():
        for key, value in table.items():
            assert dumped[section][key] == value, (section, key, dumped[section][key], value)


# -- all of them ----------------------------------------------------------------------------------------------------


def all_targets() -> list[Target]:
    """Every target, grouped by parser (the group is the name's first part). A new parser of untrusted input joins
    here with its strategies and properties beside the others', and its group in `tests/unit/test_fuzz.py`'s
    `test_the_targets_cover_every_parser`. Next: the SIP parser (issue 22), as `sip.*`: any datagram gives a
    message or its typed error; a message it builds parses back to itself; Content-Length and header counts
    never make it buffer past its datagram bound."""
    targets = []
    for provider in WS_PROVIDERS:
        targets.append(Target(f"{provider}.decode", ws_frames(provider), check_ws_decode(provider),
                              f"any {provider} frames: events or a ProtocolError, within the memory bound"))
    for provider in (*WS_PROVIDERS, "audiosocket"):
        targets.append(Target(f"{provider}.roundtrip", roundtrip_calls(provider), check_roundtrip(provider),
                              f"{provider}: what the caller's end sends the server decodes, and back"))
    targets += [
        Target("audiosocket.stream", audiosocket_streams(), check_audiosocket,
               "AudioSocket bytes cut anywhere: the same events and errors, the buffer bounded"),
        Target("sdp.offer", offer_bodies(), check_offer, "POST /webrtc/offer bodies: an offer or BadOffer"),
        Target("sdp.oversize", st.integers(0, 2 * MAX_OFFER_BYTES), check_big_offer,
               "offers over the size bound are refused as too large"),
        Target("sdp.roundtrip", good_offers(), check_good_offer, "well-formed offers pass with their start fields"),
        Target("sip.message", sip_texts(), check_sip_message,
               "/sip messages: a request or response that writes back the same, or a SipError to answer with"),
        Target("sip.dtmf", dtmf_infos(), check_dtmf_info, "INFO bodies: a DTMF key or BadDtmf"),
        Target("sip.digest", digest_requests(), check_digest, "Authorization values: a user or a reason, no error"),
        Target("replay.case", case_documents(), check_case, "case.toml: a case or a CaseError"),
        Target("replay.roundtrip", good_cases(), check_good_case, "a valid case.toml loads to what it says"),
        Target("settings.load", settings_inputs(), check_settings, "file, --set, env: settings or SettingsError"),
        Target("settings.roundtrip", good_settings(), check_good_settings, "file and --set load the same tree"),
    ]
    return targets
