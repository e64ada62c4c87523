"""The queue tables' classes of SQLite and PostgreSQL (`contextpipe.stores._queue`), and `table_for`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..session import SessionKey
from ._queue import QueueRow, QueueTable

if TYPE_CHECKING:
    import sqlite3

    import asyncpg

    from ._records import Lease
    from .base import SessionStore
    from .postgres import PostgresStore
    from .sqlite import SQLiteStore

__all__ = ["table_for"]



def table_for(store: SessionStore) -> QueueTable:
    """Return the queue table of `store`'s backend (the memory store keeps its own: `MemoryStore.queue_table`)."""
    match store.backend:
        case "sqlite":
            return _SQLiteQueue(store)  # type: ignore[arg-type]
        case "postgres":
            return _PostgresQueue(store)  # type: ignore[arg-type]
        case "redis":
            from ._queue_redis import RedisQueue

            return RedisQueue(store)  # type: ignore[arg-type]
    from ..errors import UsageError

    raise UsageError(f"the {store.backend} store keeps no message queue; use MemoryStore, SQLiteStore, "
                     "PostgresStore or RedisStore")


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

    def nothing_queued(self, key: SessionKey, lease: Lease) -> bool:
        # The run's latest append fenced by `lease` looked at the queue in its transaction (`SQLiteStore._append`):
        # this spares a boundary one trip to the store's thread (70-100 µs).
        return self._store._queue_looks.pop((lease.tenant, lease.session_id, lease.token), None) is False


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

    def nothing_queued(self, key: SessionKey, lease: Lease) -> bool:
        return False  # not known without a query: the boundary reads the table
