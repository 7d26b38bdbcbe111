"""The end-of-turn policy: evidence in, a decision out ("end" now, "wait", or "hold" for longer), with the reason.

Pure logic, no I/O. The call session asks it after every VAD window of the caller's silence, with what it knows
by then:

- the silence since the caller's speech ended (VAD);
- text completeness: P(the message ends where the caller's words end), from the call's own LLM (the early reply's
  prefill computes it, see `LLMEngine.generate(end_probe=True)`); it arrives after the speech end, once the STT
  has the words and the engine has prefilled them. Whether the STT itself ended the words with `.`, `?` or `!`
  counts too: Whisper hears the falling pitch of a finished sentence and writes "..." or nothing after a
  fragment, so such words are complete from `text_complete_marked` on, the others from `text_complete`;
- acoustic completeness: P(complete) from Smart Turn over the last 8 s of the caller's audio (voicepipe/turns/
  acoustic.py). Under `hybrid` the call scores the sound only once the words are known and unsure (the two compete
  for the same cores, and the words usually settle the pause alone); under `acoustic` at the speech end.

Each probability gives a verdict: complete (at or above its `*_complete` threshold), incomplete (below
`*_incomplete`) or unsure. The verdict sets the silence to wait for: `short_wait_ms` when complete, `long_wait_ms`
when the caller is mid-thought, `middle_wait_ms` when unsure or while the evidence is still on its way. `hybrid`
takes the words' verdict when they are sure and the sound's when they are not. `silence` is the old rule: a fixed
`vad.end_of_turn_silence_ms`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from voicepipe.config import TurnSettings

Action = Literal["end", "wait", "hold"]
Verdict = Literal["complete", "unsure", "incomplete"]
POLICIES = ("silence", "text", "acoustic", "hybrid")


@dataclass(frozen=True)
class TurnEvidence:
    silence_ms: float  # since the caller's speech ended (0 while they speak)
    text_prob: float | None = None  # None: not known (yet)
    acoustic_prob: float | None = None
    text_marked: bool = False  # the STT ended the words with a sentence mark (see `marked_end`)


@dataclass(frozen=True)
class TurnDecision:
    action: Action
    wait_ms: float  # the silence the evidence asks for
    reason: str

    def record(self, policy: str, evidence: TurnEvidence) -> dict[str, Any]:
        """The decision as the turn record keeps it (voicepipe/observability/records.py)."""
        return {"policy": policy, "action": self.action, "reason": self.reason,
                "silence_ms": round(evidence.silence_ms, 1), "wait_ms": self.wait_ms,
                "text_prob": _rounded(evidence.text_prob), "acoustic_prob": _rounded(evidence.acoustic_prob)}


def effective_policy(name: str, acoustic_loaded: bool, words_scored: bool = True) -> str:
    """The policy a call runs, given the evidence it can have. Without the acoustic model (`turn.acoustic = "auto"`
    with no model file, or `"off"`), `acoustic` and `hybrid` use the words alone; without scored words (the end
    probe runs in early replies: `calls.preemptive_generation` off), `text` and `hybrid` use the sound alone;
    with neither, the silence rule."""
    if name == "silence":
        return name
    sound = acoustic_loaded and name in ("acoustic", "hybrid")
    words = words_scored and (name in ("text", "hybrid") or not sound)  # `acoustic` without its model: the words
    if not (sound or words):
        return "silence"
    return "hybrid" if sound and words else "acoustic" if sound else "text"


class TurnPolicy:
    """One policy with its thresholds; `decide` is cheap and may be called after every VAD window."""

    def __init__(self, name: str, settings: TurnSettings, silence_ms: float) -> None:
        if name not in POLICIES:
            raise ValueError(f"unknown turn policy {name!r}; use one of {', '.join(POLICIES)}")
        self.name = name
        self.settings = settings
        self.silence_ms = float(silence_ms)

    @property
    def uses_text(self) -> bool:
        return self.name in ("text", "hybrid")

    @property
    def uses_acoustic(self) -> bool:
        return self.name in ("acoustic", "hybrid")

    @property
    def shortest_wait_ms(self) -> float:
        """No decision ends a turn before this much silence, whatever the evidence: until then it cannot matter."""
        if self.name == "silence":
            return self.silence_ms
        s = self.settings
        return float(min(s.short_wait_ms, s.middle_wait_ms, s.long_wait_ms))

    def needs_sound(self, text_prob: float | None, text_marked: bool = False) -> bool:
        """Whether the sound of a pause can change this policy's decision, given its words' P(complete) (None: not
        scored). Hybrid needs it only where the words are unsure."""
        if not self.uses_acoustic:
            return False
        return self.name == "acoustic" or self._text_verdict(text_prob, text_marked) in (None, "unsure")

    def decide(self, evidence: TurnEvidence) -> TurnDecision:
        if self.name == "silence":
            return self._act(evidence, self.silence_ms, None, f"silence of {self.silence_ms:g} ms")
        s = self.settings
        text = self._text_verdict(evidence.text_prob, evidence.text_marked) if self.uses_text else None
        sound = (_verdict(evidence.acoustic_prob, s.acoustic_complete, s.acoustic_incomplete)
                 if self.uses_acoustic else None)
        if self.name == "hybrid":
            verdict, reason = _hybrid(text, sound, s.acoustic_alone)
        else:
            verdict = text if self.name == "text" else sound
            reason = _say("text" if self.name == "text" else "sound", verdict)
        wait = {"complete": s.short_wait_ms, "unsure": s.middle_wait_ms, "incomplete": s.long_wait_ms,
                None: s.middle_wait_ms}[verdict]
        if self.uses_text and evidence.text_prob is not None and evidence.text_marked:
            reason += "; the words end with a sentence mark"
        return self._act(evidence, float(wait), verdict, reason)

    def _text_verdict(self, prob: float | None, marked: bool) -> Verdict | None:
        s = self.settings
        return _verdict(prob, s.text_complete_marked if marked else s.text_complete, s.text_incomplete)

    @staticmethod
    def _act(evidence: TurnEvidence, wait_ms: float, verdict: Verdict | None, reason: str) -> TurnDecision:
        if evidence.silence_ms >= wait_ms:
            return TurnDecision("end", wait_ms, reason)
        return TurnDecision("hold" if verdict == "incomplete" else "wait", wait_ms, reason)


def marked_end(words: str) -> bool:
    """The STT ended `words` with `.`, `?` or `!` (not with an ellipsis, its mark of a trailing-off fragment)."""
    words = words.rstrip()
    return words.endswith((".", "?", "!")) and not words.endswith(("..", "…"))


def _verdict(prob: float | None, complete: float, incomplete: float) -> Verdict | None:
    if prob is None:
        return None
    if prob >= complete:
        return "complete"
    return "incomplete" if prob < incomplete else "unsure"


def _say(source: str, verdict: Verdict | None) -> str:
    return "no evidence yet" if verdict is None else f"{source} says {_WORD[verdict]}"


def _hybrid(text: Verdict | None, sound: Verdict | None, acoustic_alone: bool) -> tuple[Verdict | None, str]:
    """Hybrid: words that are sure (complete or mid-thought) decide; unsure words leave it to the sound. Before the
    words are known the sound may hold the turn, but ends it only with `acoustic_alone`."""
    if text in ("complete", "incomplete"):
        return text, _say("text", text)
    if text == "unsure":
        if sound is None:
            return "unsure", "text says unsure; the sound is not known yet"
        return sound, f"text says unsure, sound says {_WORD[sound]}"
    if sound is None:
        return None, "no evidence yet"
    if sound == "complete" and not acoustic_alone:
        return "unsure", "sound says complete; waiting for the words"
    return sound, _say("sound", sound) + "; words not known yet"


_WORD = {"complete": "complete", "unsure": "unsure", "incomplete": "mid-thought"}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)
