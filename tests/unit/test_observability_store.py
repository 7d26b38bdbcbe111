"""The call store (SQLite): migrations, restart, batching, retention, filters and percentiles."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tests.observability_helpers import REOPENED, decide, decision, report_call
from voicepipe.observability.records import CallRecord, TurnRecord
from voicepipe.observability.store import CallStore, connect
from voicepipe.observability.store_schema import MIGRATIONS, SchemaError, migrate, schema_version


def make_call(call_id: str, transport: str = "twilio", started: float | None = None, v2v: list[float] = (),
              **fields) -> CallRecord:
    call = CallRecord(call_id, transport, **fields)
    if started is not None:
        call.started = started
    for n, ms in enumerate(v2v, start=1):
        call.turns.append(TurnRecord(n, user_text=f"question {n}", agent_text=f"answer {n}",
                                     timings_ms={"voice_to_voice": ms, "ttft": 40.0},
                                     timeline={"speech_end": n * 5.0, "first_audio_sent": n * 5.0 + ms / 1000}))
    return call


def committed_rows(path: Path, table: str) -> int:
    """Rows another process would see (a fresh connection: only what is committed)."""
    with sqlite3.connect(str(path)) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "calls.sqlite3"


def test_an_empty_database_is_migrated_to_the_latest_schema_in_wal_mode(db: Path) -> None:
    store = CallStore(db)
    store.close()
    conn = connect(db)
    assert schema_version(conn) == len(MIGRATIONS) >= 1
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"calls", "turns"} <= tables
    assert migrate(conn) == len(MIGRATIONS)  # reopening an up-to-date database applies nothing
    conn.close()


def test_migrations_apply_in_order_keep_data_and_roll_back_whole(tmp_path: Path) -> None:
    conn = connect(tmp_path / "m.sqlite3")
    v1 = ["CREATE TABLE t (a INTEGER)"]
    assert migrate(conn, [v1]) == 0
    conn.execute("INSERT INTO t VALUES (7)")
    v2 = ["ALTER TABLE t ADD COLUMN b TEXT DEFAULT 'x'"]
    assert migrate(conn, [v1, v2]) == 1
    assert [tuple(r) for r in conn.execute("SELECT a, b FROM t")] == [(7, "x")]
    broken = ["CREATE TABLE u (a INTEGER)", "THIS IS NOT SQL"]
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, [v1, v2, broken])
    assert schema_version(conn) == 2
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'u'").fetchone() is None
    with pytest.raises(SchemaError, match="newer"):
        migrate(conn, [v1])
    conn.close()


def test_a_version_1_file_is_migrated_and_keeps_its_rows(db: Path) -> None:
    db.parent.mkdir(parents=True)
    conn = connect(db)
    migrate(conn, MIGRATIONS[:1])
    conn.execute("INSERT INTO calls (id, transport, started, outcome) VALUES ('old', 'twilio', ?, 'completed')",
                 (time.time(),))
    conn.execute("INSERT INTO turns (call_id, turn, user_text, voice_to_voice_ms, timings_ms) "
                 """VALUES ('old', 1, 'hello', 640.0, '{"voice_to_voice":640.0}')""")
    conn.close()

    store = CallStore(db)
    call = store.get_call("old")
    report_call(store, make_call("new", v2v=[500.0]))  # and the new columns take new turns
    store.close()
    conn = connect(db)
    assert schema_version(conn) == len(MIGRATIONS)
    conn.close()
    assert call["outcome"] == "completed" and call["voice_to_voice_ms"]["p50"] == 640.0
    (turn,) = call["turns"]
    assert turn["user_text"] == "hello" and turn["timings_ms"] == {"voice_to_voice": 640.0}
    assert turn["decision"] == {} and turn["reopened"] == [] and turn["backchannels"] == []
    assert turn["dtmf"] is None and turn["tool_calls"] == []


TOOL_CALLS = [{"name": "lookup_order", "arguments": '{"order_id":"4217"}', "t": 3.5, "latency_ms": 120.0,
               "result_chars": 44, "error": None},
              {"name": "end_call", "arguments": "{}", "t": 9.0, "latency_ms": 0.1, "result_chars": 20,
               "error": "timed out after 2.0 s"}]


def test_a_keypad_turn_and_a_replys_tool_calls_are_kept_and_queryable(db: Path) -> None:
    store = CallStore(db)
    call = make_call("c-1", v2v=[500.0, 600.0])
    call.turns[0].dtmf = "4217#"
    call.turns[1].tool_calls = [dict(c) for c in TOOL_CALLS]
    report_call(store, call)
    turns = store.get_call("c-1")["turns"]
    store.close()
    assert turns[0]["dtmf"] == "4217#" and turns[0]["tool_calls"] == []
    assert turns[1]["dtmf"] is None and turns[1]["tool_calls"] == TOOL_CALLS
    with sqlite3.connect(str(db)) as conn:
        rows = conn.execute("SELECT turn, name FROM tool_calls WHERE error IS NOT NULL").fetchall()
    assert rows == [(2, "end_call")]


def test_a_turns_decision_reopens_and_backchannels_are_kept_and_the_decision_can_be_queried(db: Path) -> None:
    store = CallStore(db)
    call = make_call("c-1", v2v=[500.0, 600.0, 700.0])
    decide(call.turns[0], reopened=2, backchannels=("mm-hm", "yeah"))
    call.turns[1].decision = decision("silence", "silence", 612.0, 600.0, None, None)  # turn 3: none (end of stream)
    report_call(store, call)
    turns = store.get_call("c-1")["turns"]
    store.close()
    assert turns[0]["decision"] == decision() and turns[0]["reopened"] == [REOPENED, REOPENED]
    assert turns[0]["backchannels"] == ["mm-hm", "yeah"]
    assert turns[1]["decision"]["text_prob"] is None and turns[1]["decision"]["silence_ms"] == 612.0
    assert turns[2]["decision"] == {} and turns[2]["reopened"] == [] and turns[2]["backchannels"] == []
    assert not any(key.startswith("decision_") for key in turns[0])
    with sqlite3.connect(str(db)) as conn:
        rows = conn.execute("SELECT turn, decision_policy, decision_silence_ms FROM turns "
                            "WHERE decision_text_prob > 0.9 OR decision_policy = 'silence' ORDER BY turn").fetchall()
    assert rows == [(1, "hybrid", 212.0), (2, "silence", 612.0)]


def test_the_store_survives_a_restart(db: Path) -> None:
    store = CallStore(db)
    report_call(store, make_call("c-1", metadata={"from": "+15550100"}, v2v=[500.0, 700.0], barge_ins=1))
    store.close()

    store = CallStore(db)
    call = store.get_call("c-1")
    store.close()
    assert call is not None
    assert call["outcome"] == "completed" and call["end_reason"] == "stop" and call["barge_ins"] == 1
    assert call["metadata"] == {"from": "+15550100"}
    assert [t["turn"] for t in call["turns"]] == [1, 2]
    assert call["turns"][1]["timings_ms"] == {"voice_to_voice": 700.0, "ttft": 40.0}
    assert call["turns"][1]["timeline"]["first_audio_sent"] == pytest.approx(10.7)
    assert call["turns"][0]["user_text"] == "question 1" and call["turns"][0]["interrupted"] is False


def test_writes_are_batched_and_committed_within_the_flush_interval(db: Path) -> None:
    store = CallStore(db, flush_interval_s=1.0)
    started = time.monotonic()
    report_call(store, make_call("c-1", v2v=[float(ms) for ms in range(100, 4100, 100)]), end=False)
    if time.monotonic() - started < 0.5:  # (the machine was not stalled) nothing is committed before the interval
        assert committed_rows(db, "turns") == 0
    deadline = time.monotonic() + 3.0
    while committed_rows(db, "turns") < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert committed_rows(db, "turns") == 40, "a batch was not committed within the flush interval"
    assert store.writer.commits == 1, "41 writes queued together should make one commit"
    store.close()


def test_close_commits_what_is_queued(db: Path) -> None:
    store = CallStore(db, flush_interval_s=1.0)
    report_call(store, make_call("c-1", v2v=[300.0]))
    store.close()  # well before the interval ends
    assert committed_rows(db, "calls") == 1 and committed_rows(db, "turns") == 1


def test_a_failing_write_is_skipped_and_the_writer_carries_on(db: Path) -> None:
    store = CallStore(db)
    store.writer.put("INSERT INTO no_such_table VALUES (:x)", {"x": 1})
    store.writer.put("INSERT INTO calls (id, transport, started) VALUES (:id, 'x', 0)", {"id": object()})
    report_call(store, make_call("c-1", metadata={"odd": object()}))  # metadata that is not JSON is kept as text
    assert store.get_call("c-1") is not None
    store.close()


def test_call_ended_stores_turns_that_were_never_reported_and_a_reused_id_starts_over(db: Path) -> None:
    store = CallStore(db)
    call = make_call("c-1", v2v=[400.0, 500.0, 600.0])
    store.call_started(call)
    store.turn_finished(call, call.turns[0])
    call.outcome = "dropped"
    store.call_ended(call)
    assert [t["turn"] for t in store.get_call("c-1")["turns"]] == [1, 2, 3]
    report_call(store, make_call("c-1", transport="native", v2v=[900.0]))
    again = store.get_call("c-1")
    assert again["transport"] == "native" and [t["voice_to_voice_ms"] for t in again["turns"]] == [900.0]
    store.close()


def test_each_turn_of_a_live_call_stores_its_metadata_as_it_stands(db: Path) -> None:
    store = CallStore(db)
    call = make_call("c-1", v2v=[400.0, 500.0], metadata={"from": "+15550100", "echo_canceller": {"gated_words": 0}})
    store.call_started(call)
    call.metadata["echo_canceller"] = {"gated_words": 4}  # the session refreshes the call's echo figures each turn
    store.turn_finished(call, call.turns[0])
    live = store.get_call("c-1")
    assert live["ended"] is None and live["metadata"] == {"from": "+15550100", "echo_canceller": {"gated_words": 4}}
    store.close()


def test_retention_deletes_old_calls_and_their_turns_at_open(db: Path) -> None:
    now = time.time()
    store = CallStore(db, retention_days=30)
    report_call(store, make_call("old", started=now - 3 * 86400, v2v=[100.0, 200.0]))
    report_call(store, make_call("new", started=now - 3600, v2v=[300.0]))
    old = make_call("old2", started=now - 3 * 86400, v2v=[100.0])
    old.turns[0].tool_calls = [dict(TOOL_CALLS[0])]
    report_call(store, old)
    store.close()
    assert committed_rows(db, "tool_calls") == 1

    store = CallStore(db, retention_days=2)
    assert [c["id"] for c in store.list_calls()] == ["new"]
    store.close()
    assert committed_rows(db, "turns") == 1 and committed_rows(db, "tool_calls") == 0


def test_retention_also_runs_periodically(db: Path) -> None:
    store = CallStore(db, retention_days=1, prune_every_s=0.2)
    report_call(store, make_call("old", started=time.time() - 2 * 86400, v2v=[100.0]))  # written after the open
    report_call(store, make_call("new", v2v=[100.0]))
    deadline = time.monotonic() + 5.0
    while len(store.list_calls()) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [c["id"] for c in store.list_calls()] == ["new"]
    store.close()


def test_list_filters_by_time_and_transport_and_gives_percentiles(db: Path) -> None:
    store = CallStore(db)
    t0 = time.time() - 1000
    report_call(store, make_call("a", "twilio", t0, v2v=[100.0, 200.0, 300.0, 400.0]))
    report_call(store, make_call("b", "native", t0 + 100, v2v=[1000.0]))
    report_call(store, make_call("c", "twilio", t0 + 200))  # no turns
    report_call(store, make_call("d", "twilio", t0 + 300, v2v=[50.0]), end=False)  # live

    assert [c["id"] for c in store.list_calls()] == ["d", "c", "b", "a"]
    assert [c["id"] for c in store.list_calls(transport="twilio")] == ["d", "c", "a"]
    assert [c["id"] for c in store.list_calls(since=t0 + 100, until=t0 + 300)] == ["c", "b"]
    assert [c["id"] for c in store.list_calls(limit=2)] == ["d", "c"]
    assert store.list_calls(transport="telnyx") == []
    by_id = {c["id"]: c for c in store.list_calls()}
    assert by_id["a"]["voice_to_voice_ms"] == {"p50": 250.0, "p95": 385.0}
    assert by_id["a"]["turn_count"] == 4
    assert by_id["c"]["voice_to_voice_ms"] == {"p50": None, "p95": None} and by_id["c"]["turn_count"] == 0
    assert by_id["d"]["ended"] is None and by_id["d"]["outcome"] is None
    assert store.transports() == ["native", "twilio"]
    assert store.get_call("nope") is None
    store.close()
