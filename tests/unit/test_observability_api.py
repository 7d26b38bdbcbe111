"""`/api/calls*` and the `/dashboard*` pages over a real call store (no models: the app's lifespan opens the
store, records are fed through its observer hooks as a call session would)."""

from __future__ import annotations

import re
import time
import wave
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.observability_helpers import REOPENED, decide, decision, report_call
from voicepipe.config import load_settings
from voicepipe.observability.records import ECHO_METADATA, CallRecord, TurnRecord
from voicepipe.observability.store import CallStore
from voicepipe.observability.timeline import EVENTS, derive_timings
from voicepipe.server import create_app


def full_turn(n: int, at: float) -> TurnRecord:
    """A turn whose timeline has every event, 0.1 s apart from `at`, and the figures derived from it."""
    timeline = {key: at + i * 0.1 for i, key in enumerate(EVENTS)}
    return TurnRecord(n, user_text=f"caller words {n}", agent_text=f"Agent reply number {n}. It goes on.",
                      prompt_tokens=100 + n, cached_prompt_tokens=90, output_tokens=12,
                      timings_ms=derive_timings(timeline), timeline=timeline)


def make_app(tmp_path: Path, **observability):
    settings = load_settings(overrides={
        "paths": {"data_dir": str(tmp_path / "data"), "recordings_dir": str(tmp_path / "rec")},
        "observability": observability,
    })
    return create_app(settings, load_models=False)


@pytest.fixture
def served(tmp_path: Path):
    app = make_app(tmp_path)
    with TestClient(app) as client:
        call = CallRecord("call-1", "twilio", metadata={"from": "+15550100"}, greeting="Hi there.",
                          greeting_heard="Hi there.")
        call.turns = [full_turn(n, n * 10.0) for n in (1, 2, 3)]
        call.turns[1].interrupted, call.turns[1].heard_text = True, "Agent reply"
        decide(call.turns[2], reopened=1, backchannels=("mm-hm", "yeah"))  # turns 1 and 2 have no decision
        call.barge_ins = 1
        report_call(app.state.observers, call)
        other = CallRecord("call-2", "native", started=time.time() - 3 * 86400)
        other.turns = [TurnRecord(1, "hello", "hi", timings_ms={"voice_to_voice": 900.0, "response": 700.0,
                                                                "stt_final": 50.0, "ttft": 300.0})]
        report_call(app.state.observers, other)
        yield client, app


def test_api_lists_and_gets_calls(served) -> None:
    client, _ = served
    calls = client.get("/api/calls").json()["calls"]
    assert [c["id"] for c in calls] == ["call-1", "call-2"]
    first = calls[0]
    assert first["transport"] == "twilio" and first["turn_count"] == 3 and first["outcome"] == "completed"
    v2v = (EVENTS.index("first_audio_sent") - EVENTS.index("speech_end")) * 100.0  # full_turn: events 0.1 s apart
    assert first["voice_to_voice_ms"]["p50"] == pytest.approx(v2v)
    assert [c["id"] for c in client.get("/api/calls", params={"transport": "native"}).json()["calls"]] == ["call-2"]
    recent = client.get("/api/calls", params={"since": time.time() - 3600}).json()["calls"]
    assert [c["id"] for c in recent] == ["call-1"]
    old = client.get("/api/calls", params={"until": time.time() - 86400}).json()["calls"]
    assert [c["id"] for c in old] == ["call-2"]
    assert len(client.get("/api/calls", params={"limit": 1}).json()["calls"]) == 1

    call = client.get("/api/calls/call-1").json()
    assert [t["turn"] for t in call["turns"]] == [1, 2, 3]
    assert call["turns"][1]["interrupted"] is True and call["turns"][1]["heard_text"] == "Agent reply"
    assert set(call["turns"][0]["timeline"]) == set(EVENTS)
    assert call["metadata"] == {"from": "+15550100"} and call["recording"] is False
    last = call["turns"][2]
    assert last["decision"] == decision() and last["reopened"] == [REOPENED]
    assert last["backchannels"] == ["mm-hm", "yeah"]
    assert [(t["decision"], t["reopened"], t["backchannels"]) for t in call["turns"][:2]] == [({}, [], [])] * 2
    assert not {"decision", "reopened", "backchannels"} & set(calls[0])  # the list adds nothing


@pytest.mark.parametrize("query", [{"limit": 0}, {"limit": 100000}, {"since": "yesterday"}])
def test_bad_queries_get_a_clear_client_error(served, query) -> None:
    client, _ = served
    response = client.get("/api/calls", params=query)
    assert response.status_code == 400  # the app's validation errors: one line naming the parameter
    assert f"query.{next(iter(query))}" in response.json()["error"]["message"]


def test_unknown_calls_and_missing_recordings_are_404(served, tmp_path: Path) -> None:
    client, _ = served
    assert client.get("/api/calls/nope").status_code == 404
    assert "nope" in client.get("/api/calls/nope").json()["detail"]
    assert client.get("/api/calls/call-1/recording.wav").status_code == 404
    assert client.get("/dashboard/calls/nope").status_code == 404
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "call.wav").write_bytes(b"RIFF")
    assert client.get("/api/calls/..%2Fsecret/recording.wav").status_code == 404


def write_recording(path: Path) -> None:
    path.parent.mkdir(parents=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0\0\0" * 1600)


def test_a_recorded_call_serves_its_wav_and_the_page_plays_it(served, tmp_path: Path) -> None:
    client, _ = served
    write_recording(tmp_path / "rec" / "call-1" / "call.wav")
    response = client.get("/api/calls/call-1/recording.wav")
    assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
    assert response.content.startswith(b"RIFF")
    assert client.get("/api/calls/call-1").json()["recording"] is True
    page = client.get("/dashboard/calls/call-1").text
    assert '<audio class="recording" controls preload="metadata" src="/api/calls/call-1/recording.wav">' in page


def test_the_call_list_page_shows_calls_and_filters(served) -> None:
    client, _ = served
    page = client.get("/dashboard").text  # default: the last 24 h
    assert re.findall(r'data-call-id="([^"]+)"', page) == ["call-1"]
    v2v = (EVENTS.index("first_audio_sent") - EVENTS.index("speech_end")) * 100  # full_turn: events 0.1 s apart
    assert 'href="/dashboard/calls/call-1"' in page and f">{v2v} ms<" in page
    page = client.get("/dashboard", params={"range": "all"}).text
    assert re.findall(r'data-call-id="([^"]+)"', page) == ["call-1", "call-2"]
    page = client.get("/dashboard", params={"range": "all", "transport": "native"}).text
    assert re.findall(r'data-call-id="([^"]+)"', page) == ["call-2"]
    assert client.get("/dashboard", params={"range": "forever"}).status_code == 400
    two_days_ago = datetime.fromtimestamp(time.time() - 2 * 86400, UTC).strftime("%Y-%m-%dT%H:%M")
    page = client.get("/dashboard", params={"to": two_days_ago, "range": "all"}).text
    assert re.findall(r'data-call-id="([^"]+)"', page) == ["call-2"]
    assert f'name="to" type="datetime-local" value="{two_days_ago}"' in page
    page = client.get("/dashboard", params={"from": two_days_ago}).text
    assert re.findall(r'data-call-id="([^"]+)"', page) == ["call-1"]
    bad = client.get("/dashboard", params={"from": "last tuesday"})
    assert bad.status_code == 400 and "from: expected a UTC date and time" in bad.json()["detail"]


def test_the_call_page_draws_one_bar_group_per_turn(served) -> None:
    client, _ = served
    page = client.get("/dashboard/calls/call-1").text
    groups = re.findall(r'<g class="turn[^"]*" data-turn="(\d+)">(.*?)</g>', page)
    assert [n for n, _ in groups] == ["1", "2", "3"]
    for _, body in groups:  # every stage of a full timeline is drawn, in pipeline order
        assert re.findall(r'data-stage="(\w+)"', body) == ["end_of_turn", "stt", "queue", "prefill",
                                                             "first_clause", "tts", "send"]
    assert '<g class="turn interrupted" data-turn="2">' in page
    assert "barge-in" in page and '<span class="unheard"' in page
    assert "caller words 3" in page and 'class="legend"' in page
    # a turn stored without a timeline falls back to its derived figures
    fallback = client.get("/dashboard/calls/call-2").text
    body = re.search(r'<g class="turn" data-turn="1">(.*?)</g>', fallback).group(1)
    assert re.findall(r'data-stage="(\w+)"', body) == ["end_of_turn", "stt", "prefill"]


def test_the_call_page_says_what_ended_each_turn_and_marks_reopens_and_backchannels(served) -> None:
    client, _ = served
    page = client.get("/dashboard/calls/call-1").text
    groups = dict(re.findall(r'<g class="turn[^"]*" data-turn="(\d+)">(.*?)</g>', page))
    wait = re.search(r'data-stage="end_of_turn".*?<title>(.*?)</title>', groups["3"]).group(1)
    assert wait.endswith("— hybrid: text and sound say complete · text 0.91 · sound 0.88 · waited 212 ms"
                         " · reopened ×1"), wait
    assert re.search(r'data-stage="end_of_turn".*?<title>turn 1: end-of-turn wait \d+ ms</title>', groups["1"])
    items = dict(re.findall(r'<li class="turn[^"]*" data-turn="(\d+)">(.*?)</li>', page))
    assert "end of turn: hybrid: text and sound say complete" in items["3"]
    assert "↺ reopened ×1" in items["3"]
    assert "at 4.2 s: text: text says complete · text 0.62 · waited 320 ms" in items["3"]  # in the mark's tooltip
    assert '<span class="backchannel"' in items["3"] and "“mm-hm” · “yeah”" in items["3"]
    for plain in ("1", "2"):  # no decision, nothing reopened, no backchannel: rendered as before
        assert not re.search(r'class="(decision|reopened|backchannel)"', items[plain])


def test_the_call_page_shows_a_keypad_turn_and_each_tool_call(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    with TestClient(app) as client:
        call = CallRecord("call-k", "twilio")
        keys, tools = full_turn(1, 10.0), full_turn(2, 20.0)
        keys.dtmf, keys.user_text = "4217", "[keypad: 4 2 1 7]"
        tools.tool_calls = [{"name": "lookup_order", "arguments": '{"order_id":"4217"}', "t": 21.0,
                             "latency_ms": 120.4, "result_chars": 40, "error": None},
                            {"name": "broken", "arguments": "{}", "t": 22.0, "latency_ms": 2000.0,
                             "result_chars": 60, "error": "no answer within 2 s"}]
        call.turns = [keys, tools]
        report_call(app.state.observers, call)
        stored = client.get("/api/calls/call-k").json()
        page = client.get("/dashboard/calls/call-k").text
    assert stored["turns"][0]["dtmf"] == "4217" and stored["turns"][1]["tool_calls"][1]["error"]
    items = dict(re.findall(r'<li class="turn[^"]*" data-turn="(\d+)">(.*?)</li>', page))
    assert '<span class="keypad"' in items["1"] and "⌨ 4 2 1 7" in items["1"]
    assert "<code>lookup_order({&quot;order_id&quot;:&quot;4217&quot;})</code> · 120 ms · 40 chars back" in items["2"]
    assert '<span class="tool-error">error: no answer within 2 s</span>' in items["2"]
    assert "dtmf" not in items["2"] and "tool-call" not in items["1"]


def test_the_call_page_shows_the_echo_figures_and_what_the_echo_gate_took_out_where_it_was_said(tmp_path) -> None:
    gated = [{"t": 20.0, "turn": 2, "text": "yes on the fourteenth I know", "kept": "yes i know"},  # in turn 2
             {"t": 5.0, "turn": 1, "text": "how can I help you", "kept": ""},  # a turn of echo alone, before turn 1
             {"t": 31.5, "turn": 2, "text": "<b>renew</b> them", "kept": ""}]  # over turn 2's reply
    echo = {"delay_ms": 150.0, "erle_db": 18.5, "erl_db": 11.2, "clock_skew_ppm": 1000.0, "gated_audio_s": 4.5,
            "gated_segments": 2, "gated_words": 9, "gate_openings": 7, "gated_speech": gated, "cpu_ms": 80.0,
            "audio_s": 40.0}
    app = make_app(tmp_path)
    with TestClient(app) as client:
        call = CallRecord("call-e", "twilio", metadata={"from": "+15550100", ECHO_METADATA: echo})
        call.turns = [full_turn(1, 10.0), full_turn(2, 20.0)]
        no_echo_found = CallRecord("call-n", "twilio", metadata={ECHO_METADATA: {
            **echo, "delay_ms": None, "erle_db": None, "erl_db": None, "gated_speech": []}})
        for record in (call, no_echo_found, CallRecord("call-p", "native", turns=[full_turn(1, 1.0)])):
            report_call(app.state.observers, record)
        stored = client.get("/api/calls/call-e").json()
        page, none_found, plain = (client.get(f"/dashboard/calls/{c}").text for c in ("call-e", "call-n", "call-p"))
    assert stored["metadata"] == {"from": "+15550100", ECHO_METADATA: echo}  # kept by the store, served whole
    facts = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", page))
    assert facts["echo"] == "delay 150 ms · ERL 11.2 dB · ERLE 18.5 dB · loudspeaker clock +1000 ppm"
    assert facts["gated as echo"] == "audio 4.5 s · segments 2 · words 9 · gate openings 7"
    assert facts["caller metadata"] == "{&quot;from&quot;: &quot;+15550100&quot;}"  # not the echo figures
    lines = re.findall(r'<li class="(turn|echo-gated)[^"]*" data-turn="(\d+)">(.*?)</li>', page, re.S)
    assert [(kind, n) for kind, n, _ in lines] == [("echo-gated", "1"), ("turn", "1"), ("turn", "2"),
                                                   ("echo-gated", "2"), ("echo-gated", "2")]
    assert "“how can I help you”" in lines[0][2] and "⟲ echo: all the agent's own words" in lines[0][2]
    assert "“yes on the fourteenth I know”" in lines[3][2] and "⟲ echo: kept “yes i know”" in lines[3][2]
    assert "“&lt;b&gt;renew&lt;/b&gt; them”" in lines[4][2]
    assert dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", none_found))["echo"] == "none found"
    assert "<dt>echo</dt>" not in plain and "echo-gated" not in plain and "gated as echo" not in plain


def test_pages_load_nothing_from_other_hosts(served) -> None:
    client, _ = served
    for url in ("/dashboard", "/dashboard/calls/call-1"):
        page = client.get(url).text
        refs = re.findall(r'(?:src|href|action)="([^"]*)"', page)
        assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
        for ref in refs:
            if ref.startswith("/static/"):
                assert client.get(ref).status_code == 200


def test_auth_token_guards_the_api_and_pages_and_pages_carry_it(tmp_path: Path) -> None:
    settings = load_settings(overrides={"paths": {"data_dir": str(tmp_path)}, "calls": {"auth_token": "s3cret"}})
    app = create_app(settings, load_models=False)
    with TestClient(app) as client:
        report_call(app.state.observers, CallRecord("call-1", "twilio", turns=[full_turn(1, 1.0)]))
        for url in ("/api/calls", "/api/calls/call-1", "/dashboard", "/dashboard/calls/call-1"):
            assert client.get(url).status_code == 401, url
            assert client.get(url, params={"token": "wrong"}).status_code == 401, url
        assert client.get("/api/calls", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        page = client.get("/dashboard", params={"token": "s3cret", "range": "all"}).text
        assert 'href="/dashboard/calls/call-1?token=s3cret"' in page
        assert '<input type="hidden" name="token" value="s3cret">' in page


def test_with_the_store_off_the_api_says_so(tmp_path: Path) -> None:
    app = make_app(tmp_path, store=False)
    with TestClient(app) as client:
        response = client.get("/api/calls")
        assert response.status_code == 503 and "observability.store" in response.json()["detail"]
    assert not (tmp_path / "data" / "calls.sqlite3").exists()


def test_odd_stored_values_do_not_break_the_pages(served) -> None:
    client, app = served
    odd = CallRecord("odd <b>&", "twilio", metadata={"x": "</dd><script>"})
    odd.turns = [TurnRecord(1, "<i>", "x", timings_ms={"voice_to_voice": float("nan")},
                            timeline={"speech_end": "soon", "first_token": None}),
                 TurnRecord(2, "", "", timeline={"speech_end": 2.0, "end_of_turn": 1.0})]  # out of order
    report_call(app.state.observers, odd)
    page = client.get("/dashboard/calls/odd%20%3Cb%3E%26")
    assert page.status_code == 200
    assert "<script>" not in page.text and "odd &lt;b&gt;&amp;" in page.text
    assert client.get("/dashboard", params={"range": "all"}).status_code == 200


def test_the_app_opens_the_store_at_start_up_and_commits_it_at_shutdown(tmp_path: Path) -> None:
    app = make_app(tmp_path, flush_interval_s=1.0)
    with TestClient(app):
        store = app.state.call_store
        assert store in app.state.observers.observers
        report_call(app.state.observers, CallRecord("call-1", "twilio", turns=[full_turn(1, 1.0)]))
    assert app.state.call_store is None and store not in app.state.observers.observers
    reopened = CallStore(tmp_path / "data" / "calls.sqlite3")
    assert reopened.get_call("call-1")["turn_count"] == 1  # committed at shutdown, before the flush interval
    reopened.close()
