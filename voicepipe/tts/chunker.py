"""Cut the LLM's token stream into speakable clauses. Pure: no I/O, no model.

Rules, in order:
- a sentence ends at . ! ? (and closing quotes or brackets after them) followed by whitespace, or at a
  newline; a '.' after an abbreviation (Dr., e.g.) or a single initial (J.) is not a sentence end, and after
  a.m./p.m./etc. only when the next word starts with a capital;
- a clause ends at , ; : followed by whitespace once it has at least `min_clause_chars` characters;
- because a cut needs whitespace after the mark, numbers (3.5, 9:40, 1,200) and URLs (example.com/a.b)
  are never split;
- a clause longer than `max_clause_chars` without any of these is cut at the last word boundary;
- optionally (`first_chunk_words` > 0), the first chunk of a stream is released at a word boundary once it
  has that many words, so the first audio starts sooner (at some cost to the first clause's prosody);
- `cut_words()` releases the complete words held so far, whatever the rules say (the speech is about to run dry);
- `flush()` releases the rest.
Each chunk keeps its character span in the whole text, so audio can be traced back to the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Never end a sentence after these (lowercase, without the final dot).
ABBREVIATIONS = frozenset({
    "dr", "mr", "mrs", "ms", "prof", "st", "jr", "sr", "mt", "ft", "no", "vs", "cf", "approx", "dept", "e.g",
    "i.e", "fig", "inc", "ltd", "co", "corp", "u.s", "gen", "col", "capt", "sgt", "rev", "hon",
})
# End a sentence after these only when the next word starts with a capital letter.
MAYBE_FINAL = frozenset({"etc", "a.m", "p.m", "am", "pm", "ave", "blvd", "rd"})

_SENTENCE = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)|\n")
_CLAUSE = re.compile(r"[,;:][\"'”’)\]]*(?=\s)")


@dataclass(frozen=True)
class TextChunk:
    text: str
    start: int  # character span in the whole text pushed so far
    end: int
    index: int  # 0 for the first chunk of the stream


class TextChunker:
    def __init__(self, min_clause_chars: int = 24, max_clause_chars: int = 200, first_chunk_words: int = 0) -> None:
        if min_clause_chars < 1 or max_clause_chars < min_clause_chars:
            raise ValueError(f"need 1 <= min_clause_chars <= max_clause_chars, got {min_clause_chars}, "
                             f"{max_clause_chars}")
        if first_chunk_words < 0:
            raise ValueError(f"first_chunk_words must be >= 0, got {first_chunk_words}")
        self.min_clause_chars = min_clause_chars
        self.max_clause_chars = max_clause_chars
        self.first_chunk_words = first_chunk_words
        self.text = ""
        self._start = 0  # first character not yet released
        self._count = 0

    def push(self, text: str) -> list[TextChunk]:
        """Add text (any size, e.g. one LLM token); return the chunks it completes."""
        if not isinstance(text, str):
            raise TypeError(f"expected str, got {type(text).__name__}")
        self.text += text
        chunks = []
        while (cut := self._next_cut()) is not None:
            chunk = self._release(cut)
            if chunk is not None:
                chunks.append(chunk)
        return chunks

    def cut_words(self) -> list[TextChunk]:
        """Release the complete words held so far (a word is complete once whitespace follows it)."""
        complete = re.sub(r"\S+$", "", self.text[self._start:]).rstrip()  # without a word that may still grow
        if not complete:
            return []
        chunk = self._release(self._start + len(complete))
        return [chunk] if chunk is not None else []

    def flush(self) -> list[TextChunk]:
        """End of the text: release whatever is left."""
        chunk = self._release(len(self.text))
        return [chunk] if chunk is not None else []

    def _next_cut(self) -> int | None:
        pending = self.text[self._start:]
        cuts = []
        for m in _SENTENCE.finditer(pending):
            if m.group() == "\n" or self._is_sentence_end(pending, m.start(), m.end()) is True:
                cuts.append(m.end())
                break
        head = len(pending) - len(pending.lstrip())
        for m in _CLAUSE.finditer(pending):
            if m.end() - head >= self.min_clause_chars:
                cuts.append(m.end())
                break
        if cuts:
            return self._start + min(cuts)
        if self._count == 0 and self.first_chunk_words:
            words = list(re.finditer(r"\S+(?=\s)", pending))
            for m in words[self.first_chunk_words - 1:]:
                if m.group().lower().rstrip(".") not in ABBREVIATIONS:
                    return self._start + m.end()
        if len(pending.strip()) > self.max_clause_chars:
            limit = head + self.max_clause_chars
            space = pending.rfind(" ", head + 1, limit + 1)
            return self._start + (space if space > head else limit)
        return None

    def _is_sentence_end(self, pending: str, mark_start: int, mark_end: int) -> bool | None:
        """True, False, or None when the next word has not arrived yet (wait for more text)."""
        if pending[mark_start] != ".":
            return True
        word = re.search(r"(\S+)$", pending[:mark_start])
        token = word.group(1).lower().lstrip("(\"'“‘") if word else ""
        if token in ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
            return False
        if token in MAYBE_FINAL:
            rest = pending[mark_end:].lstrip()
            if not rest:
                return None
            return rest[0].isupper()
        return True

    def _release(self, cut: int) -> TextChunk | None:
        raw = self.text[self._start:cut]
        begin = self._start + (len(raw) - len(raw.lstrip()))
        end = self._start + len(raw.rstrip())
        self._start = cut
        if end <= begin:
            return None
        chunk = TextChunk(self.text[begin:end], begin, end, self._count)
        self._count += 1
        return chunk
