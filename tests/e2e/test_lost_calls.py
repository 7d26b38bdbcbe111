"""A server killed mid-call (SIGKILL, the real default models, a real native WebSocket call): its call ends as lost,
not live forever, and what it had recorded survives.

- One replica on the SQLite store, recording: killed just after a turn; a new server on the same store (the same
  replica) shows the call lost, keeps every turn handed to the store more than `flush_interval_s` before the kill,
  and serves a recording that is a valid WAV up to its last flush.
- Two replicas on one PostgreSQL store: one killed mid-call; the other shows its call lost once the dead one's
  heartbeat is `lost_after_s` old, and closes it in the store within two heartbeat intervals after that.

Each killed server is `voicepipe serve` in a subprocess; each survivor is the app in this process without models
(reading and closing calls needs none).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import wave
from pathlib import Path
from types import SimpleNamespace

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.call_helpers import GREETING
from tests.e2e.test_call_transports import THREE_TURNS, speak
from tests.net_helpers import server_process
from tests.postgres_helpers import postgres_server
from voicepipe.caller import run_call
from voicepipe.config import ObservabilitySettings, load_settings
from voicepipe.observability.recorder import FLUSH_EVERY_S, HOLD_BACK_S, RATE
from voicepipe.server import create_app

pytestmark = pytest.mark.e2e

FLUSH_S = 0.5  # observability.flush_interval_s: the store's promise
DEFAULTS = ObservabilitySettings()
HEARTBEAT_S, LOST_AFTER_S = DEFAULTS.heartbeat_s, DEFAULTS.lost_after_s  # the fleet runs on the defaults
SLACK_S = 1.0  # a busy machine: the writer threads, the poll and the kill run late by up to this much


def replica_settings(tmp: Path, replica: str, **extra: object) -> list[str]:
    """``--set`` pairs of a real-call server: short greedy replies after a greeting, its files under `tmp`."""
    pairs = {"paths.data_dir": tmp / "data", "paths.recordings_dir": tmp / "recordings",
             "observability.replica": replica, "observability.flush_interval_s": FLUSH_S,
             "calls.greeting": GREETING, "calls.max_reply_tokens": 16, "calls.temperature": 0.0,
             "llm.kv_cache_mib": 64, **extra}
    return [f"{key}={value}" for key, value in pairs.items()]


def survivor(pairs: list[str]) -> TestClient:
    """The app on the same settings, in this process, without models."""
    return TestClient(create_app(load_settings(set_pairs=pairs), load_models=False))


async def call_and_kill(base: str, proc, call_id: str, voice_dir: Path, after_turn: int) -> SimpleNamespace:
    """A three-turn call; SIGKILL to the server once turn `after_turn` is seen finished (every 50 ms). Returns when
    each turn was first seen finished (monotonic), the kill's time, and the server's last record of the call."""
    utts = [speak(text, voice_dir) for text, _ in THREE_TURNS]
    call = asyncio.create_task(run_call(base.replace("http://", "ws://") + "/ws", "native", utts, call_id=call_id,
                                        quiet_s=0.6, reply_timeout_s=120, fetch_record=False))
    finished: dict[int, float] = {}
    deadline = time.monotonic() + 300
    async with httpx.AsyncClient() as client:
        while after_turn not in finished:
            assert time.monotonic() < deadline and not call.done(), "the call never reached its turn"
            response = await client.get(f"{base}/calls/{call_id}")
            if response.status_code == 200:
                record = response.json()
                for turn in record["turns"]:
                    if turn["timings_ms"]:  # derived when the turn is finished and handed to the observers
                        finished.setdefault(turn["turn"], time.monotonic())
            await asyncio.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)  # the line went dead with the server
    return SimpleNamespace(finished=finished, killed_at=killed_at, record=record)


def assert_kept_what_was_flushed(stored: dict, cut: SimpleNamespace) -> list[int]:
    """Every turn finished more than the flush interval before the kill is in the store (a whole prefix of the
    call's turns); returns them."""
    kept = [t["turn"] for t in stored["turns"]]
    must_keep = [n for n, at in cut.finished.items() if cut.killed_at - at > FLUSH_S + SLACK_S]
    assert must_keep and kept == list(range(1, len(kept) + 1)) and set(must_keep) <= set(kept), (kept, cut)
    ages = {n: round(cut.killed_at - at, 2) for n, at in cut.finished.items()}
    print(f"turns finished (s before the kill): {ages}; kept: {kept}; missing: {sorted(set(ages) - set(kept))}")
    return kept


def test_a_killed_servers_call_is_lost_and_keeps_what_it_flushed(tmp_path: Path, voice_dir: Path) -> None:
    pairs = replica_settings(tmp_path, "solo", **{"observability.record_calls": "true"})
    with server_process(*(f"--set={pair}" for pair in pairs)) as (base, proc):
        cut = asyncio.run(call_and_kill(base, proc, "killed-mid-call", voice_dir, after_turn=2))

    with survivor(pairs) as client:  # a new server on the same store, as the same replica
        stored = client.get("/api/calls/killed-mid-call").json()
        assert (stored["outcome"], stored["end_reason"]) == ("lost", "process ended")
        kept = assert_kept_what_was_flushed(stored, cut)
        assert stored["started"] < stored["ended"] <= time.time()
        assert client.get("/api/calls", params={"outcome": "lost"}).json()["calls"][0]["id"] == "killed-mid-call"
        assert 'class="recording"' in client.get("/dashboard/calls/killed-mid-call").text
        wav = client.get("/api/calls/killed-mid-call/recording.wav")
    assert wav.status_code == 200
    path = tmp_path / "cut.wav"
    path.write_bytes(wav.content)
    with wave.open(str(path)) as w:  # the header is valid and matches the data it describes
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, RATE)
        frames = w.getnframes()
        assert len(w.readframes(frames)) == frames * 4
    recorded_s = frames / RATE
    call_s = cut.killed_at - cut.record["started_mono"]  # one machine: the server's monotonic clock is this one
    print(f"recording: {recorded_s:.2f} s of the {call_s:.2f} s the call lasted")
    assert 0 < call_s - recorded_s < HOLD_BACK_S + FLUSH_EVERY_S + SLACK_S
    lines = (tmp_path / "recordings" / "killed-mid-call" / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]  # every line whole
    assert events[0]["type"] == "call_start"
    assert set(kept) <= {e["turn"] for e in events if e["type"] == "turn"}


def test_a_live_replica_closes_a_killed_replicas_call_within_two_heartbeats(tmp_path: Path, voice_dir: Path) -> None:
    with postgres_server() as url:
        fleet = {"observability.store_url": url}
        with survivor(replica_settings(tmp_path / "a", "replica-a", **fleet)) as a, \
                server_process(*(f"--set={p}" for p in replica_settings(tmp_path / "b", "replica-b", **fleet))) \
                as (b_base, b_proc):
            cut = asyncio.run(call_and_kill(b_base, b_proc, "on-replica-b", voice_dir, after_turn=2))
            with psycopg.connect(url, autocommit=True) as db:
                last_beat = db.execute("SELECT heartbeat FROM replicas WHERE name = 'replica-b'").fetchone()[0]
                assert a.get("/api/calls/on-replica-b").json()["outcome"] is None  # b's heartbeat is still fresh
                shown_at = closed_at = None
                deadline = time.monotonic() + 120
                while closed_at is None:
                    assert time.monotonic() < deadline, "the dead replica's call was never closed"
                    outcome = db.execute("SELECT outcome FROM calls WHERE id = 'on-replica-b'").fetchone()[0]
                    if outcome == "lost":
                        closed_at = time.time()
                    if shown_at is None and a.get("/api/calls/on-replica-b").json()["outcome"] == "lost":
                        shown_at = time.time()  # read after the store's row: a closed call is shown lost
                    time.sleep(0.05)
            stale_at = last_beat + LOST_AFTER_S
            print(f"after b's heartbeat went stale: shown lost {shown_at - stale_at:+.2f} s, closed "
                  f"{closed_at - stale_at:+.2f} s (heartbeat {HEARTBEAT_S} s); killed "
                  f"{time.monotonic() - cut.killed_at:.1f} s ago")
            assert closed_at - stale_at <= 2 * HEARTBEAT_S
            stored = a.get("/api/calls/on-replica-b").json()
            assert (stored["replica"], stored["outcome"], stored["end_reason"]) == ("replica-b", "lost",
                                                                                   "process ended")
            assert_kept_what_was_flushed(stored, cut)
            metrics = a.get("/metrics").text
            assert 'voicepipe_calls_lost_total{found="stale_heartbeat",transport="native"} 1.0' in metrics
