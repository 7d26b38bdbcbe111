"""LocalAgreement: commit the words on which two successive decodes of a growing utterance agree.

Pure logic, no model: a hypothesis is a list of `Word`s (text plus the decoder tokens that produced it),
and the committed words grow monotonically. The last word of a hypothesis is never committed, because
the audio may end in the middle of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Word:
    text: str  # as decoded, with its leading space and punctuation
    tokens: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """What two decodes must agree on: the word lowercased, without punctuation."""
        return _key(self.text)


def _key(text: str) -> str:
    return re.sub(r"[^\w']", "", text.lower())


def same_words(a: list[Word], b: list[Word]) -> bool:
    return [w.key for w in a] == [w.key for w in b]


@dataclass
class LocalAgreement:
    """Tracks committed words across successive hypotheses of one utterance.

    `update(hypothesis)` takes the full hypothesis (committed words first, as the decoder was forced to
    produce them) and returns the words newly committed.
    """

    holdback: int = 1  # words at the end of a hypothesis that are never committed
    committed: list[Word] = field(default_factory=list)
    previous: list[Word] | None = None  # the last hypothesis, beyond the committed words

    def update(self, hypothesis: list[Word]) -> list[Word]:
        n = len(self.committed)
        if [w.key for w in hypothesis[:n]] != [w.key for w in self.committed]:
            # The decoder strayed from the committed prefix: keep what is committed, compare the rest.
            tail = hypothesis[n:] if len(hypothesis) > n else []
        else:
            tail = hypothesis[n:]
        new: list[Word] = []
        if self.previous is not None:
            limit = max(0, len(tail) - self.holdback)
            for i in range(min(limit, len(self.previous))):
                if tail[i].key != self.previous[i].key or not tail[i].key:
                    break
                new.append(tail[i])
        self.committed.extend(new)
        self.previous = tail[len(new):]
        return new

    @property
    def committed_tokens(self) -> list[int]:
        return [t for w in self.committed for t in w.tokens]

    @property
    def committed_text(self) -> str:
        return "".join(w.text for w in self.committed).strip()

    def text_with(self, unstable: list[Word] | None = None) -> str:
        rest = self.previous if unstable is None else unstable
        return ("".join(w.text for w in self.committed) + "".join(w.text for w in rest or [])).strip()

    def reset(self) -> None:
        self.committed = []
        self.previous = None


def group_words(tokens: list[int], decode) -> list[Word]:
    """Split decoder tokens into words: a word starts at a token whose text begins with a space.

    `decode(token_id) -> str` gives one token's text. Tokens that do not start a word (suffixes,
    punctuation) join the word before them.
    """
    words: list[list[int]] = []
    for tok in tokens:
        piece = decode(tok)
        if not words or piece.startswith(" "):
            words.append([tok])
        else:
            words[-1].append(tok)
    return [Word("".join(decode(t) for t in ids), tuple(ids)) for ids in words]
