"""The caller side of every transport: what `voicepipe call` runs, as a library.

`run_call(url, transport, utterances)` connects like the provider would (Twilio, Telnyx, Vonage, Plivo,
Exotel, voicepipe's native `/ws`, Asterisk AudioSocket, or a WebRTC peer: see webrtc/client_link.py),
streams caller audio at real-time pace in 20 ms frames (silence between utterances, like a phone line),
plays the agent's audio on a local clock, answers marks when the audio before them has played (and at
once on a clear, as the providers do), records the agent's audio, and measures per turn what a caller
would: caller speech start/end, first agent audio, clears.

Turn taking: each utterance is spoken once the agent has gone quiet (its reply has played out) and, with
`sync_with_server` (the default), once the server says the agent listens again (`GET /calls/{id}`), since
a slow clause on a busy machine can leave a pause inside a reply; with `barge_in_after_ms` the utterances
after the first start that long after the agent's reply began, so they interrupt it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from voicepipe.audio import get_codec, resample
from voicepipe.auth import TELNYX_AUTH_HEADER

log = logging.getLogger(__name__)

FRAME_S = 0.02
RECORD_RATE = 16000
TRANSPORTS = ("twilio", "telnyx", "vonage", "plivo", "exotel", "native", "audiosocket", "webrtc")


# -- utterances --------------------------------------------------------------------------------------------


@dataclass
class Utterance:
    audio: np.ndarray  # int16 mono at `rate`
    rate: int
    voiced_start: int  # first voiced sample
    voiced_end: int  # end of the last voiced sample


def voiced_span(audio: np.ndarray, rate: int, threshold: float = 300.0) -> tuple[int, int]:
    """First and last+1 sample of 10 ms windows whose RMS is over `threshold` (int16 units)."""
    win = max(1, rate // 100)
    n = len(audio) // win
    if n == 0:
        return 0, len(audio)
    rms = np.sqrt(np.mean(audio[: n * win].astype(np.float64).reshape(n, win) ** 2, axis=1))
    loud = np.flatnonzero(rms > threshold)
    if not len(loud):
        return 0, 0
    return int(loud[0] * win), int((loud[-1] + 1) * win)


def split_utterances(audio: np.ndarray, rate: int, min_gap_s: float = 0.5, pad_s: float = 0.1) -> list[Utterance]:
    """Cut a recording into utterances separated by at least `min_gap_s` of silence."""
    win = max(1, rate // 100)
    n = len(audio) // win
    rms = np.sqrt(np.mean(audio[: n * win].astype(np.float64).reshape(n, win) ** 2, axis=1)) if n else []
    loud = np.flatnonzero(np.asarray(rms) > 300.0)
    spans: list[list[int]] = []
    for i in loud:
        if spans and i - spans[-1][1] <= min_gap_s * 100:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    out = []
    pad = int(pad_s * rate)
    for a, b in spans:
        start, end = max(0, a * win - pad), min(len(audio), (b + 1) * win + pad)
        piece = audio[start:end]
        vs, ve = voiced_span(piece, rate)
        out.append(Utterance(piece, rate, vs, ve))
    return out


def utterance(audio: np.ndarray, rate: int) -> Utterance:
    vs, ve = voiced_span(audio, rate)
    return Utterance(audio, rate, vs, ve)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV files are supported")
        rate, channels = w.getframerate(), w.getnchannels()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1).astype(np.int16)
    return data.astype(np.int16), rate


def write_wav(path: Path, audio: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(audio, dtype="<i2").tobytes())


# -- the provider side of each wire format -----------------------------------------------------------------


class Wire:
    """Client-side frames for one transport. `parse` returns a list of (kind, value) items."""

    rate = 8000
    codec = "pcmu"
    text_only = True

    def __init__(self, call_id: str, params: dict[str, Any]) -> None:
        self.call_id = call_id
        self.stream_id = f"MZ{uuid.uuid4().hex}"
        self.params = params
        self.seq = 0
        self.chunk = 0
        self._codec = get_codec(self.codec)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def headers(self) -> dict[str, str]:
        return {}

    def start(self) -> list:
        raise NotImplementedError

    def audio(self, pcm16: np.ndarray) -> list:
        raise NotImplementedError

    def mark_ack(self, name: str) -> list:
        return []

    def clear_ack(self) -> list:
        return []

    def stop(self) -> list:
        return []

    def parse(self, frame) -> list[tuple[str, Any]]:
        raise NotImplementedError

    def encode(self, pcm16: np.ndarray) -> bytes:
        return self._codec.encode(pcm16)

    def decode(self, data: bytes) -> np.ndarray:
        return self._codec.decode(data)


def _dumps(message: dict) -> str:
    return json.dumps(message, separators=(",", ":"))


class TwilioWire(Wire):
    def start(self) -> list:
        return [
            _dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
            _dumps({"event": "start", "sequenceNumber": str(self.next_seq()), "streamSid": self.stream_id,
                    "start": {"streamSid": self.stream_id, "accountSid": "AC" + "0" * 32, "callSid": self.call_id,
                              "tracks": ["inbound"], "customParameters": self.params,
                              "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}),
        ]

    def audio(self, pcm16: np.ndarray) -> list:
        self.chunk += 1
        return [_dumps({"event": "media", "sequenceNumber": str(self.next_seq()), "streamSid": self.stream_id,
                        "media": {"track": "inbound", "chunk": str(self.chunk), "timestamp": str(self.chunk * 20),
                                  "payload": base64.b64encode(self.encode(pcm16)).decode()}})]

    def mark_ack(self, name: str) -> list:
        return [_dumps({"event": "mark", "sequenceNumber": str(self.next_seq()), "streamSid": self.stream_id,
                        "mark": {"name": name}})]

    def stop(self) -> list:
        return [_dumps({"event": "stop", "sequenceNumber": str(self.next_seq()), "streamSid": self.stream_id,
                        "stop": {"accountSid": "AC" + "0" * 32, "callSid": self.call_id}})]

    def parse(self, frame) -> list[tuple[str, Any]]:
        msg = json.loads(frame)
        event = msg.get("event")
        if event in ("media", "playAudio"):
            return [("audio", self.decode(base64.b64decode(msg["media"]["payload"])))]
        if event == "mark":
            return [("mark", msg["mark"]["name"])]
        if event == "checkpoint":
            return [("mark", msg["name"])]
        if event in ("clear", "clearAudio"):
            return [("clear", None)]
        return [("other", msg)]


class TelnyxWire(TwilioWire):
    def __init__(self, call_id: str, params: dict[str, Any], token: str | None = None) -> None:
        super().__init__(call_id, params)
        self.token = token

    def headers(self) -> dict[str, str]:
        return {TELNYX_AUTH_HEADER: self.token} if self.token else {}

    def start(self) -> list:
        return [
            _dumps({"event": "connected", "version": "1.0.0"}),
            _dumps({"event": "start", "sequence_number": str(self.next_seq()), "stream_id": self.stream_id,
                    "start": {"call_control_id": self.call_id, "call_session_id": str(uuid.uuid4()),
                              "from": "+15550000001", "to": "+15550000002", "custom_parameters": self.params,
                              "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}}),
        ]

    def audio(self, pcm16: np.ndarray) -> list:
        self.chunk += 1
        return [_dumps({"event": "media", "sequence_number": str(self.next_seq()), "stream_id": self.stream_id,
                        "media": {"track": "inbound", "chunk": str(self.chunk), "timestamp": str(self.chunk * 20),
                                  "payload": base64.b64encode(self.encode(pcm16)).decode()}})]

    def mark_ack(self, name: str) -> list:
        return [_dumps({"event": "mark", "sequence_number": str(self.next_seq()), "stream_id": self.stream_id,
                        "mark": {"name": name}})]

    def stop(self) -> list:
        return [_dumps({"event": "stop", "sequence_number": str(self.next_seq()), "stream_id": self.stream_id,
                        "stop": {"call_control_id": self.call_id}})]


class ExotelWire(TwilioWire):
    rate = 16000
    codec = "l16le"

    def start(self) -> list:
        return [
            _dumps({"event": "connected"}),
            _dumps({"event": "start", "sequence_number": str(self.next_seq()), "stream_sid": self.stream_id,
                    "start": {"stream_sid": self.stream_id, "call_sid": self.call_id, "account_sid": "voicepipe",
                              "from": "+15550000001", "to": "+15550000002", "custom_parameters": self.params,
                              "media_format": {"encoding": "raw/slin", "sample_rate": str(self.rate),
                                               "bit_rate": "16"}}}),
        ]

    def audio(self, pcm16: np.ndarray) -> list:
        self.chunk += 1
        return [_dumps({"event": "media", "sequence_number": str(self.next_seq()), "stream_sid": self.stream_id,
                        "media": {"chunk": str(self.chunk), "timestamp": str(self.chunk * 20),
                                  "payload": base64.b64encode(self.encode(pcm16)).decode()}})]

    def mark_ack(self, name: str) -> list:
        return [_dumps({"event": "mark", "sequence_number": str(self.next_seq()), "stream_sid": self.stream_id,
                        "mark": {"name": name}})]

    def stop(self) -> list:
        return [_dumps({"event": "stop", "sequence_number": str(self.next_seq()), "stream_sid": self.stream_id,
                        "stop": {"call_sid": self.call_id, "reason": "callended"}})]


class PlivoWire(TwilioWire):
    rate = 16000
    codec = "l16le"

    def start(self) -> list:
        return [_dumps({"event": "start", "sequenceNumber": self.next_seq(),
                        "start": {"callId": self.call_id, "streamId": self.stream_id, "accountId": "MA0000",
                                  "tracks": ["inbound"], "customParameters": self.params,
                                  "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": self.rate}}})]

    def audio(self, pcm16: np.ndarray) -> list:
        self.chunk += 1
        return [_dumps({"event": "media", "sequenceNumber": self.next_seq(), "streamId": self.stream_id,
                        "media": {"track": "inbound", "timestamp": str(self.chunk * 20), "chunk": self.chunk,
                                  "payload": base64.b64encode(self.encode(pcm16)).decode()}})]

    def mark_ack(self, name: str) -> list:
        return [_dumps({"event": "playedStream", "sequenceNumber": self.next_seq(), "streamId": self.stream_id,
                        "name": name})]

    def clear_ack(self) -> list:
        return [_dumps({"event": "clearedAudio", "sequenceNumber": self.next_seq(), "streamId": self.stream_id})]

    def stop(self) -> list:
        return []  # Plivo has no stop event: the socket closes


class VonageWire(Wire):
    rate = 16000
    codec = "l16le"
    text_only = False

    def start(self) -> list:
        return [_dumps({"event": "websocket:connected", "content-type": f"audio/l16;rate={self.rate}",
                        "uuid": self.call_id, **self.params})]

    def audio(self, pcm16: np.ndarray) -> list:
        return [self.encode(pcm16)]

    def mark_ack(self, name: str) -> list:
        return [_dumps({"event": "websocket:notify", "payload": {"name": name}})]

    def clear_ack(self) -> list:
        return [_dumps({"event": "websocket:cleared"})]

    def parse(self, frame) -> list[tuple[str, Any]]:
        if isinstance(frame, bytes):
            return [("audio", self.decode(frame))]
        msg = json.loads(frame)
        action = msg.get("action")
        if action == "notify":
            return [("mark", msg["payload"]["name"])]
        if action == "clear":
            return [("clear", None)]
        return [("other", msg)]


class NativeWire(Wire):
    rate = 16000
    codec = "l16le"
    text_only = False

    def start(self) -> list:
        return [_dumps({"type": "start", "sample_rate": self.rate, "encoding": "pcm16", "call_id": self.call_id,
                        "marks": True, **self.params})]

    def audio(self, pcm16: np.ndarray) -> list:
        return [self.encode(pcm16)]

    def mark_ack(self, name: str) -> list:
        return [_dumps({"type": "mark", "name": name})]

    def stop(self) -> list:
        return [_dumps({"type": "stop", "reason": "hangup"})]

    def parse(self, frame) -> list[tuple[str, Any]]:
        if isinstance(frame, bytes):
            return [("audio", self.decode(frame))]
        msg = json.loads(frame)
        kind = msg.get("type")
        if kind == "mark":
            return [("mark", msg["name"])]
        if kind == "clear":
            return [("clear", None)]
        return [("event", msg)]


class AudioSocketWire(Wire):
    """Asterisk's side of AudioSocket: a UUID message, then 20 ms slin frames; no marks, no clear."""

    rate = 8000
    codec = "l16le"
    text_only = False

    def __init__(self, call_id: str, params: dict[str, Any]) -> None:
        super().__init__(call_id, params)
        self._buffer = bytearray()
        try:
            self.uuid = uuid.UUID(call_id)
        except ValueError:
            self.uuid = uuid.uuid5(uuid.NAMESPACE_URL, call_id)
        self.call_id = str(self.uuid)

    @staticmethod
    def _message(kind: int, payload: bytes = b"") -> bytes:
        return bytes([kind]) + len(payload).to_bytes(2, "big") + payload

    def start(self) -> list:
        return [self._message(0x01, self.uuid.bytes)]

    def audio(self, pcm16: np.ndarray) -> list:
        return [self._message(0x10, self.encode(pcm16))]

    def stop(self) -> list:
        return [self._message(0x00)]

    def parse(self, frame) -> list[tuple[str, Any]]:
        self._buffer += frame
        out: list[tuple[str, Any]] = []
        while len(self._buffer) >= 3:
            kind, length = self._buffer[0], int.from_bytes(self._buffer[1:3], "big")
            if len(self._buffer) < 3 + length:
                break
            payload = bytes(self._buffer[3: 3 + length])
            del self._buffer[: 3 + length]
            if kind == 0x10:
                out.append(("audio", self.decode(payload)))
            elif kind == 0x00:
                out.append(("hangup", None))
            else:
                out.append(("other", {"kind": kind}))
        return out


class _TCPConnection:
    """What `run_call` needs of a WebSocket, over TCP (AudioSocket)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 9092
        self.close_code: int | None = None
        self.close_reason: str | None = None

    async def __aenter__(self) -> _TCPConnection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.transport = self.writer.transport
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):  # already reset
            await self.writer.wait_closed()

    async def send(self, frame: bytes) -> None:
        self.writer.write(frame)
        await self.writer.drain()

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        while True:
            data = await self.reader.read(65536)
            if not data:
                self.close_code = 1000
                return
            yield data


class WebRtcWire(NativeWire):
    """A WebRTC call: 48 kHz mono PCM frames on the peer's audio tracks, the native protocol's events on its
    data channel (the signalling happens when the link opens, so there is no start message).

    The server's track never stops sending: frames of silence are not agent audio, except the short gaps
    inside a reply (up to `HANGOVER_S` after the last loud frame), which stay in the recording."""

    rate = 48000
    SILENCE_PEAK = 64  # int16 peak below which a received frame is silence
    HANGOVER_S = 0.3

    def __init__(self, call_id: str, params: dict[str, Any]) -> None:
        super().__init__(call_id, params)
        self._quiet = None  # samples of silence since the last loud frame (None: no agent audio yet)

    def start(self) -> list:
        return []

    def audio(self, pcm16: np.ndarray) -> list:
        return [pcm16]

    def parse(self, frame) -> list[tuple[str, Any]]:
        if isinstance(frame, str):
            return [("event", json.loads(frame))]
        if len(frame) and int(np.abs(frame.astype(np.int32)).max()) > self.SILENCE_PEAK:
            self._quiet = 0
            return [("audio", frame)]
        if self._quiet is None or self._quiet >= self.HANGOVER_S * self.rate:
            return []
        self._quiet += len(frame)
        return [("audio", frame)]


WIRES: dict[str, type[Wire]] = {"twilio": TwilioWire, "telnyx": TelnyxWire, "exotel": ExotelWire,
                                "plivo": PlivoWire, "vonage": VonageWire, "native": NativeWire,
                                "audiosocket": AudioSocketWire, "webrtc": WebRtcWire}


def make_wire(transport: str, call_id: str, params: dict[str, Any], token: str | None = None) -> Wire:
    if transport not in WIRES:
        raise ValueError(f"unknown transport {transport!r}; expected one of: {', '.join(WIRES)}")
    if transport == "telnyx":
        return TelnyxWire(call_id, params, token)
    return WIRES[transport](call_id, params)


# -- results -------------------------------------------------------------------------------------------------


@dataclass
class ClientTurn:
    index: int
    audio_start: float | None = None  # client clock: the utterance's first sample sent
    speech_start: float | None = None  # client clock: first voiced sample sent
    speech_end: float | None = None  # last voiced sample sent
    first_audio: float | None = None  # first agent audio received after speech_end
    last_audio: float | None = None
    audio_s: float = 0.0  # agent audio received for this turn
    clear_at: float | None = None  # a clear received while this utterance was being spoken
    user_text: str | None = None  # what the server heard (from the call record or native events)
    agent_text: str | None = None
    server_timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def voice_to_voice_ms(self) -> float | None:
        if self.first_audio is None or self.speech_end is None:
            return None
        return (self.first_audio - self.speech_end) * 1000


@dataclass
class CallResult:
    transport: str
    call_id: str
    turns: list[ClientTurn] = field(default_factory=list)
    greeting_audio_s: float = 0.0
    agent_audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))  # 16 kHz, as played
    audio_chunks: list[tuple[float, float]] = field(default_factory=list)  # (client time received, seconds)
    clears: list[float] = field(default_factory=list)
    marks_acked: int = 0
    events: list[dict] = field(default_factory=list)  # native protocol events
    close_code: int | None = None
    close_reason: str | None = None
    record: dict | None = None  # the server's call record (GET /calls/{id})
    started: float = 0.0
    send_lag_ms: list[float] = field(default_factory=list)  # per 20 ms frame: actual send time - real-time schedule


# -- the call --------------------------------------------------------------------------------------------------


class _Caller:
    def __init__(self, ws, wire: Wire, result: CallResult) -> None:
        self.ws = ws
        self.wire = wire
        self.result = result
        self.rate = wire.rate
        self.frame = int(wire.rate * FRAME_S)
        self._speech: list[tuple[np.ndarray, Utterance, ClientTurn, int]] = []  # pending audio to speak
        self.play_end = 0.0  # client clock when the agent audio received so far finishes playing
        self.last_audio_rx = 0.0
        self._pending_marks: list[tuple[float, str]] = []
        self._recorded: list[np.ndarray] = []
        self._recorded_len = 0  # samples at RECORD_RATE
        self._play_started_rec = 0  # where (in recorded samples) the current playout began
        self.current: ClientTurn | None = None  # the turn whose reply is expected
        self.speaking: ClientTurn | None = None
        self.closed = asyncio.Event()
        self._send_lock = asyncio.Lock()

    async def send(self, frames: list) -> None:
        async with self._send_lock:
            for frame in frames:
                await self.ws.send(frame)

    # sender: 20 ms frames at real time, speech when queued, silence otherwise
    async def sender(self) -> None:
        t0 = time.monotonic()
        n = 0
        silence = np.zeros(self.frame, np.int16)
        pos = 0
        while not self.closed.is_set():
            chunk = silence
            if self._speech:
                audio, utt, turn, offset = self._speech[0]
                chunk = audio[pos: pos + self.frame]
                now = time.monotonic()
                if turn.audio_start is None:
                    turn.audio_start = now
                if turn.speech_start is None and pos + self.frame > utt.voiced_start + offset:
                    turn.speech_start = now
                    self.speaking = turn
                if turn.speech_end is None and pos + self.frame >= utt.voiced_end + offset:
                    turn.speech_end = now + FRAME_S
                pos += self.frame
                if pos >= len(audio):
                    self._speech.pop(0)
                    pos = 0
                    self.speaking = None
                if len(chunk) < self.frame:
                    chunk = np.concatenate([chunk, silence[: self.frame - len(chunk)]])
            try:
                await self.send(self.wire.audio(chunk))
            except Exception:
                self.closed.set()
                return
            self.result.send_lag_ms.append((time.monotonic() - t0 - n * FRAME_S) * 1000)
            self._ack_due_marks()
            n += 1
            delay = t0 + n * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    def speak(self, utt: Utterance, turn: ClientTurn) -> None:
        audio = utt.audio if utt.rate == self.rate else resample(utt.audio, utt.rate, self.rate)
        scale = self.rate / utt.rate
        scaled = Utterance(audio, self.rate, int(utt.voiced_start * scale), int(utt.voiced_end * scale))
        self._speech.append((audio, scaled, turn, 0))

    def _ack_due_marks(self) -> None:
        now = time.monotonic()
        due = [m for m in self._pending_marks if m[0] <= now]
        if due:
            self._pending_marks = [m for m in self._pending_marks if m[0] > now]
            for _, name in due:
                self.result.marks_acked += 1
                asyncio.ensure_future(self._safe_send(self.wire.mark_ack(name)))

    async def _safe_send(self, frames: list) -> None:
        try:
            await self.send(frames)
        except Exception:
            self.closed.set()

    # receiver
    async def receiver(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for frame in self.ws:
                for kind, value in self.wire.parse(frame):
                    await self._on(kind, value)
        except (ConnectionClosed, ConnectionError):
            pass
        finally:
            rcvd = getattr(self.ws, "close_code", None)
            self.result.close_code = rcvd
            self.result.close_reason = getattr(self.ws, "close_reason", None)
            self.closed.set()

    async def _on(self, kind: str, value: Any) -> None:
        now = time.monotonic()
        if kind == "audio":
            seconds = len(value) / self.rate
            if self.play_end <= now:
                self._play_started_rec = self._recorded_len
            self.play_end = max(self.play_end, now) + seconds
            self.last_audio_rx = now
            self.result.audio_chunks.append((now, seconds))
            rec = resample(value, self.rate, RECORD_RATE) if self.rate != RECORD_RATE else value
            self._recorded.append(rec)
            self._recorded_len += len(rec)
            turn = self.current
            if turn is None:
                self.result.greeting_audio_s += seconds
            else:
                if turn.first_audio is None:
                    turn.first_audio = now
                turn.last_audio = now
                turn.audio_s += seconds
        elif kind == "mark":
            self._pending_marks.append((self.play_end, value))
            self._ack_due_marks()
        elif kind == "clear":
            self.result.clears.append(now)
            if self.speaking is not None and self.speaking.clear_at is None:
                self.speaking.clear_at = now
            unplayed = max(0.0, self.play_end - now)
            self._drop_recorded(int(unplayed * RECORD_RATE))
            self.play_end = now
            pending, self._pending_marks = self._pending_marks, []
            frames = [f for _, name in pending for f in self.wire.mark_ack(name)] + self.wire.clear_ack()
            self.result.marks_acked += len(pending)
            if frames:
                await self._safe_send(frames)
        elif kind == "event":
            self.result.events.append(value)

    def _drop_recorded(self, samples: int) -> None:
        while samples > 0 and self._recorded:
            last = self._recorded[-1]
            if len(last) <= samples:
                self._recorded.pop()
                self._recorded_len -= len(last)
                samples -= len(last)
            else:
                self._recorded[-1] = last[: len(last) - samples]
                self._recorded_len -= samples
                samples = 0

    def agent_quiet(self, quiet_s: float) -> bool:
        now = time.monotonic()
        return self.play_end <= now and now - max(self.last_audio_rx, self.play_end) >= quiet_s

    def recording(self) -> np.ndarray:
        return np.concatenate(self._recorded) if self._recorded else np.zeros(0, np.int16)


def http_base(url: str) -> str:
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


async def run_call(
    url: str,
    transport: str,
    utterances: list[Utterance],
    *,
    params: dict[str, Any] | None = None,
    token: str | None = None,
    call_id: str | None = None,
    greeting_wait_s: float = 20.0,
    reply_timeout_s: float = 60.0,
    quiet_s: float = 0.8,
    barge_in_after_ms: float | None = None,
    record_path: Path | None = None,
    fetch_record: bool = True,
    record_url: str | None = None,
    sync_with_server: bool = True,
) -> CallResult:
    """One call over `transport` at `url` (e.g. ws://127.0.0.1:8000/ws/twilio); see the module docstring."""

    async def converse(caller: _Caller, server: _ServerState | None) -> None:
        await _converse(caller, utterances, greeting_wait_s, reply_timeout_s, quiet_s, barge_in_after_ms, server)

    return await _call(url, transport, converse, params=params, token=token, call_id=call_id,
                       record_path=record_path, fetch_record=fetch_record, record_url=record_url,
                       sync_with_server=sync_with_server)


async def play_call(
    url: str,
    transport: str,
    audio: np.ndarray,
    rate: int,
    *,
    params: dict[str, Any] | None = None,
    token: str | None = None,
    call_id: str | None = None,
    record_url: str | None = None,
    settle_s: float = 1.5,
    quiet_s: float = 0.8,
    reply_timeout_s: float = 60.0,
    fetch_record: bool = True,
) -> CallResult:
    """Continuous mode (replay): play the whole caller channel `audio` once, at real-time pace from the moment
    the call connects, silences and talking over the agent included, whatever the agent does. Then keep the line
    open (silence) until the last reply has played out. The result has one `ClientTurn` for the whole channel
    (`audio_start` is when its first sample went out); the server's record says where the turns were."""

    async def converse(caller: _Caller, server: _ServerState | None) -> None:
        whole = ClientTurn(1)
        caller.result.turns.append(whole)
        caller.speak(utterance(audio, rate), whole)
        while caller._speech and not caller.closed.is_set():
            await asyncio.sleep(0.02)
        await asyncio.sleep(settle_s)  # let a trailing end of turn be decided
        deadline = time.monotonic() + reply_timeout_s
        while not caller.closed.is_set() and time.monotonic() < deadline:
            listening = server is None or await server.state() in ("listening", "ended", None)
            if listening and caller.agent_quiet(quiet_s):
                return
            await asyncio.sleep(0.05)

    return await _call(url, transport, converse, params=params, token=token, call_id=call_id,
                       record_url=record_url, fetch_record=fetch_record, sync_with_server=fetch_record)


async def _call(url: str, transport: str, converse, *, params: dict[str, Any] | None, token: str | None,
                call_id: str | None, record_path: Path | None = None, fetch_record: bool = True,
                record_url: str | None = None, sync_with_server: bool = True) -> CallResult:
    """Connect as the provider would, run `converse(caller, server_state)`, hang up, collect the results."""
    from websockets.asyncio.client import connect

    call_id = call_id or (str(uuid.uuid4()) if transport == "audiosocket" else f"CA{uuid.uuid4().hex}")
    wire = make_wire(transport, call_id, dict(params or {}), token)
    call_id = wire.call_id
    headers = dict(wire.headers())
    if token and transport != "telnyx":
        headers["authorization"] = f"Bearer {token}"
    result = CallResult(transport, call_id, started=time.monotonic())
    if transport == "audiosocket":
        link = _TCPConnection(url)
    elif transport == "webrtc":
        from voicepipe.transports.webrtc.client_link import PeerClient

        link = PeerClient(url, call_id, wire.params, token)
    else:
        link = connect(url, additional_headers=headers, max_size=8 << 20, open_timeout=30)
    async with link as ws:
        caller = _Caller(ws, wire, result)
        await caller.send(wire.start())
        tasks = [asyncio.create_task(caller.receiver()), asyncio.create_task(caller.sender())]
        server = None
        if sync_with_server and (transport != "audiosocket" or record_url):
            server = _ServerState(http_base(record_url or url), call_id, token)
        try:
            await converse(caller, server)
            if not caller.closed.is_set():
                await caller.send(wire.stop())
        finally:
            if server is not None:
                await server.close()
            caller.closed.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        result.agent_audio = caller.recording()
    if result.close_code is None:
        result.close_code = ws.close_code
        result.close_reason = ws.close_reason
    if record_path is not None:
        write_wav(record_path, result.agent_audio, RECORD_RATE)
    if fetch_record and (transport != "audiosocket" or record_url):
        result.record = await fetch_call_record(record_url or url, call_id, token)
        _merge_record(result)
    _merge_native(result)
    return result


def http_client(base: str, headers: dict[str, str]):
    """An httpx client for the server's HTTP API. Over plain http no certificates are loaded: loading them takes
    0.1-0.4 s of CPU on the event loop, which would delay the caller audio of every other call in flight."""
    import httpx

    return httpx.AsyncClient(base_url=base, headers=headers, timeout=5, verify=base.startswith("https:"))


class _ServerState:
    """Asks the server (`GET /calls/{id}`) whether the agent is listening: a test caller's way to take turns
    exactly, where a human would wait for a pause (a slow clause can leave a gap in the agent's speech)."""

    def __init__(self, base: str, call_id: str, token: str | None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.client = http_client(base, headers)
        self.call_id = call_id

    async def state(self) -> str | None:
        import httpx

        try:
            resp = await self.client.get(f"/calls/{self.call_id}")
        except httpx.TransportError:
            return None
        return resp.json().get("state") if resp.status_code == 200 else None

    async def wait_listening(self, timeout: float, caller: _Caller) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not caller.closed.is_set():
            if await self.state() in ("listening", "ended"):
                return
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        await self.client.aclose()


async def _converse(caller: _Caller, utterances: list[Utterance], greeting_wait_s: float, reply_timeout_s: float,
                    quiet_s: float, barge_in_after_ms: float | None, server: _ServerState | None = None) -> None:
    # The greeting (if any): wait for it to start and play out, or for a quiet spell without one.
    deadline = time.monotonic() + greeting_wait_s
    t0 = time.monotonic()
    while time.monotonic() < deadline and not caller.closed.is_set():
        started = caller.last_audio_rx > 0
        if started and caller.agent_quiet(quiet_s):
            break
        if not started and time.monotonic() - t0 > min(greeting_wait_s, 3.0) and server is None:
            break
        if not started and server is not None and time.monotonic() - t0 > 1.0 \
                and await server.state() == "listening":
            break  # no greeting
        await asyncio.sleep(0.02)
    if server is not None:
        await server.wait_listening(greeting_wait_s, caller)
    for i, utt in enumerate(utterances):
        if caller.closed.is_set():
            return
        turn = ClientTurn(i + 1)
        caller.result.turns.append(turn)
        caller.speak(utt, turn)
        # Agent audio that arrives from now on belongs to this turn (once the caller has stopped speaking).
        while turn.speech_end is None and not caller.closed.is_set():
            await asyncio.sleep(0.01)
        caller.current = turn
        deadline = time.monotonic() + reply_timeout_s
        while turn.first_audio is None and time.monotonic() < deadline and not caller.closed.is_set():
            await asyncio.sleep(0.01)
        if turn.first_audio is None:
            log.warning("turn %d: no agent audio within %.0f s", turn.index, reply_timeout_s)
            continue
        if barge_in_after_ms is not None and i + 1 < len(utterances):
            await asyncio.sleep(max(0.0, turn.first_audio + barge_in_after_ms / 1000 - time.monotonic()))
            continue
        while not caller.agent_quiet(quiet_s) and time.monotonic() < deadline and not caller.closed.is_set():
            await asyncio.sleep(0.02)
        if server is not None and i + 1 < len(utterances):
            await server.wait_listening(max(1.0, deadline - time.monotonic()), caller)


async def fetch_call_record(url: str, call_id: str, token: str | None = None, wait_s: float = 30.0) -> dict | None:
    """The server's record of the call (transcripts, timings, LLM cache figures), once it has ended."""
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + wait_s
    record = None
    async with http_client(http_base(url), headers) as client:
        while time.monotonic() < deadline:
            try:
                resp = await client.get(f"/calls/{call_id}")
            except httpx.TransportError:
                resp = None
            if resp is not None and resp.status_code == 200:
                record = resp.json()
                if record.get("ended") is not None:
                    return record
            await asyncio.sleep(0.2)
    return record


def _merge_record(result: CallResult) -> None:
    if not result.record:
        return
    by_turn = {t["turn"]: t for t in result.record.get("turns", [])}
    for turn in result.turns:
        server = by_turn.get(turn.index)
        if server is not None:
            turn.user_text = server.get("user_text")
            turn.agent_text = server.get("heard_text") if server.get("interrupted") else server.get("agent_text")
            turn.server_timings_ms = server.get("timings_ms", {})


def _merge_native(result: CallResult) -> None:
    for ev in result.events:
        index = ev.get("turn")
        if not isinstance(index, int) or not 1 <= index <= len(result.turns):
            continue
        turn = result.turns[index - 1]
        if ev.get("type") == "transcript" and ev.get("final") and turn.user_text is None:
            turn.user_text = ev.get("text")
        elif ev.get("type") == "agent_text" and ev.get("final") and turn.agent_text is None:
            turn.agent_text = ev.get("text")
        elif ev.get("type") == "turn" and not turn.server_timings_ms:
            turn.server_timings_ms = ev.get("timings_ms", {})


def format_report(result: CallResult) -> str:
    lines = [f"call {result.call_id} over {result.transport}: {len(result.turns)} turns, "
             f"greeting {result.greeting_audio_s:.1f} s of audio, {len(result.clears)} clears, "
             f"{result.marks_acked} marks acknowledged, closed with {result.close_code}"]
    for t in result.turns:
        v2v = f"{t.voice_to_voice_ms:.0f} ms" if t.voice_to_voice_ms is not None else "-"
        lines.append(f"turn {t.index}: caller (as heard by the server): {t.user_text!r}")
        lines.append(f"        agent: {t.agent_text!r}")
        lines.append(f"        voice-to-voice at the client {v2v}, agent audio {t.audio_s:.1f} s"
                     + (f", clear {1000 * (t.clear_at - t.speech_start):.0f} ms after speech start"
                        if t.clear_at and t.speech_start else "")
                     + (f", server {t.server_timings_ms}" if t.server_timings_ms else ""))
    return "\n".join(lines)


def endpoint_url(url: str, transport: str) -> str:
    """`url` as given when it has a path; otherwise the transport's endpoint on that server."""
    parts = urlsplit(url)
    if parts.path not in ("", "/") or transport == "audiosocket":
        return url
    path = {"native": "/ws", "webrtc": "/webrtc/offer"}.get(transport, f"/ws/{transport}")
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


async def call_wav(url: str, transport: str, wav: Path, **options: Any) -> CallResult:
    """`voicepipe call`: speak the utterances of `wav` (separated by silence) over `transport`."""
    audio, rate = read_wav(wav)
    utterances = split_utterances(audio, rate)
    if not utterances:
        raise ValueError(f"{wav}: no speech found")
    return await run_call(endpoint_url(url, transport), transport, utterances, **options)


def result_summary(result: CallResult) -> dict[str, Any]:
    """The call as plain data (for --json)."""
    return {
        "call_id": result.call_id, "transport": result.transport, "close_code": result.close_code,
        "greeting_audio_s": round(result.greeting_audio_s, 3), "clears": len(result.clears),
        "marks_acked": result.marks_acked,
        "turns": [{"turn": t.index, "user_text": t.user_text, "agent_text": t.agent_text,
                   "voice_to_voice_ms": None if t.voice_to_voice_ms is None else round(t.voice_to_voice_ms, 1),
                   "agent_audio_s": round(t.audio_s, 3), "server_timings_ms": t.server_timings_ms,
                   "clear_after_speech_start_ms": None if not (t.clear_at and t.speech_start)
                   else round((t.clear_at - t.speech_start) * 1000, 1)} for t in result.turns],
    }
