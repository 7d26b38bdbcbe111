"""Observability of a real call: the turn timeline against the caller's own clock, the call store, /metrics,
the recording, and the dashboard in headless Chromium; and a caller who vanishes mid-reply.

One in-process server (real models) records every call, with its store and recordings in a temporary directory;
one three-turn Twilio call feeds most tests. The dashboard's screenshot lands in reports/dashboard/ (git-ignored).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import wave
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from tests.browser_helpers import chromium
from tests.call_helpers import call_settings
from tests.e2e.test_call_bad_input import vanish_mid_reply
from tests.e2e.test_call_transports import THREE_TURNS, speak
from tests.metrics_helpers import Scrape
from tests.net_helpers import in_process_server
from voicepipe.caller import run_call
from voicepipe.observability.timeline import CHAIN, EVENTS
from voicepipe.observability.waterfall import turn_stages

pytestmark = pytest.mark.e2e

REPORTS = Path(__file__).resolve().parents[2] / "reports" / "dashboard"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The real app, recording every call, with its store and recordings in a temporary directory."""
    root = tmp_path_factory.mktemp("observability")
    with in_process_server(call_settings(root, observability={"record_calls": True})) as (base, app):
        yield base, app, root


def stored_call(base: str, call_id: str, timeout: float = 15.0) -> dict:
    """The call from /api/calls/{id} once the server has ended it."""
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(f"{base}/api/calls/{call_id}", timeout=10)
        if response.status_code == 200 and response.json()["outcome"] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] is not None, "the call never ended in the store"
    return response.json()


def scrape(base: str) -> Scrape:
    return Scrape(httpx.get(f"{base}/metrics", timeout=10).text)


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


@pytest.fixture(scope="module")
def called(server, voice_dir: Path):
    """One finished three-turn Twilio call: the client's result, the store's and the server's own record of it,
    and /metrics before and after."""
    base, _, root = server
    utts = [speak(text, voice_dir) for text, _ in THREE_TURNS]
    before = scrape(base)
    result = asyncio.run(run_call(f"{base.replace('http://', 'ws://')}/ws/twilio", "twilio", utts,
                                  quiet_s=1.5, record_url=base))  # 1.5 s of agent silence: every reply plays out
    call_id = result.record["call_id"]
    stored = stored_call(base, call_id)
    after = wait_for_scrape(base, lambda m: m.value("voicepipe_calls_total", transport="twilio") >
                            before.value("voicepipe_calls_total", transport="twilio"))
    return SimpleNamespace(base=base, root=root, utterances=utts, result=result, stored=stored, before=before,
                           after=after, live=httpx.get(f"{base}/calls/{call_id}", timeout=10).json())


def test_the_store_holds_what_the_call_recorded(called) -> None:
    call, live = called.stored, called.live
    assert call["transport"] == "twilio" and call["outcome"] == "completed" and call["end_reason"] == "stop"
    assert call["ended"] > call["started"]
    assert (call["barge_ins"], call["metadata"], call["greeting"]) == (live["barge_ins"], live["metadata"],
                                                                       live["greeting"])
    assert [t["turn"] for t in call["turns"]] == [t["turn"] for t in live["turns"]] == [1, 2, 3]
    for stored, recorded in zip(call["turns"], live["turns"], strict=True):
        for name in ("user_text", "agent_text", "heard_text", "interrupted", "prompt_tokens", "cached_prompt_tokens",
                     "output_tokens", "timings_ms", "timeline", "error", "decision", "reopened", "backchannels"):
            assert stored[name] == recorded[name], (stored["turn"], name, stored[name], recorded[name])
    for turn, key in zip(call["turns"], ("dinner", "london", "capital"), strict=True):
        assert key in turn["user_text"].lower(), (key, turn["user_text"])
    for turn in call["turns"]:  # the events a turn has happened in pipeline order
        timeline = turn["timeline"]
        times = [timeline[key] for key in CHAIN if key in timeline]
        assert times == sorted(times), timeline
    played = [t for t in call["turns"] if "playout_end" in t["timeline"]]
    assert len(played) >= 2, "fewer than two replies played out"
    for turn in played:  # a reply that played out has every event
        timeline = turn["timeline"]
        assert set(CHAIN) <= set(timeline), sorted(set(CHAIN) - set(timeline))
        assert timeline["speech_start"] <= min(timeline["first_partial"], timeline["final_transcript"])
        assert timeline["speech_end"] < timeline["end_of_turn"] <= timeline["first_audio_sent"]
        v2v = (timeline["first_audio_sent"] - timeline["speech_end"]) * 1000
        assert turn["voice_to_voice_ms"] == pytest.approx(v2v, abs=1) and turn["agent_text"].strip()
    assert call["voice_to_voice_ms"]["p50"] is not None
    assert call["recording"] is True


def test_the_timeline_is_complete_and_matches_the_callers_clock(called) -> None:
    result, turns = called.result, called.live["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    mismatches = []
    for client, server_turn in zip(result.turns, turns, strict=True):
        timeline = server_turn["timeline"]
        missing = [e for e in EVENTS if e not in timeline]
        assert not missing, f"turn {server_turn['turn']}: no {missing} in {timeline}"
        figures = server_turn["timings_ms"]
        assert {"voice_to_voice", "response", "stt_final", "queue", "ttft", "tts_first_audio",
                "send_delay"} <= set(figures)
        # What the server says the caller waited matches what the caller measured (one process: one clock).
        t0 = called.live["started_mono"]
        ends = (round((t0 + timeline["speech_end"] - client.speech_end) * 1000),
                round((t0 + timeline["first_audio_sent"] - client.first_audio) * 1000))
        if abs(figures["voice_to_voice"] - client.voice_to_voice_ms) > 50:
            mismatches.append(f"turn {server_turn['turn']}: server {figures['voice_to_voice']} ms, client "
                              f"{client.voice_to_voice_ms:.1f} ms; server - client at speech end {ends[0]} ms, "
                              f"at first audio {ends[1]} ms")
    assert not mismatches, "the server's voice-to-voice is not what the caller measured: " + "; ".join(mismatches)


def test_metrics_moved_by_what_the_call_did(called) -> None:
    before, after, turns = called.before, called.after, called.live["turns"]

    def moved(sample: str, **labels: str) -> float:
        return after.value(sample, **labels) - before.value(sample, **labels)

    call = {"tier": "priority", "transport": "twilio"}
    for histogram in ("voice_to_voice", "response", "stt_final", "tts_first_audio"):
        assert moved(f"voicepipe_{histogram}_seconds_count", **call) == 3, histogram
    assert moved("voicepipe_voice_to_voice_seconds_sum", **call) * 1000 == pytest.approx(
        sum(t["timings_ms"]["voice_to_voice"] for t in turns), abs=1)
    # One LLM request per reply, plus one per early reply the caller's resumed speech dropped (cancelled: its
    # first token and inter-token gaps, if it got that far, are counted too). Without a drop the counts are exact.
    replies = sum(moved("voicepipe_llm_requests_total", **call, reason=r) for r in ("stop", "length"))
    dropped = moved("voicepipe_llm_requests_total", **call, reason="cancelled")
    assert replies == 3
    # A dropped reply gives its turn number back, so each reply keeps the label of its own turn.
    first, later = (moved("voicepipe_llm_ttft_seconds_count", **call, turn=t) for t in ("1", "2-5"))
    assert first >= 1 and later >= 2 and first + later <= replies + dropped, (first, later, dropped)
    if not dropped:
        assert (first, later) == (1, 2)
    gaps = moved("voicepipe_llm_itl_seconds_count", **call) - sum(t["output_tokens"] - 1 for t in turns)
    assert gaps >= 0 and (gaps == 0 or dropped > 0), (gaps, dropped)
    assert moved("voicepipe_calls_total", transport="twilio", outcome="completed") == 1
    assert moved("voicepipe_barge_ins_total", transport="twilio") == 0
    assert moved("voicepipe_prefix_cache_hit_tokens_total") >= sum(t["cached_prompt_tokens"] for t in turns)
    assert after.value("voicepipe_active_calls", transport="twilio") == 0


def test_the_recording_is_time_aligned_with_the_timeline(called) -> None:
    turns = called.live["turns"]
    directory = called.root / "recordings" / called.result.call_id
    stereo = read_stereo(directory / "call.wav")
    call_s = len(stereo) / 16000
    assert call_s > sum(len(u.audio) / u.rate for u in called.utterances)
    caller, agent = stereo[:, 0], stereo[:, 1]
    for turn in turns:
        tl = turn["timeline"]
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


def test_the_dashboard_in_headless_chromium(called) -> None:
    base, call = called.base, called.stored
    REPORTS.mkdir(parents=True, exist_ok=True)
    requested: list[str] = []
    with chromium() as browser:
        page = browser.new_page()
        page.on("request", lambda request: requested.append(request.url))

        page.goto(f"{base}/dashboard")
        row = page.locator(f'tr.call[data-call-id="{call["id"]}"]')
        assert row.count() == 1, "the call list does not show the call"
        assert row.locator("td.p50").inner_text().endswith(" ms")
        assert row.locator("td.p95").inner_text().endswith(" ms")
        page.select_option("select[name=transport]", "twilio")  # the filter form keeps the call
        page.click("form.filters button")
        page.wait_for_load_state()
        assert "transport=twilio" in page.url and row.count() == 1

        row.locator("a").click()
        page.wait_for_load_state()
        assert page.url.startswith(f"{base}/dashboard/calls/")
        groups = page.locator("svg.waterfall g.turn")
        assert groups.count() == len(call["turns"]), "not one bar group per turn"
        for i, turn in enumerate(call["turns"]):
            group = groups.nth(i)
            assert group.get_attribute("data-turn") == str(turn["turn"])
            stages = group.locator("rect.stage")
            names = [stages.nth(j).get_attribute("data-stage") for j in range(stages.count())]
            assert names == [segment.stage for segment in turn_stages(turn)], names
            if "playout_end" not in turn["timeline"]:
                continue  # a reply cut short draws the stages it reached (checked above)
            assert names == ["end_of_turn", "stt", "queue", "prefill", "first_clause", "tts", "send"], names
            # The stages end where the caller hears the reply (an early reply's overlap the end-of-turn wait).
            end = max(segment.end_ms for segment in turn_stages(turn))
            assert abs(end - turn["voice_to_voice_ms"]) <= 1, (end, turn)
            box = stages.first.bounding_box()
            assert box is not None and box["width"] > 0 and box["height"] > 0, "a bar is not drawn"
        assert page.locator(".legend li").count() >= 5
        assert "london" in page.locator(".transcript").inner_text().lower()
        duration = page.eval_on_selector("audio.recording", """a => a.readyState >= 1 ? a.duration :
            new Promise(done => { a.onloadedmetadata = () => done(a.duration); a.onerror = () => done(-1); })""")
        assert duration > 2.0, f"the recording did not load in the player (duration {duration})"
        fill = page.eval_on_selector("rect.stage-prefill", "r => getComputedStyle(r).fill")
        assert fill not in ("", "none", "rgb(0, 0, 0)"), "the local stylesheet did not load"
        page.screenshot(path=str(REPORTS / "call.png"), full_page=True)

    assert requested, "no requests were recorded"
    foreign = [url for url in requested if not url.startswith(f"{base}/")]
    assert not foreign, f"the pages asked other hosts: {foreign}"


def test_a_caller_who_vanishes_mid_reply_is_stored_as_dropped_with_a_valid_recording(server, voice_dir) -> None:
    base, app, root = server
    asyncio.run(vanish_mid_reply(base.replace("http://", "ws://"), "twilio", app, speak(THREE_TURNS[0][0],
                                                                                         voice_dir)))
    vanished = [c for c in httpx.get(f"{base}/api/calls", params={"transport": "twilio"}).json()["calls"]
                if c["id"].startswith("vanish-twilio-")]
    assert len(vanished) == 1, vanished
    call = stored_call(base, vanished[0]["id"])
    assert call["outcome"] == "dropped" and call["end_reason"] == "disconnected"
    assert call["ended"] >= call["started"]
    assert [t["turn"] for t in call["turns"]] == [1] and "dinner" in call["turns"][0]["user_text"].lower()
    recording = httpx.get(f"{base}/api/calls/{call['id']}/recording.wav", timeout=10)
    assert recording.status_code == 200
    with wave.open(io.BytesIO(recording.content)) as wav:
        assert wav.getnchannels() == 2 and wav.getnframes() > wav.getframerate()  # more than a second

    directory = root / "recordings" / call["id"]
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
