"""Observability of real calls: the turn timeline against the caller's own clock, the recordings, and /metrics.

A real 3-turn Twilio call (espeak-ng caller, the default models) and a caller who vanishes mid-reply, against one
in-process server that records every call into a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.call_helpers import call_settings
from tests.e2e.test_call_bad_input import vanish_mid_reply
from tests.e2e.test_call_transports import THREE_TURNS, speak, ws_url
from tests.metrics_helpers import Scrape
from tests.net_helpers import in_process_server
from voicepipe.observability.timeline import CHAIN, EVENTS
from voicepipe.transports.client import run_call

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("observability")
    settings = call_settings(root, observability={"record_calls": True})
    with in_process_server(settings) as (base, app):
        yield base.replace("http://", "ws://"), app, root


def scrape(base: str) -> Scrape:
    return Scrape(httpx.get(f"{base.replace('ws://', 'http://')}/metrics", timeout=10).text)


def wait_for_scrape(base: str, ready, timeout: float = 10.0) -> Scrape:
    """/metrics once `ready(scrape)` holds (the call's end is counted just after its socket closes)."""
    deadline = time.monotonic() + timeout
    while not ready(metrics := scrape(base)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return metrics


def read_stereo(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, 16000)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) if audio.size else 0.0


def test_a_three_turn_call_has_a_full_monotonic_timeline_and_a_recording(server, voice_dir: Path) -> None:
    base, app, root = server
    utts = [speak(text, voice_dir) for text, _ in THREE_TURNS]
    before = scrape(base)
    result = asyncio.run(run_call(ws_url(base, "twilio"), "twilio", utts, quiet_s=1.5,  # every reply plays out
                                  record_url=base.replace("ws://", "http://")))
    turns = result.record["turns"]
    after = wait_for_scrape(base, lambda m: m.value("voicepipe_calls_total", transport="twilio") >
                            before.value("voicepipe_calls_total", transport="twilio"))
    assert [t["turn"] for t in turns] == [1, 2, 3]
    mismatches = []
    for client, server_turn in zip(result.turns, turns, strict=True):
        timeline = server_turn["timeline"]
        missing = [e for e in EVENTS if e not in timeline]
        assert not missing, f"turn {server_turn['turn']}: no {missing} in {timeline}"
        times = [timeline[e] for e in CHAIN]
        assert times == sorted(times), f"turn {server_turn['turn']}: not monotonic: {timeline}"
        assert timeline["speech_start"] <= timeline["first_partial"] <= timeline["final_transcript"], timeline
        figures = server_turn["timings_ms"]
        assert {"voice_to_voice", "response", "stt_final", "queue", "ttft", "tts_first_audio",
                "send_delay"} <= set(figures)
        # What the server says the caller waited matches what the caller measured (one process: one clock).
        t0 = result.record["started_mono"]
        ends = (round((t0 + timeline["speech_end"] - client.speech_end) * 1000),
                round((t0 + timeline["first_audio_sent"] - client.first_audio) * 1000))
        if abs(figures["voice_to_voice"] - client.voice_to_voice_ms) > 50:
            mismatches.append(f"turn {server_turn['turn']}: server {figures['voice_to_voice']} ms, client "
                              f"{client.voice_to_voice_ms:.1f} ms; server - client at speech end {ends[0]} ms, "
                              f"at first audio {ends[1]} ms")

    def moved(sample: str, **labels: str) -> float:
        return after.value(sample, **labels) - before.value(sample, **labels)

    call = {"tier": "priority", "transport": "twilio"}
    for histogram in ("voice_to_voice", "response", "stt_final", "tts_first_audio"):
        assert moved(f"voicepipe_{histogram}_seconds_count", **call) == 3, histogram
    assert moved("voicepipe_voice_to_voice_seconds_sum", **call) * 1000 == pytest.approx(
        sum(t["timings_ms"]["voice_to_voice"] for t in turns), abs=1)
    assert moved("voicepipe_llm_ttft_seconds_count", **call, turn="1") == 1
    assert moved("voicepipe_llm_ttft_seconds_count", **call, turn="2-5") == 2
    assert moved("voicepipe_llm_itl_seconds_count", **call) == sum(t["output_tokens"] - 1 for t in turns)
    assert moved("voicepipe_calls_total", transport="twilio", outcome="completed") == 1
    assert moved("voicepipe_barge_ins_total", transport="twilio") == 0
    assert moved("voicepipe_prefix_cache_hit_tokens_total") >= sum(t["cached_prompt_tokens"] for t in turns)
    assert after.value("voicepipe_active_calls", transport="twilio") == 0

    directory = root / "recordings" / result.call_id
    stereo = read_stereo(directory / "call.wav")
    call_s = len(stereo) / 16000
    assert call_s > sum(len(u.audio) / u.rate for u in utts)
    caller, agent = stereo[:, 0], stereo[:, 1]
    for server_turn in turns:
        tl = server_turn["timeline"]
        spoken = caller[int(tl["speech_start"] * 16000): int(tl["speech_end"] * 16000)]
        assert rms(spoken) > 300, "the caller's words are not on the left channel where the timeline puts them"
        reply = agent[int(tl["first_audio_sent"] * 16000): int(tl["playout_end"] * 16000)]
        assert rms(reply) > 300, "the agent's reply is not on the right channel where the timeline puts it"
        assert rms(agent[int(tl["speech_start"] * 16000): int(tl["speech_end"] * 16000)]) < 50  # no double talk
    events = read_events(directory / "events.jsonl")
    assert events[0]["type"] == "call_start" and events[0]["transport"] == "twilio"
    assert events[-1]["type"] == "call_end" and events[-1]["outcome"] == "completed"
    assert [e["turn"] for e in events if e["type"] == "turn"] == [1, 2, 3]
    inbound = [e for e in events if e["type"] == "inbound"]
    assert len(inbound) >= call_s / 0.02 * 0.9  # every 20 ms frame the caller sent
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    assert not mismatches, "the server's voice-to-voice is not what the caller measured: " + "; ".join(mismatches)


def test_a_caller_who_vanishes_mid_reply_leaves_a_valid_recording(server, voice_dir) -> None:
    base, app, root = server
    asyncio.run(vanish_mid_reply(base, "twilio", app, speak(THREE_TURNS[0][0], voice_dir)))
    dropped = [r for r in app.state.calls.ended.values() if r.call_id.startswith("vanish-twilio-")]
    assert len(dropped) == 1 and dropped[0].outcome == "dropped"
    directory = root / "recordings" / dropped[0].call_id
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the writer thread closes the files just after the call ends
        events = read_events(directory / "events.jsonl")
        if events and events[-1]["type"] == "call_end":
            break
        time.sleep(0.1)
    assert events[-1]["type"] == "call_end" and events[-1]["outcome"] == "dropped"
    assert [e["turn"] for e in events if e["type"] == "turn"] == [1]  # the turn cut short is there too
    stereo = read_stereo(directory / "call.wav")
    assert len(stereo) / 16000 == pytest.approx(events[-1]["t"], abs=0.6)
    assert rms(stereo[:, 0]) > 100 and rms(stereo[:, 1]) > 50  # the caller, and the start of the reply
