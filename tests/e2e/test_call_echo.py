"""A caller on a speakerphone over Twilio's protocol, with the real models: their microphone picks up the agent's
voice, made only from the audio the caller received over the wire, 150 ms later at -10 dB with two weaker
reflections (`caller.echo.SpeakerEcho`). Echo cancelling finds the echo path through the whole real chain (the
wire's pacing and marks, 8 kHz mu-law, resampling to 16 kHz), the canceller and the level gate take the echo out,
the text gate drops the agent's own words heard back, and the call goes as it would without echo: a turn per
utterance and no reply cut by its own echo, while a caller who talks over the agent still stops it."""

from __future__ import annotations

import asyncio

import pytest

from tests.call_helpers import call_settings
from tests.e2e.test_call_transports import speak
from tests.net_helpers import in_process_server
from voicepipe.caller import run_call
from voicepipe.caller.echo import SpeakerEcho
from voicepipe.observability.records import ECHO_METADATA

pytestmark = pytest.mark.e2e

FIVE = {"I want to book a table for dinner.": ("table", "dinner"),
        "How is the weather in London today?": ("weather", "london"),
        "What is the capital of France?": ("capital",),
        "Can you recommend a good book to read?": ("recommend", "read"),
        "Thank you, that is all for today.": ("thank",)}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = call_settings(tmp_path_factory.mktemp("server"), echo={"enabled": {"twilio": True}})
    with in_process_server(settings) as (base, _):
        yield base


def call(server: str, utterances, **kw):
    return asyncio.run(run_call(f"{server.replace('http://', 'ws://')}/ws/twilio", "twilio", utterances,
                                record_url=server, quiet_s=0.8, greeting_wait_s=10.0, reply_timeout_s=20.0,
                                echo=SpeakerEcho(8000, delay_ms=150, level_db=-10), **kw))


def test_a_speakerphone_caller_has_a_turn_per_utterance_and_no_echo_turn(server, voice_dir) -> None:
    record = call(server, [speak(text, voice_dir) for text in FIVE]).record
    # Echo the STT hears as no words (a CI run beside a CPU burner had the echo that cut turn 1's reply so) is no turn.
    turns = record["turns"]
    assert len(turns) == len(FIVE), [t["user_text"] for t in turns]
    # Replies cut by their own echo: before the gate, every reply; with it, three in a CI run beside a CPU burner;
    # with the canceller's read position held as well, none in 4 of 4 runs beside a burner (docs/echo.md, "With the
    # gate"). The bound catches a gate that stops working; the issue's target (none in every run) is not shown yet.
    assert record["barge_ins"] <= 2, turns
    heard = sum(any(word in t["user_text"].lower() for word in words) for t, words in zip(turns, FIVE.values(),
                                                                                           strict=True))
    # Each turn the caller's own words, in order, none of them the agent's heard back (whisper-tiny mishears one at
    # times).
    assert heard >= len(FIVE) - 1, turns
    figures = record["metadata"][ECHO_METADATA]
    # Found, and echo taken out; not the delay's value: it is the speakerphone's 150 ms plus how late the caller's
    # end plays each reply, which a busy machine moves by tens of ms (153 to 206 ms measured).
    assert figures["delay_ms"] is not None and figures["erle_db"] > 0 and figures["gated_audio_s"] > 1, figures


def test_a_caller_who_talks_over_the_agent_through_its_echo_stops_it_and_keeps_their_words(server, voice_dir) -> None:
    story = speak("Please tell me a long story about a dragon and a knight.", voice_dir)
    # whisper-tiny hears this sentence whole with no echo; "what is the time in Tokyo?" it heard as "the timing
    # Tokyo" in 4 of 5 echo-free calls beside a burner, so a check of it tested the STT, not the echo.
    wait = speak("Wait, what is the weather in London?", voice_dir)
    record = call(server, [story, wait], barge_in_after_ms=1500).record
    first, second = record["turns"][:2]
    assert first["interrupted"] and record["barge_ins"] >= 1, first
    heard, said = first["heard_text"].strip(), first["agent_text"].strip()
    assert heard and len(heard) < len(said) and said.startswith(heard), (heard, said)
    replies = [m["content"] for m in record["history"] if m["role"] == "assistant"]
    assert heard in replies and said not in replies, replies  # the session rolled back to the words heard
    # the caller's words, spoken over the agent's: theirs kept, none of the agent's taken for theirs
    assert {"weather", "london"} <= set(second["user_text"].lower().strip(".?").replace(",", "").split()), second
    agent_only = set(said.lower().split()) - {"wait", "what", "is", "the", "weather", "in", "london"}
    assert not agent_only & set(second["user_text"].lower().strip(".?").split()), (second, said)
