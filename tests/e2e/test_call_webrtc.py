"""Real calls over WebRTC: the real app on loopback with real models, called from an aiortc peer (`voicepipe
call`'s client) and from headless Chromium on the softphone page; and offers that must be refused.

One server serves the module; replies are kept short with `calls.max_reply_tokens`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.browser_helpers import chromium
from tests.call_helpers import GREETING, assert_history_keeps_what_was_heard, call_settings
from tests.e2e.test_call_transports import THREE_TURNS, speak
from tests.net_helpers import in_process_server
from voicepipe.caller import Utterance, format_report, run_call
from voicepipe.caller.webrtc import PeerClient
from voicepipe.transports.serializers.native import WebRtcCallerSerializer
from voicepipe.transports.webrtc import hang_up_webrtc_calls

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    settings = call_settings(tmp_path_factory.mktemp("webrtc-server"))
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


def test_barge_in_over_webrtc(server, voice_dir: Path) -> None:
    """The caller talks over the reply: agent audio stops at the client within 300 ms, the agent's track drops its
    queue, and the LLM keeps only what was heard (the playout cursor is the frame the track sends)."""
    base, app = server
    utts = [speak("Tell me a long story about a brave dragon and a princess.", voice_dir),
            speak("What is the capital of France?", voice_dir)]
    result = asyncio.run(run_call(base, "webrtc", utts, quiet_s=0.6, barge_in_after_ms=700))

    first, second = result.turns
    assert first.audio_s > 0.3
    # Agent audio received while the caller speaks is the interrupted reply (the answer comes after): when did
    # it stop? The client counts up to HANGOVER_S of silence after the last loud frame as part of a reply.
    during = [t for t, _ in result.audio_chunks if second.speech_start < t < second.speech_end]
    assert during, "the reply was already over when the caller spoke: nothing was interrupted"
    stop_ms = (max(during) - WebRtcCallerSerializer.HANGOVER_S - second.speech_start) * 1000
    print(f"webrtc barge-in: agent audio stopped {stop_ms:.0f} ms after the caller's speech start")
    # The track holds its audio from the VAD's speech start (calls.hold_on_speech), before the barge-in decision.
    assert stop_ms <= 300, f"agent audio went on {stop_ms:.0f} ms after the caller's speech start"
    assert second.audio_s > 0.3, "no answer after the barge-in"

    record = result.record
    assert record["barge_ins"] == 1
    assert "capital" in record["turns"][1]["user_text"].lower()
    assert_history_keeps_what_was_heard(record)
    wait_until(lambda: no_calls_left(app), 10, "the call to go")


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


def test_server_shutdown_hangs_up_webrtc_calls(server) -> None:
    """What the app's shutdown does before it closes the models: every WebRTC call ends as a hang-up."""
    base, app = server

    async def call_then_shutdown() -> tuple[int | None, str]:
        async with PeerClient(base, "shutdown-call", {"greeting": None}) as peer:
            wait = time.monotonic() + 10
            while "shutdown-call" not in app.state.calls.active and time.monotonic() < wait:
                await asyncio.sleep(0.05)
            server_loop = next(iter(app.state.webrtc_calls)).get_loop()
            future = asyncio.run_coroutine_threadsafe(hang_up_webrtc_calls(app), server_loop)
            await asyncio.wrap_future(future)
            wait = time.monotonic() + 10
            while peer.pc.connectionState != "closed" and time.monotonic() < wait:
                await asyncio.sleep(0.05)
            return peer.close_code, peer.pc.connectionState

    code, state = asyncio.run(call_then_shutdown())
    assert state == "closed" and code == 1000, (code, state)
    assert no_calls_left(app)
    assert app.state.calls.get("shutdown-call").end_reason == "shutdown"


VANISHING_CALLER = """
import asyncio, sys
import numpy as np
from voicepipe.transports.webrtc import hang_up_webrtc_calls
from voicepipe.caller.webrtc import PeerClient

async def main():
    async with PeerClient(sys.argv[1], sys.argv[2], {"greeting": sys.argv[3]}) as peer:
        print("connected", flush=True)
        while True:  # a live caller's line: silence at real time, until the process is killed
            await peer.send(np.zeros(960, np.int16))
            await asyncio.sleep(0.02)

asyncio.run(main())
"""


def test_a_vanishing_peer_ends_its_call_and_another_call_carries_on(server, voice_dir: Path) -> None:
    """A caller killed mid-greeting (no hang-up, no DTLS close) is noticed within seconds; a concurrent
    WebRTC call is not disturbed."""
    base, app = server
    turns = [("What is the capital of France?", "capital"), ("I lost my credit card.", "credit")]
    healthy: dict = {}
    utts = [speak(text, voice_dir) for text, _ in turns]

    def healthy_call() -> None:
        healthy["result"] = asyncio.run(run_call(base, "webrtc", utts, quiet_s=0.6, reply_timeout_s=90))

    thread = threading.Thread(target=healthy_call)
    thread.start()
    greeting = "Hello, and welcome. " * 6  # still talking when the caller vanishes
    proc = subprocess.Popen([sys.executable, "-c", VANISHING_CALLER, base, "vanishing", greeting],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "connected", proc.stderr.read()
        wait_until(lambda: "vanishing" in app.state.calls.active, 15, "the vanishing caller's call to start")
        time.sleep(1.0)
    finally:
        proc.kill()
        proc.wait(10)
    killed = time.monotonic()
    wait_until(lambda: "vanishing" not in app.state.calls.active, 30, "the vanished caller's call to end")
    print(f"a vanished WebRTC caller's call ended {time.monotonic() - killed:.1f} s after the kill")
    assert time.monotonic() - killed < 20
    assert app.state.calls.get("vanishing").end_reason == "disconnected"

    thread.join(240)
    result = healthy["result"]
    record = result.record
    assert record["end_reason"] == "hangup"
    for t, (_, key) in zip(record["turns"], turns, strict=True):
        assert key in t["user_text"].lower(), (key, t["user_text"])
        assert t["agent_text"].strip() and t["error"] is None
    assert all(turn.audio_s > 0.3 for turn in result.turns)
    wait_until(lambda: no_calls_left(app), 10, "every call to go")


def caller_wav(directory: Path, utt: Utterance, lead_s: float, tail_s: float) -> Path:
    """A 16-bit mono WAV for Chromium's fake microphone: silence, the utterance, silence."""
    audio, rate = utt.audio, utt.rate
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


# The turn of the caller's final line that holds the key word (a stray noise may have made an empty turn first).
# The key word is "capital", not "france": after Chromium's Opus round trip, tiny.en has heard "France" as
# "I'm friends"; the page's transcript, not the STT's accuracy, is under test here.
USER_TURN_JS = """() => {
  const lines = [...document.querySelectorAll('#transcript li.user:not(.partial)')];
  const line = lines.find((li) => li.textContent.toLowerCase().includes('capital'));
  return line ? Number(line.dataset.turn) : null;
}"""


def wait_for_page(page, js: str, timeout_s: float, app):
    """`page.wait_for_function`, failing with what the page and the server saw."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        return page.wait_for_function(js, timeout=timeout_s * 1000).json_value()
    except PlaywrightTimeout:
        events = page.evaluate("window.softphone.events")
        records = {k: (c.state.value, c.record.turns) for k, c in app.state.calls.active.items()}
        raise AssertionError(f"the page never showed {js!r}\nstate {page.evaluate('window.softphone.state')}\n"
                             f"events {events}\nlive calls {records}\nended {list(app.state.calls.ended)}") from None


def test_softphone_in_headless_chromium(server, voice_dir: Path) -> None:
    """The page's microphone says one sentence: the page shows its transcript and plays the agent's reply; then
    its keypad presses 4, 2, # (Chromium's RTCDTMFSender: RFC 4733 events), which reach the call as a turn."""
    base, app = server
    wav = caller_wav(voice_dir, speak("What is the capital of France?", voice_dir), lead_s=4.0, tail_s=1.0)
    flags = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             f"--use-file-for-fake-audio-capture={wav}%noloop", "--autoplay-policy=no-user-gesture-required")
    with chromium(*flags) as browser:
        page = browser.new_page()
        page.goto(f"{base}/")
        page.click("#call")
        page.wait_for_function("window.softphone.state === 'in call'", timeout=30000)
        started = time.monotonic()  # the file (about 7 s) plays from about here
        turn = wait_for_page(page, USER_TURN_JS, 90, app)  # the line of the caller's final words
        before = page.evaluate(INBOUND_AUDIO_JS)
        wait_for_page(page, f"document.querySelector('#line-agent-{turn}:not(.partial)')?.textContent.trim()",
                      60, app)
        call_id = page.evaluate("window.softphone.callId")
        wait_until(lambda: app.state.calls.active.get(call_id) is not None
                   and app.state.calls.active[call_id].state.value == "listening", 60, "the reply to play out")
        after = page.evaluate(INBOUND_AUDIO_JS)
        playing = page.evaluate("!document.querySelector('#agent-audio').paused")
        # The keypad: Chromium sends RFC 4733 telephone events, and the keys are the caller's next turn.
        for key in "42#":
            page.click(f"#keypad button[data-key='{key}']")
            time.sleep(0.3)
        wait_until(lambda: any(t.dtmf == "42" for t in app.state.calls.active[call_id].record.turns), 30,
                   "the page's keys to make a keypad turn")
        # The fake microphone's file is over, but the page still sends (silent) audio: the call lives on.
        time.sleep(max(0.0, started + 8.0 + 12.0 - time.monotonic()))
        assert page.evaluate("window.softphone.state") == "in call"
        assert call_id in app.state.calls.active, "the call ended while the page was still in it"
        page.click("#hangup")
        page.wait_for_function("window.softphone.state === 'ended'", timeout=10000)

    print(f"softphone: inbound audio before the reply {before}, after it {after}")
    assert playing, "the agent's <audio> element is not playing"
    assert after["bytes"] > before["bytes"] > 0
    # The reply's audio reached the page's audio pipeline with real energy (not silence).
    assert after["energy"] - before["energy"] > 0.01, (before, after)
    wait_until(lambda: no_calls_left(app), 15, "the call to end after the hang-up")
    record = app.state.calls.get(call_id)
    answered = record.turns[turn - 1]
    print(f"softphone call {call_id}: {record.end_reason}; caller {answered.user_text!r}, "
          f"agent {answered.agent_text!r}")
    assert record.end_reason == "hangup", record.end_reason  # the page's stop on the data channel
    assert "capital" in answered.user_text.lower()
    assert answered.agent_text.strip()
    keys = next(t for t in record.turns if t.dtmf)
    assert keys.user_text == "[keypad: 4 2]" and keys.turn > turn
