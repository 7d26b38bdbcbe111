"""Echo cancelling in a call: the connection keeps what it played on the call's input timeline (sent audio placed
where it plays, moved by marks, dropped by a clear), and the call cleans its caller's audio before the VAD hears it
when the call cancels echo, and hands it over untouched when it does not.

The models are the scripted stand-ins of tests/pipeline_fakes.py; the echo is `echo.simulate`'s synthetic path.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.pipeline_fakes import FakeDetector, RecordingObserver, fake_call_resources
from voicepipe.audio import StreamResampler
from voicepipe.audio.l16 import float32_to_int16
from voicepipe.config import TRANSPORTS, Settings
from voicepipe.echo.path import EchoPath
from voicepipe.echo.playout import PlayedAudio
from voicepipe.echo.reference import FarEndReference
from voicepipe.echo.simulate import echo_of, microphone, spoken
from voicepipe.observability.records import ECHO_METADATA
from voicepipe.pipeline import CallRegistry, CallSession
from voicepipe.pipeline.call_echo import CallEcho, open_call_echo, wants_echo_cancelling
from voicepipe.transports.connection import Connection
from voicepipe.transports.serializers import make_caller_serializer, make_serializer

RATE = 16000  # the call's input timeline, where the canceller runs
FRAME = 320  # one caller frame of 20 ms, at RATE
SLACK = 64  # samples a resampler holds back (32 at 8 to 16 kHz), with room to spare


def echo_settings(**enabled: bool) -> Settings:
    settings = Settings()
    settings.calls.greeting = None
    settings.echo.enabled = {**settings.echo.enabled, **enabled}
    return settings


class RecordingDetector(FakeDetector):
    """The VAD's stand-in, keeping every sample it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list[np.ndarray] = []

    def push(self, audio: np.ndarray):
        self.heard.append(audio)
        return super().push(audio)


@pytest.fixture(autouse=True)
def scripted_vad(monkeypatch):
    monkeypatch.setattr(CallSession, "_make_detector", lambda self: RecordingDetector())


class Phone:
    """A Twilio media stream's far end over a fake socket: it sends what the test says, and keeps what it gets."""

    def __init__(self) -> None:
        self.wire = make_caller_serializer("twilio")
        self.inbound: asyncio.Queue[dict] = asyncio.Queue()
        self.marks: list[str] = []
        self._mic = StreamResampler(8000, RATE)  # what the call makes of the microphone's audio
        self.talked = 0  # its samples at RATE, the input position the call reaches once it has taken them

    async def receive(self) -> dict:
        return await self.inbound.get()

    async def send_text(self, text: str) -> None:
        self.marks += [value for kind, value in self.wire.parse(text) if kind == "mark"]

    async def close(self, code: int = 1000, reason: str = "") -> None:
        pass

    async def say(self, frames: list) -> None:
        for frame in frames:
            await self.inbound.put({"type": "websocket.receive", "text": frame})

    async def talk(self, frames: int) -> None:
        """`frames` 20 ms frames of silence from the caller's microphone."""
        for _ in range(frames):
            await self.say(self.wire.audio(np.zeros(160, np.int16)))
            self.talked += len(self._mic.process(np.zeros(160, np.int16)))


async def until(condition, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


class Clock:
    """The connection's clock, moved by the test: the caller's frames arrive 20 ms apart, at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def talk(phone: Phone, ref: FarEndReference, clock: Clock, frames: int) -> None:
    for _ in range(frames):
        clock.now += 0.02
        await phone.talk(1)
        await until(lambda: ref.received == phone.talked)


def sounding(ref: FarEndReference, start: int, count: int) -> bool:
    return bool(np.abs(ref.window(start, count)).max() > 0)


def test_the_connection_keeps_what_played_where_it_played_across_marks_and_a_clear() -> None:
    async def main():
        phone, registry = Phone(), CallRegistry()
        conn = Connection(phone, "twilio", make_serializer("twilio"), echo_settings(twilio=True),
                          fake_call_resources(), registry)
        conn.clock = clock = Clock()
        run = asyncio.create_task(conn.run())
        await phone.say(phone.wire.start())
        await until(lambda: registry.active)
        call = next(iter(registry.active.values()))
        ref = call._echo.path.reference
        assert ref is conn._played.reference and ref.rate == RATE

        await talk(phone, ref, clock, 5)
        t0 = ref.received
        tone = np.full(1600, 8000, np.int16)  # 200 ms at the wire's 8 kHz: sent at once (calls.max_lead_ms)
        conn.play(tone, (1, 0, len(tone)))
        await until(lambda: len(phone.marks) == 10)
        assert sounding(ref, t0 + SLACK, 10 * FRAME - 2 * SLACK) and not sounding(ref, 0, t0)  # plays from now
        assert not sounding(ref, t0 + 10 * FRAME, 10 * FRAME)

        await talk(phone, ref, clock, 10)  # the phone plays it 200 ms later than sent, and says so chunk by chunk
        for mark in phone.marks:
            await talk(phone, ref, clock, 1)
            await phone.say(phone.wire.mark_ack(mark))
        await until(lambda: not sounding(ref, t0, 5 * FRAME))
        # its ten marks in a row said so: the tone moved 11 frames on (the least they said)
        assert sounding(ref, t0 + 11 * FRAME, 10 * FRAME - 2 * SLACK)
        assert not sounding(ref, t0, 10 * FRAME) and not sounding(ref, t0 + 21 * FRAME, 10 * FRAME)

        await talk(phone, ref, clock, 10)  # the tone has played out by the connection's clock too
        t2 = ref.received
        conn.play(tone, (2, 0, len(tone)))
        await until(lambda: len(phone.marks) == 20)
        await talk(phone, ref, clock, 4)
        t3 = ref.received
        conn.clear()  # barge-in 80 ms into the reply: the rest never plays
        assert sounding(ref, t2 + SLACK, t3 - t2 - 2 * SLACK)
        assert not sounding(ref, t3, 20 * FRAME)

        await conn.cleanup()
        run.cancel()

    asyncio.run(main())


def test_audio_sent_where_the_far_end_cannot_clear_it_still_plays_and_marks_within_tolerance_move_nothing() -> None:
    ref = FarEndReference(RATE)
    played = PlayedAudio(ref, RATE, clears=False)  # AudioSocket: its peer plays what it was sent
    played.sent(np.full(FRAME, 1000, np.int16), now=0.0, lead_s=0.0, mark="m1")
    played.sent(np.full(FRAME, 1000, np.int16), now=0.0, lead_s=0.0, mark="m2")
    ref.received = 2 * FRAME + 1000  # the mark says its chunk ended 1000 samples (62 ms) later than placed
    played.played("m2", now=0.0)
    placed = ref.window(0, 8 * FRAME)
    assert np.abs(placed[:2 * FRAME]).min() > 0 and not placed[2 * FRAME:].any()
    ref.received = 2 * FRAME + 3000  # said twice, and now 3000 samples late: it moves nothing the second time
    played.played("m2", now=0.0)
    played.cleared(now=0.0)
    assert np.array_equal(ref.window(0, 8 * FRAME), placed)


def test_a_late_mark_alone_moves_nothing_and_a_run_of_them_moves_the_reply_from_its_first_chunk() -> None:
    ref = FarEndReference(RATE)
    played = PlayedAudio(ref, RATE)
    for n in range(20):  # 400 ms of reply, sent at once, placed from input position 0 on
        played.sent(np.full(FRAME, 1000, np.int16), now=0.0, lead_s=0.0, mark=f"m{n}")
    placed = ref.window(0, 30 * FRAME)

    ref.received = FRAME + 3000  # m0 says its chunk ended 3000 samples (190 ms) after it was placed to
    played.played("m0", now=0.0)
    ref.received = 2 * FRAME + 100  # and m1 comes about on time: the far end's loop was late with m0, no more
    played.played("m1", now=0.0)
    assert np.array_equal(ref.window(0, 30 * FRAME), placed)

    for n in range(2, 12):  # ten marks in a row 1900-2080 samples late: the far end plays the reply that much later
        ref.received = (n + 1) * FRAME + 2080 - 20 * (n - 2)
        played.played(f"m{n}", now=0.0)
    moved = ref.window(0, 30 * FRAME)
    assert np.array_equal(moved[:2 * FRAME], placed[:2 * FRAME])  # what the run did not speak of stays
    assert not moved[2 * FRAME:2 * FRAME + 1900].any()  # the run's first chunk on moved by the least it said
    assert np.array_equal(moved[2 * FRAME + 1900:20 * FRAME + 1900], placed[2 * FRAME:20 * FRAME])


def test_a_mark_that_comes_before_the_reference_has_its_chunk_end_moves_it_back_at_once() -> None:
    ref = FarEndReference(RATE)
    played = PlayedAudio(ref, RATE)
    ref.received = 1600
    for n in range(10):
        played.sent(np.full(FRAME, 1000, np.int16), now=0.0, lead_s=0.0, mark=f"m{n}")  # placed from 1600 on
    ref.received = 1600 + 5 * FRAME - 1700  # m4's chunk had played 1700 samples (106 ms) before it was placed to end
    played.played("m4", now=0.0)
    start = 1600 + 4 * FRAME - 1700  # m4's chunk and the rest play from here
    assert np.abs(ref.window(start, 6 * FRAME)).min() > 0 and not sounding(ref, start + 6 * FRAME, 2000)


def test_audio_is_placed_by_the_callers_pace_not_by_how_much_of_their_audio_came_late() -> None:
    ref = FarEndReference(RATE)
    played = PlayedAudio(ref, RATE)
    for n in range(1, 11):  # on time: frame n arrives at n * 20 ms
        ref.received += FRAME
        played.arrived(n * 0.02)
    for _ in range(2):  # by 300 ms only two more have come: the line is holding three
        ref.received += FRAME
        played.arrived(0.3)
    played.sent(np.full(FRAME, 1000, np.int16), now=0.3, lead_s=0.02)
    assert not sounding(ref, 0, 16 * FRAME) and sounding(ref, 16 * FRAME, FRAME)


def call_with(settings: Settings, params: dict, output) -> tuple[CallSession, RecordingDetector]:
    call = CallSession(fake_call_resources(), settings, output, input_rate=RATE, transport="twilio",
                       parameters=params)
    return call, call._make_detector()


class PlayedOutput:
    """An AgentOutput that keeps a reference the test fills."""

    sample_rate = 8000

    def __init__(self) -> None:
        self.reference: FarEndReference | None = None

    def far_end_reference(self, rate: int) -> FarEndReference:
        self.reference = FarEndReference(rate, capacity_s=30.0)
        return self.reference

    def play(self, audio, origin) -> None:
        pass

    def end_of_reply(self) -> None:
        pass

    def is_playing(self) -> bool:
        return False

    def heard(self) -> list:
        return []

    def clear(self) -> list:
        return []

    def hold(self, on: bool) -> None:
        pass

    def event(self, kind: str, **data) -> None:
        pass


@pytest.mark.parametrize("echo", ["true", "false"])
def test_the_callers_audio_reaches_the_vad_cleaned_of_the_echo_only_when_the_call_cancels_it(echo) -> None:
    far = spoken("The agent reads out a long answer about the opening hours of the library and its branches, "
                 "and then the list of books that are due back next week.", RATE)[: 8 * RATE]
    near = microphone(echo_of(far, RATE, delay_ms=150, level_db=-10), np.zeros_like(far))
    caller = (near * 32768).astype(np.int16)

    async def main():
        output = PlayedOutput()
        call, detector = call_with(echo_settings(twilio=True), {"echo": echo, ECHO_METADATA: "sent"}, output)
        call._make_detector = lambda: detector
        await call.start()
        if output.reference is not None:
            output.reference.append(far, at=0)
        for i in range(0, len(caller), FRAME):
            call.push_audio(caller[i:i + FRAME])
        await call.close()
        return call, np.concatenate(detector.heard)

    call, heard = asyncio.run(main())
    tail = slice(-3 * RATE, None)  # the canceller converges within the first seconds (docs/echo.md)
    erle = 10 * np.log10(np.mean(caller[tail].astype(float) ** 2) / np.mean(heard[tail].astype(float) ** 2))
    if echo == "false":
        assert np.array_equal(heard, caller) and ECHO_METADATA not in call.record.metadata
        return
    assert erle > 15, erle
    figures = call.record.metadata[ECHO_METADATA]
    assert abs(figures["delay_ms"] - 150) <= 2 and figures["erle_db"] > 10, figures
    assert 10 <= figures["erl_db"] <= 14, figures  # the echo's 10 dB, read up to 2 dB over (level_gate.py)
    assert abs(figures["clock_skew_ppm"]) < 50, figures  # one clock at both ends: nothing to follow (echo/skew.py)


def live_echo_call(far: np.ndarray, parts, params: dict) -> tuple[dict, list[tuple[dict, list[dict]]]]:
    """A Twilio call that cancels echo over the agent's audio `far`, fed the caller's `parts` (int16) in turn: its echo
    figures at the start, and after each part those `GET /calls/{id}` reads with the timeline's events so far."""
    async def main():
        output = PlayedOutput()
        call, detector = call_with(echo_settings(twilio=True), params, output)
        call.observers.add(events := RecordingObserver())
        at_start = dict(call.record.metadata[ECHO_METADATA])
        calls = CallRegistry()  # what GET /calls/{id} reads
        calls.add(call)
        call._make_detector = lambda: detector
        await call.start()
        output.reference.append(far, at=0)
        live = []
        for part in parts:
            for i in range(0, len(part), FRAME):
                call.push_audio(part[i:i + FRAME])
            live.append((dict(calls.get(call.call_id).metadata[ECHO_METADATA]), list(events.events)))
        await call.close()
        return at_start, live

    return asyncio.run(main())


def test_a_live_calls_record_holds_its_echo_figures_as_they_stand_and_never_the_callers_value() -> None:
    far = spoken("The agent reads out a long answer about the opening hours of the library and its branches, "
                 "and then the list of books that are due back next week.", RATE)[: 8 * RATE]
    caller = float32_to_int16(microphone(echo_of(far, RATE, delay_ms=150, level_db=-10), np.zeros_like(far)))
    half = len(caller) // 2 // FRAME * FRAME

    at_start, live = live_echo_call(far, (caller[:half], caller[half:]), {ECHO_METADATA: {"gated_words": 10**9}})
    (first, _), (second, events) = live
    delays = [e["delay_ms"] for e in events if e["type"] == "echo_delay"]
    assert at_start["gated_words"] == 0 and at_start["delay_ms"] is None  # the call's own figures, from the start
    assert delays and abs(delays[0] - 150) <= 2 and len(delays) <= 3, delays  # in the timeline: found, then steady
    assert abs(first["delay_ms"] - 150) <= 2, first  # read while the call is live, not only once it ends
    assert 0 < first["gated_audio_s"] < second["gated_audio_s"], (first, second)
    assert first["audio_s"] == pytest.approx(half / RATE, abs=0.05) and second["audio_s"] > first["audio_s"]


def test_each_opening_of_the_level_gate_is_in_the_calls_timeline_and_its_figures() -> None:
    """The gate opens for a caller who talks over the agent, and for echo it lets through: `bench echo` counts the
    openings while the caller is silent as the gate's leaks. (This echo alone, -10 dB, opens it once, 4.74 s in:
    a syllable the canceller took 18 dB out of where it took 34 before, over the settled bar 3 blocks running.)"""
    far = spoken("The agent reads out a long answer about the opening hours of the library and its branches, "
                 "and then the list of books that are due back next week.", RATE)[: 8 * RATE]
    near = np.zeros_like(far)
    start = 5 * RATE
    voice = 0.5 * spoken("Actually I wanted to ask about Sunday.", RATE, voice="en-us+f3")[: len(far) - start]
    near[start:start + len(voice)] = voice
    mic = float32_to_int16(microphone(echo_of(far, RATE, delay_ms=150, level_db=-10), near))

    _, ((_, alone), (figures, events)) = live_echo_call(far, (mic[:start], mic[start:]), {})
    echo_alone, with_caller = (sum(e["type"] == "echo_gate_open" for e in part) for part in (alone, events))
    assert with_caller > echo_alone, (echo_alone, with_caller)  # the caller opened it
    assert figures["gate_openings"] == with_caller  # each opening, in the timeline as in the figures


def test_the_text_gate_counts_what_it_took_out_of_the_callers_words_and_keeps_each_for_the_record() -> None:
    echo = CallEcho(EchoPath(FarEndReference(RATE)), max_delay_ms=500)
    said = "Your books are due back on the fourteenth of next month."
    for i, word in enumerate(said.split()):
        echo.agent_said(1.0 + 0.25 * i, word, 0.25)  # word by word, as they go out
    assert echo.judge("your books are due back", 1.2, 2.5, turn=2) == ""
    assert echo.judge("yes on the fourteenth of next month I know", 2.5, 4.5, turn=2) == "yes i know"
    assert echo.judge("can I renew them", 5.0, 6.0, turn=3) == "can I renew them"  # the caller's own: not counted
    figures = echo.figures()
    assert (figures["gated_segments"], figures["gated_words"]) == (1, 5 + 6)
    assert figures["gated_speech"] == [
        {"t": 1.2, "turn": 2, "text": "your books are due back", "kept": ""},
        {"t": 2.5, "turn": 2, "text": "yes on the fourteenth of next month I know", "kept": "yes i know"}]


@pytest.mark.parametrize(("transport", "found"), [("webrtc", True), ("sip", True), ("twilio", False)])
def test_over_an_rtp_link_an_echo_behind_the_far_ends_jitter_buffer_is_searched_for_and_found(transport, found) -> None:
    """150 ms of echo path behind 500 ms of a far end's buffering: 650 ms after the server sent the audio, beyond
    `echo.max_delay_ms` (500). An RTP link's far end plays through a jitter buffer the server does not see; a
    phone line's media stream reports when its audio played."""
    output = PlayedOutput()
    echo = open_call_echo(echo_settings(**{transport: True}), transport, {}, output, RATE, "c")
    agent = 0.5 * spoken("Thank you for calling, how can I help you today? I can book a table for you.", RATE)
    output.reference.append(agent, at=0)
    mic = microphone(echo_of(agent, RATE, 650, -10), np.zeros(len(agent), np.float32))
    for start in range(0, len(mic) - FRAME, FRAME):
        echo.process(float32_to_int16(mic[start:start + FRAME]))
    delay = echo.path.delay.delay
    if found:
        assert delay is not None and abs(delay * 1000 / RATE - 650) <= 2, delay
    else:
        assert delay is None


def test_without_an_echo_found_the_callers_audio_passes_at_once_whatever_its_chunks() -> None:
    path = EchoPath(FarEndReference(RATE))  # the agent has played nothing
    rng = np.random.default_rng(1)
    for size in (100, 333, 320, 7, 1000):
        chunk = (3000 * rng.standard_normal(size)).astype(np.int16)
        assert np.array_equal(path.process(chunk), chunk)
    assert path.reference.received == 1760 and path.delay.delay is None


@pytest.mark.parametrize(("transport", "params", "allow", "expected"), [
    ("twilio", {}, True, True),
    ("webrtc", {}, True, False),
    ("webrtc", {"echo": True}, True, True),
    ("twilio", {"echo": " Off "}, True, False),
    ("twilio", {"echo": ["no"]}, True, True),  # not a yes or a no: the transport's default
    ("twilio", {"echo": "false"}, False, True),  # overrides not allowed
])
def test_a_calls_echo_parameter_overrides_its_transports_default(transport, params, allow, expected) -> None:
    settings = echo_settings(twilio=True, webrtc=False)
    settings.calls.allow_overrides = allow
    assert wants_echo_cancelling(settings, transport, params) is expected


def test_by_default_phone_lines_cancel_echo_and_browsers_and_the_native_protocol_do_not() -> None:
    settings = Settings()
    on = [name for name in TRANSPORTS if wants_echo_cancelling(settings, name, {})]
    assert on == ["twilio", "telnyx", "vonage", "plivo", "exotel", "audiosocket"]
