"""Backchannels keep the agent talking; anything more interrupts it."""

from __future__ import annotations

import pytest

from voicepipe.turns.backchannel import is_backchannel, normalise


@pytest.mark.parametrize("text", ["Mm-hmm.", "mhm", "Yeah.", "Right.", "Okay.", "OK", "Uh-huh.", "Yeah, yeah.",
                                  "Oh, okay.", "I see.", "Got it.", "Sure."])
def test_backchannels(text) -> None:
    assert is_backchannel(text)


@pytest.mark.parametrize("text", ["Wait.", "Stop.", "No.", "Yeah, wait.", "Okay, stop.", "Hold on.", "",
                                  "Yes, I want the second one.", "What time is it?", "Okay okay okay okay okay",
                                  "Actually, no."])
def test_interruptions(text) -> None:
    assert not is_backchannel(text)


def test_normalise() -> None:
    assert normalise("  Mm-Hmm... YEAH!  ") == "mm hmm yeah"
    assert normalise("That's right.") == "thats right"
