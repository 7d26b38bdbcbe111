"""The call store's schema, versioned in code: the database's schema version counts the migrations applied
(SQLite's `PRAGMA user_version`, PostgreSQL's `voicepipe_schema` table: `store_db.py`).

A migration is a list of SQL statements that both databases run (`store_db.ddl` maps the one type they spell
differently). `migrate()` applies the missing ones in order, each in its own transaction together with the version
bump, so a database is always at one whole version; replicas that start together take turns
(`store_db.migration_lock`) and the later ones find the work done. Add a migration by appending to `MIGRATIONS`;
never edit one that has shipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from voicepipe.observability import store_db

Migration = Sequence[str]

MIGRATIONS: list[Migration] = [
    # 1: calls and their turns
    [
        """CREATE TABLE calls (
            id TEXT PRIMARY KEY,
            transport TEXT NOT NULL,
            started REAL NOT NULL,            -- unix seconds
            ended REAL,                       -- unix seconds; NULL while the call is live (or was cut by a crash)
            outcome TEXT,                     -- completed | dropped | idle_timeout | error
            end_reason TEXT,
            metadata TEXT NOT NULL DEFAULT '{}',  -- JSON: what the caller's start message carried
            system_prompt TEXT NOT NULL DEFAULT '',
            greeting TEXT,
            greeting_heard TEXT,
            barge_ins INTEGER NOT NULL DEFAULT 0,
            error TEXT
        )""",
        "CREATE INDEX calls_by_start ON calls (started)",
        """CREATE TABLE turns (
            call_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            user_text TEXT NOT NULL DEFAULT '',
            agent_text TEXT NOT NULL DEFAULT '',   -- everything generated
            heard_text TEXT,                       -- what the caller heard of an interrupted reply
            interrupted INTEGER NOT NULL DEFAULT 0,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            cached_prompt_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            voice_to_voice_ms REAL,                -- a column of its own for the call list's percentiles
            timings_ms TEXT NOT NULL DEFAULT '{}', -- JSON: the derived figures
            timeline TEXT NOT NULL DEFAULT '{}',   -- JSON: event -> seconds since the call started
            error TEXT,
            PRIMARY KEY (call_id, turn)
        )""",
    ],
    # 2: each turn's end-of-turn decision (all NULL: none, as for turns stored before), its reopens and backchannels
    [
        "ALTER TABLE turns ADD COLUMN decision_policy TEXT",  # silence | text | acoustic | hybrid
        "ALTER TABLE turns ADD COLUMN decision_action TEXT",
        "ALTER TABLE turns ADD COLUMN decision_reason TEXT",
        "ALTER TABLE turns ADD COLUMN decision_silence_ms REAL",  # the caller's silence when it was taken
        "ALTER TABLE turns ADD COLUMN decision_wait_ms REAL",  # the silence its evidence asked for
        "ALTER TABLE turns ADD COLUMN decision_text_prob REAL",
        "ALTER TABLE turns ADD COLUMN decision_acoustic_prob REAL",
        "ALTER TABLE turns ADD COLUMN reopened TEXT NOT NULL DEFAULT '[]'",  # JSON: earlier decisions, each with t
        "ALTER TABLE turns ADD COLUMN backchannels TEXT NOT NULL DEFAULT '[]'",  # JSON: said over the reply
    ],
    # 3: which replica (observability.replica) served the call, for a store several replicas share
    [
        "ALTER TABLE calls ADD COLUMN replica TEXT",
    ],
    # 4: keypad turns (DTMF) and each tool call a reply made
    [
        "ALTER TABLE turns ADD COLUMN dtmf TEXT",  # a keypad turn's keys (NULL: a spoken turn)
        """CREATE TABLE tool_calls (
            call_id TEXT NOT NULL,
            turn INTEGER NOT NULL,
            idx INTEGER NOT NULL,                  -- its place among the turn's calls, from 0
            name TEXT NOT NULL,
            arguments TEXT NOT NULL DEFAULT '{}',  -- the model's JSON text
            t REAL,                                -- seconds since the call started: the model's call complete
            latency_ms REAL,                       -- from the call to its result
            result_chars INTEGER NOT NULL DEFAULT 0,
            error TEXT,                            -- NULL: it succeeded
            PRIMARY KEY (call_id, turn, idx)
        )""",
        "CREATE INDEX tool_calls_by_name ON tool_calls (name)",
    ],
    # 5: lost calls (outcome "lost": their process died): each call's latest record, each replica's heartbeat
    [
        "ALTER TABLE calls ADD COLUMN last_record REAL",  # unix seconds; a lost call ends here
        "CREATE INDEX calls_live ON calls (replica) WHERE ended IS NULL",
        "CREATE TABLE replicas (name TEXT PRIMARY KEY, heartbeat REAL NOT NULL)",  # unix seconds
    ],
]


class SchemaError(RuntimeError):
    pass


def schema_version(conn: Any) -> int:
    return store_db.schema_version(conn)


def migrate(conn: Any, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the database up to `len(migrations)`; returns the version it had before.

    `conn` must be in autocommit mode (`store_db.open_connection`): the transactions are explicit here."""
    with store_db.migration_lock(conn):
        before = schema_version(conn)
        if before > len(migrations):
            raise SchemaError(f"the call store's schema is version {before}, newer than this voicepipe knows "
                              f"({len(migrations)}): upgrade voicepipe or point the store elsewhere")
        for version in range(before + 1, len(migrations) + 1):
            with store_db.write_transaction(conn):
                if schema_version(conn) < version:  # another process may have applied it while this one waited
                    for statement in migrations[version - 1]:
                        conn.execute(store_db.ddl(conn, statement))
                    store_db.set_schema_version(conn, version)
    return before
