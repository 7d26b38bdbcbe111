"""The call store under faults: a full or read-only disk (calls go on; one clear log line; the `store` errors
metric counts what is lost; writes resume when the disk does), and `kill -9` while calls are written (reopening
the store finds every record handed over more than `flush_interval_s` before the kill).

A full and a read-only disk are made with SQLite's own switches on the writer's connection (`max_page_count`,
`query_only`): SQLite then fails writes with the same errors as on a full disk (SQLITE_FULL, "database or disk is
full") and a read-only one (SQLITE_READONLY). A real full disk or a read-only remount cannot be made here (the
tests run as root on a shared filesystem). The calls of the app test run on the scripted models of
tests/pipeline_fakes.py: the store is under test, not the models.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.metrics_helpers import Scrape
from tests.observability_helpers import report_call
from tests.pipeline_fakes import FakeDetector, fake_call_resources
from voicepipe.config import load_settings
from voicepipe.observability.records import CallRecord, TurnRecord
from voicepipe.observability.store import CallStore
from voicepipe.pipeline import CallSession
from voicepipe.server import create_app
from voicepipe.transports import gateway
from voicepipe.transports.serializers import make_caller_serializer

FULL = ["PRAGMA max_page_count = 1", "database or disk is full"]  # below the file's size: no page may be added
READ_ONLY = ["PRAGMA query_only = ON", "readonly"]


def call(call_id: str) -> CallRecord:
    """A call whose row needs new pages (a full disk refuses those; a row that fits a page's free room passes)."""
    record = CallRecord(call_id, "twilio", system_prompt="You are a voice agent. " * 800)
    record.turns = [TurnRecord(1, "hello", "hi there")]
    return record


@pytest.mark.parametrize(("switch", "error"), [FULL, READ_ONLY], ids=["disk-full", "read-only"])
def test_a_failing_disk_loses_records_with_one_log_line_and_writes_resume(tmp_path: Path, caplog, switch, error):
    store = CallStore(tmp_path / "calls.sqlite3", flush_interval_s=0.05)
    try:
        report_call(store, call("before"))
        assert store.flush() and store.write_failures == 0
        store.writer.put(switch, {})
        assert store.flush()
        with caplog.at_level(logging.WARNING, logger="voicepipe.observability.store_writer"):
            for i in range(20):
                report_call(store, call(f"lost-{i}"))
            assert store.flush()
            failures = store.write_failures
            assert failures >= 20, failures
            lines = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(lines) == 1 and error in lines[0].getMessage() and "Calls go on" in lines[0].getMessage()
            store.writer.put(switch.replace("= 1", "= 1073741823").replace("= ON", "= OFF"), {})
            report_call(store, call("after"))
            assert store.flush()
        assert "writes succeed again" in caplog.text and store.write_failures == failures
        kept = {c["id"] for c in store.list_calls(limit=100)}
        assert kept == {"before", "after"}
    finally:
        store.close()


def test_calls_go_on_while_the_store_cannot_write_and_the_metric_counts_it(tmp_path: Path, monkeypatch,
                                                                          caplog) -> None:
    monkeypatch.setattr(gateway, "call_resources", lambda runtime: fake_call_resources())
    monkeypatch.setattr(CallSession, "_make_detector", lambda self: FakeDetector())
    app = create_app(load_settings(overrides={"calls": {"greeting": "Hi."}, "paths": {"data_dir": str(tmp_path)},
                                              "observability": {"flush_interval_s": 0.05}}), load_models=False)
    with TestClient(app) as client:
        store = app.state.call_store
        store.writer.put(READ_ONLY[0], {})
        assert store.flush()
        wire = make_caller_serializer("native", call_id="during-the-fault")
        with client.websocket_connect("/ws") as ws:
            for frame in wire.start():
                ws.send_text(frame)
            assert ws.receive_json()["type"] == "started"
            while ws.receive().get("bytes") is None:  # the greeting's audio comes: the call works
                pass
            for frame in wire.stop():
                ws.send_text(frame)
        record = client.get("/calls/during-the-fault").json()
        assert record["outcome"] == "completed" and record["end_reason"] == "hangup"
        assert store.flush() and store.write_failures > 0
        assert Scrape(client.get("/metrics").text).value("voicepipe_errors_total", kind="store") == store.write_failures
        assert client.get("/api/calls/during-the-fault").status_code == 404  # lost, as the log line says
        assert "Calls go on" in caplog.text


WRITER = """
import sys, time
from voicepipe.observability.records import CallRecord
from voicepipe.observability.store import CallStore

store = CallStore(sys.argv[1], flush_interval_s=float(sys.argv[2]))
i = 0
while True:
    store.call_started(CallRecord(f"c{i}", "twilio"))
    print(i, time.monotonic(), flush=True)  # handed to the store: queued, not yet committed
    i += 1
    time.sleep(0.005)
"""


def test_kill_9_loses_at_most_the_flush_interval(tmp_path: Path) -> None:
    """The store's bound is `flush_interval_s`; the slack on top is for the writer thread's commit on a busy
    machine (it shares two cores with the writer loop, and other work)."""
    flush_s, slack_s = 0.5, 0.3
    path = tmp_path / "calls.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(flush_s)], stdout=subprocess.PIPE,
                              text=True, env=env)
    handed: list[tuple[int, float]] = []
    try:
        started = None
        for line in writer.stdout:
            i, at = line.split()
            handed.append((int(i), float(at)))
            started = started or time.monotonic()
            if time.monotonic() - started > 3.0:
                break
        killed_at = time.monotonic()
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -signal.SIGKILL and len(handed) > 100
    store = CallStore(path)
    try:
        kept = {c["id"] for c in store.list_calls(limit=100_000)}
    finally:
        store.close()
    must_keep = [i for i, at in handed if at < killed_at - flush_s - slack_s]
    missing = [i for i in must_keep if f"c{i}" not in kept]
    assert len(must_keep) > 100 and not missing, f"lost {len(missing)} records older than the flush interval"
    assert kept <= {f"c{i}" for i, _ in handed}
