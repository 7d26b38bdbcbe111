"""The text gate: caller words that are the agent's own words, heard back as they played.

What the canceller and the level gate leave of the echo can still reach the STT as words. The agent knows what it
said and when each word went out (`AgentWords`, fed from the TTS's word alignment as the transport sends the
audio), so words heard over it, or in its echo's tail, are compared with the agent's words of that moment: a
caller transcript made of them is echo (`is_echo`), and a run of them inside a caller's own words is taken out
(`without_echo`). Words match when they are the same once normalised, or close in spelling (the STT hears
"children" in an echo as "child"), so a caller's different words are kept.
"""

from __future__ import annotations

from collections import deque
from difflib import SequenceMatcher

from voicepipe.turns.backchannel import normalise

SIMILAR = 0.75  # a heard word this close in spelling to an agent word is that word (`SequenceMatcher.ratio`)
# A word's echo ends this long after the word has played out, past the echo's delay: the transport sends audio up
# to its pacing lead before it plays (the word is dated by its sending), and the room's tail.
SLACK_S = 0.35
KEPT_S = 30.0  # the agent's words are remembered this long
# Words too common to tell whose they are: a caller's "what is the capital of France" over an agent's story shares
# "is", "the" and "of" with it. A share of words is counted over the others, where there are any.
COMMON = frozenset({"a", "an", "and", "are", "at", "be", "do", "for", "i", "im", "in", "is", "it", "its", "me", "my",
                    "of", "on", "or", "so", "that", "the", "this", "to", "was", "we", "what", "you", "your"})
ECHO_RUN = 3  # this many of the agent's words in a row inside a caller's are echo (two, "Friday is", the caller's too)


class AgentWords:
    """The agent's words, each with when its audio went out to the caller and how long it plays (seconds)."""

    def __init__(self) -> None:
        self._words: deque[tuple[float, float, str]] = deque()  # (sent at, played out by, word)

    def sent(self, at: float, text: str, duration_s: float) -> None:
        """The audio of the agent's word `text` (`duration_s` long) started to go out at `at`."""
        self._words.extend((at, at + duration_s, word) for word in normalise(text).split())
        while self._words and self._words[0][0] < at - KEPT_S:
            self._words.popleft()

    def around(self, start: float, end: float, echo_delay_s: float) -> list[str]:
        """The agent's words whose echo, at most `echo_delay_s` late, can fall in the caller's speech from `start`
        to `end`, in order."""
        return [word for at, out, word in self._words if at <= end and out + echo_delay_s + SLACK_S >= start]


def _matches(heard: list[str], agent: list[str]) -> list[bool]:
    said = set(agent)
    return [w in said or any(SequenceMatcher(None, w, a).ratio() >= SIMILAR for a in said) for w in heard]


def is_echo(text: str, agent: list[str], share: float = 1.0) -> bool:
    """The caller's `text` is the agent's words (`agent`: `AgentWords.around` the speech): all of them, or at
    least `share` of them (of the words not `COMMON`, where there are any). "" is not."""
    heard = normalise(text).split()
    telling = [w for w in heard if w not in COMMON] or heard
    return bool(heard) and bool(agent) and sum(_matches(telling, agent)) >= share * len(telling)


def without_echo(text: str, agent: list[str]) -> str:
    """The caller's `text` less each run of `ECHO_RUN` or more words in a row that are the agent's (fewer the caller
    may well have said too); normalised words, or `text` itself when nothing was taken out."""
    heard = normalise(text).split()
    matched = _matches(heard, agent) if agent else [False] * len(heard)
    kept: list[str] = []
    run: list[str] = []
    for word, echo in zip(heard, matched, strict=True):
        if echo:
            run.append(word)
            continue
        kept.extend(run if len(run) < ECHO_RUN else [])
        run = []
        kept.append(word)
    kept.extend(run if len(run) < ECHO_RUN else [])
    return text if len(kept) == len(heard) else " ".join(kept)
