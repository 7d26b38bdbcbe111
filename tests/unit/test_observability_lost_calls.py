"""Calls whose process died: closed as lost by the same replica's next start, or, in a fleet, shown as lost once
their replica's heartbeat is older than `lost_after_s` and closed by the first replica to see it; the metric and the
outcome filter (SQLite here; the same scenario on PostgreSQL in test_observability_store_postgres.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.metrics_helpers import Scrape
from tests.observability_helpers import report_call
from tests.unit.test_observability_store import make_call
from voicepipe.config import load_settings
from voicepipe.observability.records import CallRecord
from voicepipe.observability.store import AT_START, STALE_HEARTBEAT, CallStore
from voicepipe.server import create_app

HEARTBEAT_S, LOST_AFTER_S = 0.1, 1.0  # ten heartbeats: a live replica's writer may run late


def left_live(store: CallStore, call_id: str, turns: int = 2) -> tuple[float, float]:
    """A call with `turns` turns reported and never ended; returns the wall-clock bounds of its last turn's write."""
    call = make_call(call_id, v2v=[500.0] * turns)
    report_call(store, call, end=False)
    before = time.time()
    store.turn_finished(call, call.turns[-1])  # the last record, again: its time is known to the test
    return before, time.time()


def wait_for(condition, timeout_s: float = 20.0):
    """Poll `condition()` until it returns something true (generous: the machine is shared)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def stored_outcome(path: Path, call_id: str) -> str | None:
    """The committed outcome (what another process reads), not the store's view of it."""
    with sqlite3.connect(str(path)) as conn:
        return conn.execute("SELECT outcome FROM calls WHERE id = ?", (call_id,)).fetchone()[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "calls.sqlite3"


def test_a_restart_closes_the_calls_its_last_run_left_live_at_their_last_record(db: Path) -> None:
    first = CallStore(db, replica="pod-a")
    before, after = left_live(first, "cut")
    report_call(first, make_call("done", v2v=[400.0]))
    other = CallStore(db, replica="pod-b")
    report_call(other, make_call("elsewhere", v2v=[400.0]), end=False)
    first.close()  # the process dies: nothing ends its call
    other.close()

    restarted = CallStore(db, replica="pod-a")
    try:
        cut = restarted.get_call("cut")
        assert (cut["outcome"], cut["end_reason"]) == ("lost", "process ended")
        assert before <= cut["ended"] <= after, "a lost call ends at its last record"
        assert [t["turn"] for t in cut["turns"]] == [1, 2]
        assert restarted.get_call("done")["outcome"] == "completed"
        assert restarted.get_call("elsewhere")["outcome"] is None, "another replica's live call was closed"
        assert restarted.lost_calls == {("twilio", AT_START): 1}
    finally:
        restarted.close()
    again = CallStore(db, replica="pod-a")
    assert again.lost_calls == {}
    again.close()


def test_a_call_of_a_replica_whose_heartbeat_is_old_reads_as_lost_before_anyone_closes_it(db: Path) -> None:
    reader = CallStore(db, replica="reader", lost_after_s=LOST_AFTER_S)  # no heartbeat: closes nothing
    try:
        dead = CallStore(db, replica="dead")
        before, after = left_live(dead, "on-dead")
        dead.close()
        with sqlite3.connect(str(db)) as conn:
            conn.execute("INSERT INTO replicas (name, heartbeat) VALUES ('dead', ?)", (time.time(),))
        assert reader.get_call("on-dead")["outcome"] is None  # its heartbeat is fresh: live
        assert [c["id"] for c in reader.list_calls(outcome="live")] == ["on-dead"]
        wait_for(lambda: reader.get_call("on-dead")["outcome"] == "lost")
        shown = reader.get_call("on-dead")
        assert shown["end_reason"] == "process ended" and before <= shown["ended"] <= after
        listed = reader.list_calls(outcome="lost")
        assert [(c["id"], c["outcome"], c["turn_count"]) for c in listed] == [("on-dead", "lost", 2)]
        assert reader.list_calls(outcome="live") == [] and reader.list_calls(outcome="completed") == []
        assert stored_outcome(db, "on-dead") is None and reader.lost_calls == {}
    finally:
        reader.close()


def replica(location: Path | str, name: str) -> CallStore:
    return CallStore(location, replica=name, heartbeat_s=HEARTBEAT_S, lost_after_s=LOST_AFTER_S)


def dead_replicas_call_is_closed_once(location: Path | str, committed_outcome) -> None:
    """Three replicas on one store; one dies with a call live: both others see it, exactly one closes it (at its
    last record, its replica forgotten), and the live replicas' own calls stay live."""
    a, b, c = (replica(location, name) for name in ("pod-a", "pod-b", "pod-c"))
    try:
        report_call(a, make_call("on-a", v2v=[300.0]), end=False)
        before, after = left_live(b, "on-b")
        assert a.flush() and b.flush()
        time.sleep(LOST_AFTER_S * 2)  # heartbeats go on: nothing is lost
        assert committed_outcome("on-b") is None and a.get_call("on-b")["outcome"] is None
        b.close()  # pod-b dies: its heartbeat stops, its call stays live in the store
        wait_for(lambda: committed_outcome("on-b") == "lost")
        closed = a.get_call("on-b")
        assert closed["end_reason"] == "process ended" and before <= closed["ended"] <= after
        assert [t["turn"] for t in closed["turns"]] == [1, 2]
        closers = [s.lost_calls for s in (a, c)]
        assert sorted(closers, key=len) == [{}, {("twilio", STALE_HEARTBEAT): 1}], closers
        assert a.get_call("on-a")["outcome"] is None, "a live replica's call was lost"
        assert {r["name"] for r in a._query("SELECT name FROM replicas")} == {"pod-a", "pod-c"}
    finally:
        for store in (a, b, c):
            store.close()


def test_the_first_live_replica_closes_a_dead_replicas_call_once(db: Path) -> None:
    db.parent.mkdir(parents=True)
    dead_replicas_call_is_closed_once(db, lambda call_id: stored_outcome(db, call_id))


def test_the_app_counts_the_calls_it_closed_and_filters_by_outcome(tmp_path: Path) -> None:
    data = tmp_path / "data"
    earlier = CallStore(data / "calls.sqlite3", replica="pod-a")
    left_live(earlier, "cut")
    report_call(earlier, CallRecord("fine", "native"))
    earlier.close()
    settings = load_settings(overrides={"paths": {"data_dir": str(data), "recordings_dir": str(tmp_path / "rec")},
                                        "observability": {"replica": "pod-a"}})
    with TestClient(create_app(settings, load_models=False)) as client:
        metrics = Scrape(client.get("/metrics").text)
        assert metrics.value("voicepipe_calls_lost_total", transport="twilio", found="at_start") == 1
        assert [c["id"] for c in client.get("/api/calls", params={"outcome": "lost"}).json()["calls"]] == ["cut"]
        assert [c["id"] for c in client.get("/api/calls", params={"outcome": "completed"}).json()["calls"]] == \
            ["fine"]
        page = client.get("/dashboard", params={"outcome": "lost"}).text
        assert 'data-call-id="cut"' in page and 'data-call-id="fine"' not in page
        assert '<td class="outcome-lost">lost</td>' in page and '<option value="lost" selected>' in page
        for path in ("/api/calls", "/dashboard"):
            assert client.get(path, params={"outcome": "gone'; DROP TABLE calls"}).status_code == 400
        assert client.get("/api/calls/cut").json()["outcome"] == "lost"
