"""Real calls over every WebSocket transport: the real app on loopback, real models, `voicepipe call`'s client.

Caller utterances are made with espeak-ng. One server serves the whole module; replies are kept short with
`calls.max_reply_tokens` so the module stays within a few minutes on a 2-core CPU.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from tests.call_helpers import assert_history_keeps_what_was_heard, call_settings
from tests.net_helpers import in_process_server
from voicepipe.caller import Utterance, read_wav, run_call, utterance

pytestmark = pytest.mark.e2e

TRANSPORTS = ("twilio", "telnyx", "vonage", "plivo", "exotel", "native", "audiosocket")
# Sentences whisper-tiny.en transcribes reliably from espeak-ng, at 8 kHz u-law too, with their key words.
# Key words the server's transcript must hold. "capital", not "france": over 8 kHz telephone audio tiny.en has
# heard "France" as "front" about one call in four; the transports, not the STT's accuracy, are under test here.
# Not "Tell me about the weather in London.": its 8 kHz audio, cut at 31 points from 200 ms before its end to 400 ms
# after it, came out as "Tell me I'm out and" at 15; "How is the weather in London today?" kept "London" at all 31.
# Spain, not France: espeak's "What is the capital of France?" over 8 kHz is one whisper-tiny hears as "What in the
# car, the long run" at some alignments of its start and end (offline, 10 of 36 of them: leads of 100-340 ms before it,
# 0-300 ms of silence after), where it hears "What is the capital of Spain?" at all 36.
QUESTION = "What is the capital of Spain?"
THREE_TURNS = [("I want to book a table for dinner.", "dinner"),
               ("How is the weather in London today?", "london"),
               (QUESTION, "capital")]


def speak(text: str, directory: Path) -> Utterance:
    path = directory / f"{abs(hash(text))}.wav"
    if not path.exists():
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    audio, rate = read_wav(path)
    return utterance(audio, rate)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = call_settings(tmp_path_factory.mktemp("server"),
                             calls={"barge_in_min_speech_ms": 150, "audiosocket_port": 0})
    with in_process_server(settings) as (base, app):
        yield base.replace("http://", "ws://"), app


def ws_url(base: str, transport: str, app=None) -> str:
    if transport == "audiosocket":  # Asterisk AudioSocket: plain TCP on its own port
        return f"tcp://127.0.0.1:{app.state.audiosocket_port}"
    return f"{base}/ws" if transport == "native" else f"{base}/ws/{transport}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_three_turn_call(server, voice_dir: Path, transport: str) -> None:
    base, app = server
    utts = [speak(text, voice_dir) for text, _ in THREE_TURNS]
    result = asyncio.run(run_call(ws_url(base, transport, app), transport, utts, quiet_s=0.6,
                                  record_url=base.replace("ws://", "http://")))

    assert result.greeting_audio_s > 0.3, "the greeting was not played"
    assert len(result.turns) == 3
    for turn in result.turns:
        assert turn.audio_s > 0.3, f"turn {turn.index}: no agent reply audio"
        assert turn.voice_to_voice_ms is not None and turn.voice_to_voice_ms < 20000
    record = result.record
    assert record is not None
    # Plivo and Vonage have no stop message: the call ends when the socket closes.
    if transport in ("plivo", "vonage"):
        assert record["end_reason"] == "disconnected"
    else:
        assert record["end_reason"] in ("stop", "callended", "hangup")  # the stop message's reason, if any
    if transport == "audiosocket":
        assert result.marks_acked == 0 and not result.clears  # no marks, no clear: paced on the local clock
    turns = record["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3], turns
    for t, (_, key) in zip(turns, THREE_TURNS, strict=True):
        assert key in t["user_text"].lower(), (key, t["user_text"])
        assert t["agent_text"].strip() and not t["interrupted"] and t["error"] is None
    # The call's LLM session keeps its KV between turns: every later turn reuses the earlier ones.
    assert turns[0]["prompt_tokens"] > 0
    for prev, t in zip(turns, turns[1:], strict=False):
        assert t["cached_prompt_tokens"] >= prev["prompt_tokens"], (prev, t)
    assert record["barge_ins"] == 0
    history = record["history"]
    assert [m["content"] for m in history if m["role"] == "user"] == [t["user_text"] for t in turns]
    assert history[1] == {"role": "assistant", "content": "Hi, how can I help?"}  # the greeting is remembered
    if transport == "native":  # the native protocol shows the live transcript and per-turn timings
        kinds = {e.get("type") for e in result.events}
        assert {"started", "transcript", "agent_text", "turn"} <= kinds, kinds
    assert not app.state.calls.active, "a call outlived its connection"


@pytest.mark.parametrize("transport", ["twilio", "telnyx"])
def test_barge_in(server, voice_dir: Path, transport: str) -> None:
    """The caller talks over the reply: the server stops sending agent audio within 300 ms (held from the VAD's
    speech start), its words make it a barge-in (clear) rather than a backchannel, and the LLM keeps only what was
    heard."""
    base, app = server
    utts = [speak("Tell me a long story about a brave dragon and a princess.", voice_dir),
            speak(QUESTION, voice_dir)]
    result = asyncio.run(run_call(ws_url(base, transport), transport, utts, quiet_s=0.6, barge_in_after_ms=700))

    first, second = result.turns
    assert first.audio_s > 0.3
    assert second.clear_at is not None, "no clear received while the caller talked over the agent"
    sent = [t for t, _ in result.audio_chunks if second.speech_start < t < second.clear_at]
    stop_ms = ((max(sent) if sent else second.speech_start) - second.speech_start) * 1000
    clear_ms = (second.clear_at - second.speech_start) * 1000
    print(f"{transport} barge-in: agent audio stopped {stop_ms:.0f} ms and the clear came {clear_ms:.0f} ms after "
          "the caller's speech start")
    assert stop_ms <= 300, f"agent audio went on {stop_ms:.0f} ms after the caller's speech start"
    # the words decide: at the first partial that shows them, at the latest once backchannel_max_ms of speech
    assert clear_ms <= app.state.settings.calls.backchannel_max_ms + 500, clear_ms
    # Nothing of the interrupted reply arrives after the clear (the next audio is the answer to turn 2).
    late = [s for t, s in result.audio_chunks if second.clear_at < t < second.speech_end]
    assert not late, f"{sum(late):.2f} s of agent audio after the clear"
    assert second.audio_s > 0.3, "no answer after the barge-in"

    record = result.record
    assert record["barge_ins"] == 1
    assert "capital" in record["turns"][1]["user_text"].lower()
    assert_history_keeps_what_was_heard(record)
    assert not app.state.calls.active


def test_four_simultaneous_calls(server, voice_dir: Path) -> None:
    """Four calls at once over two transports: each agent answers its own caller, nothing crosses."""
    base, app = server
    plans = [("native", [("I want to book a table for dinner.", "dinner"), ("How is the weather in London today?",
                                                                             "london")]),
             ("vonage", [("What is the capital of France?", "capital"), ("How do I reset my password?",
                                                                        "password")]),
             ("native", [("My computer will not turn on.", "computer"), ("Please send me the invoice.", "invoice")]),
             ("vonage", [("Where is the nearest hospital?", "hospital"), ("I lost my credit card.", "credit")])]

    async def all_calls():
        return await asyncio.gather(*[
            run_call(ws_url(base, transport), transport, [speak(text, voice_dir) for text, _ in turns], quiet_s=0.6,
                     reply_timeout_s=90)
            for transport, turns in plans])

    results = asyncio.run(all_calls())
    all_keys = {key for _, turns in plans for _, key in turns}
    for (transport, turns), result in zip(plans, results, strict=True):
        record = result.record
        assert record is not None and len(record["turns"]) == 2, (transport, record)
        own = {key for _, key in turns}
        for t, (_, key) in zip(record["turns"], turns, strict=True):
            text = t["user_text"].lower()
            assert key in text, (key, text)
            assert not any(k in text for k in all_keys - own), (own, text)
            assert t["agent_text"].strip()
        for turn in result.turns:
            assert turn.audio_s > 0.3
        users = [m["content"] for m in record["history"] if m["role"] == "user"]
        assert users == [t["user_text"] for t in record["turns"]]
    assert len({r.call_id for r in results}) == 4
    assert not app.state.calls.active


def test_voicepipe_call_cli(server, voice_dir: Path, tmp_path: Path) -> None:
    """`voicepipe call` itself: one WAV with three utterances separated by silence, over Telnyx."""
    import json
    import subprocess
    import sys

    import numpy as np

    from voicepipe.caller import write_wav

    utts = [speak(text, voice_dir) for text, _ in THREE_TURNS]
    rate = utts[0].rate
    gap = np.zeros(rate, np.int16)
    write_wav(tmp_path / "caller.wav", np.concatenate([x for u in utts for x in (u.audio, gap)]), rate)
    base, _ = server
    proc = subprocess.run(
        [sys.executable, "-m", "voicepipe.cli", "call", "--wav", str(tmp_path / "caller.wav"), "--url", base,
         "--transport", "telnyx", "--record", str(tmp_path / "agent.wav"), "--json", str(tmp_path / "call.json")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "turn 3:" in proc.stdout and "voice-to-voice at the client" in proc.stdout, proc.stdout
    report = json.loads((tmp_path / "call.json").read_text())
    assert [t["turn"] for t in report["turns"]] == [1, 2, 3]
    for t, (_, key) in zip(report["turns"], THREE_TURNS, strict=True):
        assert key in t["user_text"].lower() and t["agent_text"], t
        assert t["agent_audio_s"] > 0.3 and t["voice_to_voice_ms"] > 0
    audio, rec_rate = read_wav(tmp_path / "agent.wav")
    assert rec_rate == 16000 and len(audio) / rec_rate > 2.0  # greeting and three replies, as played
