"""Table-driven tests of the pure text chunker."""

from __future__ import annotations

import pytest

from voicepipe.tts.chunker import TextChunker


def chunk_all(text: str, min_clause: int = 24, max_clause: int = 200, step: int = 0) -> list[str]:
    """Feed `text` whole (step 0) or `step` characters at a time, like LLM tokens; then flush."""
    chunker = TextChunker(min_clause, max_clause)
    pieces = [text] if step == 0 else [text[i: i + step] for i in range(0, len(text), step)]
    out = []
    for piece in pieces:
        out += chunker.push(piece)
    out += chunker.flush()
    for c in out:  # every chunk's span points at its text
        assert chunker.text[c.start: c.end] == c.text
    assert [c.index for c in out] == list(range(len(out)))
    return [c.text for c in out]


CASES = [
    ("empty", "", []),
    ("whitespace only", "   \n  ", []),
    ("one sentence, no end mark", "hello there", ["hello there"]),
    ("two sentences", "Hello there. How are you?", ["Hello there.", "How are you?"]),
    ("exclamation and quotes", 'He said "stop!" Then he left.', ['He said "stop!"', "Then he left."]),
    ("decimal number", "The rate is 3.5 percent today. Thanks.", ["The rate is 3.5 percent today.", "Thanks."]),
    ("clock time", "Your slot is at 9:40 on Monday, is that fine?",
     ["Your slot is at 9:40 on Monday,", "is that fine?"]),
    ("thousands", "It costs 1,200 dollars in total, plus tax and fees.",
     ["It costs 1,200 dollars in total,", "plus tax and fees."]),
    ("title abbreviation", "Dr. Smith will see you now. Please wait.", ["Dr. Smith will see you now.", "Please wait."]),
    ("latin abbreviation", "Bring an ID, e.g. a passport or a license. Thanks.",
     ["Bring an ID, e.g. a passport or a license.", "Thanks."]),
    ("initial", "I spoke with J. Smith yesterday. Fine.", ["I spoke with J. Smith yesterday.", "Fine."]),
    ("a.m. mid sentence", "Come at 9 a.m. tomorrow please.", ["Come at 9 a.m. tomorrow please."]),
    ("a.m. at sentence end", "Come at 9 a.m. Then call me.", ["Come at 9 a.m.", "Then call me."]),
    ("url", "Visit https://example.com/a.b?x=1 for details. Bye.",
     ["Visit https://example.com/a.b?x=1 for details.", "Bye."]),
    ("url at sentence end", "See example.org. It has it all.", ["See example.org.", "It has it all."]),
    ("short clause is not cut", "Sure, I can do that.", ["Sure, I can do that."]),
    ("long clause is cut at comma", "I have checked every available slot this week, and Friday works best.",
     ["I have checked every available slot this week,", "and Friday works best."]),
    ("semicolon and colon", "There are two options for you today; here they are: red or blue.",
     ["There are two options for you today;", "here they are: red or blue."]),
    ("newline ends a clause", "First item here\nSecond item here", ["First item here", "Second item here"]),
    ("ellipsis", "Well... let me check that for you.", ["Well...", "let me check that for you."]),
]


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_chunks(name: str, text: str, expected: list[str]) -> None:
    assert chunk_all(text) == expected


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("step", [1, 3, 7])
def test_streamed_tokens_give_the_same_chunks(name: str, text: str, expected: list[str], step: int) -> None:
    assert chunk_all(text, step=step) == expected


def test_long_text_without_punctuation_is_cut_at_word_boundaries() -> None:
    words = [f"word{i}" for i in range(60)]
    text = " ".join(words)
    chunks = chunk_all(text, min_clause=10, max_clause=50, step=4)
    assert len(chunks) > 1
    assert all(len(c) <= 50 for c in chunks)
    assert " ".join(chunks).split() == words  # no word was split or lost


def test_single_huge_token_is_cut_hard() -> None:
    chunks = chunk_all("x" * 130, min_clause=10, max_clause=50)
    assert "".join(chunks) == "x" * 130
    assert all(len(c) <= 50 for c in chunks)


def test_first_clause_released_before_the_rest_arrives() -> None:
    chunker = TextChunker(min_clause_chars=20)
    released = []
    for token in ["Sure", ", I", " can", " book", " that", " for", " you", ",", " Maria", "."]:
        released += chunker.push(token)
        if released:
            break
    assert released and released[0].text == "Sure, I can book that for you,"


def test_sentence_end_waits_for_the_next_character() -> None:
    chunker = TextChunker()
    assert chunker.push("It is 3.") == []  # could be 3.5
    assert [c.text for c in chunker.push("5 now. ")] == ["It is 3.5 now."]


@pytest.mark.parametrize(("text", "expected"), [
    ("Your table for four people is booked for tonight.", ["Your table for four", "people is booked for tonight."]),
    ("Sure, your table for four people is booked.", ["Sure, your table for", "four people is booked."]),
    ("Hi there. Your table for four is booked.", ["Hi there.", "Your table for four is booked."]),  # punctuation first
    ("Ask Dr. Smith about the booking today.", ["Ask Dr. Smith about", "the booking today."]),  # not after Dr.
    ("Come at 9:40 or at 10:15 today please.", ["Come at 9:40 or", "at 10:15 today please."]),
])
def test_eager_first_chunk(text: str, expected: list[str]) -> None:
    for step in (0, 1, 5):
        chunker = TextChunker(min_clause_chars=24, first_chunk_words=4)
        pieces = [text] if step == 0 else [text[i: i + step] for i in range(0, len(text), step)]
        out = [c for piece in pieces for c in chunker.push(piece)] + chunker.flush()
        assert [c.text for c in out] == expected


def test_cut_words_releases_the_complete_words_only() -> None:
    chunker = TextChunker(min_clause_chars=24)
    assert chunker.push("Your table for fo") == []
    assert chunker.cut_words()[0].text == "Your table for"  # "fo" may still grow into "four"
    assert chunker.cut_words() == []  # no complete word held
    rest = chunker.push("ur is booked. Thanks") + chunker.flush()
    assert [c.text for c in rest] == ["four is booked.", "Thanks"]
    assert [(c.start, c.end, c.index) for c in rest] == [(15, 30, 1), (31, 37, 2)]


def test_bad_settings_and_input() -> None:
    with pytest.raises(ValueError):
        TextChunker(min_clause_chars=0)
    with pytest.raises(ValueError):
        TextChunker(min_clause_chars=50, max_clause_chars=20)
    with pytest.raises(TypeError):
        TextChunker().push(None)  # type: ignore[arg-type]
