"""Real calls over WebRTC: the real app on loopback with real models, called from an aiortc peer (`voicepipe
call`'s client) and from headless Chromium on the softphone page; and offers that must be refused.

One server serves the module; replies are kept short with `calls.max_reply_tokens`.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.browser_helpers import chromium
from tests.net_helpers import in_process_server
from voicepipe.config import load_settings
from voicepipe.transports.client import Utterance, format_report, read_wav, run_call, utterance
from voicepipe.transports.webrtc.client_link import PeerClient

pytestmark = pytest.mark.e2e

GREETING = "Hi, how can I help?"
THREE_TURNS = [("I want to book a table for dinner.", "dinner"),
               ("Tell me about the weather in London.", "london"),
               ("What is the capital of France?", "france")]


def espeak(text: str, directory: Path) -> Path:
    path = directory / f"{abs(hash(text))}.wav"
    if not path.exists():
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    return path


def speak(text: str, directory: Path) -> Utterance:
    audio, rate = read_wav(espeak(text, directory))
    return utterance(audio, rate)


@pytest.fixture(scope="module")
def voice_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("caller")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("webrtc-server")
    settings = load_settings(overrides={
        "calls": {"max_reply_tokens": 16, "greeting": GREETING, "temperature": 0.0},
        "llm": {"kv_cache_mib": 64},
        "paths": {"data_dir": str(tmp / "data"), "recordings_dir": str(tmp / "recordings")},
    })
    with in_process_server(settings) as (base, app):
        yield base, app


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def no_calls_left(app) -> bool:
    return not app.state.calls.active and not app.state.webrtc_calls


def test_three_turn_call_from_aiortc(server, voice_dir: Path) -> None:
    base, app = server
    utts = [speak(text, voice_dir) for text, _ in THREE_TURNS]
    result = asyncio.run(run_call(base, "webrtc", utts, quiet_s=0.6))
    print(format_report(result))

    assert result.greeting_audio_s > 0.3, "the greeting was not played"
    assert len(result.turns) == 3
    for turn in result.turns:
        assert turn.audio_s > 0.3, f"turn {turn.index}: no agent reply audio"
        assert turn.voice_to_voice_ms is not None and turn.voice_to_voice_ms < 20000
    assert len(result.agent_audio) > 16000, "no agent audio recorded"
    record = result.record
    assert record is not None and record["transport"] == "webrtc"
    assert record["end_reason"] == "hangup", record["end_reason"]  # the client's stop on the data channel
    turns = record["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3], turns
    for t, (_, key) in zip(turns, THREE_TURNS, strict=True):
        assert key in t["user_text"].lower(), (key, t["user_text"])
        assert t["agent_text"].strip() and not t["interrupted"] and t["error"] is None
    for prev, t in zip(turns, turns[1:], strict=False):
        assert t["cached_prompt_tokens"] >= prev["prompt_tokens"], (prev, t)
    assert record["barge_ins"] == 0
    history = record["history"]
    assert history[1] == {"role": "assistant", "content": GREETING}  # the greeting was played out to the end
    # The live transcript reaches the caller over the data channel, as the native protocol's events.
    kinds = {e.get("type") for e in result.events}
    assert {"started", "transcript", "agent_text", "turn"} <= kinds, kinds
    finals = [e["text"] for e in result.events if e.get("type") == "transcript" and e.get("final")]
    assert any("london" in text.lower() for text in finals), finals
    wait_until(lambda: no_calls_left(app), 10, "the call and its peer connection to go")


GARBAGE = [
    b"not json at all",
    b"[1, 2, 3]",
    b'{"type": "offer"}',
    b'{"type": "answer", "sdp": "v=0"}',
    b'{"type": "offer", "sdp": 42}',
    b'{"type": "offer", "sdp": "garbage\\r\\nmore garbage"}',
    b'{"type": "offer", "sdp": "v=0\\r\\no=- 0 0 IN IP4 0.0.0.0\\r\\ns=-\\r\\nt=0 0\\r\\n'
    b'm=audio 9 UDP/TLS/RTP/SAVPF 0\\r\\n"}',  # audio, but no ICE credentials
    b'{"type": "offer", "sdp": "' + b"a" * 70000 + b'"}',
]


# An SDP body that is valid as far as the server's own checks go; only the call options are wrong.
AUDIO_SDP = ("v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\n"
                  "a=rtpmap:0 PCMU/8000\r\n")


def test_garbage_sdp_gets_400_and_the_server_keeps_serving(server) -> None:
    base, app = server
    for body in GARBAGE:
        resp = httpx.post(f"{base}/webrtc/offer", content=body, timeout=10)
        assert resp.status_code == 400, (body[:80], resp.status_code, resp.text)
        assert resp.json()["detail"], body[:80]
    resp = httpx.post(f"{base}/webrtc/offer", json={"type": "offer", "sdp": AUDIO_SDP, "greeting": 5})
    assert resp.status_code == 400 and "greeting" in resp.json()["detail"], resp.text

    async def connect_and_hang_up() -> str:
        async with PeerClient(base, "after-garbage", {"greeting": None}) as peer:
            assert peer.pc.connectionState == "connected"
            wait = time.monotonic() + 10
            while "after-garbage" not in app.state.calls.active and time.monotonic() < wait:
                await asyncio.sleep(0.05)
            assert "after-garbage" in app.state.calls.active
            await peer.send('{"type": "stop", "reason": "hangup"}')
        return "ok"

    assert asyncio.run(connect_and_hang_up()) == "ok"
    wait_until(lambda: no_calls_left(app), 10, "the call to end")
    assert app.state.calls.get("after-garbage").end_reason == "hangup"


def caller_wav(directory: Path, text: str, lead_s: float, tail_s: float) -> Path:
    """A 16-bit mono WAV for Chromium's fake microphone: silence, the sentence, silence."""
    audio, rate = read_wav(espeak(text, directory))
    pad = np.zeros(int(lead_s * rate), np.int16), np.zeros(int(tail_s * rate), np.int16)
    path = directory / "softphone-caller.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.concatenate([pad[0], audio, pad[1]]).astype("<i2").tobytes())
    return path


INBOUND_AUDIO_JS = """async () => {
  const stats = await window.softphone.pc.getStats();
  for (const s of stats.values()) {
    if (s.type === "inbound-rtp" && s.kind === "audio")
      return {bytes: s.bytesReceived, energy: s.totalAudioEnergy || 0, samples: s.totalSamplesReceived || 0};
  }
  return null;
}"""


def test_softphone_in_headless_chromium(server, voice_dir: Path) -> None:
    """The page's microphone says one sentence: the page shows its transcript and plays the agent's reply."""
    base, app = server
    wav = caller_wav(voice_dir, "What is the capital of France?", lead_s=4.0, tail_s=10.0)
    flags = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             f"--use-file-for-fake-audio-capture={wav}%noloop", "--autoplay-policy=no-user-gesture-required")
    with chromium(*flags) as browser:
        page = browser.new_page()
        page.goto(f"{base}/")
        page.click("#call")
        page.wait_for_function("window.softphone.state === 'in call'", timeout=30000)
        page.wait_for_function("(document.querySelector('#line-user-1:not(.partial)') || {}).textContent"
                               "?.toLowerCase().includes('france')", timeout=90000)
        before = page.evaluate(INBOUND_AUDIO_JS)
        page.wait_for_function("document.querySelector('#line-agent-1:not(.partial)')?.textContent.trim()",
                               timeout=60000)
        call_id = page.evaluate("window.softphone.callId")
        wait_until(lambda: app.state.calls.active.get(call_id) is not None
                   and app.state.calls.active[call_id].state.value == "listening", 60, "the reply to play out")
        after = page.evaluate(INBOUND_AUDIO_JS)
        playing = page.evaluate("!document.querySelector('#agent-audio').paused")
        page.click("#hangup")
        page.wait_for_function("window.softphone.state === 'ended'", timeout=10000)

    print(f"softphone: inbound audio before the reply {before}, after it {after}")
    assert playing, "the agent's <audio> element is not playing"
    assert after["bytes"] > before["bytes"] > 0
    # The reply's audio reached the page's audio pipeline with real energy (not silence).
    assert after["energy"] - before["energy"] > 0.01, (before, after)
    wait_until(lambda: no_calls_left(app), 15, "the call to end after the hang-up")
    record = app.state.calls.get(call_id)
    print(f"softphone call {call_id}: {record.end_reason}; caller {record.turns[0].user_text!r}, "
          f"agent {record.turns[0].agent_text!r}")
    assert record.end_reason in ("hangup", "disconnected"), record.end_reason
    assert "france" in record.turns[0].user_text.lower()
    assert record.turns[0].agent_text.strip()
