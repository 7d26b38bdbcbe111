"""Early replies (`calls.preemptive_generation`): the reply started at the VAD's speech end, held until the
end-of-turn decision, then released as the turn's reply, or dropped (with its LLM turn) if the caller goes on."""

from __future__ import annotations

import asyncio
import logging

from voicepipe.observability.records import TurnRecord
from voicepipe.pipeline.call_types import CallState, _Reply

log = logging.getLogger("voicepipe.pipeline.session")  # the call's log lines keep the session's logger


class EarlyReplies:
    """CallSession's early-reply machinery (a mixin).

    Reads `cfg`, `state`, `turns`, `stt`, `session`, `res.engine`; reads and writes `_early` (the held reply),
    `_reply` (a released one becomes it), `_pending_assistant` / `_unanswered` (a dropped reply gives back what
    its prompt took) and `record.turns`. Uses CallSession's `_open_speech`, `_run_reply`, `_reply_done`, `_stt_end`,
    `_emit`, `note`, `_since`, `_spawn` and `_session_idle`."""

    def _start_early_reply(self) -> bool:
        """At the VAD's speech end: take the transcript so far and start the reply, held until the end of turn.
        True when it started one that scores the words for the end-of-turn policy (`_generate`'s end probe)."""
        if not self.cfg.preemptive_generation or self.state is not CallState.LISTENING or self._early is not None:
            return False
        turn = self._turns + 1
        record = TurnRecord(turn, timeline={**self._next_timeline, "stt_requested": self._since()})
        reply = _Reply(turn, self._open_speech(turn), record=record, release=asyncio.Event(),
                       segment=self.turns.segment)
        reply.transcript = self.stt.peek(self._stt_end())
        self._early = reply
        self.note("early_reply", turn=turn)
        reply.task = asyncio.create_task(self._run_reply(reply), name=f"early-{self.call_id}-{turn}")
        return self.turns.policy.uses_text

    def _release(self, reply: _Reply, timeline: dict[str, float]) -> None:
        """The end of turn confirms an early reply: it becomes the turn's reply and may be heard."""
        for key, value in timeline.items():  # the reply's own events (it started before the end of turn) stay
            reply.record.timeline.setdefault(key, value)
        reply.record.timeline["end_of_turn"] = timeline["end_of_turn"]
        if "speech_end" in timeline:  # as settled after the reply started (_settle_speech_end)
            reply.record.timeline["speech_end"] = timeline["speech_end"]
        self.record.turns.append(reply.record)
        self._reply = reply
        reply.release.set()
        for kind, data in reply.held_events:
            self._emit(kind, data)
        reply.held_events.clear()
        if reply.task.done():  # it ended while held (an empty transcript, an error): end the turn now
            self._reply_done(reply)

    def _drop_early_reply(self) -> None:
        reply, self._early = self._early, None
        reply.stream.cancel()
        reply.task.cancel()
        if reply.llm_started:
            self._pending_assistant, self._unanswered = reply.consumed
        self.note("early_reply_dropped", turn=reply.turn)
        self._spawn(self._forget_early_turn(reply), "drop-early")

    async def _forget_early_turn(self, reply: _Reply) -> None:
        """Take a dropped early reply's turn out of the LLM session, once its generation has stopped."""
        await asyncio.wait([reply.task])
        if not reply.llm_started or not await self._session_idle():
            return
        try:
            self.res.engine.drop_turns(self.session, reply.turns_before)
        except Exception:
            log.exception("call %s: dropping an early reply's turn failed", self.call_id)
