"""Whisper's hallucinated loops are cut where they start (`voicepipe.stt.decoder.cut_repetition`), on a toy
vocabulary: each token is one word piece, as whisper's tokenizer gives them."""

from __future__ import annotations

from voicepipe.stt.decoder import cut_repetition


def tokens_of(text: str) -> tuple[list[int], dict[int, str]]:
    """One token per word and per trailing mark, as whisper splits " know." into " know" and "."."""
    pieces: list[str] = []
    for word in text.split():
        core = word.rstrip(".?!,")
        pieces += [" " + core, *word[len(core):]]
    return list(range(len(pieces))), dict(enumerate(pieces))


def cut(text: str, keep: int = 0) -> str:
    tokens, vocab = tokens_of(text)
    return "".join(vocab[t] for t in cut_repetition(tokens, vocab.__getitem__, keep)).strip()


def test_a_repeated_sentence_and_a_restart_in_one_decode_are_cut_at_the_first_loop() -> None:
    # A replay of tests/calls/echo got this final (2026-12-07): the restart of "Thank you." at its end once hid the
    # repeated sentence before it, and the caller's turn failed its words.
    said = "Thank you. That is all I needed to know. That is all I needed to know. Thank you."
    assert cut(said) == "Thank you. That is all I needed to know."


def test_a_restart_alone_and_a_loop_alone_are_each_cut() -> None:
    assert cut("I would like to check my order. I would") == "I would like to check my order."
    assert cut("Can you send the invoice to me send the invoice to me") == "Can you send the invoice to me"


def test_words_that_repeat_without_a_loop_are_kept() -> None:
    for said in ("No, no, I said the blue one.", "Thank you, thank you so much.", "It is what it is."):
        assert cut(said) == said


def test_a_loop_inside_a_forced_prefix_is_left_as_it_is() -> None:
    said = "send the invoice send the invoice to me"
    assert cut(said, keep=len(tokens_of(said)[0])) == said
    assert cut("My order. My", keep=4) == "My order. My"  # the restart would cut into the prefix
    assert cut("My order. My", keep=3) == "My order."
