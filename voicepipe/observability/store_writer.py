"""The call store's one writer thread: statements arrive on a queue and are committed in batches.

The first statement of a batch opens a transaction; the batch commits `flush_interval_s` later (or on
`flush()` / `close()`), so a crash loses at most that much. A failing statement is skipped and a failing commit
rolls its batch back; neither stops the thread, so calls go on while the disk is full or read-only. The first
failure of a run is logged as an error, the return to normal with the count lost meanwhile; `failures` counts
them all (the `store` kind of `voicepipe_errors_total`). The `chores` (the retention sweep, a fleet's heartbeat)
run in the same thread, each every so often, so the database only ever has one writer here. A PostgreSQL
connection that breaks (the server restarted) is opened again with `reconnect` before the next batch or chore; the
batch it was in is lost, and logged.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from voicepipe.observability import store_db

log = logging.getLogger(__name__)

_STOP = object()


@dataclass(frozen=True)
class Chore:
    """Work the writer thread does every `every_s` on its connection, after committing the open batch; `run`
    opens and commits its own transaction."""

    name: str
    every_s: float
    run: Callable[[Any], None]


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


class StoreWriter:
    def __init__(self, conn: Any, flush_interval_s: float, chores: Sequence[Chore] = (),
                 reconnect: Callable[[], Any] | None = None) -> None:
        self._conn = conn  # autocommit mode (store_db.open_connection); owned by the writer thread from here on
        self._errors = store_db.errors(conn)
        self._reconnect = reconnect
        self._interval = flush_interval_s
        self._chores = tuple(chores)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.commits = 0  # batches committed (for tests and logs)
        self.statements = 0  # statements executed
        self.failures = 0  # statements and commits that failed
        self._failing_since: int | None = None  # `failures` when the current run of failures began
        self._wrote = False  # a statement of the open batch succeeded
        self._thread = threading.Thread(target=self._run, name="call-store-writer", daemon=True)
        self._thread.start()

    def put(self, sql: str, params: dict[str, Any]) -> None:
        """Queue one statement; returns at once (safe on the event loop)."""
        if self._closed:
            log.warning("call store is closed; a write was dropped")
            return
        self._queue.put((sql, params))

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until everything queued before this call is committed; False on timeout or when closed."""
        if self._closed:
            return False
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is queued, stop the thread and close the connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("call store writer did not stop within %.0f s; its last batch may be lost", timeout)

    # -- the thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        deadline: float | None = None  # when the open batch must commit
        due = [time.monotonic() + chore.every_s for chore in self._chores]  # when each chore runs next
        try:
            while True:
                wakes = [*due, deadline] if deadline is not None else due
                timeout = max(min(wakes) - time.monotonic(), 0.0) if wakes else None
                try:
                    item = self._queue.get(timeout=timeout)
                except queue.Empty:
                    item = None
                if item is _STOP:
                    break
                if isinstance(item, _Flush):
                    self._commit()
                    deadline = None
                    item.done.set()
                elif item is not None:
                    self._execute(*item)
                    if deadline is None:
                        deadline = time.monotonic() + self._interval
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self._commit()
                    deadline = None
                for i, chore in enumerate(self._chores):
                    if now >= due[i]:
                        self._commit()
                        deadline = None
                        self._run_chore(chore)
                        due[i] = now + chore.every_s
        except Exception:
            log.exception("call store writer failed")
        finally:
            self._commit()
            self._conn.close()

    def _execute(self, sql: str, params: dict[str, Any]) -> None:
        self._check_connection()
        try:
            if not self._conn.in_transaction:
                self._conn.execute("BEGIN")
            store_db.execute_in_batch(self._conn, sql, params)
            self.statements += 1
            self._wrote = True
        except Exception as exc:  # database errors, and values it cannot bind: skip this one, keep the thread
            self._failed(f"a write ({sql.split('(')[0].strip()})", exc)

    def _check_connection(self) -> None:
        if not getattr(self._conn, "broken", False) or self._reconnect is None:
            return
        log.error("call store: the database connection broke; its open batch is lost; reconnecting")
        try:
            conn = self._reconnect()
        except Exception as exc:
            log.error("call store: reconnecting failed: %s", exc)
            return
        with contextlib.suppress(Exception):
            self._conn.close()
        self._conn = conn

    def _commit(self) -> None:
        if not self._conn.in_transaction:
            return
        wrote, self._wrote = self._wrote, False
        try:
            self._conn.execute("COMMIT")
            self.commits += 1
        except self._errors as exc:
            self._failed("a commit (its batch is lost)", exc)
            with contextlib.suppress(*self._errors):
                self._conn.execute("ROLLBACK")
            return
        if wrote:
            self._recovered()

    def _recovered(self) -> None:
        if self._failing_since is not None:
            log.warning("call store: writes succeed again; %d writes or commits failed meanwhile",
                        self.failures - self._failing_since)
            self._failing_since = None

    def _failed(self, what: str, exc: Exception) -> None:
        """Count a failure; log the first of a run (a full disk fails every write: one line, not thousands)."""
        if self._failing_since is None:
            self._failing_since = self.failures
            log.error("call store: %s failed: %s. Calls go on; their records are lost until the store can write "
                      "again (disk full or read-only?)", what, exc)
        self.failures += 1

    def _run_chore(self, chore: Chore) -> None:
        self._check_connection()
        try:
            chore.run(self._conn)
        except self._errors as exc:
            self._failed(f"its {chore.name}", exc)
            if self._conn.in_transaction:
                with contextlib.suppress(*self._errors):
                    self._conn.execute("ROLLBACK")
            return
        self._recovered()
