"""The call store on PostgreSQL (observability.store_url): the same schema and queries as on SQLite, shared by
replicas. A real server from Debian's postgresql package, started here (tests/postgres_helpers.py)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.observability_helpers import REOPENED, decide, decision, report_call
from tests.postgres_helpers import postgres_server
from tests.unit.test_observability_lost_calls import dead_replicas_call_is_closed_once
from tests.unit.test_observability_store import make_call
from voicepipe.observability.store import CallStore
from voicepipe.observability.store_schema import MIGRATIONS


@pytest.fixture(scope="module")
def server_url():
    with postgres_server() as url:
        yield url


@pytest.fixture
def url(server_url: str):
    """An empty database on the module's server for each test."""
    name = f"t{time.monotonic_ns()}"
    admin = server_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def test_replicas_that_start_together_migrate_once_and_see_each_others_calls(url: str) -> None:
    stores: dict[str, CallStore] = {}

    def open_store(name: str) -> None:
        stores[name] = CallStore(url, replica=name)

    threads = [threading.Thread(target=open_store, args=(name,)) for name in ("pod-a", "pod-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    a, b = stores["pod-a"], stores["pod-b"]
    t0 = 1_790_000_000.123456  # unix seconds keep their microseconds (PostgreSQL's REAL would round to ~100 s)
    report_call(a, make_call("from-a", "twilio", t0, v2v=[100.0, 200.0, 300.0, 400.0]))
    report_call(b, make_call("from-b", "native", t0 + 1, v2v=[1000.0]))
    assert a.flush() and b.flush()  # each replica commits within observability.flush_interval_s
    for store in (a, b):
        listed = store.list_calls()
        assert [(c["id"], c["replica"]) for c in listed] == [("from-b", "pod-b"), ("from-a", "pod-a")]
        assert listed[1]["started"] == t0 and listed[1]["voice_to_voice_ms"] == {"p50": 250.0, "p95": 385.0}
        assert [c["id"] for c in store.list_calls(transport="twilio", since=t0, until=t0 + 1)] == ["from-a"]
        assert store.transports() == ["native", "twilio"]
    a.close()
    b.close()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM voicepipe_schema").fetchall() == [(len(MIGRATIONS),)]
        kinds = dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                                  "WHERE table_name = 'calls'").fetchall())
    assert kinds["started"] == "double precision" and kinds["replica"] == "text"


def test_turns_decisions_and_a_reused_id_round_trip(url: str) -> None:
    store = CallStore(url, replica="pod-a")
    call = make_call("c-1", metadata={"from": "+15550100"}, v2v=[500.0, 600.0], barge_ins=1)
    decide(call.turns[0], reopened=1, backchannels=("mm-hm",))
    report_call(store, call)
    got = store.get_call("c-1")
    assert got["metadata"] == {"from": "+15550100"} and got["barge_ins"] == 1 and got["outcome"] == "completed"
    first = got["turns"][0]
    assert first["decision"] == decision() and first["reopened"] == [REOPENED] and first["backchannels"] == ["mm-hm"]
    assert first["interrupted"] is False and got["turns"][1]["decision"] == {}
    report_call(store, make_call("c-1", transport="native", v2v=[900.0]))
    again = store.get_call("c-1")
    assert again["transport"] == "native" and [t["voice_to_voice_ms"] for t in again["turns"]] == [900.0]
    assert store.get_call("nope") is None
    store.close()


def test_a_failing_write_is_skipped_and_the_rest_of_its_batch_is_kept(url: str) -> None:
    store = CallStore(url, flush_interval_s=1.0)
    report_call(store, make_call("before", v2v=[100.0]), end=False)
    store.writer.put("INSERT INTO no_such_table VALUES (:x)", {"x": 1})  # aborts a PostgreSQL transaction...
    report_call(store, make_call("after", v2v=[200.0]))  # ...but only its savepoint here
    assert {c["id"] for c in store.list_calls()} == {"before", "after"}
    store.close()


def test_a_broken_connection_is_opened_again_and_later_writes_land(url: str) -> None:
    store = CallStore(url)
    report_call(store, make_call("first", v2v=[100.0]))
    assert store.get_call("first") is not None
    with psycopg.connect(url, autocommit=True) as admin:  # as a database restart would
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    report_call(store, make_call("lost-with-the-batch"))  # the broken connection's batch: logged, lost
    store.flush()
    report_call(store, make_call("second", v2v=[200.0]))
    assert store.get_call("second") is not None
    store.close()


def test_retention_deletes_old_calls_and_their_turns(url: str) -> None:
    now = time.time()
    store = CallStore(url, retention_days=30)
    report_call(store, make_call("old", started=now - 3 * 86400, v2v=[100.0, 200.0]))
    report_call(store, make_call("new", started=now - 3600, v2v=[300.0]))
    store.close()
    store = CallStore(url, retention_days=2)
    assert [c["id"] for c in store.list_calls()] == ["new"]
    store.close()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM turns").fetchone() == (1,)


def test_the_first_live_replica_closes_a_dead_replicas_call_once(url: str) -> None:
    def committed_outcome(call_id: str) -> str | None:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT outcome FROM calls WHERE id = %s", (call_id,)).fetchone()[0]

    dead_replicas_call_is_closed_once(url, committed_outcome)
