"""WebRTC without models: the media helpers, the offer checks, the endpoints' refusals, and a `PeerLink` driven by a
real aiortc peer on loopback (audio and a video track in, the data channel both ways, the hang-up)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription, VideoStreamTrack
from av import AudioFrame
from fastapi.testclient import TestClient

from voicepipe.caller import endpoint_url
from voicepipe.caller.webrtc import offer_url
from voicepipe.config import load_settings
from voicepipe.server import create_app
from voicepipe.transports.connection import Connection
from voicepipe.transports.playback import PlaybackController
from voicepipe.transports.serializers.base import ChunkPolicy
from voicepipe.transports.serializers.native import NativeSerializer, WebRtcCallerSerializer
from voicepipe.transports.webrtc.link import PeerLink
from voicepipe.transports.webrtc.media import FedTrack, MonoInput, PacedTrack
from voicepipe.transports.webrtc.signalling import BadOffer, check_sdp, start_fields

# -- media ----------------------------------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def test_paced_track_sends_queued_audio_then_silence_and_echoes_marks_as_frames_go_out() -> None:
    played: list[str] = []
    track = PacedTrack(played.append, rate=1000)  # 20 samples a frame
    track.push_audio(np.arange(1, 31, dtype=np.int16))  # 1.5 frames
    track.push_mark("m1")
    track.push_audio(np.full(10, 7, np.int16))
    track.push_mark("m2")

    async def frames(n):
        return [await track.recv() for _ in range(n)]

    started = time.monotonic()
    out = run(frames(4))
    elapsed = time.monotonic() - started
    pcm = [f.to_ndarray()[0] for f in out]
    assert [len(p) for p in pcm] == [20] * 4
    assert list(pcm[0]) == list(range(1, 21))
    assert list(pcm[1]) == list(range(21, 31)) + [7] * 10  # the next piece fills the frame up
    assert not pcm[2].any() and not pcm[3].any()  # silence when there is nothing to say
    assert played == ["m1", "m2"]  # both marks' audio went out in frame 2
    assert [f.pts for f in out] == [0, 20, 40, 60] and all(f.sample_rate == 1000 for f in out)
    assert elapsed >= 0.055, "frames must be paced at real time (20 ms each)"


def test_paced_track_clear_drops_queued_audio_and_marks() -> None:
    played: list[str] = []
    track = PacedTrack(played.append, rate=1000)
    track.push_audio(np.ones(100, np.int16))
    track.push_mark("gone")
    first = run(track.recv())
    assert first.to_ndarray().all() and track.queued_samples == 80
    track.clear()
    assert track.queued_samples == 0
    assert not run(track.recv()).to_ndarray().any()
    assert played == []


def test_paced_track_hold_sends_silence_and_keeps_the_queue_and_its_marks() -> None:
    played: list[str] = []
    track = PacedTrack(played.append, rate=1000)
    track.push_audio(np.ones(40, np.int16))
    track.push_mark("m")
    track.hold(True)
    assert not run(track.recv()).to_ndarray().any()  # held: silence, and nothing heard
    assert track.queued_samples == 40 and played == []
    track.hold(False)
    assert run(track.recv()).to_ndarray().all() and run(track.recv()).to_ndarray().all()
    assert played == ["m"]  # the mark goes out with the held audio, once it really plays


def test_stereo_and_float_frames_are_downmixed_to_mono_int16() -> None:
    packed = AudioFrame.from_ndarray(np.array([[100, 300, -50, 50, 1000, 3000]], np.int16), format="s16",
                                     layout="stereo")
    packed.sample_rate = 48000
    assert list(MonoInput().convert(packed)) == [200, 0, 2000]
    planar = AudioFrame.from_ndarray(np.array([[0.5, -0.5], [0.5, 0.5]], np.float32), format="fltp",
                                     layout="stereo")
    planar.sample_rate = 48000
    mono = MonoInput().convert(planar)
    assert mono.dtype == np.int16 and abs(int(mono[0]) - 16383) <= 1 and mono[1] == 0


def test_mono_input_resamples_g711_rate_frames_to_48k() -> None:
    mono = MonoInput()
    total = 0
    for _ in range(50):
        frame = AudioFrame.from_ndarray(np.zeros((1, 160), np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        total += len(mono.convert(frame))
    assert 48000 - 480 <= total <= 48000  # one second at 48 kHz, less the resampler's delay (under 10 ms)


def test_fed_track_sends_what_it_is_fed_with_rising_pts_and_drops_the_oldest_when_unread() -> None:
    async def scenario():
        track = FedTrack()
        for i in range(FedTrack.MAX_QUEUED + 5):
            track.feed(np.full(960, i, np.int16))
        first, second = await track.recv(), await track.recv()
        return first, second

    first, second = run(scenario())
    assert first.to_ndarray()[0, 0] == 5 and second.to_ndarray()[0, 0] == 6
    assert (first.pts, second.pts) == (0, 960)


def test_webrtc_wire_counts_only_loud_frames_and_short_gaps_as_agent_audio() -> None:
    wire = WebRtcCallerSerializer("c", {})
    silence, loud = np.zeros(960, np.int16), np.full(960, 2000, np.int16)
    assert wire.parse(silence) == []  # before the agent speaks
    assert [k for k, _ in wire.parse(loud)] == ["audio"]
    gap = [wire.parse(silence) for _ in range(20)]  # 400 ms of silence: the first 300 ms stay
    assert sum(1 for g in gap if g) == 15
    assert wire.parse('{"type": "transcript", "text": "hi"}') == [("event", {"type": "transcript", "text": "hi"})]
    assert wire.start() == [] and json.loads(wire.stop()[0])["type"] == "stop"


def test_urls() -> None:
    assert offer_url("http://h:1") == "http://h:1/webrtc/offer"
    assert offer_url("ws://h:1/") == "http://h:1/webrtc/offer"
    assert offer_url("https://h/custom/offer?token=x") == "https://h/custom/offer?token=x"
    assert endpoint_url("http://h:1", "webrtc") == "http://h:1/webrtc/offer"


# -- offers ---------------------------------------------------------------------------------------------------

AUDIO_SDP = ("v=0\r\no=- 0 0 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\n"
             "a=rtpmap:0 PCMU/8000\r\n")


@pytest.mark.parametrize("sdp", [None, 42, "", "   ", "garbage", "v=0\r\nm=video 9 RTP/AVP 96\r\n"])
def test_check_sdp_refuses_offers_without_audio(sdp) -> None:
    with pytest.raises(BadOffer):
        check_sdp(sdp)


def test_check_sdp_accepts_an_audio_offer() -> None:
    check_sdp(AUDIO_SDP)


def test_start_fields_are_checked_like_the_native_start() -> None:
    start = start_fields({"sdp": "x", "type": "offer", "greeting": None, "system_prompt": "Be brief.",
                          "sample_rate": 8000})
    assert start["greeting"] is None and start["system_prompt"] == "Be brief." and "sample_rate" not in start
    assert start["call_id"].startswith("rtc-")
    for bad in ({"greeting": 5}, {"metadata": "x"}, {"call_id": 7}, {"call_id": "x" * 200}):
        with pytest.raises(BadOffer):
            start_fields(bad)


async def aiortc_offer() -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def app_client(**calls) -> TestClient:
    return TestClient(create_app(load_settings(overrides={"calls": calls}), load_models=False))


def test_offer_endpoint_refusals_without_models() -> None:
    client = app_client()
    assert client.post("/webrtc/offer", content=b"{oops").status_code == 400
    bad = client.post("/webrtc/offer", json={"type": "offer", "sdp": "v=0"})
    assert bad.status_code == 400 and "no audio" in bad.json()["detail"]
    unusable = client.post("/webrtc/offer", json={"type": "offer", "sdp": AUDIO_SDP})  # no ICE credentials
    assert unusable.status_code in (400, 503)
    good = client.post("/webrtc/offer", json={"type": "offer", "sdp": run(aiortc_offer())})
    assert good.status_code == 503 and "loading" in good.json()["detail"]  # a fine offer, but no models yet
    assert client.get("/health").status_code == 200


def test_offer_endpoint_needs_the_token_when_one_is_set() -> None:
    client = app_client(auth_token="s3cret", ice_servers=[{"urls": ["turn:t.example:3478"], "username": "u",
                                                           "credential": "pw"}])
    assert client.post("/webrtc/offer", json={"type": "offer", "sdp": AUDIO_SDP}).status_code == 401
    assert client.get("/webrtc/config").status_code == 401
    config = client.get("/webrtc/config?token=s3cret").json()
    assert config == {"iceServers": [{"urls": ["turn:t.example:3478"], "username": "u", "credential": "pw"}]}
    page = client.get("/")
    assert page.status_code == 200 and "softphone.js" in page.text
    assert client.get("/static/softphone/softphone.js").status_code == 200


def test_ice_servers_default_to_none() -> None:
    assert load_settings().calls.ice_servers == []


# -- a PeerLink against a real aiortc peer --------------------------------------------------------------------


class Tone(FedTrack):
    """A stereo-ish test caller: a loud 48 kHz tone, fed by itself at real time."""

    async def recv(self):
        await asyncio.sleep(0.02)
        self.feed((np.sin(np.arange(960) / 5.0) * 8000).astype(np.int16))
        return await super().recv()


async def link_scenario() -> dict:
    server_pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    link = PeerLink(server_pc, {"call_id": "unit"})
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    client.addTrack(Tone())
    client.addTrack(VideoStreamTrack())  # must be drained too
    channel = client.createDataChannel("events")
    got_text: list[str] = []
    channel.on("message", got_text.append)
    agent_audio: list[np.ndarray] = []

    async def read_agent(track):
        mono = MonoInput()
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            agent_audio.append(mono.convert(frame))

    readers = []
    client.on("track", lambda t: readers.append(asyncio.ensure_future(read_agent(t))))
    await client.setLocalDescription(await client.createOffer())
    await server_pc.setRemoteDescription(client.localDescription)
    await server_pc.setLocalDescription(await server_pc.createAnswer())
    await client.setRemoteDescription(RTCSessionDescription(server_pc.localDescription.sdp, "answer"))

    start = json.loads((await asyncio.wait_for(link.receive(), 20))["text"])
    audio = b""
    while len(audio) < 48000 * 2 // 2:  # half a second of caller audio
        message = await asyncio.wait_for(link.receive(), 10)
        audio += message.get("bytes") or b""
    # 100 ms of a 440 Hz tone (not a constant: Opus filters DC out, so only its onset would come through)
    tone = 6000 * np.sin(2 * np.pi * 440 * np.arange(960 * 5) / 48000)
    await link.send_bytes(tone.astype("<i2").tobytes())
    await link.send_text(json.dumps({"type": "mark", "name": "vp:0:0"}))
    await link.send_text(json.dumps({"type": "transcript", "role": "user", "text": "hello", "final": True,
                                     "turn": 1}))
    marks = []
    while not marks:
        message = await asyncio.wait_for(link.receive(), 10)
        if "text" in message:
            marks.append(json.loads(message["text"]))
    # The mark echoes once the audio left the server; the client's receiver hands it on a few frames later (its
    # jitter buffer), later still on a loaded machine. Wait for it, within a bound, before hanging up.
    deadline = asyncio.get_running_loop().time() + 10
    while not any(np.abs(a).max() > 2000 for a in agent_audio) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    while not got_text:
        await asyncio.sleep(0.05)
    channel.send(json.dumps({"type": "mark", "name": "forged"}))  # ignored: only a stop gets through
    channel.send(json.dumps({"type": "stop"}))
    stop = None
    while stop is None:
        message = await asyncio.wait_for(link.receive(), 10)
        if "text" in message:
            stop = json.loads(message["text"])
    drains_running = sum(not t.done() for t in link._drains)
    link.hang_up("shutdown")  # what the server's shutdown does
    shutdown = None
    while shutdown is None:
        message = await asyncio.wait_for(link.receive(), 10)
        if "text" in message:
            shutdown = json.loads(message["text"])
    await link.close()
    await client.close()
    end = await asyncio.wait_for(link.receive(), 5)
    while end.get("type") != "websocket.disconnect":
        end = await asyncio.wait_for(link.receive(), 5)
    for task in readers:
        task.cancel()
    return {"start": start, "audio": np.frombuffer(audio, "<i2"), "marks": marks, "text": got_text, "stop": stop,
            "shutdown": shutdown, "end": end, "drains": drains_running, "agent": agent_audio,
            "state": server_pc.connectionState}


def test_peer_link_carries_a_call_over_a_real_peer_connection() -> None:
    r = run(link_scenario())
    assert r["start"]["type"] == "start" and r["start"]["sample_rate"] == 48000 and r["start"]["marks"] is True
    assert r["start"]["call_id"] == "unit"
    assert np.abs(r["audio"]).max() > 3000, "the caller's tone did not arrive"
    assert r["drains"] == 2, "the audio and the video track must both be read"
    assert r["marks"] == [{"type": "mark", "name": "vp:0:0"}]  # echoed once the audio before it went out
    assert json.loads(r["text"][0])["text"] == "hello"  # events reach the data channel
    assert r["stop"] == {"type": "stop", "reason": "hangup"}
    assert r["shutdown"] == {"type": "stop", "reason": "shutdown"}
    assert r["end"] == {"type": "websocket.disconnect"} and r["state"] == "closed"
    assert any(np.abs(a).max() > 2000 for a in r["agent"]), "the agent audio did not reach the client"


class RecordingLink:
    """Stands in for a PeerLink: keeps what the Connection hands it, in order."""

    def __init__(self) -> None:
        self.log: list = []

    async def send_bytes(self, data: bytes) -> None:
        self.log.append("audio")

    async def send_text(self, text: str) -> None:
        self.log.append(json.loads(text)["type"])

    def hold_playout(self, on: bool) -> None:
        self.log.append(("hold", on))


def test_a_held_connection_sends_no_audio_and_its_link_gets_the_clear_before_the_release() -> None:
    async def scenario() -> list:
        link = RecordingLink()
        ser = NativeSerializer()
        ser.decode(json.dumps({"type": "start", "sample_rate": 8000}))
        conn = Connection(link, "webrtc", ser, None, None, None)
        conn.pb = PlaybackController(8000, ChunkPolicy.millis(8000, 20), max_lead_ms=200)
        tasks = [asyncio.create_task(conn._writer()), asyncio.create_task(conn._pacer())]
        conn.play(np.ones(320, np.int16), None)
        await asyncio.sleep(0.05)
        assert link.log == ["audio", "audio"]
        conn.hold(True)
        conn.play(np.ones(320, np.int16), None)
        await asyncio.sleep(0.1)
        assert link.log[2:] == [("hold", True)]  # nothing new went out while held
        assert conn.is_playing()
        conn.clear()
        conn.hold(False)
        conn.play(np.ones(160, np.int16), None)
        await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        return link.log[3:]

    assert run(scenario()) == ["clear", ("hold", False), "audio"]
