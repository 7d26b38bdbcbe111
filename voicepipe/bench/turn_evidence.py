"""What the end-of-turn policy knows at each pause of a labelled utterance, recorded from real calls.

Each utterance is a turn of a `CallSession` over the process's models (VAD, streaming STT, the LLM engine, TTS and
Smart Turn), fed in 20 ms chunks at real-time pace, so the evidence arrives when it would in a call: the STT's pause
decode, the early reply's prefill with its end probe, then Smart Turn on a worker thread, all sharing the cores as
in a call. (Under the `acoustic` policy a call scores the sound at the speech end, alongside the prefill; its
replay here sees it after the words.) The call's policy is told to wait 10 s at every pause, so it never ends the
turn by itself; its `TurnTaking` reports, in the utterance's samples, where the VAD reported each speech end and
when each piece of evidence landed. Once the last pause's evidence is in, the rest of the utterance (silence) is
not played. The agent's audio goes nowhere.

A call plays one utterance (a first turn, after the greeting) or several in a row (`per_call`): then the turn is
ended at each utterance's end, the agent's reply is generated and kept in the call's history, and the next
utterance is scored with that history, as the words of a conversation's later turns are (their P(end) is not a
first turn's). `voicepipe.bench.turns` replays every policy over this record.

Each utterance starts at a fixed place in its call's audio (`slot_chunks`: the greeting's room, then each earlier
utterance and `REPLY_ROOM_S` after it), not when the agent's reply happens to end: the caller's audio is then the
same in every run, quiet or loaded, as a replay's is, and the two recordings differ only where the pipeline does.
(Starting each utterance once the reply had ended, the VAD's recurrent state had heard a different length of
silence before it in each run and judged it differently: a window's move of its speech start, a pause found in one
run and not the other.) A reply that runs past its room pushes the next utterance to where it ends, and that
utterance is marked `late_start`.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voicepipe.observability.hooks import Observers
from voicepipe.vad.silero import WINDOW

RATE = 16000
CHUNK = RATE // 50  # 20 ms, as a carrier sends it
EVIDENCE_WAIT_S = 1.5  # at most this long after the last speech end for its evidence
NEVER_MS = 10_000  # the recording policy's wait: longer than any silence in the set
ALIGN = np.lcm(CHUNK, WINDOW) // CHUNK  # 8 chunks of 20 ms: where the chunks and the VAD's windows line up again
GREETING_ROOM_S = 3.0  # the first utterance starts this long into its call: the greeting has been made by then
REPLY_ROOM_S = 3.0  # after an utterance's audio (which ends in 1.5-3 s of silence): the agent's reply fits in it
SILENCE = np.zeros(CHUNK, np.int16)


@dataclass
class Pause:
    """One VAD speech end in an utterance, and when its evidence landed (sample positions of the utterance)."""

    end: int  # the VAD's speech end: the caller's silence counts from here
    at: int  # samples judged when the VAD reported it (the policy is first asked here)
    segment: int  # TurnTaking.segment of the speech it ends
    resumed: int | None = None  # samples judged when the VAD reported speech again (None: it did not)
    text: str = ""  # what the early reply heard
    text_prob: float | None = None
    acoustic_prob: float | None = None
    text_ready: int | None = None  # from here on the words' evidence is known (None: it never came)
    acoustic_ready: int | None = None


@dataclass
class Evidence:
    name: str
    label: str  # "complete" or "paused"
    voice: str
    speech_end: int  # the truth: where the caller stopped (complete) or stopped for good (paused)
    pause_end: int | None  # paused: where the continuation begins
    processed: int  # the utterance's length in whole VAD windows
    pauses: list[Pause] = field(default_factory=list)
    turn: int = 1  # the utterance's turn in its call: 1 after the greeting, more with earlier turns' history
    late_start: bool = False  # the reply before it ran past its room: the silence before it is not the set's own


def save_recordings(recordings: dict[str, list[Evidence]], path: Path) -> None:
    """Each recording of the run ("quiet", "loaded") by name."""
    path.write_text(json.dumps({name: [asdict(ev) for ev in evidence] for name, evidence in recordings.items()}))


def load_recordings(path: Path) -> dict[str, list[Evidence]]:
    """Recordings written by `save_recordings` (a recorded run replays every policy in seconds, without models)."""
    return {name: [_evidence(row) for row in rows] for name, rows in json.loads(path.read_text()).items()}


def _evidence(row: dict[str, Any]) -> Evidence:
    pauses = [Pause(**p) for p in row.pop("pauses")]
    return Evidence(**row, pauses=pauses)


class _Sink:
    """An AgentOutput that has played everything the moment it gets it."""

    sample_rate = RATE

    def play(self, audio, origin) -> None: ...
    def end_of_reply(self) -> None: ...
    def is_playing(self) -> bool: return False
    def heard(self) -> list: return []
    def clear(self) -> list: return []
    def hold(self, on: bool) -> None: ...
    def event(self, kind: str, **data: Any) -> None: ...


def recording_settings(settings):
    """`settings` with a hybrid policy that never ends a turn and finds every pause's words unsure, so the call
    gathers all the evidence: the words, then the sound, scored after them as hybrid scores it when it needs it."""
    turn = settings.turn.model_copy(update={"policy": "hybrid", "acoustic": "on", "short_wait_ms": NEVER_MS,
                                            "middle_wait_ms": NEVER_MS, "long_wait_ms": NEVER_MS,
                                            "text_complete": 2.0, "text_complete_marked": 2.0,
                                            "text_incomplete": -1.0})  # no probability is sure
    return settings.model_copy(update={"turn": turn})


def collect_evidence(items, resources, settings, progress: Callable[[int, int], None] | None = None,
                     per_call: int = 1) -> list[Evidence]:
    """Evidence for every labelled utterance (`voicepipe.bench.turn_corpus.LabelledUtterance`), `per_call` of them
    in turn in each call."""
    async def main() -> list[Evidence]:
        out: list[Evidence] = []
        for first in range(0, len(items), per_call):
            out += await _record(items[first:first + per_call], resources, recording_settings(settings))
            if progress:
                progress(len(out), len(items))
        return out

    return asyncio.run(main())


class _Recorder:
    """Observes one call: VAD reports and evidence, placed in the utterance's samples."""

    def __init__(self, item, call, turn: int = 1, offset: int = 0, late_start: bool = False) -> None:
        self.call = call
        self.offset = offset  # the call's samples before the utterance began
        length = len(item.audio) - len(item.audio) % WINDOW
        self.ev = Evidence(item.name, item.label, item.voice, item.speech_end, item.pause_end, length, turn=turn,
                           late_start=late_start)
        self.heard = ""
        self.last_report: float | None = None

    def on_evidence(self, kind: str, segment: int, value: float | None) -> None:
        if kind == "speech_end":
            detector = self.call.detector
            self.ev.pauses.append(Pause(detector.last_speech_end - self.offset,
                                        detector.stream.samples_processed - self.offset, segment))
            self.last_report = asyncio.get_running_loop().time()
            return
        pause = next((p for p in reversed(self.ev.pauses) if p.segment == segment), None)
        if pause is None:
            return
        now = self.call._vad_pos - self.offset  # the next window the policy is asked after is past this sample
        if kind == "text":
            pause.text_prob, pause.text_ready, pause.text = value, now, self.heard
        else:
            pause.acoustic_prob, pause.acoustic_ready = value, now

    # -- the CallObserver methods the call uses ------------------------------------------------------------------
    def event(self, call, event: dict[str, Any]) -> None:
        if event["type"] == "stt_final":
            self.heard = event.get("text", "")
        elif event["type"] == "vad" and event.get("kind") == "speech_start" and self.ev.pauses:
            last = self.ev.pauses[-1]
            if last.resumed is None:
                last.resumed = self.call.detector.stream.samples_processed - self.offset

    def call_started(self, call) -> None: ...
    def audio(self, *args) -> None: ...
    def turn_finished(self, call, turn) -> None: ...
    def call_ended(self, call) -> None: ...

    def done(self, pushed: int) -> bool:
        """The last pause of the utterance has its evidence (or has waited long enough for it). The VAD reports a
        pause once its silence is `vad.min_silence_ms` long, so one reported before the true end of speech is not
        the last."""
        if pushed < self.ev.speech_end or not self.ev.pauses or self.ev.pauses[-1].at < self.ev.speech_end:
            return False
        last = self.ev.pauses[-1]
        waited = asyncio.get_running_loop().time() - (self.last_report or 0.0)
        return (last.text_ready is not None and last.acoustic_ready is not None) or waited > EVIDENCE_WAIT_S


async def _record(items, resources, settings) -> list[Evidence]:
    """One call: each utterance in turn, the turn ended at its end (after its last pause's evidence) and the agent's
    reply generated before the next."""
    from voicepipe.pipeline.session import CallSession
    from voicepipe.turns.policy import TurnPolicy

    observers = Observers()
    call = CallSession(resources, settings, _Sink(), input_rate=RATE, transport="bench", observers=observers)
    out = []
    await call.start()
    pace = _Pace()
    try:
        await pace.until(call, lambda: call._reply is None)  # the greeting, played at once
        recording = call.turns.policy
        start = slot_chunks(GREETING_ROOM_S)
        for turn, item in enumerate(items, start=1):
            on_time = await pace.to(call, start)
            start = pace.sent + slot_chunks(len(item.audio) / RATE + REPLY_ROOM_S)
            recorder = _Recorder(item, call, turn, offset=call._received, late_start=not on_time)
            observers.add(recorder)
            call.turns.on_evidence = recorder.on_evidence
            for pos in range(0, len(item.audio), CHUNK):
                await pace.push(call, item.audio[pos:pos + CHUNK])
                if recorder.done(pos + CHUNK):
                    break
            observers.observers.remove(recorder)
            out.append(recorder.ev)
            if turn < len(items):  # end the turn here and let the agent answer, for the next turn's history
                call.turns.policy = TurnPolicy("silence", settings.turn, 0)
                await pace.until(call, lambda t=turn: call._turns == t and call._reply is None and call._early is None)
                call.turns.policy = recording
    finally:
        await call.close()
    return out


class _Pace:
    """Feeds a call its caller's audio in 20 ms chunks at real-time pace (silence while it waits for something)."""

    def __init__(self) -> None:
        self.start = asyncio.get_running_loop().time()
        self.sent = 0

    async def push(self, call, audio: np.ndarray) -> None:
        call.push_audio(audio)
        self.sent += 1
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self.start + self.sent * CHUNK / RATE - loop.time()))

    async def until(self, call, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
        for _ in range(int(timeout_s * RATE / CHUNK)):
            if done():
                return
            await self.push(call, SILENCE)
        raise TimeoutError("the call did not get there within 30 s of audio")

    async def to(self, call, chunk: int) -> bool:
        """Silence up to `chunk` (a multiple of `ALIGN`), so that every run has sent the same audio there. Past it
        already: up to the next multiple of `ALIGN` (each utterance then still meets the VAD's windows and the STT's
        chunks at the same places), and False."""
        on_time = self.sent <= chunk
        while self.sent < chunk or self.sent % ALIGN:
            await self.push(call, SILENCE)
        return on_time


def slot_chunks(seconds: float) -> int:
    """`seconds` of audio in chunks, rounded up to a multiple of `ALIGN`."""
    return math.ceil(seconds * RATE / CHUNK / ALIGN) * ALIGN
