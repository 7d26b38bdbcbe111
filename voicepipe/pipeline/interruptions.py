"""Caller speech over the agent: barge-in (stop, clear, roll the LLM session back to what was heard), reopening a
turn the caller went on with before any of its reply was sent, backchannels, and holding the agent's audio."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from voicepipe.observability.records import TurnRecord
from voicepipe.pipeline.call_types import CallState, _Reply
from voicepipe.turns.backchannel import is_backchannel

log = logging.getLogger("voicepipe.pipeline.session")  # the call's log lines keep the session's logger


class Interruptions:
    """CallSession's barge-in, reopen, backchannel and hold machinery (a mixin).

    Reads `cfg`, `stt`, `turns`, `output`, `session`, `closed`, `res.engine`, `_echo` (the echo gate), `_speech_due`
    (when the caller's latest speech began); reads and writes `_reply` and `state` (an interruption hands the call
    back to the caller: LISTENING), `_holding`, `_turns`, `_stt_turn_active` (speech that was echo) and
    `_next_timeline` (a reopened turn), `_pending_assistant` / `_unanswered`, and `record` (`barge_ins`, `turns`,
    `greeting_heard`). Uses CallSession's `_finish_turn`, `_stt_end`, `_echo_judged`, `_emit`, `note`, `_since` and
    `_spawn`."""

    def _over_agent(self) -> bool:
        """The agent's audio is going out and caller speech over it waits for its words (`calls.backchannels`)."""
        return self.cfg.backchannels and self.state is CallState.SPEAKING and self._reply is not None

    def _check_backchannel(self) -> None:
        """Caller speech over the agent ended: its words decide whether it was a backchannel (the agent goes on, where
        it stopped if `hold_on_speech` held it) or an interruption."""
        reply = self._reply
        future = asyncio.wrap_future(self.stt.peek(self._stt_end()))
        segment = self.turns.segment
        spoken = (self._next_timeline.get("speech_start", self._since()), self._since())
        future.add_done_callback(lambda f: self._backchannel_heard(reply, segment, spoken, f))

    def _backchannel_heard(self, reply: _Reply, segment: int, spoken: tuple[float, float],
                           future: asyncio.Future) -> None:
        if self._reply is not reply or self.turns.segment != segment or self.closed:
            return  # the reply ended, or the caller spoke again (that speech decides)
        failed = future.cancelled() or future.exception() is not None
        text = "" if failed else future.result().text.strip()
        if text and self._echo is not None:  # the agent's own words heard back are no words: as a noise, it goes on
            kept = self._echo_judged(text, *spoken, reply.turn, over_agent=True)
            if not kept:  # its audio is no caller's turn: the caller's next words start their own
                self.stt.cancel_turn()
                self._stt_turn_active = False
            text = kept
        if text and not is_backchannel(text):
            self._barge_in()
            return
        if text:
            log.info("call %s: backchannel %r over turn %d", self.call_id, text, reply.turn)
            if reply.record is not None:
                reply.record.backchannels.append(text)
            self.note("backchannel", turn=reply.turn, text=text)
            self._emit("transcript", {"text": text, "final": True, "turn": reply.turn, "backchannel": True})
        self._hold_output(False)  # a backchannel, or a noise with no words: the agent goes on
        self.stt.resume()

    def _barge_in(self, by_keys: bool = False) -> None:
        """The caller talks over the agent (or presses a key, `by_keys`): stop now (synchronously), then clear and roll
        back. Where the caller went on before hearing any of the reply (`_went_on`), the turn is reopened instead."""
        reply = self._reply
        if reply.record is not None and not reply.greeting and self._went_on(reply.record, by_keys):
            self._reopen(reply, speech_goes_on=not by_keys)
            return
        self._reply = None  # from here on the caller's new turn owns the call
        self.state = CallState.LISTENING
        self.record.barge_ins += 1
        if reply.record is not None:
            reply.record.timeline["interrupted"] = self._since()
        reply.stream.cancel()
        if reply.task is not None:
            reply.task.cancel()
        heard = self.output.clear()
        self._hold_output(False)  # the clear dropped what was held; the next reply plays
        self._spawn(self._after_barge_in(reply, heard), "barge-in")

    def _went_on(self, record: TurnRecord, by_keys: bool) -> bool:
        """The caller went on with their turn rather than answering the reply: none of it was sent, or its speech
        began less than `calls.caller_reaction_ms` after the reply's first audio went out, too soon to be a reaction
        to it. The latter once per turn: a turn already reopened is barged in on (so a line that sends back the
        agent's first words cannot restart the reply over and over)."""
        sent = record.timeline.get("first_audio_sent")
        if sent is None:
            return True
        reaction = self.cfg.caller_reaction_ms / 1000
        return (reaction > 0 and not by_keys and not record.reopened and self._speech_due is not None
                and self._speech_due < sent + reaction)

    def _reopen(self, reply: _Reply, speech_goes_on: bool = True) -> None:
        """The caller went on speaking after the end-of-turn decision, before hearing the reply (`_went_on`): the
        reply and its LLM turn are dropped, and its words open the turn that goes on (a keypad turn when the caller
        went on with keys: the turn-taking's turn is not reopened then)."""
        self._reply = None
        self.state = CallState.LISTENING
        record = reply.record
        reply.stream.cancel()
        if reply.task is not None:
            reply.task.cancel()
        self.output.clear()  # what is queued goes, and the little that went out is no turn the caller heard
        self._hold_output(False)
        if record in self.record.turns:
            self.record.turns.remove(record)
        self._turns -= 1
        if speech_goes_on:
            self.turns.reopen(record.decision, self._since())
            for key in ("speech_start", "first_partial"):  # the turn began back then
                if key in record.timeline:
                    self._next_timeline[key] = record.timeline[key]
        log.info("call %s: turn %d reopened (%s)", self.call_id, reply.turn, record.decision.get("reason", "?"))
        self.note("turn_reopened", turn=reply.turn, decision=record.decision)
        self._spawn(self._after_reopen(reply), "reopen")

    async def _after_reopen(self, reply: _Reply) -> None:
        if reply.task is not None:
            await asyncio.wait([reply.task])
        if not reply.llm_started:
            words = await self._late_transcript(reply)
        else:
            words = reply.record.user_text  # it holds the words the reply took from `_unanswered` too
            self._pending_assistant = reply.consumed[0]
            if await self._session_idle():
                try:
                    self.res.engine.drop_turns(self.session, reply.turns_before)
                except Exception:
                    log.exception("call %s: dropping a reopened turn failed", self.call_id)
        self._unanswered = " ".join(w for w in (self._unanswered, words) if w) or None

    def _hold_output(self, on: bool) -> None:
        if on != self._holding:
            self._holding = on
            self.output.hold(on)
            self.note("hold" if on else "unhold")

    async def _after_barge_in(self, reply: _Reply, heard: list[Any]) -> None:
        played = _played_samples(heard, reply.turn)
        char_end = reply.stream.cursor.heard(played).char_end if played else 0
        heard_text = reply.text[:char_end].strip()
        log.info("call %s: barge-in on turn %d after %d samples: heard %r", self.call_id, reply.turn, played,
                 heard_text)
        self.note("barge_in", turn=reply.turn, heard_text=heard_text)
        if reply.greeting:
            self.record.greeting_heard = heard_text
            self._pending_assistant = heard_text or None
            return
        record = reply.record  # a reply whose audio was heard: its LLM had started (else `_reopen` took it)
        if record is not None:
            record.interrupted = True
            record.agent_text = reply.text
            record.heard_text = heard_text
            self._finish_turn(reply)
        heard_tokens = 0
        for text_end, tokens in reply.pieces:
            if text_end <= char_end:
                heard_tokens = tokens
        await self._rollback(heard_tokens)

    async def _late_transcript(self, reply: _Reply, timeout_s: float = 10.0) -> str:
        """The final transcript of a turn interrupted before the LLM started ("" if there is none)."""
        if reply.transcript is None:
            return ""
        try:
            transcript = await asyncio.wait_for(asyncio.wrap_future(reply.transcript), timeout_s)
        except Exception:  # timed out, failed or cancelled by the STT: the words are lost
            return ""
        return transcript.text.strip()

    async def _session_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait for a cancelled generation to leave the LLM session (within a step); False if the call ended."""
        session = self.session
        deadline = time.monotonic() + timeout_s
        while session is not None and session.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return not (self.closed or session is None or session.closed)

    async def _rollback(self, heard_tokens: int) -> None:
        if not await self._session_idle():
            return
        try:
            self.res.engine.rollback_reply(self.session, heard_tokens)
        except Exception:
            log.exception("call %s: rollback failed", self.call_id)


def _played_samples(heard: list[Any], turn: int) -> int:
    """How far into turn `turn`'s speech stream the caller heard, from the transport's `Heard` list."""
    played = 0
    for h in heard:
        origin = getattr(h, "origin", None)
        if isinstance(origin, tuple) and len(origin) == 3 and origin[0] == turn and h.heard > 0:
            played = max(played, origin[1] + min(h.heard, origin[2]))
    return played
