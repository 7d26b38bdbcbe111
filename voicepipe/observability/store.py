"""The call store: every call and every turn, kept `retention_days`, in one SQLite file (WAL mode) or, with
`observability.store_url`, in a PostgreSQL database several replicas share (`store_db.py`: one code path, the
same statements on both).

`CallStore` is a `CallObserver`: a call row on `call_started`, a turn row on `turn_finished` (and the call's
metadata as it stands: its echo figures so far), and the call's final state (and every turn again, so none is
missed) on `call_ended`. The observer methods only snapshot the record and queue the statements; one writer thread
(`store_writer.StoreWriter`) commits them in batches every `flush_interval_s`. Reads use their own connection
(readers never wait for the writer) and see every write queued before them; call them off the event loop
(`asyncio.to_thread`). Each call row names the replica that served it (`observability.replica`, by default the host
name: a pod's name under Kubernetes).

A call id is the key: a later call that reuses an id replaces the earlier call's record.

A process that dies leaves its calls "live" in the store. Such a call is closed as `lost` (end reason `process
ended`, ended at its last record: its start, a turn, `last_record`) by the first of these to see it: the same
replica's next start (`close_lost_calls`), or, in a fleet (`heartbeat_s`: each replica writes its heartbeat that
often), any other replica once the dead one's heartbeat is older than `lost_after_s`. Reads show such a call as
lost from that moment on, before any replica has closed it. Each replica needs a name of its own in the store.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter as Tally
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voicepipe.observability import store_db
from voicepipe.observability.store_rows import (
    CALL_COLUMNS,
    TOUCH_CALL,
    UPSERT_CALL,
    UPSERT_TOOL_CALL,
    UPSERT_TURN,
    call_row,
    percentiles,
    row_dict,
    tool_call_rows,
    touch_row,
    turn_row,
)
from voicepipe.observability.store_schema import migrate
from voicepipe.observability.store_writer import Chore, StoreWriter

if TYPE_CHECKING:
    from voicepipe.config import Settings
    from voicepipe.observability.records import CallRecord, TurnRecord

log = logging.getLogger(__name__)

STORE_FILE = "calls.sqlite3"
DAY_S = 86400.0
LOST = "lost"  # the outcome of a call whose process died
LOST_REASON = "process ended"
OUTCOMES = ("completed", "dropped", "idle_timeout", "error", LOST)
LIVE = "live"  # the outcome filter of the calls not ended
# How a replica found the lost calls it closed (the `found` label of voicepipe_calls_lost_total)
AT_START = "at_start"  # its own, left live by its previous run
STALE_HEARTBEAT = "stale_heartbeat"  # another replica's, whose heartbeat stopped

_CLOSE_LOST = (f"UPDATE calls SET ended = COALESCE(last_record, started), outcome = '{LOST}', "
               f"end_reason = '{LOST_REASON}' WHERE ended IS NULL AND replica = ? RETURNING transport")
_HEARTBEAT = ("INSERT INTO replicas (name, heartbeat) VALUES (?, ?) "
              "ON CONFLICT (name) DO UPDATE SET heartbeat = excluded.heartbeat")
# The calls as reads show them: `lost` when the call is live and its replica's heartbeat older than the first `?`
_CALLS_SHOWN = ("(SELECT c.*, c.ended IS NULL AND r.heartbeat < ? AS lost "
                "FROM calls c LEFT JOIN replicas r ON r.name = c.replica) shown")
_AS_LOST = {"ended": "COALESCE(last_record, started)", "outcome": f"'{LOST}'", "end_reason": f"'{LOST_REASON}'"}


def _shown(column: str) -> str:
    """A column of `_CALLS_SHOWN` as reads see it."""
    return f"CASE WHEN lost THEN {_AS_LOST[column]} ELSE {column} END" if column in _AS_LOST else column


def _select(columns: tuple[str, ...]) -> str:
    return ", ".join(f"{_shown(c)} AS {c}" for c in columns)


_LIST_COLUMNS = _select(("id", "transport", "started", "ended", "outcome", "end_reason", "metadata", "barge_ins",
                         "error", "replica"))
_CALL_COLUMNS = _select(CALL_COLUMNS)


def connect(path: Path):
    """A connection to the SQLite store at ``path`` (see `store_db.open_connection`)."""
    return store_db.open_connection(path)


def prune(conn, retention_days: float, now: float | None = None) -> int:
    """Delete calls that started more than `retention_days` ago, with their turns; returns how many."""
    cutoff = (time.time() if now is None else now) - retention_days * DAY_S
    with store_db.write_transaction(conn):
        for table in ("turns", "tool_calls"):
            conn.execute(f"DELETE FROM {table} WHERE call_id IN (SELECT id FROM calls WHERE started < ?)", (cutoff,))
        deleted = conn.execute("DELETE FROM calls WHERE started < ?", (cutoff,)).rowcount
    if deleted:
        log.info("call store: deleted %d calls older than %g days", deleted, retention_days)
    return deleted


def close_lost_calls(conn, replica: str) -> list[str]:
    """Close the calls `replica` left live as lost, at their last record (inside the caller's transaction);
    returns their transports. Another replica closing them at the same moment closes each call once."""
    return [row["transport"] for row in conn.execute(_CLOSE_LOST, (replica,)).fetchall()]


class CallStore:
    def __init__(self, location: Path | str, *, retention_days: float = 30.0, flush_interval_s: float = 0.5,
                 prune_every_s: float = 3600.0, replica: str | None = None, heartbeat_s: float | None = None,
                 lost_after_s: float = 5.0) -> None:
        """``location``: the SQLite file, or a ``postgresql://`` URL. ``heartbeat_s``: write this replica's
        heartbeat and close the calls of replicas whose heartbeat is older than ``lost_after_s`` that often (None:
        no heartbeat, a store of one process)."""
        self.location = location if store_db.is_url(location) else Path(location)
        if isinstance(self.location, Path):
            self.location.parent.mkdir(parents=True, exist_ok=True)
        self.retention_days = retention_days
        self.replica = replica or socket.gethostname()
        self.lost_after_s = lost_after_s
        self._lost: Tally[tuple[str, str]] = Tally()  # (transport, how found) -> calls this process closed as lost
        self._lost_lock = threading.Lock()
        conn = store_db.open_connection(self.location)
        try:
            migrate(conn)
            prune(conn, retention_days)
            self._start(conn, heartbeat=heartbeat_s is not None)
        except BaseException:
            conn.close()
            raise
        chores = [Chore("retention sweep", prune_every_s, lambda c: prune(c, retention_days))]
        if heartbeat_s is not None:
            chores.append(Chore("heartbeat", heartbeat_s, self._heartbeat))
        self._writer = StoreWriter(conn, flush_interval_s, chores,
                                   reconnect=lambda: store_db.open_connection(self.location))
        self._read = store_db.open_connection(self.location, read_only=True)
        self._read_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> CallStore:
        obs = settings.observability
        location = obs.store_url.get_secret_value() if obs.store_url else settings.paths.data_dir / STORE_FILE
        return cls(location, retention_days=obs.retention_days, flush_interval_s=obs.flush_interval_s,
                   replica=obs.replica, heartbeat_s=obs.heartbeat_s if obs.store_url else None,
                   lost_after_s=obs.lost_after_s)

    def describe(self) -> str:
        return store_db.describe(self.location)

    @property
    def writer(self) -> StoreWriter:
        return self._writer

    def flush(self, timeout: float = 10.0) -> bool:
        return self._writer.flush(timeout)

    @property
    def lost_calls(self) -> dict[tuple[str, str], int]:
        """The calls this process closed as lost, by (transport, how it found them: `AT_START`, `STALE_HEARTBEAT`)."""
        with self._lost_lock:
            return dict(self._lost)

    @property
    def write_failures(self) -> int:
        """Writes and commits that failed since the store opened (disk full, read-only, ...)."""
        return self._writer.failures

    def close(self) -> None:
        """Commit what is queued and close both connections (blocks; call it off the event loop)."""
        self._writer.close()
        with self._read_lock:
            self._read.close()

    # -- lost calls ------------------------------------------------------------------------------------------
    def _start(self, conn, heartbeat: bool) -> None:
        """Close the calls this replica's previous run left live; the first heartbeat."""
        with store_db.write_transaction(conn):
            lost = close_lost_calls(conn, self.replica)
            if heartbeat:
                conn.execute(_HEARTBEAT, (self.replica, time.time()))
        if lost:
            log.warning("call store: %d calls of this replica (%s) were live when its last process ended; closed "
                        "them as lost", len(lost), self.replica)
        self._count_lost(lost, AT_START)

    def _heartbeat(self, conn) -> None:
        """The writer's chore: this replica's heartbeat, and the calls of replicas whose heartbeat stopped closed
        (their rows go with them)."""
        now = time.time()
        stale_before = now - self.lost_after_s
        lost: list[str] = []
        with store_db.write_transaction(conn):
            conn.execute(_HEARTBEAT, (self.replica, now))
            for row in conn.execute("SELECT name FROM replicas WHERE heartbeat < ? AND name <> ?",
                                    (stale_before, self.replica)).fetchall():
                lost += close_lost_calls(conn, row["name"])
                conn.execute("DELETE FROM replicas WHERE name = ? AND heartbeat < ?", (row["name"], stale_before))
        if lost:
            log.warning("call store: closed %d calls of replicas whose heartbeat stopped as lost", len(lost))
        self._count_lost(lost, STALE_HEARTBEAT)

    def _count_lost(self, transports: list[str], found: str) -> None:
        with self._lost_lock:
            for transport in transports:
                self._lost[transport, found] += 1

    # -- CallObserver (on the event loop: snapshot and queue only) -------------------------------------------
    def call_started(self, call: CallRecord) -> None:
        for table in ("turns", "tool_calls"):  # a reused id starts over
            self._writer.put(f"DELETE FROM {table} WHERE call_id = :id", {"id": call.call_id})
        self._writer.put(UPSERT_CALL, call_row(call, self.replica))

    def event(self, call: CallRecord, event: dict[str, Any]) -> None:
        pass

    def audio(self, call: CallRecord, channel: str, samples: Any, rate: int, t: float) -> None:
        pass

    def turn_finished(self, call: CallRecord, turn: TurnRecord) -> None:
        self._put_turn(call.call_id, turn)
        self._writer.put(TOUCH_CALL, touch_row(call, time.time()))

    def call_ended(self, call: CallRecord) -> None:
        self._writer.put(UPSERT_CALL, call_row(call, self.replica))
        for turn in call.turns:
            self._put_turn(call.call_id, turn)

    def _put_turn(self, call_id: str, turn: TurnRecord) -> None:
        self._writer.put(UPSERT_TURN, turn_row(call_id, turn))
        for row in tool_call_rows(call_id, turn):
            self._writer.put(UPSERT_TOOL_CALL, row)

    # -- reads (blocking; off the event loop) ----------------------------------------------------------------
    def _query(self, sql: str, params: tuple | dict = ()) -> list[Any]:
        self._writer.flush()
        with self._read_lock:
            try:
                return self._read.execute(sql, params).fetchall()
            except store_db.errors(self._read):
                if not getattr(self._read, "broken", False):
                    raise
            log.warning("call store: the read connection broke (the database restarted?); reconnecting")
            self._read.close()
            self._read = store_db.open_connection(self.location, read_only=True)
            return self._read.execute(sql, params).fetchall()

    def list_calls(self, *, since: float | None = None, until: float | None = None, transport: str | None = None,
                   outcome: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The most recent calls first (started in [since, until); with `outcome`, one of `OUTCOMES` or `LIVE`),
        each with its turn count and p50/p95 voice-to-voice over its turns."""
        where, params = [], [self._stale_before()]
        if since is not None:
            where.append("started >= ?")
            params.append(since)
        if until is not None:
            where.append("started < ?")
            params.append(until)
        if transport:
            where.append("transport = ?")
            params.append(transport)
        if outcome == LIVE:
            where.append(f"{_shown('outcome')} IS NULL")
        elif outcome:
            where.append(f"{_shown('outcome')} = ?")
            params.append(outcome)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(f"SELECT {_LIST_COLUMNS} FROM {_CALLS_SHOWN} {clause} ORDER BY started DESC LIMIT ?",
                           (*params, max(0, int(limit))))
        calls = [row_dict(r) for r in rows]
        if not calls:
            return []
        marks = ", ".join("?" * len(calls))
        turns: dict[str, list[float | None]] = {c["id"]: [] for c in calls}
        for r in self._query(f"SELECT call_id, voice_to_voice_ms FROM turns WHERE call_id IN ({marks})",
                             tuple(turns)):
            turns[r["call_id"]].append(r["voice_to_voice_ms"])
        for call in calls:
            figures = turns[call["id"]]
            call["turn_count"] = len(figures)
            call["voice_to_voice_ms"] = percentiles([v for v in figures if v is not None])
        return calls

    def get_call(self, call_id: str) -> dict[str, Any] | None:
        """One call with all its turns in order, or None."""
        rows = self._query(f"SELECT {_CALL_COLUMNS} FROM {_CALLS_SHOWN} WHERE id = ?",
                           (self._stale_before(), call_id))
        if not rows:
            return None
        call = row_dict(rows[0])
        call["turns"] = [row_dict(r) for r in
                         self._query("SELECT * FROM turns WHERE call_id = ? ORDER BY turn", (call_id,))]
        tools: dict[int, list[dict[str, Any]]] = {}
        for r in self._query("SELECT * FROM tool_calls WHERE call_id = ? ORDER BY turn, idx", (call_id,)):
            row = row_dict(r)
            for key in ("call_id", "idx"):
                del row[key]
            tools.setdefault(row.pop("turn"), []).append(row)
        for turn in call["turns"]:
            del turn["call_id"]
            turn["tool_calls"] = tools.get(turn["turn"], [])
        call["turn_count"] = len(call["turns"])
        call["voice_to_voice_ms"] = percentiles([t["voice_to_voice_ms"] for t in call["turns"]
                                                 if t["voice_to_voice_ms"] is not None])
        return call

    def _stale_before(self) -> float:
        """A heartbeat older than this: its replica's live calls are lost."""
        return time.time() - self.lost_after_s

    def transports(self) -> list[str]:
        """Every transport that has a call in the store (for the dashboard's filter)."""
        return [r["transport"] for r in self._query("SELECT DISTINCT transport FROM calls ORDER BY transport")]
