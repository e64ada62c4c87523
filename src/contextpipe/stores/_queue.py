"""The queue tables of the SQL stores: messages queued for a session, whoever holds its lease.

An entry is written at once, in its own transaction, without the session's lease (it creates the
session's row when there is none, as a write does, and counts as the session's activity for its
TTL). Entries are unique by tenant, session and id (the queued message's id): a retried enqueue
adds nothing. Reading lists the session's entries not marked settled, in the order they were
written; settling marks them (the store's clock), once. Deleting a session, or its expiry, deletes
its entries with its messages (``cp_queue`` / ``<prefix>queue`` is one of the tables a deletion
empties). Delivery itself is an append to the log (`contextpipe.queue`): settling only keeps the
reading short.

`table_for` returns the backend's table for any store (memory and Redis are in `_queue_kv`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Protocol

from ..session import SessionKey

if TYPE_CHECKING:
    import asyncpg

    from .base import SessionStore
    from .postgres import PostgresStore
    from .sqlite import SQLiteStore

__all__ = ["SQLITE_QUEUE", "QueueRow", "QueueTable", "postgres_migration", "table_for"]

QueueRow = tuple[str, str, str]
"""``(entry id, when, message body)`` of an entry not settled, as the table lists them."""

SQLITE_QUEUE: Final = """
CREATE TABLE IF NOT EXISTS cp_queue (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    due TEXT NOT NULL,
    body TEXT NOT NULL,
    settled_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS cp_queue_entry ON cp_queue (tenant, session_id, entry_id);
CREATE INDEX IF NOT EXISTS cp_queue_pending ON cp_queue (tenant, session_id, id) WHERE settled_at IS NULL;
"""
"""The SQLite queue table (created, when missing, whenever a store opens its file for writing)."""


class QueueTable(Protocol):
    """What each backend does for `contextpipe.queue`; every method is on a validated key."""

    async def add(self, key: SessionKey, entry_id: str, when: str, body: str) -> None:
        """Write the entry now (idempotent by `entry_id`), without the lease."""

    async def rows(self, key: SessionKey) -> list[QueueRow]:
        """Return the session's entries not settled, in the order they were written."""

    async def settle(self, key: SessionKey, entry_ids: Sequence[str]) -> None:
        """Mark the entries settled (`rows` no longer lists them); unknown or settled ones are skipped."""


def table_for(store: SessionStore) -> QueueTable:
    """Return the queue table of `store`'s backend."""
    from . import _queue_kv

    match store.backend:
        case "sqlite":
            return _SQLiteQueue(store)  # type: ignore[arg-type]
        case "postgres":
            return _PostgresQueue(store)  # type: ignore[arg-type]
        case "memory":
            return _queue_kv.MemoryQueue(store)  # type: ignore[arg-type]
        case "redis":
            return _queue_kv.RedisQueue(store)  # type: ignore[arg-type]
    from ..errors import UsageError

    raise UsageError(f"the {store.backend} store keeps no message queue; use MemoryStore, SQLiteStore, "
                     "PostgresStore or RedisStore")


# --- SQLite -------------------------------------------------------------------------------------------------


class _SQLiteQueue:
    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    async def add(self, key: SessionKey, entry_id: str, when: str, body: str) -> None:
        store = self._store

        def write(conn: sqlite3.Connection) -> None:
            with store._transaction(conn, durable=True):
                now = store._clock()
                if store._session_row(conn, key, now) is None:
                    conn.execute("INSERT INTO cp_sessions (tenant, session_id, created_at, updated_at) "
                                 "VALUES (?, ?, ?, ?)", (key.tenant, key.id, now, now))
                conn.execute("INSERT OR IGNORE INTO cp_queue (tenant, session_id, entry_id, due, body) "
                             "VALUES (?, ?, ?, ?, ?)", (key.tenant, key.id, entry_id, when, body))
                store._touch(conn, key, now)

        await store._run(write)

    async def rows(self, key: SessionKey) -> list[QueueRow]:
        def read(conn: sqlite3.Connection) -> list[QueueRow]:
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'cp_queue'").fetchone():
                return []  # a file opened read-only that no writer of this release opened yet
            return [(r["entry_id"], r["due"], r["body"]) for r in conn.execute(
                "SELECT entry_id, due, body FROM cp_queue WHERE tenant = ? AND session_id = ? AND settled_at IS NULL "
                "ORDER BY id", (key.tenant, key.id))]

        return await self._store._run(read)

    async def settle(self, key: SessionKey, entry_ids: Sequence[str]) -> None:
        store = self._store

        def mark(conn: sqlite3.Connection) -> None:
            with store._transaction(conn, durable=False):  # a lost mark only makes the next reader look again
                conn.executemany("UPDATE cp_queue SET settled_at = ? WHERE tenant = ? AND session_id = ? "
                                 "AND entry_id = ? AND settled_at IS NULL",
                                 [(store._clock(), key.tenant, key.id, i) for i in entry_ids])

        await store._run(mark)


# --- PostgreSQL ---------------------------------------------------------------------------------------------


def postgres_migration(p: str) -> list[str]:
    """Return the schema step that adds the queue table (tables prefixed `p`)."""
    return [
        f"""CREATE TABLE {p}queue (
            id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, entry_id TEXT NOT NULL,
            due TEXT NOT NULL, body TEXT NOT NULL, settled_at DOUBLE PRECISION)""",
        f"CREATE UNIQUE INDEX {p}queue_entry ON {p}queue (tenant, session_id, entry_id)",
        f"CREATE INDEX {p}queue_pending ON {p}queue (tenant, session_id, id) WHERE settled_at IS NULL",
    ]


class _PostgresQueue:
    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def add(self, key: SessionKey, entry_id: str, when: str, body: str) -> None:
        store, p = self._store, self._store._p
        async with store._transaction() as conn:
            await store._locked_row(conn, key, None, check=False)  # created when missing; serialised with appends
            await conn.execute(f"INSERT INTO {p}queue (tenant, session_id, entry_id, due, body) "
                               "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, session_id, entry_id) DO NOTHING",
                               key.tenant, key.id, entry_id, when, body)
            await store._touch(conn, key)

    async def rows(self, key: SessionKey) -> list[QueueRow]:
        async with self._store._connection() as conn:
            found: list[asyncpg.Record] = await conn.fetch(
                f"SELECT entry_id, due, body FROM {self._store._p}queue WHERE tenant = $1 AND session_id = $2 "
                "AND settled_at IS NULL ORDER BY id", key.tenant, key.id)
        return [(r["entry_id"], r["due"], r["body"]) for r in found]

    async def settle(self, key: SessionKey, entry_ids: Sequence[str]) -> None:
        async with self._store._connection() as conn:
            await conn.execute(
                f"UPDATE {self._store._p}queue SET settled_at = extract(epoch from clock_timestamp())::float8 "
                "WHERE tenant = $1 AND session_id = $2 AND settled_at IS NULL AND entry_id = ANY($3::text[])",
                key.tenant, key.id, list(entry_ids))
