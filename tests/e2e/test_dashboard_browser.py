"""The call store and the dashboard after a real call: a recorded three-turn call over the Twilio transport against
the real app (real models), its store and recordings in a temporary directory; then, in headless Chromium, the
call list, the call page's waterfall and recording player, and a check that the pages asked nothing of any host
but the server.

The screenshot of the call page lands in reports/dashboard/ (git-ignored).
"""

from __future__ import annotations

import asyncio
import io
import time
import wave
from pathlib import Path

import httpx
import pytest

from tests.browser_helpers import chromium
from tests.call_helpers import call_settings
from tests.e2e.test_call_bad_input import vanish_mid_reply
from tests.e2e.test_call_transports import speak
from tests.net_helpers import in_process_server
from voicepipe.observability.timeline import CHAIN
from voicepipe.observability.waterfall import turn_stages
from voicepipe.transports.client import run_call

pytestmark = pytest.mark.e2e

REPORTS = Path(__file__).resolve().parents[2] / "reports" / "dashboard"
TURNS = ["I want to book a table for dinner.", "Tell me about the weather in London.", "What is the capital of France?"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The real app, recording every call, with its store and recordings in a temporary directory."""
    tmp = tmp_path_factory.mktemp("dashboard")
    settings = call_settings(tmp, observability={"record_calls": True})
    with in_process_server(settings) as (base, app):
        yield base, app, tmp


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


@pytest.fixture(scope="module")
def called(server):
    """The server's base URL, the stored record of one finished three-turn Twilio call, and the server's own
    in-memory record of it (GET /calls/{id})."""
    base, _, tmp = server
    utts = [speak(text, tmp) for text in TURNS]
    result = asyncio.run(run_call(f"{base.replace('http://', 'ws://')}/ws/twilio", "twilio", utts, quiet_s=0.6,
                                  record_url=base))
    call_id = result.record["call_id"]
    stored = stored_call(base, call_id)
    return base, stored, httpx.get(f"{base}/calls/{call_id}", timeout=10).json()


def test_the_store_holds_what_the_call_recorded(called) -> None:
    _, call, live = called
    assert call["transport"] == "twilio" and call["outcome"] == "completed" and call["end_reason"] == "stop"
    assert call["ended"] > call["started"]
    assert (call["barge_ins"], call["metadata"], call["greeting"]) == (live["barge_ins"], live["metadata"],
                                                                       live["greeting"])
    assert [t["turn"] for t in call["turns"]] == [t["turn"] for t in live["turns"]] == [1, 2, 3]
    for stored, recorded in zip(call["turns"], live["turns"], strict=True):
        for name in ("user_text", "agent_text", "heard_text", "interrupted", "prompt_tokens", "cached_prompt_tokens",
                     "output_tokens", "timings_ms", "timeline", "error"):
            assert stored[name] == recorded[name], (stored["turn"], name, stored[name], recorded[name])
    for turn, key in zip(call["turns"], ("dinner", "london", "france"), strict=True):
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
        assert timeline["speech_start"] <= timeline["first_partial"] <= timeline["final_transcript"]
        v2v = (timeline["first_audio_sent"] - timeline["speech_end"]) * 1000
        assert turn["voice_to_voice_ms"] == pytest.approx(v2v, abs=1) and turn["agent_text"].strip()
    assert call["voice_to_voice_ms"]["p50"] is not None
    assert call["recording"] is True


def test_the_dashboard_in_headless_chromium(called) -> None:
    base, call, _ = called
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
            total = sum(float(stages.nth(j).get_attribute("data-ms")) for j in range(stages.count()))
            assert 0.8 * turn["voice_to_voice_ms"] <= total <= turn["voice_to_voice_ms"] + 1, (total, turn)
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


def test_a_call_whose_client_vanishes_mid_reply_is_stored_as_dropped(server) -> None:
    base, app, tmp = server
    asyncio.run(vanish_mid_reply(base.replace("http://", "ws://"), "twilio", app, speak(TURNS[0], tmp)))
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
