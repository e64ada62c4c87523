"""The queue tables of the SQL stores: messages queued for a session, whoever holds its lease.

An entry is written at once, in its own transaction, without the session's lease (it creates the
session's row when there is none, as a write does, and counts as the session's activity for its
TTL). Entries are unique by tenant, session and id (the queued message's id): a retried enqueue
adds nothing. Reading lists the session's entries not marked settled, in the order they were
written; settling marks them (the store's clock), once. Deleting a session, or its expiry, deletes
its entries with its messages (``cp_queue`` / ``<prefix>queue`` is one of the tables a deletion
empties). Delivery itself is an append to the log (`contextpipe.queue`): settling only keeps the
reading short.

The tables' classes are in `_queue_sql` (and `_queue_redis`; the memory store keeps its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Protocol

from ..session import SessionKey

if TYPE_CHECKING:
    from ._records import Lease

__all__ = ["SQLITE_QUEUE", "QueueRow", "QueueTable", "postgres_migration"]

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

    def nothing_queued(self, key: SessionKey, lease: Lease) -> bool:
        """Return True if the table knows without I/O that `rows` would list nothing now (`contextpipe.queue`).

        False when it does not know. A table that answers from a fenced write's look at the queue
        (SQLite) forgets that look once asked, so it answers True at most once per look.
        """


def postgres_migration(p: str) -> list[str]:
    """Return the schema step that adds the queue table (tables prefixed `p`)."""
    return [
        f"""CREATE TABLE {p}queue (
            id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, entry_id TEXT NOT NULL,
            due TEXT NOT NULL, body TEXT NOT NULL, settled_at DOUBLE PRECISION)""",
        f"CREATE UNIQUE INDEX {p}queue_entry ON {p}queue (tenant, session_id, entry_id)",
        f"CREATE INDEX {p}queue_pending ON {p}queue (tenant, session_id, id) WHERE settled_at IS NULL",
    ]
