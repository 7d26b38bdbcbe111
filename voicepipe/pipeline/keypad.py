"""The keypad (DTMF): key presses collect into an entry that ends at the terminator (`calls.dtmf_terminator`), a
pause (`calls.dtmf_timeout_ms`) or `calls.dtmf_max_digits`, then enter the conversation as the caller's turn, the
text "[keypad: 4 2 1 7]" the LLM sees plainly. A key while the agent talks interrupts it as speech does; a key
while the caller's own speech turn is still open ends that turn, and its words open the keypad turn's message.

With `calls.preemptive_generation`, each key also starts the reply to the entry as it stands, held like a spoken
turn's early reply: the next key drops it, the entry's end releases it (its audio may already be synthesized)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass

from voicepipe.observability.records import TurnRecord
from voicepipe.pipeline.call_types import CallState, _Reply

log = logging.getLogger("voicepipe.pipeline.session")  # the call's log lines keep the session's logger

KEYS = frozenset("0123456789*#ABCD")


def keypad_text(entry: str) -> str:
    """What the LLM sees of a keypad entry."""
    return f"[keypad: {' '.join(entry)}]"


@dataclass(frozen=True)
class _Words:
    """A keypad turn's "transcript": what `_run_reply` reads from an STT final."""

    text: str


class Keypad:
    """CallSession's keypad (a mixin).

    Reads `cfg`, `state`, `closed`, `stt`, `_loop`, `_reply`; reads and writes `_keys`, `_keys_started`,
    `_keys_timer`, `_turns`, `_early` (a held reply to the keys so far has `record.dtmf` set), `_stt_turn_active`,
    `_next_timeline`, `_last_activity`, `state` and `record.turns`. Uses CallSession's `_barge_in`, `_release`,
    `_drop_early_reply`, `_run_reply`, `_stt_end`, `_open_speech`, `_start_reply`, `note` and `_since`."""

    def push_dtmf(self, digit: str) -> None:
        """One key press from the transport (0-9, *, #, A-D; anything else is logged and dropped)."""
        if self.closed:
            return
        if not isinstance(digit, str) or digit.upper() not in KEYS:
            log.info("call %s: ignoring key %r (not a DTMF digit)", self.call_id, digit)
            return
        digit = digit.upper()
        now = self._since()
        self.note("dtmf", digit=digit)
        self._last_activity = time.monotonic()
        if not self._keys:
            self._keys_started = now
        if self._reply is not None and self.state in (CallState.THINKING, CallState.SPEAKING):
            self._barge_in(by_keys=True)  # the agent stops as it does for speech
        self._cancel_keys_timer()
        if digit == self.cfg.dtmf_terminator:
            self._keypad_turn(self._keys or [digit])
            return
        self._keys.append(digit)
        if len(self._keys) >= self.cfg.dtmf_max_digits:
            self._keypad_turn(self._keys)
            return
        self._keys_timer = self._loop.call_later(self.cfg.dtmf_timeout_ms / 1000, self._keys_paused)
        self._speculate("".join(self._keys))

    def _keys_paused(self) -> None:
        self._keys_timer = None
        if self._keys and not self.closed:
            self._keypad_turn(self._keys)

    def _cancel_keys_timer(self) -> None:
        if self._keys_timer is not None:
            self._keys_timer.cancel()
            self._keys_timer = None

    def _speculate(self, entry: str) -> None:
        """Start the reply to `entry` now, held until the entry ends (and dropped if another key comes first)."""
        early = self._early
        if early is not None and early.record.dtmf is not None:
            self._drop_early_reply()  # the entry went on
        if (not self.cfg.preemptive_generation or self._early is not None or self._stt_turn_active
                or self.state is not CallState.LISTENING):
            return
        turn = self._turns + 1
        reply = _Reply(turn, self._open_speech(turn), record=TurnRecord(turn, dtmf=entry), release=asyncio.Event())
        reply.transcript = _with_keys(None, keypad_text(entry))
        self._early = reply
        self.note("early_reply", turn=turn)
        reply.task = asyncio.create_task(self._run_reply(reply), name=f"early-keys-{self.call_id}-{turn}")

    def _keypad_turn(self, keys: list[str]) -> None:
        """The entry is complete: it becomes the caller's turn (its held reply, when one answers the same keys)."""
        entry, started = "".join(keys), self._keys_started
        self._keys, self._keys_started = [], None
        early = self._early if self._early is not None and self._early.record.dtmf is not None else None
        if early is not None and early.record.dtmf != entry:
            self._drop_early_reply()
            early = None
        if self._reply is not None:  # a reply to speech began while the caller was typing
            self._barge_in(by_keys=True)
        words = self._end_speech_turn() if early is None else None
        self._turns += 1
        now = self._since()
        timeline = {"dtmf_start": started if started is not None else now, "dtmf_end": now, "end_of_turn": now}
        self.state = CallState.THINKING
        self.note("keypad", turn=self._turns, digits=entry)
        log.info("call %s: keypad entry %r is turn %d", self.call_id, entry, self._turns)
        if early is not None:
            self._early = None
            self._release(early, timeline)
            return
        record = TurnRecord(self._turns, dtmf=entry, timeline=timeline)
        self.record.turns.append(record)
        reply = _Reply(self._turns, self._open_speech(self._turns), record=record)
        reply.transcript = _with_keys(words, keypad_text(entry))
        self._start_reply(reply)

    def _end_speech_turn(self) -> concurrent.futures.Future | None:
        """The caller's speech turn still open (no end of turn yet) ends here, unanswered: its final transcript."""
        if not self._stt_turn_active:
            if self._early is not None:  # a held reply to keys the caller went on from
                self._drop_early_reply()
            return None
        self._stt_turn_active = False
        self._next_timeline = {}
        early = self._early
        if early is not None:  # its transcript is the turn's final; the reply itself is not wanted
            self._drop_early_reply()
            self.stt.cancel_turn()
            return early.transcript
        return self.stt.finish(self._stt_end())

    def _close_keypad(self) -> None:
        self._cancel_keys_timer()
        self._keys = []


def _with_keys(words: concurrent.futures.Future | None, keys: str) -> concurrent.futures.Future:
    """A future of the keypad turn's text: the caller's unanswered words (if any) and then the keys."""
    out: concurrent.futures.Future = concurrent.futures.Future()
    if words is None:
        out.set_result(_Words(keys))
        return out

    def done(f: concurrent.futures.Future) -> None:
        said = "" if f.cancelled() or f.exception() is not None else f.result().text.strip()
        out.set_result(_Words(f"{said} {keys}".strip()))

    words.add_done_callback(done)
    return out

