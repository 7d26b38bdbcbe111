"""Pure parts of the speech rooms: end-of-turn policy, LocalAgreement, WER, word alignment, playout cursor."""

from __future__ import annotations

import pytest

from voicepipe.stt.agreement import LocalAgreement, Word, group_words
from voicepipe.stt.wer import corpus_wer, normalize_words, wer
from voicepipe.tts.alignment import word_spans
from voicepipe.tts.cursor import PlayoutCursor, SpeechOrigin, WordTiming
from voicepipe.vad.turn import SilenceEndOfTurn, TurnView

# --- end of turn -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("view", "expected"), [
    (TurnView(speech_seen=False, in_speech=False, silence_ms=5000), False),  # no speech yet: never a turn
    (TurnView(speech_seen=True, in_speech=True, silence_ms=0), False),
    (TurnView(speech_seen=True, in_speech=False, silence_ms=599), False),
    (TurnView(speech_seen=True, in_speech=False, silence_ms=600), True),
    (TurnView(speech_seen=True, in_speech=False, silence_ms=2000), True),
])
def test_silence_end_of_turn(view: TurnView, expected: bool) -> None:
    assert SilenceEndOfTurn(silence_ms=600).decide(view) is expected


def test_end_of_turn_needs_enough_speech() -> None:
    policy = SilenceEndOfTurn(silence_ms=300, min_speech_ms=200)
    assert not policy.decide(TurnView(True, False, 1000, speech_ms=150))
    assert policy.decide(TurnView(True, False, 1000, speech_ms=250))


# --- LocalAgreement ----------------------------------------------------------------------------------


def words(text: str) -> list[Word]:
    return [Word((" " if i else "") + w, (i,)) for i, w in enumerate(text.split())]


def test_local_agreement_commits_what_two_decodes_agree_on() -> None:
    la = LocalAgreement()
    assert la.update(words("can you")) == []  # nothing to compare with yet
    assert [w.key for w in la.update(words("Can you tell me"))] == ["can", "you"]
    # "tell" agrees, "me" is the last word (held back), "the weather" is new
    assert [w.key for w in la.update(words("Can you tell me the weather"))] == ["tell", "me"]
    assert la.committed_text == "Can you tell me"  # the text of the decode that confirmed them
    assert la.text_with() == "Can you tell me the weather"


def test_local_agreement_never_commits_the_last_word_or_disagreements() -> None:
    la = LocalAgreement()
    la.update(words("book a table"))
    assert [w.key for w in la.update(words("book a tab"))] == ["book", "a"]
    assert la.update(words("book a cable for")) == []  # 'cable' vs 'tab': no agreement
    assert la.committed_text == "book a"


def test_local_agreement_keeps_commits_when_the_decoder_strays() -> None:
    la = LocalAgreement()
    la.update(words("please book"))
    la.update(words("please book it now"))
    assert la.committed_text == "please book"  # confirmed by the second decode
    la.update(words("police book it now today"))
    assert la.committed_text.startswith("please book")  # committed words are never taken back


def test_group_words_splits_on_leading_space() -> None:
    pieces = {1: " Hel", 2: "lo", 3: ",", 4: " world", 5: "."}
    grouped = group_words([1, 2, 3, 4, 5], pieces.__getitem__)
    assert [w.text for w in grouped] == [" Hello,", " world."]
    assert [w.tokens for w in grouped] == [(1, 2, 3), (4, 5)]


# --- WER ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "hyp", "expected"), [
    ("the cat sat", "the cat sat", 0.0),
    ("The cat sat.", "the Cat, sat", 0.0),
    ("the cat sat", "the bat sat", 1 / 3),
    ("the cat sat", "the cat", 1 / 3),
    ("the cat", "the cat sat down", 1.0),
    ("platform three in ten minutes", "platform 3 in 10 minutes", 0.0),
    ("it costs 1,200 dollars", "it costs 1200 dollars", 0.0),
    ("", "", 0.0),
    ("", "noise", 1.0),
])
def test_wer(ref: str, hyp: str, expected: float) -> None:
    assert wer(ref, hyp) == pytest.approx(expected)


def test_corpus_wer_weights_by_reference_length() -> None:
    assert corpus_wer([("a b c d", "a b c d"), ("e f", "x f")]) == pytest.approx(1 / 6)
    assert normalize_words("It's 9:40, e-mail me!") == ["it's", "940", "e", "mail", "me"]
    assert normalize_words("Dr. Smith, 3.5") == ["doctor", "smith", "3.5"]


# --- word alignment and the playout cursor --------------------------------------------------------------


def test_word_spans_exact_when_counts_match() -> None:
    # "hi you": h a i | j u  (the space and padding phonemes are skipped)
    align = [("^", 100), ("h", 10), ("a", 20), ("ɪ", 30), (" ", 40), ("j", 50), ("u", 60), (".", 70), ("$", 5)]
    counts = {"hi": 3, "you.": 2}
    spans = word_spans("hi you.", align, counts.__getitem__)
    assert [s[0] for s in spans] == ["hi", "you."]
    assert spans[0][1:3] == (0, 2) and spans[1][1:3] == (3, 7)
    assert spans[0][3] == 100  # the first phoneme of "hi" starts after BOS
    assert spans[1][3] == 100 + 10 + 20 + 30 + 40  # "you" starts at j
    assert spans[1][4] >= 100 + 10 + 20 + 30 + 40 + 50 + 60


def test_word_spans_align_merged_and_expanded_words() -> None:
    # espeak speaks "for the" as one phonetic word, and "9:40" as two ("nine forty").
    align = [("f", 10), ("ɚ", 10), ("ð", 10), ("ə", 10), (" ", 5), ("n", 10), ("a", 10), ("ɪ", 10), ("n", 10),
             (" ", 5), ("f", 10), ("ɔ", 10), ("ɹ", 10), ("ɾ", 10), ("i", 10), (" ", 5), ("o", 10), ("k", 10)]
    counts = {"for": 3, "the": 2, "9:40": 9, "ok": 2}
    spans = word_spans("for the 9:40 ok", align, counts.__getitem__)
    assert [s[0] for s in spans] == ["for", "the", "9:40", "ok"]
    starts = [s[3] for s in spans]
    assert starts[0] == 0 and 10 <= starts[1] <= 30  # "the" inside the merged phonetic word
    assert starts[2] == 45  # "9:40" starts at "nine"
    assert starts[3] == 45 + 40 + 5 + 50 + 5  # "ok" after "forty"


def test_word_spans_proportional_when_espeak_merges_words() -> None:
    # espeak produced 4 speech phonemes for words it would speak as 2 + 2 alone, minus one merge.
    align = [("a", 10), ("b", 10), ("c", 10), ("d", 10)]
    spans = word_spans("ab cd", align, lambda w: 2)
    assert [(s[3], s[4]) for s in spans] == [(0, 20), (20, 40)]


def _origin(index: int, text: str, char_start: int, sample_start: int, per_word: int) -> SpeechOrigin:
    words, pos, s = [], char_start, sample_start
    for w in text.split():
        words.append(WordTiming(w, pos, pos + len(w), s, s + per_word))
        pos += len(w) + 1
        s += per_word
    return SpeechOrigin(0, index, text, char_start, char_start + len(text), sample_start, s, 16000, tuple(words))


def test_playout_cursor_maps_samples_to_words() -> None:
    cursor = PlayoutCursor()
    cursor.add(_origin(0, "Sure, I can help.", 0, 0, 1000))
    cursor.add(_origin(1, "Your table is ready.", 18, 4000, 1000))
    assert cursor.heard(0).words == () and cursor.heard(0).char_end == 0
    heard = cursor.heard(2500)
    assert [w.text for w in heard.words] == ["Sure,", "I"]
    assert heard.current is not None and heard.current.text == "can"
    assert heard.text == "Sure, I"
    heard = cursor.heard(6000)
    assert [w.text for w in heard.words][-1] == "table"
    assert heard.text == "Sure, I can help. Your table"
    assert cursor.heard(10**9).text == "Sure, I can help. Your table is ready."
    assert cursor.origin_at(4500).chunk_index == 1
    assert cursor.origin_at(10**9) is None


def test_playout_cursor_rejects_out_of_order_origins() -> None:
    cursor = PlayoutCursor()
    cursor.add(_origin(0, "b c", 0, 5000, 100))
    with pytest.raises(ValueError):
        cursor.add(_origin(1, "a", 4, 0, 100))
