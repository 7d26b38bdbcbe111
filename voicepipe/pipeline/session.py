"""CallSession: one call's state machine, wiring VAD -> STT -> LLM session -> TTS -> the transport.

States: LISTENING -> THINKING (the caller's turn ended: final transcript, then the LLM) -> SPEAKING (agent
audio is going out) -> LISTENING (the reply has played). ENDED is final.

Early replies (`calls.preemptive_generation`): at the VAD's speech end the call already takes the transcript
and starts the LLM and the TTS, holding their audio and client events until the end-of-turn decision (the
silence that follows, `vad.end_of_turn_silence_ms`). If the caller resumes before that, the early reply is
cancelled and its turn dropped from the LLM session; the STT turn goes on, so the final covers all the words.

Barge-in: caller speech of at least `barge_in_min_speech_ms` while the agent is THINKING or SPEAKING cancels
the generation and the TTS, clears the transport's buffered audio, and rolls the LLM session back to the
tokens whose words the caller heard (from the transport's playout cursor and the TTS word timings). Shorter
noises while the agent talks are dropped. With `hold_on_speech` the agent's audio is held from the VAD's
speech start, so it stops before the barge-in decision; a noise lets it go on where it stopped.

The transport side is an `AgentOutput` (`call_types.py`); everything here runs on the event loop, models run on
their own worker threads.

This file holds the state machine: lifecycle, caller audio, end of turn, replies, timeline and observers. Its
machinery lives beside it, in mixins `CallSession` inherits: `early_reply.py` (early replies), `interruptions.py`
(barge-in, reopen, backchannels, hold), `housekeeping.py` (background tasks, the idle watch), `keypad.py` (DTMF
entries as turns) and `tool_calls.py` (the tools a reply may call).

Each turn keeps a timeline (`TurnRecord.timeline`, see `voicepipe/observability/hooks.py`) and the call reports
to its `Observers` (call store, metrics, recorder): the call's start and end, each finished turn, caller and
agent audio, and events (VAD, transcripts, the LLM request, marks and clears).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import deque
from typing import Any

import numpy as np

from voicepipe.audio import StreamResampler
from voicepipe.config import MAX_REPLY_TOKENS, CallSettings, Settings
from voicepipe.llm.errors import LLMError
from voicepipe.observability.hooks import Observers
from voicepipe.observability.records import CallRecord, TurnRecord
from voicepipe.observability.timeline import derive_timings
from voicepipe.pipeline.call_echo import keep_echo_figures, open_call_echo
from voicepipe.pipeline.call_types import AgentOutput, CallState, _Reply
from voicepipe.pipeline.early_reply import EarlyReplies
from voicepipe.pipeline.housekeeping import Housekeeping
from voicepipe.pipeline.interruptions import Interruptions
from voicepipe.pipeline.keypad import Keypad
from voicepipe.pipeline.resources import CallResources
from voicepipe.pipeline.tool_calls import ToolCalls, call_tools
from voicepipe.pipeline.turn_taking import TurnTaking
from voicepipe.turns.backchannel import is_backchannel
from voicepipe.turns.policy import POLICIES, TurnPolicy, effective_policy
from voicepipe.vad.boundary import SEARCH_MS, audible_end

log = logging.getLogger(__name__)

PIPELINE_RATE = 16000  # VAD and STT input
PREROLL_S = 0.6  # caller audio kept before the VAD's speech_start, so the STT hears the first syllable
# The STT hears this much before the VAD's speech_start. The VAD calls speech late after a soft first sound (the "h"
# of "how", the "k" of "can"), and later still after the seconds of silence the echo gate makes of a reply: with
# 100 ms, whisper heard "How is the weather in London today?" as "in London to May" (dropped as no speech, the turn
# lost, in CI) and "Can you" as "and you". Five speakerphone calls' questions (15, the canceller's output decoded
# again from the VAD's starts): heard word for word with 100 ms 6, with 200 ms 8, with 300 ms 15, with 450 ms 9; their
# first words 11, 15, 15, 15.
STT_LEAD_S = 0.3
SEARCH_SAMPLES = SEARCH_MS * PIPELINE_RATE // 1000
ARRIVALS_KEPT = 1500  # caller chunks whose arrival time is kept (30 s of 20 ms chunks) to date VAD events
JUDGED_PIECE = 512  # caller audio is judged in pieces of at most one VAD window, so a decision parks at its window
PACE_CHUNKS = 150  # the latest arrivals (3 s of 20 ms chunks) that tell the caller's pace (`_judged_up_to_now`)
PACE_SLACK_S = 0.04  # a chunk may arrive this much after its time (one 20 ms chunk and the loop's own jitter)


class CallSession(EarlyReplies, Interruptions, Housekeeping, Keypad, ToolCalls):
    """One call. `start()`, then `push_audio()` for every inbound chunk, then `close()`."""

    def __init__(self, resources: CallResources, settings: Settings, output: AgentOutput, *,
                 input_rate: int, transport: str = "native", call_id: str | None = None,
                 parameters: dict[str, Any] | None = None, observers: Observers | None = None) -> None:
        self.res = resources
        self.observers = observers or Observers()
        self.settings = settings
        self.cfg: CallSettings = settings.calls
        self.output = output
        self.call_id = call_id or f"c-{uuid.uuid4().hex[:12]}"
        params = parameters or {}
        prompt, greeting = self.cfg.system_prompt, self.cfg.greeting
        if self.cfg.allow_overrides:
            if isinstance(params.get("system_prompt"), str) and params["system_prompt"].strip():
                prompt = params["system_prompt"]
            if "greeting" in params and (params["greeting"] is None or isinstance(params["greeting"], str)):
                greeting = params["greeting"]
        self.seed = _int_param(params.get("seed")) if self.cfg.allow_overrides else None
        budget = _int_param(params.get("max_reply_tokens")) if self.cfg.allow_overrides else None
        if budget is not None and 1 <= budget <= MAX_REPLY_TOKENS:
            self.cfg = self.cfg.model_copy(update={"max_reply_tokens": budget})
        policy = settings.turn.policy
        if self.cfg.allow_overrides and params.get("turn_policy") in POLICIES:
            policy = params["turn_policy"]
        self.turn_policy = policy
        self.tools, self.tool_choice = call_tools(self.cfg, bool(getattr(output, "can_send_dtmf", False)), params)
        self.system_prompt = prompt
        self.greeting = greeting or None
        self.record = CallRecord(self.call_id, transport, system_prompt=prompt, greeting=self.greeting,
                                 metadata={k: v for k, v in params.items() if k not in ("system_prompt", "greeting")})
        self.state = CallState.LISTENING
        self.input_rate = input_rate
        self._resampler = StreamResampler(input_rate, PIPELINE_RATE) if input_rate != PIPELINE_RATE else None
        self._echo = open_call_echo(settings, transport, params, output, PIPELINE_RATE, self.call_id)
        keep_echo_figures(self.record.metadata, self._echo)  # never a caller's value there, from the start
        self.session = None  # llm Session
        self.detector = None
        self.turns: TurnTaking | None = None
        self.stt = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._preroll: list[np.ndarray] = []
        self._preroll_len = 0
        self._vad_pos = 0  # 16 kHz samples judged: pushed to the VAD (and the STT, the turn-taking)
        self._received = 0  # 16 kHz samples received; those past `_vad_pos` wait in `_unjudged`
        self._unjudged: deque[np.ndarray] = deque()  # received, while a turn decision waits for its evidence
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=ARRIVALS_KEPT)  # (received after a chunk, when)
        self._speech_start: int | None = None  # VAD sample of the open speech segment
        self._speech_due: float | None = None  # when the latest speech start was due on the line (`_sample_due`)
        self._holding = False  # the agent's audio is held for caller speech (`hold_on_speech`)
        self._next_timeline: dict[str, float] = {}  # the timeline of the caller turn being spoken
        self._speech_end: int | None = None
        self._speech_end_settled = False  # the timeline's speech end looked at again with the audio after it
        self._stt_turn_active = False
        self._stt_vad_start = 0  # VAD sample where the STT turn's audio starts
        self._stt_sample_start = 0  # TranscriptStream sample at that point
        self._turns = 0
        self._reply: _Reply | None = None
        self._early: _Reply | None = None  # a reply started at the speech end, before the end-of-turn decision
        self._pending_assistant: str | None = None  # greeting text to put in the history before turn 1
        self._unanswered: str | None = None  # caller words cut off before the LLM heard them: they open the next turn
        self._keys: list[str] = []  # the keypad entry being typed (keypad.py)
        self._keys_started: float | None = None
        self._keys_timer: asyncio.TimerHandle | None = None
        self._last_activity = time.monotonic()
        self._watchdog: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.closed = False
        self.end_reason: str | None = None
        self.transfer_target: str | None = None  # where the agent transferred the caller (transfer_call)
        self.ended = asyncio.Event()

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.record.started_mono = time.monotonic()
        self.session = self.res.engine.open_session(self.system_prompt)
        words_scored = self.cfg.preemptive_generation and getattr(self.res.engine, "scores_words", True)
        policy = TurnPolicy(effective_policy(self.turn_policy, self.res.turn is not None, words_scored=words_scored),
                            self.settings.turn, self.settings.vad.end_of_turn_silence_ms)
        self.turns = TurnTaking(policy, self.res.turn, PIPELINE_RATE, self.settings.turn.evidence_wait_ms)
        self.turns.on_ready = self._evidence_in
        self.detector = self._make_detector()
        self.stt = self.res.transcriber.open_stream(PIPELINE_RATE, on_partial=self._on_partial)
        self._watchdog = asyncio.create_task(self._watch_idle(), name=f"idle-{self.call_id}")
        self.observers.call_started(self.record)
        if self.greeting:
            self._pending_assistant = self.greeting
            self.state = CallState.SPEAKING
            self._start_reply(_Reply(0, self._open_speech(0), greeting=True, text=self.greeting))

    def _make_detector(self):
        from voicepipe.vad import TurnDetector

        return TurnDetector(self.res.vad, PIPELINE_RATE, self.settings.vad, policy=self.turns)

    async def close(self, reason: str = "hangup") -> None:
        """End the call: cancel everything in flight and release the LLM session and every buffer."""
        if self.closed:
            return
        self.closed = True
        self.end_reason = reason
        self._close_keypad()
        early, self._early = self._early, None
        if early is not None:  # not confirmed by an end of turn: it leaves no turn behind
            early.stream.cancel()
            early.task.cancel()
        reply = self._reply
        self._reply = None
        if reply is not None:
            reply.stream.cancel()
            if reply.task is not None and reply.task is not asyncio.current_task():
                reply.task.cancel()
                await asyncio.wait([reply.task], timeout=1.0)  # it records what the engine did as it stops
            self._finish_turn(reply)
        for task in [self._watchdog, *self._tasks]:
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        try:
            if self.session is not None:
                with contextlib.suppress(Exception):  # the history is a courtesy; never fail a close on it
                    self.record.history = self.res.engine.history(self.session)
                self.res.engine.close_session(self.session)
        finally:
            if self.stt is not None:
                self.stt.close()
            if self.turns is not None:
                self.turns.close()
            self.stt = None
            self.detector = None
            self._preroll = []
            self._unjudged.clear()
            self.session = None
            self.state = CallState.ENDED
            self.record.ended = time.time()
            self.record.end_reason = reason
            self.record.outcome = call_outcome(reason, self.record.error)
            keep_echo_figures(self.record.metadata, self._echo)
            self.ended.set()
            self.observers.call_ended(self.record)
            log.info("call %s ended (%s) after %d turns", self.call_id, reason, self._turns)

    def record_now(self) -> CallRecord:
        """The call's record with its echo figures as they stand now (a live call read through the API)."""
        keep_echo_figures(self.record.metadata, self._echo)
        return self.record

    # -- caller audio -----------------------------------------------------------------------------
    def push_audio(self, samples: np.ndarray) -> None:
        """Caller audio (int16 mono at `input_rate`). Judged inline (VAD, turn decision; the STT only buffers here),
        unless a turn decision waits for its evidence: then it waits its turn (`_judge`)."""
        if self.closed or samples.size == 0:
            return
        audio = self._resampler.process(samples) if self._resampler is not None else samples
        if self.observers.observers:
            now = self._since()
            self.observers.event(self.record, {"t": now, "type": "inbound", "samples": int(samples.size),
                                               "rate": self.input_rate})
            if audio.size:
                self.observers.audio(self.record, "caller", audio, PIPELINE_RATE, now)
        if self._echo is not None:  # the recording keeps what the caller sent; the VAD and the STT hear it cleaned
            audio = self._echo.process(audio)
            if (delay_ms := self._echo.delay_moved()) is not None:
                self.note("echo_delay", delay_ms=delay_ms)
            if self._echo.gate_opened():
                self.note("echo_gate_open")
        if audio.size == 0:
            return
        self._received += len(audio)
        self._arrivals.append((self._received, self._since()))
        self._unjudged.extend(audio[i:i + JUDGED_PIECE] for i in range(0, len(audio), JUDGED_PIECE))
        self._judge()

    def _judge(self) -> None:
        """Judge the received audio in order, up to a turn decision that parks for its evidence (`TurnTaking`)."""
        while self._unjudged and not self.turns.waiting and not self.closed:
            self._judge_piece(self._unjudged.popleft())

    def _evidence_in(self) -> None:
        """TurnTaking.on_ready: the evidence a parked decision waited for is in. Asked again off the caller's stack
        (the evidence may land inside a call of this session's own)."""
        self._loop.call_soon(self._decide_again)

    def _decide_again(self) -> None:
        if self.closed or self.turns.waiting:
            return
        self._on_vad_events(self.detector.decide_again())
        self._judge()

    def _judge_piece(self, audio: np.ndarray) -> None:
        self._vad_pos += len(audio)
        self._remember(audio)
        self.turns.push(audio)
        if self._stt_turn_active:
            self.stt.push(audio)
        self._on_vad_events(self.detector.push(audio))
        if self._speech_end is not None and self._vad_pos - self._speech_end >= SEARCH_SAMPLES:
            self._settle_speech_end()
        if self._speech_start is not None and self.state in (CallState.THINKING, CallState.SPEAKING):
            speech_ms = (self.detector.stream.samples_processed - self._speech_start) * 1000 / PIPELINE_RATE
            threshold = self.cfg.backchannel_max_ms if self._over_agent() else self.cfg.barge_in_min_speech_ms
            if speech_ms >= threshold and self._reply is not None:
                self._barge_in()

    def _on_vad_events(self, events) -> None:
        for ev in events:
            self.note("vad", kind=ev.kind)
            if ev.kind == "speech_start":
                self.turns.speech_started(ev.sample)
                self._on_speech_start(ev.sample)
            elif ev.kind == "speech_end":
                self._on_speech_end(ev.sample)
            elif ev.kind == "end_of_turn":
                self._on_end_of_turn()

    def _on_speech_end(self, sample: int) -> None:
        self._speech_end = sample
        self._speech_end_settled = False
        self._speech_start = None
        hearing = self._over_agent() and self._stt_turn_active  # its words decide (_check_backchannel)
        if not hearing:
            self._hold_output(False)  # a noise: the agent goes on
        audible = self._audible_end(sample)
        words_coming = False
        if self._stt_turn_active:
            self._next_timeline["speech_end"] = self._sample_time(audible)
            words_coming = self._start_early_reply()
        listening = self._stt_turn_active and self.state is CallState.LISTENING
        self.turns.speech_ended(audible, words_coming, awaited=listening)
        if hearing:
            self._check_backchannel()

    def _judged_up_to_now(self) -> bool:
        """The VAD has judged the caller's audio up to this moment: none waits unjudged, the VAD holds no speech it
        has yet to confirm, and the audio the caller has sent by now has come (at the pace of its least delayed
        recent chunk, so a loop that reads the socket late, or a caller's late packets, count as not yet judged)."""
        if not self._arrivals:
            return True
        if self._unjudged or self.detector is None or self.detector.stream.speech_pending:
            return False
        return self._received >= (self._since() - self._sample_due(0) - PACE_SLACK_S) * PIPELINE_RATE

    def _sample_due(self, sample: int) -> float:
        """When the caller's 16 kHz `sample` was due, at the pace of the least delayed recent chunk: unlike its
        arrival (`_sample_time`), not later for a loop that read the socket late."""
        if not self._arrivals:
            return self._sample_time(sample)
        recent = itertools.islice(reversed(self._arrivals), PACE_CHUNKS)
        return min(at - end / PIPELINE_RATE for end, at in recent) + sample / PIPELINE_RATE

    async def _caller_judged(self) -> None:
        """Before a reply's first audio: wait until the caller's audio up to now is judged (`_judged_up_to_now`), at
        most `calls.caller_audio_wait_ms`."""
        deadline = time.monotonic() + self.cfg.caller_audio_wait_ms / 1000
        while not self.closed and not self._judged_up_to_now() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def _remember(self, audio: np.ndarray) -> None:
        self._preroll.append(audio)
        self._preroll_len += len(audio)
        limit = int(PREROLL_S * PIPELINE_RATE)
        while self._preroll and self._preroll_len - len(self._preroll[0]) >= limit:
            self._preroll_len -= len(self._preroll.pop(0))

    def _audible_end(self, vad_end: int) -> int:
        """The VAD's speech end pulled back to the caller's last audible sound (see `vad/boundary.py`)."""
        if not self._preroll:
            return vad_end
        recent = np.concatenate(self._preroll)
        first = self._vad_pos - len(recent)
        return first + audible_end(recent, vad_end - first, PIPELINE_RATE)

    def _settle_speech_end(self) -> None:
        """The timeline's speech end taken again from the audio that came after the VAD reported it: at the report
        only `min_silence_ms` less the padding had come (~75 ms), too little to follow a soft final sound (a
        fricative the VAD scored as silence) to its end. Settled once `SEARCH_MS` has come, or at the end of turn
        if that is sooner (the caller audio kept, `PREROLL_S`, still reaches back over the search then)."""
        end = self._speech_end
        if end is None or self._speech_end_settled or "speech_end" not in self._next_timeline:
            return
        self._next_timeline["speech_end"] = self._sample_time(self._audible_end(end))
        self._speech_end_settled = self._vad_pos - end >= SEARCH_SAMPLES

    def _on_speech_start(self, sample: int) -> None:
        self._speech_start = sample
        self._speech_due = self._sample_due(sample)
        self._speech_end = None
        self._last_activity = time.monotonic()
        if self.cfg.hold_on_speech and self._reply is not None and self.state in (CallState.THINKING,
                                                                                   CallState.SPEAKING):
            self._hold_output(True)  # stop the agent's audio now; the barge-in decision comes a little later
        if self._early is not None:  # the caller goes on: the reply started at their pause is not wanted
            self._drop_early_reply()
            self.stt.resume()
        if self._stt_turn_active:
            return
        # Start the STT turn at the speech start: hand it the buffered audio from there on.
        buffered = np.concatenate(self._preroll) if self._preroll else np.zeros(0, np.int16)
        first = self._vad_pos - len(buffered)
        begin = max(first, sample - int(STT_LEAD_S * PIPELINE_RATE))
        self._stt_turn_active = True
        self._next_timeline = {"speech_start": self._sample_time(sample)}
        self._stt_vad_start = begin
        self._stt_sample_start = self.stt.samples_pushed
        self.stt.push_before_speech(buffered[begin - first:sample - first])
        self.stt.push(buffered[sample - first:])

    def _stt_end(self) -> int | None:
        """The VAD's speech end as a sample of the STT stream (None: the turn ended without one)."""
        end = self._speech_end
        return None if end is None else self._stt_sample_start + (end - self._stt_vad_start)

    def _on_end_of_turn(self) -> None:
        decision = self.turns.decision_record()
        waited = self.turns.evidence_waited()
        self.turns.turn_ended()
        if not self._stt_turn_active:
            return
        self._stt_turn_active = False
        if self.state is not CallState.LISTENING:
            self.stt.cancel_turn()  # a noise or a backchannel while the agent talks
            return
        early, self._early = self._early, None
        if early is not None:
            self.stt.cancel_turn()  # the early reply's transcript is this turn's final
        else:
            future = self.stt.finish(self._stt_end())
        self._turns += 1
        now = self._since()
        self._settle_speech_end()
        timeline = {**self._next_timeline, "end_of_turn": now}
        timeline.setdefault("speech_end", now)  # set at the VAD's speech_end, unless the turn ended without one
        self._next_timeline = {}
        self.state = CallState.THINKING
        reopened = self.turns.take_reopened()
        if decision:
            self.note("turn_decision", turn=self._turns, **decision, **waited)
        if early is not None:
            early.record.decision, early.record.reopened = decision, reopened
            self._release(early, timeline)
            return
        record = TurnRecord(self._turns, timeline={**timeline, "stt_requested": now}, decision=decision,
                            reopened=reopened)
        self.record.turns.append(record)
        reply = _Reply(self._turns, self._open_speech(self._turns), record=record)
        reply.transcript = future
        self._start_reply(reply)

    def _on_partial(self, transcript) -> None:  # STT worker thread
        loop = self._loop
        if loop is None or self.closed:
            return
        at = self._since()
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._partial_arrived, transcript.text, transcript.stable_text, at)

    def _partial_arrived(self, text: str, stable: str, at: float) -> None:
        turn = self._turns + 1
        if self._stt_turn_active:
            self._next_timeline.setdefault("first_partial", at)
        self.note("stt_partial", turn=turn, text=text)
        self._emit("transcript", {"text": text, "final": False, "turn": turn})
        # Over the agent the words two partials agree on decide (`stable`): one partial of a syllable and the silence
        # before it may be a word the caller did not say ("Okay" heard as "I'm"), and it cut the agent.
        if (self._over_agent() and self._speech_start is not None and stable.strip() and not is_backchannel(stable)
                and not self._agent_heard_back(stable)):
            self._barge_in()  # the caller's words over the agent are more than a backchannel (or its echo: the
            return  # speech's end decides on all its words, `_check_backchannel`, with the agent held meanwhile)
        self._prefill_caller_words(stable)

    def _agent_heard_back(self, text: str) -> bool:
        """The caller's words so far may be the agent's own, heard back (the echo gate, where the call cancels echo)."""
        start = self._next_timeline.get("speech_start", self._since())
        return self._echo is not None and self._echo.echo_likely(text, start, self._since())

    def _prefill_caller_words(self, stable: str) -> None:
        """The caller is still speaking: the LLM may prefill the words committed so far, as `_generate` will send
        them (`calls.prefill_while_speaking`)."""
        if (not self.cfg.prefill_while_speaking or not stable or self.closed or self.state is not CallState.LISTENING
                or self._early is not None or self._pending_assistant or not self._stt_turn_active):
            return
        words = f"{self._unanswered} {stable}" if self._unanswered else stable
        try:
            self.res.engine.prefill_user_words(self.session, words)
        except Exception:  # a hint only: the turn prefills everything itself
            log.exception("call %s: prefilling the caller's words failed", self.call_id)

    def _emit_for(self, reply: _Reply, kind: str, data: dict[str, Any]) -> None:
        """A client event of `reply`: held while the reply is an early one, not yet confirmed."""
        if reply.held:
            reply.held_events.append((kind, data))
        else:
            self._emit(kind, data)

    def _emit(self, kind: str, data: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            self.output.event(kind, **data)
        except Exception:
            log.exception("call %s: sending a %s event failed", self.call_id, kind)

    # -- timeline and observers ---------------------------------------------------------------------
    def _since(self, mono: float | None = None) -> float:
        """Seconds since the call started (the zero of every timeline)."""
        return round((time.monotonic() if mono is None else mono) - self.record.started_mono, 4)

    def _sample_time(self, vad_sample: int) -> float:
        """When VAD sample `vad_sample` arrived: its chunk's arrival, less the audio after it in that chunk.

        Dated by arrival rather than by when the VAD reported it, so a busy event loop does not shorten what
        the timeline says the caller waited."""
        for end, at in self._arrivals:
            if end >= vad_sample:
                return round(at - (end - vad_sample) / PIPELINE_RATE, 4)
        end, at = self._arrivals[-1] if self._arrivals else (self._received, self._since())
        return round(at - (end - vad_sample) / PIPELINE_RATE, 4)

    def note(self, event_type: str, /, **data: Any) -> None:
        """One call event for the observers (the recorder's events file)."""
        if self.observers.observers:
            self.observers.event(self.record, {"t": self._since(), "type": event_type, **data})

    def agent_audio_sent(self, turn: int, samples: np.ndarray, rate: int) -> None:
        """The transport sent agent audio of `turn` to the caller (reported by the transport as it sends)."""
        reply = self._reply if self._reply is not None and self._reply.turn == turn else None
        if reply is not None and self._echo is not None:
            self._agent_words_out(reply, len(samples))
        record = reply.record if reply is not None else None
        if record is not None and "first_audio_sent" not in record.timeline:
            record.timeline["first_audio_sent"] = self._since()
            ms = derive_timings(record.timeline)
            record.timings_ms.update(ms)
            self._emit("turn", {"turn": turn, "timings_ms": ms})
        if self.observers.observers:
            now = self._since()
            self.observers.event(self.record, {"t": now, "type": "agent_audio", "turn": turn,
                                               "samples": int(samples.size)})
            self.observers.audio(self.record, "agent", samples, rate, now)

    def _agent_words_out(self, reply: _Reply, samples: int) -> None:
        """`samples` more of `reply`'s audio went out: the echo gate learns the words they began."""
        reply.sent_samples += samples
        heard = reply.stream.cursor.heard(reply.sent_samples)
        words = [*heard.words, heard.current] if heard.current is not None else list(heard.words)
        now = self._since()
        rate = self.output.sample_rate
        for word in words[reply.words_sent:]:
            self._echo.agent_said(now, word.text, (word.sample_end - word.sample_start) / rate)
        reply.words_sent = max(reply.words_sent, len(words))

    def _finish_turn(self, reply: _Reply) -> None:
        """Report a caller turn once: played out, interrupted, failed, or cut by the end of the call."""
        record = reply.record
        if record is None or reply.finished:
            return
        reply.finished = True
        if reply.wordless:
            if record in self.record.turns:
                self.record.turns.remove(record)
            if self._turns == reply.turn:
                self._turns -= 1
            return
        record.timings_ms.update(derive_timings(record.timeline))
        self.note("turn", turn=record.turn, user_text=record.user_text, agent_text=record.agent_text,
                  heard_text=record.heard_text, interrupted=record.interrupted, timings_ms=record.timings_ms,
                  timeline=record.timeline, error=record.error)
        keep_echo_figures(self.record.metadata, self._echo)  # the store and the metrics see them turn by turn
        self.observers.turn_finished(self.record, record)

    # -- replies ----------------------------------------------------------------------------------
    def _open_speech(self, turn: int):
        return self.res.synthesizer.open_stream(self.output.sample_rate, turn=turn)

    def _start_reply(self, reply: _Reply) -> None:
        self._reply = reply
        reply.task = asyncio.create_task(self._run_reply(reply), name=f"reply-{self.call_id}-{reply.turn}")

    async def _run_reply(self, reply: _Reply) -> None:
        record = reply.record
        try:
            if reply.greeting:
                self.state = CallState.SPEAKING
                reply.text = self.greeting
                reply.stream.say(self.greeting)
                await self._pump_audio(reply)
            else:
                # Shielded: a barge-in while this waits cancels the reply, not the caller's words (see below).
                transcript = await asyncio.shield(asyncio.wrap_future(reply.transcript))
                record.timeline["final_transcript"] = self._since()
                text = self._without_echo(reply, transcript.text.strip())
                record.user_text = text
                self.note("stt_final", turn=reply.turn, text=text)
                self._emit_for(reply, "transcript", {"text": text, "final": True, "turn": reply.turn})
                if not text:
                    self.turns.text_known(reply.segment, None)  # no words to score: the decision need not wait
                    await self._chores_done()  # a barge-in's late transcript may still be on its way
                    if not self._unanswered:  # a noise the STT made no words of, or the agent's own heard back
                        reply.wordless = True
                        reply.stream.cancel()
                        return
                await self._generate(reply, record, text)
            self.output.end_of_reply()
            while self.output.is_playing():
                await asyncio.sleep(0.02)
            if record is not None:
                record.timeline["playout_end"] = self._since()
            await self._act_after_reply(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one failed turn must not end the call
            log.exception("call %s: turn %d failed", self.call_id, reply.turn)
            self.turns.text_known(reply.segment, None)  # an early reply that failed scores no words
            if record is not None:
                record.error = f"{type(exc).__name__}: {exc}"
            reply.stream.cancel()
        finally:
            self._reply_done(reply)

    def _without_echo(self, reply: _Reply, text: str) -> str:
        """The turn's words less the agent's own, heard back (the echo gate, where the call cancels echo)."""
        if self._echo is None or not text:
            return text
        timeline = reply.record.timeline
        now = self._since()
        return self._echo_judged(text, timeline.get("speech_start", now), timeline.get("speech_end", now), reply.turn)

    def _echo_judged(self, text: str, start: float, end: float, turn: int, over_agent: bool = False) -> str:
        """`CallEcho.judge` (the call cancels echo), logged and noted (`echo_gated`) where it took words out."""
        kept = self._echo.judge(text, start, end, turn, over_agent)
        if kept != text:
            where = "over turn" if over_agent else "turn"
            log.info("call %s: %s %d: %r heard back from the agent, kept %r", self.call_id, where, turn, text, kept)
            self.note("echo_gated", turn=turn, text=text, kept=kept)
        return kept

    async def _chores_done(self) -> None:
        chores = [t for t in self._tasks if not t.done()]
        if chores:
            await asyncio.wait(chores)

    def _reply_done(self, reply: _Reply) -> None:
        if self._reply is reply:
            self._reply = None
            self._finish_turn(reply)
            if not self.closed:
                self.state = CallState.LISTENING
                self._last_activity = time.monotonic()

    async def _generate(self, reply: _Reply, record: TurnRecord, text: str) -> None:
        await self._chores_done()  # a barge-in's rollback or a dropped early reply changes the LLM session first
        reply.consumed = (self._pending_assistant, self._unanswered)
        messages = []
        if self._pending_assistant:
            messages.append({"role": "assistant", "content": self._pending_assistant})
            self._pending_assistant = None
        if self._unanswered:  # the words of a reopened turn, or of one the caller cut off before it was answered
            text, self._unanswered = f"{self._unanswered} {text}".strip(), None
            record.user_text = text
        messages.append({"role": "user", "content": text})
        engine = self.res.engine
        seed = None if self.seed is None else self.seed + reply.turn  # reproducible, and distinct per turn
        reply.turns_before = len(self.session.marks)
        # an early reply to speech tells the policy how finished the words are (keys need no such evidence)
        probe = reply.release is not None and record.dtmf is None and self.turns.policy.uses_text
        gen = engine.generate(self.session, messages, tier="priority", temperature=self.cfg.temperature, seed=seed,
                              end_probe=probe, **self._tool_options())
        if probe:
            gen.end_prob.add_done_callback(lambda f: self.turns.text_known(
                reply.segment, None if f.cancelled() or f.exception() is not None else f.result(), text))
        reply.llm_started = True
        record.timeline["llm_queued"] = self._since()
        self.note("llm_queued", turn=reply.turn)
        pump = asyncio.create_task(self._pump_audio(reply), name=f"tts-{self.call_id}")
        timeline = record.timeline
        generations = [gen]
        try:
            try:
                await self._speak(reply, gen)
                while gen.tool_calls and len(generations) <= self.cfg.max_tool_rounds:  # the reply goes on after a call
                    results, say = await self._call_tools(reply, gen.tool_calls)
                    gen = engine.generate(self.session, results, tier="priority", temperature=self.cfg.temperature,
                                          seed=seed, **self._tool_options(len(generations), say))
                    generations.append(gen)
                    await self._speak(reply, gen)
            except LLMError as exc:  # the engine or its remote backend failed: an apology, and the call goes on
                self._llm_failed(reply, record, exc)
            if reply.stream.end_text() and "first_clause" not in timeline:
                timeline["first_clause"] = self._since()
            record.agent_text = reply.text
            self.note("agent_text", turn=reply.turn, text=reply.text, final=True)
            self._emit_for(reply, "agent_text", {"text": reply.text, "final": True, "turn": reply.turn})
            await pump
        finally:
            if not pump.done():
                pump.cancel()
            record.agent_text = reply.text
            stats = generations[0].stats  # what the engine did, even for a reply cut short by a hang-up
            record.prompt_tokens = stats.prompt_tokens
            record.cached_prompt_tokens = stats.cached_prompt_tokens
            record.output_tokens = sum(g.stats.output_tokens for g in generations)

    async def _speak(self, reply: _Reply, gen) -> None:
        """Pass one generation's text to the TTS as it comes (a reply that calls a tool has more than one: its
        `pieces` map the text to the tokens of the latest, the one a barge-in rolls back)."""
        timeline = reply.record.timeline
        reply.generation = gen
        reply.tokens, reply.pieces = 0, []
        async for piece in gen:
            if "first_token" not in timeline:
                self._engine_times(gen.stats, timeline)
                self.note("first_token", turn=reply.turn)
            self._say(reply, piece.text, len(piece.token_ids), gen)

    def _say(self, reply: _Reply, text: str, tokens: int, gen=None) -> None:
        """Hand a piece of the reply (``tokens`` of the engine's) to the TTS and to the client."""
        reply.text += text
        reply.tokens += tokens
        reply.pieces.append((len(reply.text), reply.tokens))
        if not text:
            return
        timeline = reply.record.timeline
        if reply.stream.push_text(text) and "first_clause" not in timeline:
            timeline["first_clause"] = self._since()
            if self.cfg.first_audio_llm_pause_ms and gen is not None:
                gen.pause(self.cfg.first_audio_llm_pause_ms / 1000)  # _pump_audio resumes it
        self._emit_for(reply, "agent_text", {"text": text, "final": False, "turn": reply.turn})

    def _llm_failed(self, reply: _Reply, record: TurnRecord, exc: LLMError) -> None:
        """The LLM could not answer this turn (or broke off its answer): log it, record it on the turn, and say
        `calls.apology` after whatever was already said, so the caller is never left in silence."""
        log.error("call %s: turn %d: the LLM failed: %s", self.call_id, reply.turn, exc)
        record.error = f"{type(exc).__name__}: {exc.message}"
        self.note("llm_error", turn=reply.turn, error=record.error)
        if self.cfg.apology:
            self._say(reply, f" {self.cfg.apology}" if reply.text else self.cfg.apology, 0)

    def _engine_times(self, stats, timeline: dict[str, float]) -> None:
        """The engine's own clock for the request: queued, prefill start, first token (now if it has none)."""
        for key, value in (("llm_queued", getattr(stats, "arrival", None)),
                           ("prefill_start", getattr(stats, "first_scheduled", None)),
                           ("first_token", getattr(stats, "first_token", None))):
            if value:
                timeline[key] = self._since(value)
        timeline.setdefault("first_token", self._since())

    async def _pump_audio(self, reply: _Reply) -> None:
        """Move TTS frames to the transport as they are synthesized."""
        stream = reply.stream
        first = True
        while True:
            frame = stream.read(0)
            if frame is None:
                if stream.cancelled or (stream.done and stream.queued_frames == 0):
                    break
                await asyncio.sleep(0.005)
                continue
            if reply.first_audio is None:
                reply.first_audio = time.monotonic()
                if reply.generation is not None:
                    reply.generation.resume()
                if reply.record is not None:
                    reply.record.timeline["first_audio_synth"] = self._since(reply.first_audio)
            if reply.held:
                await reply.release.wait()
            if first:
                first = False
                await self._caller_judged()
                if stream.cancelled:  # the caller went on meanwhile: reopened, or a barge-in
                    break
            if self.state is CallState.THINKING and self._reply is reply:
                self.state = CallState.SPEAKING
            self.output.play(frame.samples, (reply.turn, frame.start_sample, len(frame.samples)))
            self._last_activity = time.monotonic()
        if stream.error is not None:
            raise stream.error


def _int_param(value: Any) -> int | None:
    """A call's integer parameter (`seed`, `max_reply_tokens`): an int, or digits, since providers pass custom
    parameters as strings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def call_outcome(end_reason: str, error: str | None = None) -> str:
    """What the call store records of how a call ended."""
    if error:
        return "error"
    if end_reason == "idle_timeout":
        return "idle_timeout"
    if end_reason == "disconnected":  # the socket went away without the provider's stop message
        return "dropped"
    return "completed"
