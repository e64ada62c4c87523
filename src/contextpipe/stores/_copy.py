"""The SQL stores' `SessionStore.copy_view`: a session's log rows copied to another session by the database.

One ``INSERT ... SELECT`` per kept range, inside the write transaction of the target session (so the
lease check, the copy and the new ``last_seq`` commit together or not at all): the rows keep their id
and body as stored, and ``ROW_NUMBER()`` numbers them on from the target's last sequence. Nothing is
decoded or encoded in Python. The database checks first that it reads each row copied as JSON: when
one is not (a damaged row, or a message holding ``NaN`` or ``Infinity``, which the codec writes and
reads but SQL's JSON does not), nothing is copied and the copy returns None, so `rewind.fork` copies
page by page: that copy takes the NaN, and names a damaged row (`CorruptRecord`, its sequence).
The outbox is left as it is: its entries are unique by tenant and key,
so the plain copy's appends (`contextpipe.rewind.copy_pages`) store none for a fork in the same
tenant either (the source's entries hold their keys).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ..session import SessionKey
from ._checks import not_empty

if TYPE_CHECKING:
    import sqlite3

    import asyncpg

__all__ = ["postgres_copy", "sqlite_copy"]

_SQLITE_COPY: Final = (
    "INSERT INTO cp_messages (tenant, session_id, seq, message_id, body) "
    "SELECT ?, ?, ? + ROW_NUMBER() OVER (ORDER BY seq), message_id, body FROM cp_messages "
    "WHERE tenant = ? AND session_id = ? AND seq >= ? AND seq <= ? ORDER BY seq")
_SQLITE_DAMAGED: Final = ("SELECT seq FROM cp_messages WHERE tenant = ? AND session_id = ? AND seq >= ? AND seq <= ? "
                          "AND NOT json_valid(body) ORDER BY seq LIMIT 1")


def sqlite_copy(conn: sqlite3.Connection, target: SessionKey, row: sqlite3.Row, now: float, source: SessionKey,
                kept: list[tuple[int, int]], touch: Callable[[sqlite3.Connection, SessionKey, float], None]
                ) -> int | None:
    """Copy the `kept` ranges of `source` to `target` (in `SQLiteStore`'s write transaction); return the count.

    None, with nothing written, when a row copied is not JSON to SQLite (see the module).
    """
    last = int(row["last_seq"])
    if last:
        raise not_empty(target, last)
    for lo, hi in kept:
        if conn.execute(_SQLITE_DAMAGED, (source.tenant, source.id, lo, hi)).fetchone():
            return None
    for lo, hi in kept:
        last += conn.execute(_SQLITE_COPY, (target.tenant, target.id, last, source.tenant, source.id, lo, hi)).rowcount
    if last:
        conn.execute("UPDATE cp_sessions SET last_seq = ? WHERE tenant = ? AND session_id = ?",
                     (last, target.tenant, target.id))
    touch(conn, target, now)
    return last


async def postgres_copy(conn: asyncpg.Connection, p: str, target: SessionKey, last: int, source: SessionKey,
                        kept: list[tuple[int, int]]) -> int | None:
    """Copy the `kept` ranges of `source` to `target` (in `PostgresStore`'s locked transaction); return the count.

    None, with nothing written, when a row copied is not JSON to PostgreSQL (see the module).
    """
    if last:
        raise not_empty(target, last)
    for lo, hi in kept:
        if not await _postgres_json(conn, p, source, lo, hi):
            return None
    for lo, hi in kept:
        status = await conn.execute(
            f"INSERT INTO {p}messages (tenant, session_id, seq, message_id, body) "
            "SELECT $1, $2, $3 + ROW_NUMBER() OVER (ORDER BY seq), message_id, body "
            f"FROM {p}messages WHERE tenant = $4 AND session_id = $5 AND seq >= $6 AND seq <= $7",
            target.tenant, target.id, last, source.tenant, source.id, lo, hi)
        last += int(str(status).split()[-1])
    return last


async def _postgres_json(conn: asyncpg.Connection, p: str, source: SessionKey, lo: int, hi: int) -> bool:
    """Whether PostgreSQL reads every body of `source` from `lo` to `hi` as JSON."""
    where = f"FROM {p}messages WHERE tenant = $1 AND session_id = $2 AND seq >= $3 AND seq <= $4"
    if conn.get_server_version().major >= 16:  # pg_input_is_valid came with PostgreSQL 16
        return not await conn.fetchval(f"SELECT EXISTS (SELECT 1 {where} AND NOT pg_input_is_valid(body, 'json'))",
                                       source.tenant, source.id, lo, hi)
    return await _casts(conn, where, source, lo, hi)


async def _casts(conn: asyncpg.Connection, where: str, source: SessionKey, lo: int, hi: int) -> bool:
    """Whether every body of the rows `where` casts to JSON (under a savepoint: a failed cast leaves the rest)."""
    import asyncpg  # a connection is open: the driver is there

    await conn.execute("SAVEPOINT cp_copy_check")  # the store's transaction is begun by hand: so is the savepoint
    try:
        await conn.fetchval(f"SELECT count(body::json) {where}", source.tenant, source.id, lo, hi)
    except asyncpg.DataError:
        await conn.execute("ROLLBACK TO SAVEPOINT cp_copy_check")
        await conn.execute("RELEASE SAVEPOINT cp_copy_check")
        return False
    await conn.execute("RELEASE SAVEPOINT cp_copy_check")
    return True
