"""One call's end-of-turn evidence, and the decisions the policy (voicepipe/turns/policy.py) takes on it.

The call's `TurnDetector` asks `decide(view)` after every VAD window. The evidence belongs to the caller's latest
speech segment: a new speech start clears it, and evidence that arrives for an older segment is dropped.
- words: the early reply's prefill gives P(end of message) (`text_known`, from the call session) for the transcript
  of the audio up to the VAD's speech end;
- sound: Smart Turn scores the turn's audio up to the speech end (its last 8 s) on a worker thread. When the words
  are being scored it waits for them: on two cores the two would slow each other down, the words come first
  (their prefill takes tens of ms), and under `hybrid` the sound is then scored only if the words are unsure.

Decisions follow the audio, not the clock: once a pause's silence is long enough for any evidence to end the turn
(`TurnPolicy.shortest_wait_ms`) while evidence it awaits is still on its way, `decide` parks (`waiting`): the call
stops judging its audio there, and `on_ready` tells it to ask again once the evidence is in. So each decision is
taken at the same VAD window with the same evidence however late the words or the sound land, and a caller who
goes on during that wait is heard after the decision, as in a quick run. The wait is bounded
(`turn.evidence_wait_ms` from the speech end): past it the decision goes on without what is missing, and says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from voicepipe.audio import AudioBuffer
from voicepipe.turns.policy import TurnDecision, TurnEvidence, TurnPolicy, marked_end
from voicepipe.vad.turn import TurnView

log = logging.getLogger(__name__)

ACOUSTIC_SECONDS = 8.0  # what Smart Turn listens to
PRE_SPEECH_S = 0.3  # audio before the turn's first speech start that it hears too


class TurnTaking:
    def __init__(self, policy: TurnPolicy, acoustic: Any | None, sample_rate: int,
                 evidence_wait_ms: float = 1000.0) -> None:
        self.policy = policy
        self.acoustic = acoustic if policy.uses_acoustic else None  # voicepipe.turns.acoustic.SmartTurn
        self.rate = sample_rate
        self.evidence_wait_s = evidence_wait_ms / 1000
        self._audio = AudioBuffer(sample_rate, ACOUSTIC_SECONDS)
        self._pushed = 0
        self._turn_start: int | None = None  # where the turn's audio begins, in pushed samples
        self._ended_turn_start: int | None = None  # the same for the turn that ended last (a reopen goes back to it)
        self.segment = 0  # counts speech starts
        self.text_prob: float | None = None
        self.text_marked = False
        self.acoustic_prob: float | None = None
        self.last: tuple[TurnDecision, TurnEvidence] | None = None
        self.reopened: list[dict[str, Any]] = []  # decisions the caller reopened, for the turn that goes on
        self._scoring: asyncio.Task | None = None
        self._words_known = asyncio.Event()  # the words of the segment the sound waits for are in (or moot)
        # the evidence this segment's decision waits for (`speech_ended`), and since when it has waited
        self._words_pending = self._sound_pending = False
        self._awaited = False  # this segment's decision parks while they are pending
        self._deadline: asyncio.TimerHandle | None = None  # the bound of the wait for them
        self._parked_at: float | None = None
        self.waiting = False  # `decide` parked for evidence: ask again after `on_ready`
        self.parked_ms = 0.0  # how long the decision that ended the turn waited for its evidence
        self.gave_up: list[str] = []  # evidence the decision went on without, past the bound
        self.on_ready: Callable[[], None] | None = None
        # called as ("speech_end" | "text" | "acoustic", segment, value) when the VAD reports a speech end or a
        # piece of evidence lands (`voicepipe bench turns` records the times)
        self.on_evidence: Callable[[str, int, float | None], None] | None = None

    def push(self, audio: np.ndarray) -> None:
        if self.acoustic is not None:
            self._audio.append(audio)
        self._pushed += len(audio)

    def speech_started(self, sample: int) -> None:
        """The caller speaks (again): what was known of their last pause no longer holds."""
        self.segment += 1
        self.text_prob = self.acoustic_prob = None
        self.text_marked = False
        self.last = None
        self.parked_ms, self.gave_up = 0.0, []
        self._stop_awaiting()
        self._words_known.set()  # a sound still waiting for the old words gives up
        if self._turn_start is None:
            self._turn_start = max(0, sample - int(PRE_SPEECH_S * self.rate))

    def speech_ended(self, end: int, words_coming: bool = False, awaited: bool = False) -> None:
        """Score the sound of the turn up to its speech end `end` (a pushed sample), off the event loop; it lands as
        evidence for this segment. The silence after the speech stays out: Smart Turn hears a fragment followed by
        0.3 s of silence as complete. `words_coming`: the call is scoring the words of this pause (the sound waits
        for them). `awaited`: this pause's decision waits for its evidence (the call is listening: a pause over the
        agent's speech ends no turn, and its barge-in must not wait)."""
        self._tell("speech_end", self.segment, None)
        self._words_pending = words_coming
        scores_sound = self.acoustic is not None and self._turn_start is not None
        self._sound_pending = scores_sound
        self._awaited = awaited
        if words_coming or scores_sound:
            self._deadline = asyncio.get_running_loop().call_later(self.evidence_wait_s, self._give_up, self.segment)
        if not scores_sound:
            return
        audio = self._audio.latest(self._pushed - self._turn_start)  # at most the last ACOUSTIC_SECONDS
        audio = audio[:max(0, len(audio) - (self._pushed - end))]
        self._words_known = asyncio.Event()
        if not words_coming:
            self._words_known.set()
        self._scoring = asyncio.get_running_loop().create_task(self._score(audio, self.segment, self._words_known))

    async def _score(self, audio: np.ndarray, segment: int, words_known: asyncio.Event) -> None:
        try:
            await words_known.wait()
            if segment != self.segment or not self.policy.needs_sound(self.text_prob, self.text_marked):
                return
            try:
                prob = await asyncio.to_thread(self.acoustic.predict, audio)
            except Exception:
                log.exception("the acoustic turn model failed; this pause goes on without it")
                return
            if segment == self.segment:
                self.acoustic_prob = prob
                self._tell("acoustic", segment, prob)
        finally:
            if segment == self.segment:
                self._sound_pending = False
                self._evidence_landed()

    def text_known(self, segment: int, prob: float | None, words: str = "") -> None:
        """The words' P(complete) for `segment` (None: the early reply brought none: no words, or it failed). For a
        segment that is over (the caller spoke again before it landed) it changes nothing, but `on_evidence` still
        hears when it landed: a decision parked for it would have waited for it (`voicepipe bench turns`, whose
        recording never parks, replays that)."""
        if segment != self.segment:
            if prob is not None:
                self._tell("text", segment, prob)
            return
        if prob is not None:
            self.text_prob, self.text_marked = prob, marked_end(words)
            self._tell("text", segment, prob)
        self._words_pending = False
        self._words_known.set()
        self._evidence_landed()

    def _tell(self, kind: str, segment: int, value: float | None) -> None:
        if self.on_evidence is not None:
            self.on_evidence(kind, segment, value)

    def _pending(self) -> bool:
        """Evidence this segment's decision waits for is still on its way."""
        if not self._awaited:
            return False
        return self._words_pending or (self._sound_pending and self.policy.needs_sound(self.text_prob,
                                                                                       self.text_marked))

    def _evidence_landed(self) -> None:
        if not (self._words_pending or self._sound_pending):
            self._stop_awaiting()
        if self.waiting and not self._pending():
            self.waiting = False
            if self._parked_at is not None:
                self.parked_ms = (time.monotonic() - self._parked_at) * 1000
            if self.on_ready is not None:
                self.on_ready()

    def _give_up(self, segment: int) -> None:
        """The bound: the decision goes on without the evidence still missing."""
        if segment != self.segment or self._deadline is None:
            return
        missing = [name for name, pending in (("words", self._words_pending), ("sound", self._sound_pending))
                   if pending]
        if self._awaited:
            log.warning("the end-of-turn decision went on without the %s of a pause after %.0f ms "
                        "(turn.evidence_wait_ms): this decision depends on the machine's speed",
                        " and ".join(missing), self.evidence_wait_s * 1000)
        self.gave_up = missing
        self._words_pending = self._sound_pending = False
        self._words_known.set()  # the sound, if it waits for the words, is scored now
        self._evidence_landed()

    def _stop_awaiting(self) -> None:
        self._awaited = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def decide(self, view: TurnView) -> bool:
        """The TurnDetector's end-of-turn question, asked after every VAD window."""
        if not view.speech_seen or view.in_speech:
            self.waiting = False
            return False
        if self._pending() and view.silence_ms >= self.policy.shortest_wait_ms:
            if not self.waiting:
                self.waiting, self._parked_at = True, time.monotonic()
            return False
        evidence = TurnEvidence(view.silence_ms, self.text_prob, self.acoustic_prob, self.text_marked)
        decision = self.policy.decide(evidence)
        self.last = (decision, evidence)
        return decision.action == "end"

    def decision_record(self) -> dict[str, Any]:
        """The decision that ended the turn, as the turn record keeps it ({} when something else ended it)."""
        if self.last is None or self.last[0].action != "end":
            return {}
        decision, evidence = self.last
        return decision.record(self.policy.name, evidence)

    def evidence_waited(self) -> dict[str, Any]:
        """How the decision that ended the turn waited for its evidence, for the call's events: how long it was parked
        (ms) and what it went on without, past the bound."""
        return {"evidence_wait_ms": round(self.parked_ms, 1), "evidence_missing": list(self.gave_up)}

    def turn_ended(self) -> None:
        self._ended_turn_start, self._turn_start = self._turn_start, None
        self.last = None
        self.parked_ms, self.gave_up = 0.0, []

    def reopen(self, decision: dict[str, Any], t: float) -> None:
        """The caller went on after `decision` ended their turn: the turn goes on, from where it began."""
        self.reopened.append({**decision, "t": t})
        if self._ended_turn_start is not None:
            self._turn_start = self._ended_turn_start

    def take_reopened(self) -> list[dict[str, Any]]:
        reopened, self.reopened = self.reopened, []
        return reopened

    def close(self) -> None:
        self._stop_awaiting()
        if self._scoring is not None:
            self._scoring.cancel()
