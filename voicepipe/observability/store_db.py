"""The call store's two databases behind one code path: SQLite (the default file, `paths.data_dir`) and
PostgreSQL (`observability.store_url`, shared by several replicas).

The store's statements are written once, with ``:name`` and ``?`` placeholders, and run on either: a SQLite
connection is the `sqlite3` one itself; a PostgreSQL connection (`PostgresConnection`, over psycopg 3) offers the
same small surface (``execute``, ``in_transaction``, ``close``) and turns the placeholders into psycopg's. What
the two do differently lives here and only here:

- the schema's version: SQLite's ``PRAGMA user_version``; PostgreSQL's table ``voicepipe_schema``;
- migrations: ``BEGIN IMMEDIATE`` (one writer); an advisory lock around them, so replicas that start together
  migrate once;
- a float column (``REAL`` in the migrations): SQLite's ``REAL`` has 8 bytes; PostgreSQL's has 4, so it becomes
  ``DOUBLE PRECISION`` (unix seconds need them);
- a failing write in a batch is skipped and the batch goes on: in PostgreSQL inside a savepoint (a failed statement
  aborts its whole transaction there);
- rows: `sqlite3.Row`; dicts.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

SQLITE = "sqlite"
POSTGRES = "postgresql"
URL_SCHEMES = ("postgresql://", "postgres://")
MIGRATION_LOCK = 0x766F6963  # the advisory lock key replicas take to migrate ("voic")


def is_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(URL_SCHEMES)


def open_connection(location: str | Path, read_only: bool = False):
    """A connection in autocommit mode (transactions are explicit): to the SQLite file at ``location`` (WAL
    mode), or to the PostgreSQL database at the URL ``location``."""
    if is_url(location):
        return PostgresConnection(str(location))
    conn = sqlite3.connect(str(location), isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a crash loses uncommitted batches only
    if read_only:
        conn.execute("PRAGMA query_only = ON")
    return conn


def describe(location: str | Path) -> str:
    """``location`` for a log line: a URL without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", str(location)) if is_url(location) else str(location)


def dialect(conn: Any) -> str:
    return getattr(conn, "dialect", SQLITE)


def errors(conn: Any) -> tuple[type[Exception], ...]:
    """The exceptions the database's driver raises."""
    if dialect(conn) == POSTGRES:
        import psycopg

        return (psycopg.Error,)
    return (sqlite3.Error,)


class PostgresConnection:
    """A psycopg connection (autocommit, rows as dicts) with the surface of a `sqlite3.Connection` the store uses."""

    dialect = POSTGRES

    def __init__(self, url: str) -> None:
        import psycopg
        from psycopg.rows import dict_row

        self._conn = psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=10)

    def execute(self, sql: str, params: tuple | dict = ()):
        cursor = self._conn.cursor()
        cursor.execute(_psycopg_sql(sql), params)
        return cursor

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self._conn.info.transaction_status != TransactionStatus.IDLE

    @property
    def broken(self) -> bool:
        """The server went away: open a new connection."""
        return self._conn.closed or self._conn.broken

    def close(self) -> None:
        self._conn.close()


@lru_cache(maxsize=256)
def _psycopg_sql(sql: str) -> str:
    """``?`` and ``:name`` placeholders as psycopg's ``%s`` and ``%(name)s`` (a literal ``%`` doubled). The store's
    SQL has no colon or question mark inside a string literal."""
    sql = sql.replace("%", "%%").replace("?", "%s")
    return re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", r"%(\1)s", sql)


# -- what differs ---------------------------------------------------------------------------------------------------
def begin_write(conn: Any) -> None:
    """Open a write transaction (SQLite: the one writer from here on)."""
    conn.execute("BEGIN" if dialect(conn) == POSTGRES else "BEGIN IMMEDIATE")


@contextmanager
def write_transaction(conn: Any) -> Iterator[None]:
    """A write transaction (`begin_write`) around the block: committed at its end, rolled back if it raises."""
    begin_write(conn)
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def migration_lock(conn: Any) -> Iterator[None]:
    """While held, no other replica migrates the schema. PostgreSQL: a session advisory lock, taken outside the
    migrations' transactions so that each of them sees what the replica before it committed. SQLite needs none:
    `begin_write` already makes every migration wait for the one before it."""
    if dialect(conn) != POSTGRES:
        yield
        return
    conn.execute(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
    try:
        yield
    finally:
        conn.execute(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")


def schema_version(conn: Any) -> int:
    if dialect(conn) == POSTGRES:
        if conn.execute("SELECT to_regclass('voicepipe_schema') AS t").fetchone()["t"] is None:
            return 0
        return conn.execute("SELECT version FROM voicepipe_schema").fetchone()["version"]
    return conn.execute("PRAGMA user_version").fetchone()[0]


def set_schema_version(conn: Any, version: int) -> None:
    if dialect(conn) == POSTGRES:
        conn.execute("CREATE TABLE IF NOT EXISTS voicepipe_schema (version INTEGER NOT NULL)")
        conn.execute("DELETE FROM voicepipe_schema")
        conn.execute("INSERT INTO voicepipe_schema (version) VALUES (?)", (version,))
    else:
        conn.execute(f"PRAGMA user_version = {version:d}")


def ddl(conn: Any, statement: str) -> str:
    """A migration's statement as this database needs it."""
    if dialect(conn) == POSTGRES:
        return re.sub(r"\bREAL\b", "DOUBLE PRECISION", statement)
    return statement


def execute_in_batch(conn: Any, sql: str, params: dict[str, Any]) -> None:
    """One write inside the writer's open batch; a failure raises and leaves the rest of the batch intact."""
    if dialect(conn) != POSTGRES:
        conn.execute(sql, params)
        return
    conn.execute("SAVEPOINT one_write")
    try:
        conn.execute(sql, params)
    except Exception:
        conn.execute("ROLLBACK TO SAVEPOINT one_write")
        raise
    conn.execute("RELEASE SAVEPOINT one_write")
