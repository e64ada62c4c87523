"""The outbox tables of the SQL stores: written in the append that stores the messages carrying the entries.

An append takes the rows `contextpipe.outbox.outbox_rows` finds in its batch and, in its own
transaction, inserts those of the messages it actually stored (a message already in the log, from a
retried append, is skipped with its entries): so an entry exists exactly when its message does, once.
Each entry is unique by tenant and key as well. Reading lists the entries not marked delivered, in the
order they were written; marking sets ``delivered_at`` (the store's clock), once. Deleting a session
(or its expiry) deletes its entries with its messages.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from ..outbox import OutboxEntry
from ..session import SessionKey

if TYPE_CHECKING:
    import asyncpg

__all__ = ["SQLITE_OUTBOX", "entry_of", "postgres_insert", "postgres_mark", "postgres_migration", "postgres_pending",
           "sqlite_insert", "sqlite_mark", "sqlite_pending"]

OutboxRows = Sequence[tuple[str, str, str, str]]
"""``(message_id, key, topic, body)`` per entry (`contextpipe.outbox.outbox_rows`)."""

_COLUMNS: Final = "tenant, session_id, seq, entry_key, topic, body"

SQLITE_OUTBOX: Final = """
CREATE TABLE IF NOT EXISTS cp_outbox (
    id INTEGER PRIMARY KEY,
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry_key TEXT NOT NULL,
    topic TEXT NOT NULL,
    body TEXT NOT NULL,
    delivered_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS cp_outbox_key ON cp_outbox (tenant, entry_key);
CREATE INDEX IF NOT EXISTS cp_outbox_pending ON cp_outbox (tenant, id) WHERE delivered_at IS NULL;
CREATE INDEX IF NOT EXISTS cp_outbox_session ON cp_outbox (tenant, session_id);
"""
"""The SQLite outbox table (created, when missing, whenever a store opens its file for writing)."""


def entry_of(row: Any) -> OutboxEntry:
    """Return the `OutboxEntry` of a row (by column name: a `sqlite3.Row`, an asyncpg record) of an outbox table."""
    body = json.loads(row["body"])
    return OutboxEntry(row["entry_key"], row["tenant"], row["session_id"], int(row["seq"]), body["call_id"],
                       row["topic"], body["payload"])


def _by_seq(key: SessionKey, seqs: Mapping[str, int], entries: OutboxRows) -> list[tuple[Any, ...]]:
    return [(key.tenant, key.id, seqs[mid], k, t, b) for mid, k, t, b in entries if mid in seqs]


# --- SQLite -------------------------------------------------------------------------------------------------


def sqlite_insert(conn: sqlite3.Connection, key: SessionKey, seqs: Mapping[str, int], entries: OutboxRows) -> None:
    """Insert the `entries` of the messages just stored (`seqs`: id to sequence), in the append's transaction."""
    conn.executemany(f"INSERT OR IGNORE INTO cp_outbox ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                     _by_seq(key, seqs, entries))


def sqlite_pending(conn: sqlite3.Connection, tenant: str, topic: str | None, limit: int) -> list[OutboxEntry]:
    """Return the tenant's first `limit` entries not marked delivered (of `topic`, when given)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'cp_outbox'").fetchone():
        return []  # a file opened read-only that no writer of this release opened yet
    where = "tenant = ? AND delivered_at IS NULL" + (" AND topic = ?" if topic is not None else "")
    args = (tenant, topic, limit) if topic is not None else (tenant, limit)
    return [entry_of(r) for r in conn.execute(f"SELECT {_COLUMNS} FROM cp_outbox WHERE {where} ORDER BY id LIMIT ?",
                                              args)]


def sqlite_mark(conn: sqlite3.Connection, tenant: str, keys: Sequence[str], now: float) -> int:
    """Mark the tenant's entries `keys` delivered at `now`; return how many were not yet."""
    marked = 0
    for start in range(0, len(keys), 500):  # under SQLite's variable limit
        chunk = keys[start:start + 500]
        marked += conn.execute(f"UPDATE cp_outbox SET delivered_at = ? WHERE tenant = ? AND delivered_at IS NULL "
                               f"AND entry_key IN ({','.join('?' * len(chunk))})", (now, tenant, *chunk)).rowcount
    return marked


# --- PostgreSQL ---------------------------------------------------------------------------------------------


def postgres_migration(p: str) -> list[str]:
    """Return the schema step that adds the outbox table (tables prefixed `p`)."""
    return [
        f"""CREATE TABLE {p}outbox (
            id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, seq BIGINT NOT NULL,
            entry_key TEXT NOT NULL, topic TEXT NOT NULL, body TEXT NOT NULL,
            delivered_at DOUBLE PRECISION)""",
        f"CREATE UNIQUE INDEX {p}outbox_key ON {p}outbox (tenant, entry_key)",
        f"CREATE INDEX {p}outbox_pending ON {p}outbox (tenant, id) WHERE delivered_at IS NULL",
        f"CREATE INDEX {p}outbox_session ON {p}outbox (tenant, session_id)",
    ]


async def postgres_insert(conn: asyncpg.Connection, p: str, key: SessionKey, seqs: Mapping[str, int],
                          entries: OutboxRows) -> None:
    """Insert the `entries` of the messages just stored (`seqs`), in the append's transaction."""
    rows = _by_seq(key, seqs, entries)
    if rows:
        columns = list(zip(*rows, strict=True))
        await conn.execute(
            f"INSERT INTO {p}outbox ({_COLUMNS}) SELECT $1, $2, s, k, t, b FROM unnest($3::bigint[], $4::text[], "
            "$5::text[], $6::text[]) AS u(s, k, t, b) ON CONFLICT (tenant, entry_key) DO NOTHING",
            key.tenant, key.id, *(list(column) for column in columns[2:]))


async def postgres_pending(conn: asyncpg.Connection, p: str, tenant: str, topic: str | None,
                           limit: int) -> list[OutboxEntry]:
    """Return the tenant's first `limit` entries not marked delivered (of `topic`, when given)."""
    rows = await conn.fetch(f"SELECT {_COLUMNS} FROM {p}outbox WHERE tenant = $1 AND delivered_at IS NULL "
                            "AND ($2::text IS NULL OR topic = $2) ORDER BY id LIMIT $3", tenant, topic, limit)
    return [entry_of(r) for r in rows]


async def postgres_mark(conn: asyncpg.Connection, p: str, tenant: str, keys: Sequence[str]) -> int:
    """Mark the tenant's entries `keys` delivered now (the server's clock); return how many were not yet."""
    status = await conn.execute(
        f"UPDATE {p}outbox SET delivered_at = extract(epoch from clock_timestamp())::float8 WHERE tenant = $1 "
        "AND delivered_at IS NULL AND entry_key = ANY($2::text[])", tenant, list(keys))
    return int(str(status).split()[-1])
