"""One call's end-of-turn evidence, and the decisions the policy (voicepipe/turns/policy.py) takes on it.

The call's `TurnDetector` asks `decide(view)` after every VAD window. The evidence belongs to the caller's latest
speech segment: a new speech start clears it, and evidence that arrives for an older segment is dropped.
- words: the early reply's prefill gives P(end of message) (`text_known`, from the call session);
- sound: Smart Turn scores the turn's audio up to the speech end (its last 8 s) on a worker thread. When the words
  are being scored it waits for them: on two cores the two would slow each other down, the words come first
  (their prefill takes tens of ms), and under `hybrid` the sound is then scored only if the words are unsure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from voicepipe.audio import AudioBuffer
from voicepipe.turns.policy import TurnDecision, TurnEvidence, TurnPolicy, marked_end
from voicepipe.vad.turn import TurnView

log = logging.getLogger(__name__)

ACOUSTIC_SECONDS = 8.0  # what Smart Turn listens to
PRE_SPEECH_S = 0.3  # audio before the turn's first speech start that it hears too
WORDS_WAIT_S = 0.5  # the sound waits at most this long for the words (an empty transcript brings none)


class TurnTaking:
    def __init__(self, policy: TurnPolicy, acoustic: Any | None, sample_rate: int) -> None:
        self.policy = policy
        self.acoustic = acoustic if policy.uses_acoustic else None  # voicepipe.turns.acoustic.SmartTurn
        self.rate = sample_rate
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
        self._words_known.set()  # a sound still waiting for the old words gives up
        if self._turn_start is None:
            self._turn_start = max(0, sample - int(PRE_SPEECH_S * self.rate))

    def speech_ended(self, end: int, words_coming: bool = False) -> None:
        """Score the sound of the turn up to its speech end `end` (a pushed sample), off the event loop; it lands as
        evidence for this segment. The silence after the speech stays out: Smart Turn hears a fragment followed by
        0.3 s of silence as complete. `words_coming`: the call is scoring the words of this pause (the sound waits
        for them)."""
        self._tell("speech_end", self.segment, None)
        if self.acoustic is None or self._turn_start is None:
            return
        audio = self._audio.latest(self._pushed - self._turn_start)  # at most the last ACOUSTIC_SECONDS
        audio = audio[:max(0, len(audio) - (self._pushed - end))]
        self._words_known = asyncio.Event()
        if not words_coming:
            self._words_known.set()
        self._scoring = asyncio.get_running_loop().create_task(self._score(audio, self.segment, self._words_known))

    async def _score(self, audio: np.ndarray, segment: int, words_known: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(words_known.wait(), WORDS_WAIT_S)
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

    def text_known(self, segment: int, prob: float | None, words: str = "") -> None:
        """The words' P(complete) for `segment` (None: the early reply brought none)."""
        if segment != self.segment:
            return
        if prob is not None:
            self.text_prob, self.text_marked = prob, marked_end(words)
            self._tell("text", segment, prob)
        self._words_known.set()

    def _tell(self, kind: str, segment: int, value: float | None) -> None:
        if self.on_evidence is not None:
            self.on_evidence(kind, segment, value)

    def decide(self, view: TurnView) -> bool:
        """The TurnDetector's end-of-turn question, asked after every VAD window."""
        if not view.speech_seen or view.in_speech:
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

    def turn_ended(self) -> None:
        self._ended_turn_start, self._turn_start = self._turn_start, None
        self.last = None

    def reopen(self, decision: dict[str, Any], t: float) -> None:
        """The caller went on after `decision` ended their turn: the turn goes on, from where it began."""
        self.reopened.append({**decision, "t": t})
        if self._ended_turn_start is not None:
            self._turn_start = self._ended_turn_start

    def take_reopened(self) -> list[dict[str, Any]]:
        reopened, self.reopened = self.reopened, []
        return reopened

    def close(self) -> None:
        if self._scoring is not None:
            self._scoring.cancel()
