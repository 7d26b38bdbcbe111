"""CallSession's state machine with scripted stand-ins for the models (the real ones run in tests/e2e).

The VAD events, the final transcripts, the LLM's reply pieces and the transport's playout cursor are scripted,
so each rule is checked exactly: the cycle listening -> thinking -> speaking -> listening, the greeting, barge-in
(clear, cancel, rollback to the tokens whose words were heard), short noises, interrupting the thinking,
overrides from the start message, a failing turn, and the release of everything at the end of the call.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.pipeline_fakes import PER_CHAR, FakeDetector, FakeEngine, FakeSpeech, FakeSTTStream, RecordingObserver
from voicepipe.config import Settings
from voicepipe.echo.path import EchoPath
from voicepipe.echo.reference import FarEndReference
from voicepipe.observability.hooks import Observers
from voicepipe.observability.timeline import CHAIN, EVENTS
from voicepipe.pipeline import CallResources, CallSession, CallState
from voicepipe.pipeline.call_echo import CallEcho
from voicepipe.transports.playback import Heard
from voicepipe.vad import VADEvent

RATE = 16000
OUT_RATE = 8000


class FakeOutput:
    sample_rate = OUT_RATE

    def __init__(self) -> None:
        self.plays: list[tuple[tuple, int]] = []
        self.played = 0  # samples of the current generation the caller has heard
        self.playing = True
        self.clears = 0
        self.held = False
        self.holds: list[bool] = []
        self.events: list[tuple[str, dict]] = []
        self.ended_replies = 0
        self.call = None

    def play(self, audio, origin) -> None:
        self.plays.append((origin, len(audio)))
        if self.call is not None:  # a transport reports what it sends (here: all of it, at once)
            self.call.agent_audio_sent(origin[0], audio, self.sample_rate)

    def end_of_reply(self) -> None:
        self.ended_replies += 1

    def is_playing(self) -> bool:
        return self.playing

    def heard(self):
        out, start = [], 0
        for origin, n in self.plays:
            out.append(Heard(origin, max(0, min(self.played - start, n)), n))
            start += n
        return out

    def clear(self):
        heard = self.heard()
        self.clears += 1
        self.plays, self.played = [], 0
        return heard

    def hold(self, on: bool) -> None:
        self.held = on
        self.holds.append(on)

    def event(self, kind: str, **data) -> None:
        self.events.append((kind, data))


class Harness:
    def __init__(self, greeting: str | None = None, params: dict | None = None, texts: list[str] | None = None,
                 backchannels: bool = False, **calls):
        settings = Settings()
        settings.calls.greeting = greeting
        settings.calls.barge_in_min_speech_ms = 150
        settings.calls.backchannels = backchannels  # off: any speech of 150 ms over the agent interrupts it
        # The harness pushes a turn's audio at once and then nothing, where a line streams it: the first audio's wait
        # for the caller's audio up to now would wait its whole bound each turn (the gate has tests of its own).
        settings.calls.caller_audio_wait_ms = 0
        # Likewise the caller speaks over a reply as soon as it plays, where a caller takes their reaction time: that
        # speech would reopen the turn (the reopen over the first audio has tests of its own).
        settings.calls.caller_reaction_ms = 0
        for key, value in calls.items():  # other calls.* settings
            setattr(settings.calls, key, value)
        self.engine = FakeEngine()
        self.stt = FakeSTTStream(texts or ["what time is it", "and tomorrow"])
        synth = SimpleNamespace(open_stream=lambda rate, turn: FakeSpeech(rate, turn))
        transcriber = SimpleNamespace(open_stream=lambda rate, on_partial=None: self.stt)
        self.output = FakeOutput()
        self.detector = FakeDetector()
        res = CallResources(self.engine, None, transcriber, synth)
        self.observer = RecordingObserver()
        self.call = CallSession(res, settings, self.output, input_rate=RATE, parameters=params,
                                observers=Observers([self.observer]))
        self.output.call = self.call
        self.call._make_detector = lambda: self.detector

    def push(self, ms: float, *events: VADEvent) -> None:
        self.detector.pending += list(events)
        self.call.push_audio(np.zeros(int(RATE * ms / 1000), np.int16))

    def ev(self, kind: str, at_ms: float | None = None) -> VADEvent:
        sample = self.detector.stream.samples_processed if at_ms is None else int(at_ms * RATE / 1000)
        return VADEvent(kind, sample, RATE)

    async def settle(self, until=lambda: True, timeout: float = 2.0) -> None:
        for _ in range(int(timeout / 0.005)):
            await asyncio.sleep(0.005)
            if until():
                return
        raise AssertionError("condition not reached")

    def speak(self, ms: float) -> None:
        """A caller turn of `ms` of speech, its end, and the end-of-turn decision (all at once)."""
        self.push(20, self.ev("speech_start"))
        self.push(ms)
        self.push(20, self.ev("speech_end"))
        self.push(20, self.ev("end_of_turn"))

    async def one_turn(self) -> None:
        """Speech, then its end of turn; waits until the agent speaks."""
        self.speak(400)
        assert self.call.state is CallState.THINKING
        await self.settle(lambda: self.call.state is CallState.SPEAKING)


def run(coro):
    return asyncio.run(coro)


def test_greeting_then_a_full_turn_cycle() -> None:
    async def main():
        h = Harness(greeting="Hi there.")
        await h.call.start()
        assert h.call.state is CallState.SPEAKING  # the greeting plays first
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)

        h.output.playing = True
        await h.one_turn()
        await h.settle(lambda: h.output.ended_replies == 2)
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        # The greeting goes into the LLM history with the first user message.
        assert h.engine.calls[0] == [{"role": "assistant", "content": "Hi there."},
                                     {"role": "user", "content": "what time is it"}]
        turn = h.call.record.turns[0]
        assert turn.user_text == "what time is it" and turn.agent_text == "Hello there my good friend."
        assert turn.cached_prompt_tokens == 30 and not turn.interrupted
        assert {"response", "voice_to_voice"} <= set(turn.timings_ms)
        kinds = [k for k, _ in h.output.events]
        assert "transcript" in kinds and "agent_text" in kinds and "turn" in kinds

        h.output.playing = True
        await h.one_turn()
        assert h.engine.calls[1] == [{"role": "user", "content": "and tomorrow"}]
        await h.call.close("stop")

    run(main())


def test_barge_in_clears_and_rolls_back_to_the_heard_words() -> None:
    async def main():
        h = Harness()
        await h.call.start()
        await h.one_turn()
        await h.settle(lambda: h.output.ended_replies == 1)
        # The caller has heard "Hello there" and half of "my" (marks or clock), then talks for 200 ms.
        h.output.played = len("Hello there m") * PER_CHAR
        h.push(20, h.ev("speech_start"))
        assert h.output.held  # the agent's audio stops at the speech start
        h.push(100)
        assert h.output.clears == 0  # not yet: 120 ms < 150 ms
        h.push(60)
        assert h.output.clears == 1
        assert h.output.holds == [True, False]  # released after the clear dropped it: the next reply plays
        assert h.call.state is CallState.LISTENING
        await h.settle(lambda: h.engine.rollbacks)
        assert h.engine.rollbacks == [2]  # the tokens of "Hello" and " there"
        turn = h.call.record.turns[0]
        assert turn.interrupted and turn.heard_text == "Hello there"
        assert h.call.record.barge_ins == 1
        # The observers get the interrupted turn once, with what was heard and when it was cut.
        await h.settle(lambda: len(h.observer.turns) == 1)
        assert h.observer.turns == [turn] and "playout_end" not in turn.timeline
        assert turn.timeline["interrupted"] >= turn.timeline["first_audio_sent"]
        assert any(e["type"] == "barge_in" and e["heard_text"] == "Hello there" for e in h.observer.events)
        h.push(200)
        assert h.output.clears == 1  # one barge-in per reply
        # The interrupting speech is the next turn.
        h.push(20, h.ev("speech_end"))
        h.push(20, h.ev("end_of_turn"))
        assert h.call.state is CallState.THINKING
        await h.settle(lambda: len(h.engine.calls) == 2)
        await h.call.close()

    run(main())


def test_a_short_noise_while_speaking_does_not_interrupt() -> None:
    async def main():
        h = Harness()
        await h.call.start()
        await h.one_turn()
        cancelled, transcripts = h.stt.cancelled_turns, len(h.stt.futures)
        h.speak(60)
        assert h.output.clears == 0 and h.call.state is CallState.SPEAKING
        assert h.output.holds == [True, False]  # held while the noise lasted, then the agent went on
        assert h.stt.cancelled_turns == cancelled + 1  # the noise's STT turn is dropped, not answered
        assert len(h.stt.futures) == transcripts
        await h.call.close()

    run(main())


def test_speech_while_thinking_reopens_the_turn() -> None:
    async def main():
        h = Harness()
        await h.call.start()
        h.stt.hold = True
        h.speak(300)
        assert h.call.state is CallState.THINKING
        ended = h.call.record.turns[0]
        h.push(20, h.ev("speech_start"))
        h.push(200)
        assert h.call.state is CallState.LISTENING
        await asyncio.sleep(0.05)
        assert h.engine.calls == [] and h.engine.rollbacks == []  # the LLM never started: nothing to undo
        assert h.call.record.turns == [] and h.call.record.barge_ins == 0  # no turn was answered or interrupted
        # The first words still count: they arrive late and open the message of the turn that goes on.
        h.stt.futures[0].set_result(SimpleNamespace(text="book a table"))
        h.stt.hold = False
        h.push(200)
        h.push(20, h.ev("speech_end"))
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: h.engine.calls)
        assert h.engine.calls[0] == [{"role": "user", "content": "book a table what time is it"}]
        (turn,) = h.call.record.turns
        assert turn.turn == 1 and turn.user_text == "book a table what time is it"
        assert len(turn.reopened) == 1 and turn.reopened[0]["t"] > 0
        assert turn.timeline["speech_start"] == ended.timeline["speech_start"]  # the turn began back then
        assert [e["type"] for e in h.observer.events if e["type"] == "turn_reopened"] == ["turn_reopened"]
        await h.call.close()

    run(main())


def test_a_turn_reopened_twice_after_its_llm_started_keeps_each_word_once() -> None:
    """Each time, the caller goes on while the LLM is thinking (it has started: `engine.slow` holds its words back):
    the words it heard open the turn that goes on, once, not again with what an earlier reopen left."""
    async def main():
        h = Harness(texts=["book a table", "for two", "at eight"])
        h.engine.slow = True
        await h.call.start()
        for calls in (1, 2):
            h.speak(300)
            await h.settle(lambda n=calls: len(h.engine.calls) == n)
            assert h.output.plays == []  # the caller has heard nothing of it
            h.push(20, h.ev("speech_start"))
            h.push(200)
            await h.settle(lambda: h.engine.dropped)
            h.engine.dropped.clear()
        h.engine.slow = False
        h.push(20, h.ev("speech_end"))
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: len(h.engine.calls) == 3)
        assert [c[-1]["content"] for c in h.engine.calls] == ["book a table", "book a table for two",
                                                              "book a table for two at eight"]
        await h.call.close()

    run(main())


async def stream_line(h: Harness, events: dict[int, str], chunks: int, stalls: dict[int, float]) -> None:
    """The caller's line: 20 ms chunks at their pace, chunk `i` bringing the VAD event `events[i]`; before chunk `i`
    in `stalls` the link stalls that many seconds, then delivers what it held at once (a late socket read, late
    packets)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(chunks):
        if i in stalls:
            await asyncio.sleep(stalls[i])
        h.push(20, *([h.ev(events[i])] if i in events else []))
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))


TURN = {0: "speech_start", 15: "speech_end", 16: "end_of_turn"}  # 300 ms of speech, its end and the decision


def test_a_replys_first_audio_waits_until_the_callers_audio_up_to_then_is_judged() -> None:
    """The turn ends, the caller's line stalls 300 ms, and the reply is ready mid-stall; the chunks the line then
    delivers hold the caller going on. The reply's audio waits for them, so the caller is heard first: the turn is
    reopened and the agent said nothing (no barge-in on words the caller never heard)."""
    async def main():
        h = Harness(caller_audio_wait_ms=1000)
        await h.call.start()
        h.stt.hold = True
        line = asyncio.create_task(stream_line(h, {**TURN, 17: "speech_start"}, 30, stalls={17: 0.3}))
        await h.settle(lambda: h.stt.futures)
        await asyncio.sleep(0.1)
        h.stt.futures[0].set_result(SimpleNamespace(text="what time is it"))  # mid-stall: the reply goes ahead
        await h.settle(lambda: h.engine.calls)
        await asyncio.sleep(0.05)
        assert h.output.plays == []  # the caller's audio since the turn's end has not come
        await line
        assert h.call.record.barge_ins == 0 and h.output.plays == []
        assert "turn_reopened" in h.observer.kinds()
        await h.call.close()

    run(main())


def test_a_reply_speaks_as_soon_as_the_line_has_brought_the_callers_audio_up_to_then() -> None:
    async def main():
        h = Harness(caller_audio_wait_ms=1000)
        await h.call.start()
        line = asyncio.create_task(stream_line(h, TURN, 40, stalls={}))
        await h.settle(lambda: h.engine.calls)
        await h.settle(lambda: h.output.plays, timeout=0.3)  # well before the bound: the line is on time
        await line
        await h.call.close()

    run(main())


async def go_on_after_first_audio(h: Harness, after_ms: float) -> None:
    """A caller turn at the line's pace; `after_ms` after the reply's first audio went out the caller speaks again
    (300 ms: longer than the barge-in's 150), and ends that speech."""
    loop = asyncio.get_running_loop()
    start, i, speech_at = loop.time(), 0, None
    while True:
        events = [h.ev(TURN[i])] if i in TURN else []
        if speech_at is None and h.output.plays:
            speech_at = i + round(after_ms / 20)
        if speech_at is not None and i == speech_at:
            events.append(h.ev("speech_start"))
        if speech_at is not None and i == speech_at + 15:
            events.append(h.ev("speech_end"))
        h.push(20, *events)
        i += 1
        await asyncio.sleep(max(0.0, start + i * 0.02 - loop.time()))
        if speech_at is not None and i > speech_at + 15:
            return


def test_a_caller_who_goes_on_as_the_reply_starts_reopens_the_turn() -> None:
    """The caller's speech begins 60 ms after the reply's first audio went out: too soon to answer it (the caller
    was going on with their turn, as a reply ready just as they resume finds them). The turn is reopened, not barged
    in on: no interruption counted, the reply's audio cleared, one turn with all the caller's words."""
    async def main():
        h = Harness(caller_reaction_ms=200)
        await h.call.start()
        await go_on_after_first_audio(h, after_ms=60)
        assert h.call.record.barge_ins == 0 and h.output.clears == 1
        assert "turn_reopened" in h.observer.kinds() and "barge_in" not in h.observer.kinds()
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: len(h.engine.calls) == 2)
        assert h.engine.calls[1][-1] == {"role": "user", "content": "what time is it and tomorrow"}
        (turn,) = h.call.record.turns
        assert len(turn.reopened) == 1 and not turn.interrupted
        await h.call.close()

    run(main())


def test_a_caller_who_speaks_after_hearing_the_reply_barges_in() -> None:
    async def main():
        h = Harness(caller_reaction_ms=200)
        await h.call.start()
        await go_on_after_first_audio(h, after_ms=400)
        assert h.call.record.barge_ins == 1 and "turn_reopened" not in h.observer.kinds()
        await h.settle(lambda: h.call.record.turns[0].interrupted)
        await h.call.close()

    run(main())


def test_a_turn_is_reopened_over_its_first_audio_once() -> None:
    """Reopened once over its first audio, the turn's next reply is barged in on even as soon: a line that sends the
    agent's first words back as speech cannot restart the reply over and over."""
    async def main():
        h = Harness(caller_reaction_ms=200)
        await h.call.start()
        await go_on_after_first_audio(h, after_ms=60)
        assert "turn_reopened" in h.observer.kinds()
        h.output.plays.clear()
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: h.output.plays)
        h.push(20, h.ev("speech_start"))
        h.push(200)
        assert h.call.record.barge_ins == 1
        await h.settle(lambda: h.call.record.turns[0].interrupted)
        await h.call.close()

    run(main())


def test_words_cut_off_while_thinking_are_answered_even_when_the_next_turn_hears_nothing() -> None:
    async def main():
        h = Harness(texts=[""])  # the second turn is a cough: its transcript is empty
        await h.call.start()
        h.stt.hold = True
        h.speak(300)
        h.push(20, h.ev("speech_start"))
        h.push(200)  # the caller talks on while the agent thinks: the thinking is cancelled
        assert h.call.state is CallState.LISTENING
        h.stt.hold = False
        h.push(20, h.ev("speech_end"))
        h.push(20, h.ev("end_of_turn"))
        await asyncio.sleep(0.05)
        assert h.engine.calls == []  # the first turn's words are not in yet
        h.stt.futures[0].set_result(SimpleNamespace(text="book a table"))  # they arrive late
        await h.settle(lambda: h.engine.calls)
        assert h.engine.calls[0] == [{"role": "user", "content": "book a table"}]
        await h.call.close()

    run(main())


def test_the_stt_hears_the_caller_from_well_before_the_vads_speech_start() -> None:
    """The VAD calls speech late after a soft first sound ("how", "can"): the STT's turn starts 300 ms before the
    start it reports, where 100 ms lost "How is the weather" of "How is the weather in London today?"."""
    async def main():
        h = Harness()
        await h.call.start()
        h.push(1000)
        h.push(20, h.ev("speech_start", at_ms=900))
        assert h.stt.samples_pushed == int(RATE * (1.02 - 0.6))  # from 600 ms: 300 ms before the start, and on
        await h.call.close()

    run(main())


def test_a_turn_the_stt_hears_no_words_in_leaves_no_turn() -> None:
    """A cough the VAD took for speech: no reply, no turn reported, and the next turn is turn 1."""
    async def main():
        h = Harness(texts=["", "what time is it"])
        await h.call.start()
        h.speak(300)
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        await asyncio.sleep(0.05)
        assert h.engine.calls == [] and h.call.record.turns == [] and h.observer.turns == []
        await h.one_turn()
        h.output.playing = False
        await h.settle(lambda: len(h.observer.turns) == 1)
        assert [(t.turn, t.user_text) for t in h.observer.turns] == [(1, "what time is it")]
        await h.call.close()

    run(main())


def test_barge_in_mid_generation_waits_for_the_engine_then_rolls_back() -> None:
    async def main():
        h = Harness()
        h.engine.slow = True  # the generation is still running when the caller talks
        await h.call.start()
        await h.one_turn()
        h.output.played = 0
        h.push(20, h.ev("speech_start"))
        h.push(200)
        await h.settle(lambda: h.engine.rollbacks)
        assert h.engine.rollbacks == [0] and not h.engine.session.busy
        assert h.call.record.turns[0].heard_text == ""
        await h.call.close()

    run(main())


def test_start_message_overrides_prompt_and_greeting() -> None:
    async def main():
        h = Harness(greeting="Default hello.", params={"system_prompt": "You sell boats.", "greeting": ""})
        await h.call.start()
        assert h.engine.session.system_prompt == "You sell boats."
        assert h.call.state is CallState.LISTENING and not h.output.plays  # no greeting
        await h.call.close()

    run(main())


def test_a_failing_turn_does_not_end_the_call() -> None:
    async def main():
        h = Harness()
        await h.call.start()
        h.engine.fail = True
        h.speak(300)
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        assert "engine is on fire" in h.call.record.turns[0].error
        assert not h.call.closed
        h.engine.fail = False
        await h.one_turn()
        await h.call.close()

    run(main())


@pytest.mark.parametrize("break_after", [0, 2])
def test_an_llm_that_fails_its_reply_gets_an_apology_and_the_call_goes_on(break_after: int) -> None:
    """Before its first word or in the middle of the reply: the caller hears calls.apology after whatever was said,
    the turn records the error, and the next turn is answered."""
    async def main():
        h = Harness()
        await h.call.start()
        h.engine.break_after = break_after
        h.speak(300)
        apology = h.call.cfg.apology
        await h.settle(lambda: h.output.ended_replies == 1)
        turn = h.call.record.turns[0]
        said = " ".join(h.engine.reply.split(" ")[:break_after])
        assert turn.agent_text == (f"{said} {apology}" if said else apology)
        assert turn.error == "LLMError: the backend went away."
        apology_samples = len(apology) * PER_CHAR  # FakeSpeech's samples per character
        assert sum(n for origin, n in h.output.plays if origin[0] == 1) >= apology_samples  # it was spoken
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        h.engine.break_after = None
        h.output.playing = True
        await h.one_turn()
        assert not h.call.closed and h.call.record.turns[1].error is None
        await h.call.close()

    run(main())


@pytest.mark.parametrize("during", ["listening", "an early reply", "speaking"])
def test_close_releases_everything(during: str) -> None:
    async def main():
        h = Harness()
        await h.call.start()
        if during == "speaking":
            await h.one_turn()
        if during == "an early reply":
            h.push(20, h.ev("speech_start"))
            h.push(400)
            h.push(20, h.ev("speech_end"))
            await h.settle(lambda: h.engine.calls)
        await h.call.close("stop")
        assert h.call.state is CallState.ENDED and h.call.closed
        assert h.engine.closed == [h.engine.session]
        assert h.stt.closed
        assert h.call.session is None and h.call.stt is None and h.call.detector is None
        assert h.call.record.end_reason == "stop" and h.call.record.ended is not None
        assert h.call.ended.is_set()
        await asyncio.sleep(0.02)
        assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await h.call.close()  # idempotent

    run(main())


def test_idle_timeout_ends_the_call_but_not_while_the_agent_talks() -> None:
    async def main():
        h = Harness(greeting="Hello.")
        h.call.cfg.idle_timeout_s = 0.2
        await h.call.start()
        await asyncio.sleep(0.4)
        assert not h.call.ended.is_set()  # the greeting is still playing
        h.output.playing = False
        await h.settle(lambda: h.call.ended.is_set(), timeout=2.0)
        assert h.call.end_reason == "idle_timeout"
        await h.call.close(h.call.end_reason)
        assert h.call.record.end_reason == "idle_timeout" and h.engine.closed

    run(main())


def pushed(push) -> tuple[float, float]:
    """When a push of caller audio arrived: within (before, after) it on the call's clock."""
    before = time.monotonic()
    push()
    return before, time.monotonic()


def test_a_turn_reports_a_monotonic_timeline_and_its_figures_to_the_observers() -> None:
    async def main():
        h = Harness()
        await h.call.start()
        # Caller audio at real-time pace: 20 ms chunks, 400 ms of speech, then the end of the turn.
        first = pushed(lambda: h.push(20, h.ev("speech_start")))
        for _ in range(21):
            await asyncio.sleep(0.02)
            last = pushed(lambda: h.push(20))
        h.push(20, h.ev("speech_end"))
        await asyncio.sleep(0.02)
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: len(h.observer.turns) == 1)
        turn = h.observer.turns[0]
        assert turn is h.call.record.turns[0] and not turn.interrupted
        timeline = turn.timeline
        missing = ("first_partial", "prefill_start")  # the fakes have no partials and no prefill time
        assert [e for e in EVENTS if e in timeline] == [e for e in EVENTS if e not in missing]
        times = [timeline[e] for e in CHAIN if e in timeline]
        assert times == sorted(times), timeline
        assert timeline["speech_end"] < timeline["end_of_turn"] <= timeline["first_audio_sent"]
        # Each VAD event is dated by its chunk's arrival, less the audio after it in the chunk, however long the
        # sleeps took: the start is the first chunk's first sample, 20 ms before that chunk arrived; the end is
        # where the last chunk of the loop ended, as it arrived (rounded to 0.1 ms).
        span = timeline["speech_end"] - timeline["speech_start"]
        assert last[0] - first[1] + 0.02 - 0.0002 <= span <= last[1] - first[0] + 0.02 + 0.0002
        for name in ("voice_to_voice", "response", "stt_final", "ttft", "tts_first_audio", "send_delay"):
            assert turn.timings_ms[name] >= 0, name
        assert turn.timings_ms["voice_to_voice"] >= turn.timings_ms["response"]
        kinds = h.observer.kinds()
        for kind in ("inbound", "vad", "stt_final", "llm_queued", "first_token", "agent_text", "agent_audio", "turn"):
            assert kind in kinds, kind
        assert {c for c, *_ in h.observer.chunks} == {"caller", "agent"}
        await h.call.close("stop")
        assert h.observer.started == [h.call.call_id]
        assert h.observer.ended == [(h.call.call_id, "completed")]
        assert len(h.observer.turns) == 1  # reported once

    run(main())


def test_a_call_closed_mid_turn_still_reports_the_turn() -> None:
    async def main():
        h = Harness()
        h.engine.slow = True
        await h.call.start()
        await h.one_turn()
        await h.call.close("disconnected")
        assert len(h.observer.turns) == 1 and h.observer.turns[0].user_text == "what time is it"
        turn = h.observer.turns[0]  # what the engine did is on the turn when the observers get it
        assert (turn.prompt_tokens, turn.cached_prompt_tokens) == (40, 30)
        assert h.observer.ended == [(h.call.call_id, "dropped")]

    run(main())


def test_a_failing_observer_never_breaks_the_call() -> None:
    class Broken:
        def __getattr__(self, name):
            def fail(*args):
                raise RuntimeError("observer bug")
            return fail

    async def main():
        h = Harness()
        h.call.observers.add(Broken())
        await h.call.start()
        await h.one_turn()
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: len(h.observer.turns) == 1)
        assert h.call.record.turns[0].agent_text == "Hello there my good friend."


@pytest.mark.parametrize(("seed", "expected"), [("41", [42, 43]), (7, [8, 9]), (None, [None, None]),
                                                ("soon", [None, None])])
def test_a_seed_parameter_seeds_every_turn_distinctly(seed, expected) -> None:
    async def main():
        h = Harness(params={} if seed is None else {"seed": seed})
        await h.call.start()
        for _ in range(2):
            h.output.playing = True
            await h.one_turn()
            await h.settle(lambda: h.output.ended_replies == len(h.engine.seeds))
            h.output.playing = False
            await h.settle(lambda: h.call.state is CallState.LISTENING)
        assert h.engine.seeds == expected
        await h.call.close("stop")

    run(main())


@pytest.mark.parametrize(("given", "overrides", "budget"), [
    (200, True, 200), ("12", True, 12), (None, True, 60), (0, True, 60), (5000, True, 60), ("lots", True, 60),
    (True, True, 60), (200, False, 60)])
def test_a_max_reply_tokens_parameter_sets_the_calls_reply_budget(given, overrides, budget) -> None:
    """A call's own `max_reply_tokens` (an int, or digits as providers send custom parameters) replaces
    `calls.max_reply_tokens` (60 here); one outside 1..4096, or not a number, or with `calls.allow_overrides` off,
    leaves the setting."""
    async def main():
        h = Harness(params={} if given is None else {"max_reply_tokens": given}, allow_overrides=overrides)
        await h.call.start()
        h.output.playing = True
        await h.one_turn()
        await h.settle(lambda: h.output.ended_replies == 1)
        assert [o["max_tokens"] for o in h.engine.tool_options] == [budget]
        await h.call.close("stop")

    run(main())


def test_the_timelines_speech_end_follows_a_final_sound_past_what_had_come_at_the_vads_report() -> None:
    """The VAD may score a soft final sound (a fricative) as silence and report the end with only ~75 ms of audio
    after it: the end then stops where that audio did. Once `SEARCH_MS` more has come, the timeline's speech end is
    taken again, to where the sound stops."""
    async def main():
        h = Harness()
        await h.call.start()
        tone = (3000 * np.sin(np.arange(4800) * 2 * np.pi * 200 / RATE)).astype(np.int16)  # 300 ms of sound

        def push(audio, *events):
            h.detector.pending += list(events)
            h.call.push_audio(audio)

        push(np.zeros(6400, np.int16))
        start = h.detector.stream.samples_processed
        push(tone[:2880], VADEvent("speech_start", start, RATE))
        push(tone[2880:3520], VADEvent("speech_end", start + 2880, RATE))  # 40 ms of the sound after the report
        await asyncio.sleep(0.08)
        push(tone[3520:])  # the sound goes on 80 ms more
        for _ in range(10):
            push(np.zeros(320, np.int16))
        push(np.zeros(320, np.int16), h.ev("end_of_turn"))
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: len(h.observer.turns) == 1)
        timeline = h.observer.turns[0].timeline
        assert timeline["speech_end"] == h.call._sample_time(start + 4800)
        assert timeline["speech_end"] > h.call._sample_time(start + 3520)  # where the report's audio stopped
        await h.call.close("stop")

    run(main())


def test_an_early_reply_starts_at_the_speech_end_and_is_heard_only_after_the_end_of_turn() -> None:
    async def main():
        h = Harness()
        await h.call.start()
        h.push(20, h.ev("speech_start"))
        h.push(400)
        h.push(20, h.ev("speech_end"))
        await h.settle(lambda: h.engine.calls and len(h.call._early.stream.frames) > 0)
        # The transcript, the LLM and the TTS ran; the caller hears and sees nothing yet, and may still go on.
        assert h.engine.calls == [[{"role": "user", "content": "what time is it"}]]
        assert h.stt.peeks == 1 and h.call.state is CallState.LISTENING and not h.call.record.turns
        await asyncio.sleep(0.05)
        assert not h.output.plays
        assert [k for k, _ in h.output.events if k in ("agent_text", "turn")] == []
        assert not any(k == "transcript" and d["final"] for k, d in h.output.events)

        h.push(20, h.ev("end_of_turn"))  # the decision releases the held reply
        await h.settle(lambda: h.output.plays)
        assert h.call.state is CallState.SPEAKING
        assert len(h.engine.calls) == 1 and h.engine.dropped == []
        kinds = [k for k, d in h.output.events if k != "transcript" or d["final"]]
        assert kinds[:2] == ["transcript", "agent_text"], kinds  # the held events, in their order
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        turn = h.call.record.turns[0]
        assert turn.user_text == "what time is it" and turn.agent_text == "Hello there my good friend."
        timeline = turn.timeline
        # The held audio goes out the moment the end of turn releases it: both may round to the same 0.1 ms.
        assert timeline["llm_queued"] < timeline["end_of_turn"] <= timeline["first_audio_sent"]
        # Figures after the end of turn count only what the caller waited for: nothing for the transcript, and the
        # response from the release (which may round to 0 ms) rather than from the early start.
        assert turn.timings_ms["stt_final"] == 0
        released_after_ms = (timeline["first_audio_sent"] - timeline["end_of_turn"]) * 1000
        assert turn.timings_ms["response"] == round(released_after_ms, 1)
        assert turn.timings_ms["response"] < (timeline["first_audio_sent"] - timeline["llm_queued"]) * 1000
        await h.call.close()

    run(main())


def test_an_early_reply_is_dropped_when_the_caller_goes_on() -> None:
    async def main():
        h = Harness(greeting="Hi.", texts=["I would like", "I would like a cake"])
        await h.call.start()
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        h.push(20, h.ev("speech_start"))
        h.push(300)
        h.push(20, h.ev("speech_end"))  # a pause: the early reply starts...
        await h.settle(lambda: h.engine.calls)
        assert h.engine.calls[0] == [{"role": "assistant", "content": "Hi."},
                                     {"role": "user", "content": "I would like"}]
        h.push(20, h.ev("speech_start"))  # ...and the caller goes on
        assert h.call._early is None
        await h.settle(lambda: h.engine.dropped)
        assert h.engine.dropped == [0] and h.engine.session.marks == []  # the turn left the LLM session
        assert h.stt.cancelled_turns == 0  # the STT turn goes on: its final covers both parts
        assert h.stt.resumes == 1  # and its partials, held since the peek, resume
        h.push(300)
        h.push(20, h.ev("speech_end"))
        h.output.playing = True
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: any(origin[0] == 1 for origin, _ in h.output.plays))
        # The greeting the dropped reply had taken goes into the history with the real turn.
        assert h.engine.calls[1] == [{"role": "assistant", "content": "Hi."},
                                     {"role": "user", "content": "I would like a cake"}]
        assert [t.user_text for t in h.call.record.turns] == ["I would like a cake"]
        assert any(e["type"] == "early_reply_dropped" for e in h.observer.events)
        await h.call.close()

    run(main())


def test_without_preemptive_generation_the_reply_waits_for_the_end_of_turn() -> None:
    async def main():
        h = Harness()
        h.call.cfg.preemptive_generation = False
        await h.call.start()
        h.push(20, h.ev("speech_start"))
        h.push(400)
        h.push(20, h.ev("speech_end"))
        await asyncio.sleep(0.05)
        assert h.engine.calls == [] and h.stt.peeks == 0
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: h.engine.calls)
        assert h.call.record.turns[0].user_text == "what time is it"
        await h.call.close()

    run(main())


@pytest.mark.parametrize("pause_ms", [400, 0])
def test_the_llm_pauses_while_the_first_audio_is_synthesized(pause_ms: int) -> None:
    async def main():
        h = Harness()
        h.call.cfg.first_audio_llm_pause_ms = pause_ms
        await h.call.start()
        await h.one_turn()
        await h.settle(lambda: h.output.ended_replies == 1)
        # Paused at the first clause handed to the TTS, resumed at its first frame: once per reply.
        assert h.engine.pauses == ([("pause", 0.4), ("resume",)] if pause_ms else [("resume",)])
        await h.call.close()

    run(main())


def partial(h: Harness, text: str, stable: str) -> None:
    """A partial transcript from the STT worker, as the call receives it."""
    h.call._on_partial(SimpleNamespace(text=text, stable_text=stable))


def test_the_callers_committed_words_are_prefilled_while_they_speak() -> None:
    async def main():
        h = Harness(greeting="Hi.")
        await h.call.start()
        await h.settle(lambda: h.output.ended_replies == 1)
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        h.push(20, h.ev("speech_start"))
        partial(h, "what time", "what")  # the greeting opens this turn's messages: it renders otherwise
        await asyncio.sleep(0.02)
        assert h.engine.prefills == []
        h.push(400)
        h.push(20, h.ev("speech_end"))
        h.output.playing = True
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: h.call.state is CallState.SPEAKING)
        h.push(20, h.ev("speech_start"))  # a noise while the agent talks: a barge-in may roll the session back
        partial(h, "and what", "and")
        await asyncio.sleep(0.02)
        assert h.engine.prefills == []
        h.push(20, h.ev("speech_end"))
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: h.output.ended_replies == 2)
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)

        h.push(20, h.ev("speech_start"))
        partial(h, "and", "")  # nothing committed yet
        partial(h, "and what about", "and what")
        partial(h, "and what about tomorrow", "and what about")
        await h.settle(lambda: len(h.engine.prefills) == 2)
        assert h.engine.prefills == ["and what", "and what about"]
        h.call.cfg.prefill_while_speaking = False
        partial(h, "and what about tomorrow then", "and what about tomorrow")
        await asyncio.sleep(0.02)
        assert len(h.engine.prefills) == 2
        await h.call.close()

    run(main())


def test_a_failing_prefill_hint_does_not_break_the_turn() -> None:
    async def main():
        h = Harness()
        await h.call.start()

        def broken(session, words):
            raise RuntimeError("the engine is on fire")

        h.engine.prefill_user_words = broken
        h.push(20, h.ev("speech_start"))
        partial(h, "what time", "what")
        await asyncio.sleep(0.02)
        h.push(400)
        h.push(20, h.ev("speech_end"))
        h.push(20, h.ev("end_of_turn"))
        await h.settle(lambda: h.call.state is CallState.SPEAKING)
        assert h.engine.calls == [[{"role": "user", "content": "what time is it"}]]
        await h.call.close()

    run(main())


def test_a_backchannel_over_the_agent_keeps_it_talking() -> None:
    async def main():
        h = Harness(backchannels=True, texts=["what time is it", "Mm-hmm."])
        await h.call.start()
        await h.one_turn()
        h.stt.hold = True  # the words are still being decoded at the speech end
        h.push(20, h.ev("speech_start"))
        h.push(300)  # longer than barge_in_min_speech_ms: no longer enough to interrupt the agent
        assert h.output.held and h.output.clears == 0  # held (hold_on_speech) while its words are heard
        h.push(20, h.ev("speech_end"))
        assert h.output.held  # not released at the speech end: the words decide
        h.stt.futures[-1].set_result(SimpleNamespace(text="Mm-hmm."))
        await h.settle(lambda: h.call.record.turns[0].backchannels)
        assert h.call.record.turns[0].backchannels == ["Mm-hmm."]
        assert h.output.clears == 0 and h.output.holds == [True, False] and h.call.state is CallState.SPEAKING
        assert ("transcript", {"text": "Mm-hmm.", "final": True, "turn": 1, "backchannel": True}) in h.output.events
        h.push(20, h.ev("end_of_turn"))  # the backchannel's own turn ends: nothing to answer
        h.output.playing = False
        await h.settle(lambda: h.call.state is CallState.LISTENING)
        turn = h.call.record.turns[0]
        assert not turn.interrupted and len(h.engine.calls) == 1 and h.call.record.barge_ins == 0
        await h.call.close()

    run(main())


def test_words_over_the_agent_that_are_more_than_a_backchannel_interrupt_it() -> None:
    async def main():
        h = Harness(backchannels=True, texts=["what time is it", "Wait, stop."])
        await h.call.start()
        await h.one_turn()
        h.push(20, h.ev("speech_start"))
        h.push(300)
        h.push(20, h.ev("speech_end"))
        await h.settle(lambda: h.output.clears == 1)
        assert h.call.record.turns[0].interrupted and h.call.record.barge_ins == 1
        await h.call.close()

    run(main())


def test_a_partial_with_real_words_or_long_speech_over_the_agent_interrupts_without_waiting_for_its_end() -> None:
    async def main():
        for how in ("partial", "long speech"):
            h = Harness(backchannels=True)
            await h.call.start()
            await h.one_turn()
            h.push(20, h.ev("speech_start"))
            h.push(300)
            if how == "partial":
                # One partial's word, which the next did not confirm (whisper made "I'm" of the lead and a syllable
                # of "Okay"): the agent goes on.
                h.call._partial_arrived("I'm", "", 0.9)
                assert h.output.clears == 0
                h.call._partial_arrived("Yeah, okay", "Yeah,", 1.0)  # still a backchannel: the agent goes on
                assert h.output.clears == 0
                h.call._partial_arrived("No, I said Tuesday", "No,", 1.2)
            else:
                h.push(600)  # 920 ms of speech: over backchannel_max_ms (900)
            assert h.output.clears == 1, how
            await h.call.close()

    run(main())


def test_on_an_echo_line_a_lone_word_over_the_agent_lets_it_go_on_and_more_words_interrupt() -> None:
    """A call that cancels echo (its gate here over an empty reference, the agent's words told to it): a lone word
    over the agent, as the STT may hear residual echo ("Tuesday."), barges in neither as a partial nor at the
    speech's end; the agent goes on and that speech is no turn. Two words, or a lone "wait", interrupt."""
    async def main():
        for heard, interrupts in (("Tuesday.", False), ("Wait.", True), ("Tuesday, please", True)):
            h = Harness(backchannels=True, texts=["what time is it", heard])
            h.call._echo = CallEcho(EchoPath(FarEndReference(RATE)), max_delay_ms=500)
            await h.call.start()
            await h.one_turn()
            h.call._echo.agent_said(h.call._since(), "Hello there my good friend.", 5.0)
            h.push(20, h.ev("speech_start"))
            h.push(200)
            h.call._partial_arrived(heard, heard, h.call._since())  # words two partials agree on
            assert h.output.clears == interrupts, heard  # a partial with words that take the turn: at once
            h.push(20, h.ev("speech_end"))
            await asyncio.sleep(0.05)
            assert (h.output.clears == 1) is interrupts, heard
            assert (h.call.record.barge_ins == 1) is interrupts and h.call._stt_turn_active is interrupts, heard
            if not interrupts:
                assert h.output.holds == [True, False] and h.call.state is CallState.SPEAKING
                assert h.call._echo.figures()["gated_speech"][-1]["kept"] == ""
            await h.call.close()

    run(main())


def test_an_early_reply_tells_the_policy_how_finished_the_words_are() -> None:
    async def main():
        for policy, probed in (("hybrid", True), ("silence", False)):
            h = Harness(params={"turn_policy": policy})
            h.engine.end_prob = 0.7
            await h.call.start()
            h.push(20, h.ev("speech_start"))
            h.push(300)
            h.push(20, h.ev("speech_end"))  # the early reply starts here, with the end probe
            await h.settle(lambda h=h: h.engine.calls)
            await asyncio.sleep(0.01)
            assert h.engine.probes == [probed] and h.call.turn_policy == policy
            assert h.call.turns.text_prob == (0.7 if probed else None)
            await h.call.close()

    run(main())
