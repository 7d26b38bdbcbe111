"""Scripted stand-ins for the models a call uses (VAD, STT stream, TTS stream, LLM engine), for the tests of
`CallSession` and of the transport connection that drives one. The real models run in tests/e2e."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np

from voicepipe.llm.errors import LLMError
from voicepipe.tts.cursor import PlayoutCursor, SpeechOrigin, WordTiming
from voicepipe.vad import VADEvent

PER_CHAR = 80  # output samples per character of agent text (10 ms at 8 kHz)


class FakeDetector:
    def __init__(self) -> None:
        self.stream = SimpleNamespace(samples_processed=0, speech_pending=False)
        self.pending: list[VADEvent] = []

    def push(self, audio: np.ndarray) -> list[VADEvent]:
        self.stream.samples_processed += len(audio)
        out, self.pending = self.pending, []
        return out

    def decide_again(self) -> list[VADEvent]:
        return []


class FakeSTTStream:
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.samples_pushed = 0
        self.futures: list[Future] = []
        self.cancelled_turns = 0
        self.peeks = 0
        self.resumes = 0  # resume() after a peek: the caller spoke again
        self.closed = False
        self.hold = False  # leave the final pending (the caller is "thinking")

    def push(self, audio: np.ndarray) -> None:
        self.samples_pushed += len(audio)

    def push_before_speech(self, audio: np.ndarray) -> None:
        self.push(audio)

    def finish(self, end_sample=None) -> Future:
        fut: Future = Future()
        self.futures.append(fut)
        if not self.hold:
            fut.set_result(SimpleNamespace(text=self.texts.pop(0)))
        return fut

    def peek(self, end_sample=None) -> Future:
        self.peeks += 1
        return self.finish(end_sample)

    def resume(self) -> None:
        self.resumes += 1

    def cancel_turn(self) -> None:
        self.cancelled_turns += 1

    def close(self) -> None:
        self.closed = True


class FakeSpeech:
    """Synthesizes each pushed clause at once: PER_CHAR samples per character, word timings from spaces."""

    def __init__(self, rate: int, turn: int) -> None:
        self.rate, self.turn = rate, turn
        self.cursor = PlayoutCursor()
        self.frames: list = []
        self.text = ""
        self.pos = 0
        self.done = self.cancelled = False
        self.error = None
        self.index = 0

    def _synth(self, text: str) -> list:
        if not text or self.cancelled:
            return []
        start_char = len(self.text)
        self.text += text
        words, offset = [], 0
        for word in text.split(" "):
            if word:
                a = start_char + offset
                words.append(WordTiming(word, a, a + len(word), self.pos + offset * PER_CHAR,
                                        self.pos + (offset + len(word)) * PER_CHAR))
            offset += len(word) + 1
        n = len(text) * PER_CHAR
        self.cursor.add(SpeechOrigin(self.turn, self.index, text, start_char, start_char + len(text), self.pos,
                                     self.pos + n, self.rate, tuple(words)))
        self.index += 1
        for i in range(0, n, 160):
            self.frames.append(SimpleNamespace(samples=np.zeros(min(160, n - i), np.int16), start_sample=self.pos + i))
        self.pos += n
        return [text]

    def push_text(self, text: str) -> list:
        return self._synth(text)

    def end_text(self) -> list:
        self.done = True
        return []

    def say(self, text: str) -> None:
        self._synth(text)
        self.done = True

    def cancel(self) -> None:
        self.cancelled = True
        self.frames.clear()
        self.done = True

    def read(self, timeout=None):
        if self.cancelled or not self.frames:
            return None
        return self.frames.pop(0)

    @property
    def queued_frames(self) -> int:
        return len(self.frames)


class FakeGeneration:
    def __init__(self, engine, words: list[str], end_prob: float | None = None, tool_calls: list | None = None) -> None:
        self.engine, self.words = engine, words
        self.tool_calls = tool_calls or []  # a scripted call: no words
        self.stats = SimpleNamespace(prompt_tokens=40, cached_prompt_tokens=30, output_tokens=len(words))
        self.end_prob = asyncio.get_running_loop().create_future()
        self.end_prob.set_result(end_prob)

    async def _run(self):
        self.engine.session.busy = True
        try:
            for i, word in enumerate(self.words):
                await asyncio.sleep(0.001)
                if i == self.engine.break_after:
                    raise LLMError("the backend went away.")
                yield SimpleNamespace(text=(" " if i else "") + word, token_ids=[i], time=0.0)
                if self.engine.slow:
                    await asyncio.sleep(10)
        finally:
            self.engine.session.busy = False

    def __aiter__(self):
        return self._run()

    def pause(self, max_s: float) -> None:
        self.engine.pauses.append(("pause", max_s))

    def resume(self) -> None:
        self.engine.pauses.append(("resume",))


class FakeSession(SimpleNamespace):
    """An LLM session's stand-in, hashable and weakly referable by identity (as the metrics hold sessions)."""

    __hash__ = object.__hash__


class FakeEngine:
    def __init__(self, reply: str = "Hello there my good friend.") -> None:
        self.reply = reply
        self.calls: list[list[dict]] = []
        self.rollbacks: list[int] = []
        self.dropped: list[int] = []  # drop_turns(keep) calls
        self.pauses: list[tuple] = []  # the generations' pause / resume calls
        self.seeds: list[int | None] = []
        self.prefills: list[str] = []  # prefill_user_words calls
        self.closed: list = []
        self.session = None
        self.fail = False
        self.slow = False
        self.break_after: int | None = None  # a generation fails (LLMError) after this many words
        self.end_prob: float | None = None  # what an early reply's end probe gives
        self.probes: list[bool] = []  # each generate's end_probe
        self.tool_options: list[dict] = []  # each generate's tools, tool_choice, reply_prefix and max_tokens
        self.tool_script: list = []  # ToolCalls the next generations make (one each, in order), then words

    def open_session(self, system_prompt=None):
        self.session = FakeSession(system_prompt=system_prompt, busy=False, closed=False, marks=[])
        return self.session

    def generate(self, session, messages, **kw):
        if self.fail:
            raise RuntimeError("the engine is on fire")
        self.calls.append(messages)
        self.seeds.append(kw.get("seed"))
        self.probes.append(kw.get("end_probe", False))
        session.marks.append(len(self.calls))  # a turn begins
        self.tool_options.append({k: kw[k] for k in ("tools", "tool_choice", "reply_prefix", "max_tokens") if k in kw})
        end_prob = self.end_prob if kw.get("end_probe") else None
        if self.tool_script and kw.get("tool_choice") not in (None, "none"):
            return FakeGeneration(self, [], end_prob, [self.tool_script.pop(0)])
        words = (kw.get("reply_prefix") or "").split() + self.reply.split(" ")
        return FakeGeneration(self, words, end_prob)

    def rollback_reply(self, session, heard_tokens: int) -> None:
        self.rollbacks.append(heard_tokens)

    def prefill_user_words(self, session, words: str) -> None:
        assert session is self.session
        self.prefills.append(words)

    def drop_turns(self, session, keep: int) -> None:
        assert not session.busy
        self.dropped.append(keep)
        del session.marks[keep:]

    def close_session(self, session) -> None:
        session.closed = True
        self.closed.append(session)

    def history(self, session):
        return [{"role": "system", "content": session.system_prompt}]


def fake_call_resources():
    """A call's `CallResources` with every model scripted: a `FakeEngine`, no Smart Turn, an STT stream that
    hears nothing and a TTS that speaks at `PER_CHAR` samples a character."""
    from voicepipe.pipeline import CallResources

    stt = FakeSTTStream([])
    return CallResources(FakeEngine(), None, SimpleNamespace(open_stream=lambda rate, on_partial=None: stt),
                         SimpleNamespace(open_stream=lambda rate, turn: FakeSpeech(rate, turn)))


class RecordingObserver:
    """Keeps every report a call makes to its observers."""

    def __init__(self) -> None:
        self.started, self.ended, self.turns, self.events, self.chunks = [], [], [], [], []

    def call_started(self, call) -> None:
        self.started.append(call.call_id)

    def event(self, call, event) -> None:
        self.events.append(event)

    def audio(self, call, channel, samples, rate, t) -> None:
        self.chunks.append((channel, len(samples), rate, t))

    def turn_finished(self, call, turn) -> None:
        self.turns.append(turn)

    def call_ended(self, call) -> None:
        self.ended.append((call.call_id, call.outcome))

    def kinds(self) -> list[str]:
        return [e["type"] for e in self.events]
