"""`SQLiteStore`: the embedded default session store, one SQLite file (WAL), safe for several processes.

Every operation runs in one worker thread that owns the connection, so the event loop never blocks
on disk. Writes use ``BEGIN IMMEDIATE`` transactions: the check (lease, version, existing ids) and
the write happen atomically, also against other processes using the same file.

Durability: with ``synchronous="FULL"`` (the default) every acknowledged write survives a process
kill, an OS crash and a power loss (each durable commit fsyncs the write-ahead log). An append with
``durable=False`` and the lease bookkeeping are committed under ``synchronous=NORMAL`` instead: they
survive a process kill, and the next durable commit makes them durable too (its fsync of the log
covers every frame before it). ``synchronous="NORMAL"`` makes every write like that.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, Final, Literal, ParamSpec, TypeAlias, TypeVar
from urllib.parse import quote

from typing_extensions import override

from .._sqlite import use_wal
from ..errors import ConcurrentUpdate, LeaseLost, StoreError, UsageError
from ..messages import Message
from ..session import Session, SessionKey, validate_tenant
from ._common import (
    JoinedRows,
    check_batch,
    check_lease,
    check_limit,
    checkpoint_past_end,
    decode_checkpoint,
    decode_cursor,
    decode_state,
    decode_trace,
    encode_checkpoint,
    encode_cursor,
    encode_state,
    encode_trace,
    joined_part,
    key_of,
    lease_is_free,
    make_page,
    translated,
)
from .base import Checkpoint, Lease, MessagePage, SessionInfo, SessionListing, SessionStore

__all__ = ["SQLiteStore"]

SQLITE_SCHEMA_VERSION: Final = 3
"""Version of the SQLite layout written by this release (cp_meta ``schema_version``).

3 stores messages in the compact form (`contextpipe.messages.dumps_compact`). A file of version 2 is
upgraded when opened (its rows keep their full form, and both forms are read); a contextpipe that
knows only 2 refuses a file of version 3 and says to upgrade, instead of failing on its messages.
"""

if TYPE_CHECKING:
    from ..vectors.sqlite import SQLiteVectorStore

T = TypeVar("T")
P = ParamSpec("P")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS cp_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cp_sessions (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT '{}',
    version INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ttl REAL,
    expires_at REAL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_token INTEGER NOT NULL DEFAULT 0,
    lease_expires REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS cp_sessions_recent ON cp_sessions (tenant, updated_at DESC, session_id);
CREATE INDEX IF NOT EXISTS cp_sessions_expiry ON cp_sessions (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS cp_messages (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, session_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS cp_messages_id ON cp_messages (tenant, session_id, message_id);
CREATE TABLE IF NOT EXISTS cp_checkpoints (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cp_traces (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, session_id, n)
) WITHOUT ROWID;
"""

_SESSION: Final = ("SELECT version, last_seq, lease_owner, lease_token, lease_expires, expires_at, state, created_at, "
                   "ttl FROM cp_sessions WHERE tenant = ? AND session_id = ?")
_LIVE_LAST_SEQ: Final = ("SELECT last_seq FROM cp_sessions WHERE tenant = ? AND session_id = ? "
                         "AND (expires_at IS NULL OR expires_at > ?)")


def _is_session(row: sqlite3.Row) -> bool:
    """Whether the row is a session: it has saved state or messages (a lease alone does not make one)."""
    return bool(row["version"] > 0 or row["last_seq"] > 0)


class SQLiteStore(SessionStore):
    """Sessions in one SQLite database file (WAL mode).

    >>> import asyncio, tempfile, os
    >>> from contextpipe import Message
    >>> async def demo(path):
    ...     async with SQLiteStore(path) as store:
    ...         await store.append("default", "chat-1", [Message.user("hi")])
    ...         return [m.text for m in (await store.load("default", "chat-1")).messages]
    >>> asyncio.run(demo(os.path.join(tempfile.mkdtemp(), "agent.db")))
    ['hi']

    `synchronous` is SQLite's durability setting: ``FULL`` (the default) keeps every acknowledged
    write through a power loss or OS crash; ``NORMAL`` only through a process crash or kill (an OS
    crash may lose the last writes, never corrupt the file), in exchange for no fsync per write.
    `busy_timeout` is how long a write waits for another process's transaction. `clock` (seconds
    since the epoch) measures TTLs and leases; tests pass a fake one.

    `commits` and `durable_commits` count this store's write transactions and those that were
    committed durably (each one fsync of the write-ahead log), for benchmarks.
    `read_only` opens an existing file for reading only (``mode=ro``): nothing is created or
    migrated, writes fail with a `StoreError`, and a file the user may not write can still be read.
    """

    backend = "sqlite"
    driver = "sqlite3"

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
    ) -> None:
        self.path = str(path)
        """The database file."""
        self.read_only = read_only
        """True when opened for reading only."""
        if synchronous not in ("NORMAL", "FULL"):
            raise UsageError(f"synchronous must be 'FULL' (survives power loss) or 'NORMAL' (survives a process "
                             f"crash), got {synchronous!r}")
        self._synchronous = synchronous
        self._busy_ms = int(busy_timeout * 1000)
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextpipe-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._dropped: list[SessionKey] = []  # sessions deleted by the running operation (worker thread only)
        self._vector_cascade = False
        self.commits = 0
        """Write transactions committed by this store."""
        self.durable_commits = 0
        """Write transactions committed with ``synchronous=FULL`` (one fsync of the log each)."""

    @property
    @override
    def server(self) -> str:
        return self.path

    # --- plumbing ----------------------------------------------------------------------------------

    async def _run(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], /, *args: P.args,
                   **kwargs: P.kwargs) -> T:
        """Run ``fn(conn, ...)`` on the store's thread, then the hooks of the expired sessions it met."""
        result, dropped = await self._execute(fn, *args, **kwargs)
        if dropped:
            await self._notify_restarted(dropped)
        return result

    async def _run_deletion(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], /, *args: P.args,
                            **kwargs: P.kwargs) -> T:
        """Like `_run` for `delete_session` and `purge_expired`: a failing hook is the call's error."""
        result, dropped = await self._execute(fn, *args, **kwargs)
        if dropped:
            await self._notify_deleted(dropped)
        return result

    async def _execute(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], /, *args: P.args,
                       **kwargs: P.kwargs) -> tuple[T, list[SessionKey]]:
        if self._closed:
            raise StoreError("the SQLite store is closed", backend=self.backend, server=self.path)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self._call(fn, *args, **kwargs))

    def _call(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], /, *args: P.args,
              **kwargs: P.kwargs) -> tuple[T, list[SessionKey]]:
        self._dropped = []
        return fn(self._connection(), *args, **kwargs), self._dropped

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None and self.read_only:
            self._conn = _open_read_only(self.path, self._busy_ms)
        if self._conn is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            use_wal(conn, self._busy_ms)
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            try:
                self._create_schema(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        with self._transaction(conn, durable=True):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            row = conn.execute("SELECT value FROM cp_meta WHERE key = 'schema_version'").fetchone()
            if row is None or int(row["value"]) < SQLITE_SCHEMA_VERSION:  # tables above are created as needed
                conn.execute("INSERT OR REPLACE INTO cp_meta VALUES ('schema_version', ?)",
                             (str(SQLITE_SCHEMA_VERSION),))
            elif int(row["value"]) > SQLITE_SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer contextpipe (schema {row['value']}, this release knows "
                    f"{SQLITE_SCHEMA_VERSION}); upgrade contextpipe", backend=self.backend, server=self.path,
                )

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection, *, durable: bool) -> Iterator[None]:
        """One ``BEGIN IMMEDIATE`` write transaction, committed durably (FULL) or not (NORMAL)."""
        relaxed = not durable and self._synchronous == "FULL"
        if relaxed:
            conn.execute("PRAGMA synchronous = NORMAL")
        mark = len(self._dropped)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                conn.execute("ROLLBACK")
                del self._dropped[mark:]  # those deletions did not happen
                raise
            conn.execute("COMMIT")
        finally:
            if relaxed:
                conn.execute("PRAGMA synchronous = FULL")
        self.commits += 1
        self.durable_commits += self._synchronous == "FULL" and durable

    def _session_row(self, conn: sqlite3.Connection, key: SessionKey, now: float) -> sqlite3.Row | None:
        """Return the live session row (an expired session is deleted on the spot and reads as absent)."""
        row: sqlite3.Row | None = conn.execute(_SESSION, (key.tenant, key.id)).fetchone()
        if row is not None and row["expires_at"] is not None and row["expires_at"] <= now:
            self._delete(conn, key)
            return None
        return row

    def _row_for_write(self, conn: sqlite3.Connection, key: SessionKey, now: float,
                       lease: Lease | None) -> sqlite3.Row:
        """Return the session's row for a write (created when missing), after the lease check."""
        row = self._session_row(conn, key, now)
        if row is None:
            conn.execute("INSERT INTO cp_sessions (tenant, session_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                         (key.tenant, key.id, now, now))
            row = conn.execute(_SESSION, (key.tenant, key.id)).fetchone()
            assert row is not None
        check_lease(self.backend, key, lease, row["lease_owner"], row["lease_token"], row["lease_expires"], now)
        return row

    async def _write(
        self,
        key: SessionKey,
        lease: Lease | None,
        fn: Callable[Concatenate[sqlite3.Connection, SessionKey, sqlite3.Row, float, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``fn(conn, key, row, now, ...)`` in one durable write transaction, after the lease check."""
        return await self._run(self._write_now, key, lease, True, fn, *args, **kwargs)

    def _write_now(
        self,
        conn: sqlite3.Connection,
        key: SessionKey,
        lease: Lease | None,
        durable: bool,
        fn: Callable[Concatenate[sqlite3.Connection, SessionKey, sqlite3.Row, float, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Do ``fn(conn, key, row, now, ...)`` in one write transaction (on the store's thread)."""
        with self._transaction(conn, durable=durable):
            now = self._clock()
            return fn(conn, key, self._row_for_write(conn, key, now, lease), now, *args, **kwargs)

    @staticmethod
    def _touch(conn: sqlite3.Connection, key: SessionKey, now: float) -> None:
        conn.execute(
            "UPDATE cp_sessions SET updated_at = ?, expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE ? + ttl END "
            "WHERE tenant = ? AND session_id = ?", (now, now, key.tenant, key.id))

    def _delete(self, conn: sqlite3.Connection, key: SessionKey) -> bool:
        """Delete everything of the session (its `on_session_deleted` hooks run after the operation)."""
        k = (key.tenant, key.id)
        conn.execute("DELETE FROM cp_messages WHERE tenant = ? AND session_id = ?", k)
        conn.execute("DELETE FROM cp_checkpoints WHERE tenant = ? AND session_id = ?", k)
        conn.execute("DELETE FROM cp_traces WHERE tenant = ? AND session_id = ?", k)
        existed = conn.execute("DELETE FROM cp_sessions WHERE tenant = ? AND session_id = ?", k).rowcount > 0
        if existed:
            self._dropped.append(key)
        return existed

    # --- session records ---------------------------------------------------------------------------

    @override
    @translated
    async def get_session(self, tenant: str, session_id: str) -> Session | None:
        key = key_of(tenant, session_id)
        row = await self._run(self._get_row, key)
        if row is None or not _is_session(row):
            return None
        state = decode_state(self.backend, key, row["state"])
        return Session(session_id, tenant, state, row["version"], row["created_at"], row["ttl"])

    def _get_row(self, conn: sqlite3.Connection, key: SessionKey) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(_SESSION, (key.tenant, key.id)).fetchone()
        if row is not None and row["expires_at"] is not None and row["expires_at"] <= self._clock():
            with self._transaction(conn, durable=True):
                row = self._session_row(conn, key, self._clock())
        return row

    @override
    @translated
    async def save_session(self, session: Session, *, lease: Lease | None = None) -> None:
        session.version = await self._write(session.key, lease, self._save_state, session, encode_state(session))

    def _save_state(self, conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row, now: float,
                    session: Session, state: str) -> int:
        if row["version"] != session.version:
            raise ConcurrentUpdate.stale(self.backend, key, row["version"], session.version)
        created = session.created_at if row["version"] == 0 else row["created_at"]
        conn.execute(
            "UPDATE cp_sessions SET state = ?, version = version + 1, ttl = ?, created_at = ?, updated_at = ?, "
            "expires_at = ? WHERE tenant = ? AND session_id = ?",
            (state, session.ttl, created, now, None if session.ttl is None else now + session.ttl, key.tenant, key.id))
        return int(row["version"]) + 1

    @override
    @translated
    async def delete_session(self, tenant: str, session_id: str) -> bool:
        return await self._run_deletion(self._delete_durably, key_of(tenant, session_id))

    def _delete_durably(self, conn: sqlite3.Connection, key: SessionKey) -> bool:
        with self._transaction(conn, durable=True):
            return self._delete(conn, key)

    @override
    @translated
    async def list_sessions(self, tenant: str, *, limit: int = 50, cursor: str | None = None) -> SessionListing:
        validate_tenant(tenant)
        check_limit(limit)
        after_time, after_id = decode_cursor(cursor) if cursor is not None else (float("inf"), "")
        rows = await self._run(lambda conn: conn.execute(
            "SELECT session_id, version, last_seq, created_at, updated_at FROM cp_sessions "
            "WHERE tenant = ? AND (expires_at IS NULL OR expires_at > ?) AND (version > 0 OR last_seq > 0) "
            "AND (updated_at < ? OR (updated_at = ? AND session_id > ?)) "
            "ORDER BY updated_at DESC, session_id ASC LIMIT ?",
            (tenant, self._clock(), after_time, after_time, after_id, limit + 1)).fetchall())
        page = rows[:limit]
        infos = [SessionInfo(tenant, r["session_id"], r["version"], r["last_seq"], r["created_at"], r["updated_at"])
                 for r in page]
        next_cursor = encode_cursor(page[-1]["updated_at"], page[-1]["session_id"]) if len(rows) > limit else None
        return SessionListing(infos, next_cursor)

    @override
    @translated
    async def purge_expired(self) -> int:
        return await self._run_deletion(self._purge)

    def _purge(self, conn: sqlite3.Connection) -> int:
        with self._transaction(conn, durable=True):
            rows = conn.execute("SELECT tenant, session_id FROM cp_sessions WHERE expires_at <= ?",
                                (self._clock(),)).fetchall()
            return sum(self._delete(conn, SessionKey(r["tenant"], r["session_id"])) for r in rows)

    # --- message log -------------------------------------------------------------------------------

    @override
    @translated
    async def append(
        self,
        tenant: str,
        session_id: str,
        messages: Sequence[Message],
        *,
        lease: Lease | None = None,
        durable: bool = True,
    ) -> int:
        key = key_of(tenant, session_id)
        encoded = check_batch(key, messages, compact=True)
        return await self._run(self._write_now, key, lease, durable, self._append_rows, encoded)

    @staticmethod
    def _append_rows(conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row, now: float,
                     encoded: list[tuple[str, str]]) -> int:
        last = int(row["last_seq"])
        fresh = encoded
        if last and encoded:
            known = _existing_ids(conn, key, [mid for mid, _ in encoded])
            fresh = [e for e in encoded if e[0] not in known]
        if fresh:
            conn.executemany(
                "INSERT INTO cp_messages (tenant, session_id, seq, message_id, body) VALUES (?, ?, ?, ?, ?)",
                [(key.tenant, key.id, last + i, mid, body) for i, (mid, body) in enumerate(fresh, 1)])
            last += len(fresh)
            conn.execute("UPDATE cp_sessions SET last_seq = ? WHERE tenant = ? AND session_id = ?",
                         (last, key.tenant, key.id))
        SQLiteStore._touch(conn, key, now)
        return last

    @override
    @translated
    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        limit: int | None = None,
        before: int | None = None,
        after: int | None = None,
    ) -> MessagePage:
        key = key_of(tenant, session_id)
        check_limit(limit)
        (end, rows), messages, first = await self._read_joined(self._load_rows, key, limit, before, after)
        if rows is None and messages is not None:
            first = first or max(end, after or 0) + 1
            return MessagePage(messages, first, first > 1)
        if rows is None:  # read row by row: a damaged message is named by its sequence
            end, rows = await self._run(self._load_rows, key, limit, before, after, None)
        return make_page(self.backend, key, end, after, rows or [])

    def _load_rows(self, conn: sqlite3.Connection, key: SessionKey, limit: int | None, before: int | None,
                   after: int | None, sink: _Sink | None) -> tuple[int, _Rows | None]:
        conn.execute("BEGIN")  # one snapshot for the end of the log and its messages
        try:
            row = conn.execute(_LIVE_LAST_SEQ, (key.tenant, key.id, self._clock())).fetchone()
            if row is None:
                return 0, []
            end = int(row["last_seq"]) if before is None else max(0, min(before - 1, int(row["last_seq"])))
            return end, _read_log(conn, key, after or 0, end, limit, sink)
        finally:
            conn.execute("COMMIT")

    @override
    @translated
    async def load_context(
        self, tenant: str, session_id: str, *, limit: int | None = None
    ) -> tuple[Checkpoint | None, MessagePage]:
        key = key_of(tenant, session_id)
        check_limit(limit)
        (body, floor, end, rows), messages, first = await self._read_joined(self._context_rows, key, limit)
        if rows is None and messages is not None:
            first = first or max(end, floor) + 1
            page = MessagePage(messages, first, first > 1)
        else:
            if rows is None:  # read row by row: a damaged message is named by its sequence
                body, floor, end, rows = await self._run(self._context_rows, key, limit, None)
            page = make_page(self.backend, key, end, floor or None, rows or [])
        checkpoint = decode_checkpoint(self.backend, key, body) if body is not None else None
        return checkpoint, page

    def _context_rows(self, conn: sqlite3.Connection, key: SessionKey, limit: int | None, sink: _Sink | None
                      ) -> tuple[str | None, int, int, _Rows | None]:
        conn.execute("BEGIN")  # one snapshot for the checkpoint and the messages
        try:
            row = conn.execute(_LIVE_LAST_SEQ, (key.tenant, key.id, self._clock())).fetchone()
            if row is None:
                return None, 0, 0, []
            ckpt = conn.execute("SELECT seq, body FROM cp_checkpoints WHERE tenant = ? AND session_id = ? "
                                "ORDER BY seq DESC LIMIT 1", (key.tenant, key.id)).fetchone()
            floor = int(ckpt["seq"]) if ckpt else 0
            end = int(row["last_seq"])
            rows = _read_log(conn, key, floor, end, limit, sink)
        finally:
            conn.execute("COMMIT")
        return (str(ckpt["body"]) if ckpt else None), floor, end, rows

    async def _read_joined(self, fn: Callable[..., T], /, *args: Any) -> tuple[T, list[Message] | None, int | None]:
        """Run ``fn(conn, *args, sink)`` on the store's thread, decoding each joined piece as it arrives.

        The read stays one job in one transaction; as the thread finishes a piece, it hands it to
        the event loop, which decodes it while the thread reads the next (SQLite works without the
        interpreter lock). Returns fn's result, the decoded messages (None when a piece could not be
        decoded: the reader was told to stop, and the log must be read row by row) and the first
        piece's sequence. When fn read rows instead (a piece failed its checks on the thread),
        whatever was decoded is to be discarded by the caller.

        Cancelled, the loop stops listening; the thread ends the read after its current piece and
        commits, so the store stays usable.
        """
        if self._closed:
            raise StoreError("the SQLite store is closed", backend=self.backend, server=self.path)
        loop = asyncio.get_running_loop()
        arrived = _Handoff(loop)
        job = loop.run_in_executor(self._executor, lambda: self._call(fn, *args, arrived.put))
        job.add_done_callback(arrived.end)
        messages: list[Message] | None = []
        first: int | None = None
        try:
            while (piece := await arrived.get()) is not None:
                if messages is None:
                    continue
                part = joined_part(piece)
                if part is None:
                    arrived.close()  # the log will be read row by row: the rest of this read is not needed
                    messages = None
                else:
                    first = piece.first_seq if first is None else first
                    messages += part
            result, dropped = await job
        finally:
            arrived.close()
        if dropped:
            await self._notify_restarted(dropped)
        return result, messages, first

    # --- checkpoints -------------------------------------------------------------------------------

    @override
    @translated
    async def save_checkpoint(
        self, tenant: str, session_id: str, checkpoint: Checkpoint, *, lease: Lease | None = None
    ) -> None:
        await self._write(key_of(tenant, session_id), lease, self._save_checkpoint, checkpoint,
                          encode_checkpoint(checkpoint))

    def _save_checkpoint(self, conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row, now: float,
                         checkpoint: Checkpoint, body: str) -> None:
        if not 1 <= checkpoint.seq <= row["last_seq"]:
            raise checkpoint_past_end(self.backend, key, checkpoint.seq, row["last_seq"])
        conn.execute("INSERT OR REPLACE INTO cp_checkpoints (tenant, session_id, seq, body) VALUES (?, ?, ?, ?)",
                     (key.tenant, key.id, checkpoint.seq, body))
        self._touch(conn, key, now)

    @override
    @translated
    async def latest_checkpoint(self, tenant: str, session_id: str) -> Checkpoint | None:
        key = key_of(tenant, session_id)
        row = await self._run(lambda conn: conn.execute(
            "SELECT c.body FROM cp_checkpoints c JOIN cp_sessions s USING (tenant, session_id) "
            "WHERE c.tenant = ? AND c.session_id = ? AND (s.expires_at IS NULL OR s.expires_at > ?) "
            "ORDER BY c.seq DESC LIMIT 1", (key.tenant, key.id, self._clock())).fetchone())
        return None if row is None else decode_checkpoint(self.backend, key, row["body"])

    # --- traces ------------------------------------------------------------------------------------

    @override
    @translated
    async def append_traces(
        self, tenant: str, session_id: str, traces: Sequence[dict[str, Any]], *, lease: Lease | None = None
    ) -> None:
        await self._write(key_of(tenant, session_id), lease, self._append_traces, [encode_trace(t) for t in traces])

    @staticmethod
    def _append_traces(conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row, now: float,
                       bodies: list[str]) -> None:
        last = conn.execute("SELECT COALESCE(MAX(n), 0) AS n FROM cp_traces WHERE tenant = ? AND session_id = ?",
                            (key.tenant, key.id)).fetchone()["n"]
        conn.executemany("INSERT INTO cp_traces (tenant, session_id, n, body) VALUES (?, ?, ?, ?)",
                         [(key.tenant, key.id, last + i, b) for i, b in enumerate(bodies, 1)])

    @override
    @translated
    async def load_traces(self, tenant: str, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        key = key_of(tenant, session_id)
        check_limit(limit)
        rows = await self._run(lambda conn: conn.execute(
            "SELECT t.body FROM cp_traces t JOIN cp_sessions s USING (tenant, session_id) WHERE t.tenant = ? "
            "AND t.session_id = ? AND (s.expires_at IS NULL OR s.expires_at > ?) ORDER BY t.n DESC LIMIT ?",
            (key.tenant, key.id, self._clock(), -1 if limit is None else limit)).fetchall())
        return [decode_trace(self.backend, key, r["body"]) for r in reversed(rows)]

    # --- leases ------------------------------------------------------------------------------------
    # Lease bookkeeping is committed without an fsync: a power loss or OS crash ends every run on this
    # machine, so a lease that did not survive it is held by nobody.

    @override
    @translated
    async def try_acquire_lease(self, tenant: str, session_id: str, owner: str, ttl: float) -> Lease | None:
        return await self._run(self._acquire, key_of(tenant, session_id), owner, ttl)

    def _acquire(self, conn: sqlite3.Connection, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        with self._transaction(conn, durable=False):
            now = self._clock()
            row = self._session_row(conn, key, now)
            if row is None:
                conn.execute("INSERT INTO cp_sessions (tenant, session_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                             (key.tenant, key.id, now, now))
                token = 0
            elif not lease_is_free(row["lease_owner"], row["lease_expires"], now, owner):
                return None
            else:
                token = int(row["lease_token"])
            conn.execute("UPDATE cp_sessions SET lease_owner = ?, lease_token = ?, lease_expires = ? "
                         "WHERE tenant = ? AND session_id = ?", (owner, token + 1, now + ttl, key.tenant, key.id))
            return Lease(key.tenant, key.id, owner, token + 1, now + ttl, ttl)

    @override
    @translated
    async def renew_lease(self, lease: Lease) -> Lease:
        return await self._run(self._renew, lease)

    def _renew(self, conn: sqlite3.Connection, lease: Lease) -> Lease:
        with self._transaction(conn, durable=False):
            expires = self._clock() + lease.ttl
            updated = conn.execute(
                "UPDATE cp_sessions SET lease_expires = ? WHERE tenant = ? AND session_id = ? AND lease_token = ? "
                "AND lease_owner = ?", (expires, lease.tenant, lease.session_id, lease.token, lease.owner)).rowcount
            if not updated:
                raise LeaseLost.taken_over(self.backend, lease.key, lease.token)
            return lease.renewed(expires)

    @override
    @translated
    async def release_lease(self, lease: Lease) -> None:
        await self._run(self._release, lease)

    def _release(self, conn: sqlite3.Connection, lease: Lease) -> None:
        with self._transaction(conn, durable=False):
            conn.execute("UPDATE cp_sessions SET lease_owner = NULL, lease_expires = 0 WHERE tenant = ? "
                         "AND session_id = ? AND lease_token = ? AND lease_owner = ?",
                         (lease.tenant, lease.session_id, lease.token, lease.owner))

    def vectors(self) -> SQLiteVectorStore:
        """Return a vector store in the same database file; deleting a session deletes its memories too.

        The vector store registers for this store's `on_session_deleted` hook (once per store).
        """
        from ..vectors.sqlite import SQLiteVectorStore

        vectors = SQLiteVectorStore(self.path, synchronous=self._synchronous)
        if not self._vector_cascade:
            self._vector_cascade = True
            vectors.forget_sessions_deleted_by(self)
        return vectors

    @override
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=True)


_Rows: TypeAlias = "list[tuple[int, str, str]]"
"""A log read row by row: one ``(seq, message_id, body)`` row per message."""

_Sink: TypeAlias = "Callable[[JoinedRows], bool]"
"""Where a joined read hands each piece (on the store's thread); False when nobody listens any more."""

_FIRST_JOINED_ROWS: Final = 256
"""Messages in the first joined read: small, so that decoding starts at once (each next read is twice as large)."""

_JOINED_ROWS: Final = 4096
"""Largest joined read: few Python objects per message, and a bounded string per read."""

_JOINED: Final = ("SELECT CAST('[' || group_concat(body, ',') || ']' AS BLOB), group_concat(seq - ?), "
                  "group_concat(message_id, char(0)), "
                  "count(*) FROM (SELECT seq, message_id, body FROM cp_messages WHERE tenant = ? AND session_id = ? "
                  "AND seq > ? AND seq <= ? ORDER BY seq)")


class _Handoff:
    """Pieces of a joined read, handed from the store's thread to the event loop as they are read.

    The thread appends under a lock and wakes the loop only when it waits for a piece: a loop busy
    decoding finds the next piece there when it asks, and the thread goes on to its next read
    without giving the interpreter lock to the loop first (a wake-up writes to the loop's socket,
    which would let the loop take the lock, and the thread wait for it until the loop lets go).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pieces: deque[JoinedRows | None] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def put(self, piece: JoinedRows) -> bool:
        """Hand `piece` over (on the store's thread); return False when the loop no longer listens."""
        with self._lock:
            if self._closed:
                return False
            self._pieces.append(piece)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            try:
                self._loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the event loop is closed: nobody is listening
                return False
        return True

    def end(self, job: asyncio.Future[Any]) -> None:
        """Mark the read ended (on the loop, when its job is done; its outcome is taken where it is awaited)."""
        if not job.cancelled():
            job.exception()  # retrieved here too: a cancelled reader no longer awaits the job
        with self._lock:
            self._pieces.append(None)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    def close(self) -> None:
        """Stop listening: the thread ends its read at its next piece."""
        with self._lock:
            self._closed = True

    async def get(self) -> JoinedRows | None:
        """Return the next piece, or None once the read has ended."""
        while True:
            with self._lock:
                if self._pieces:
                    return self._pieces.popleft()
                waiter = self._waiter = self._loop.create_future()
            await waiter


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@functools.lru_cache(maxsize=16)
def _counting(count: int) -> str:
    """``"1,2,...,count"``."""
    return ",".join(map(str, range(1, count + 1)))


def _read_log(conn: sqlite3.Connection, key: SessionKey, after: int, end: int, limit: int | None,
              sink: _Sink | None) -> _Rows | None:
    """Read the messages after `after` up to `end` (the newest `limit` of them), oldest first.

    With a `sink` (the fast way), a few thousand messages come as one value each (`JoinedRows`)
    instead of one row each: far fewer Python objects to make. Each piece goes to `sink` as soon as
    it is read, and None is returned; the first pieces are small, so the reader can start decoding
    at once. Sequences are contiguous, so the range is known; each read is checked to hold exactly
    its sequences, in order (SQLite does not promise the order in which ``group_concat`` sees rows),
    and the log is read row by row (and returned) when one does not or when a read would exceed
    SQLite's largest value. Bodies come as UTF-8 bytes, which the JSON parser reads as they are (no
    text object to make first). When the sink stops listening, the read ends there (None). Without a
    sink, the log is read row by row.
    """
    if sink is None:
        return _message_rows(conn, key, after, end, limit)
    start = after if limit is None else max(after, end - limit)
    cursor = conn.cursor()
    cursor.row_factory = None
    low = start
    size = min(_FIRST_JOINED_ROWS, _JOINED_ROWS)
    while low < end:
        high = min(low + size, end)
        try:
            bodies, seqs, ids, count = cursor.execute(_JOINED, (low, key.tenant, key.id, low, high)).fetchone()
        except sqlite3.DataError:  # too big for one value
            return _message_rows(conn, key, after, end, limit)
        if count != high - low or seqs != _counting(count):  # sequences low + 1, low + 2, ... in order
            return _message_rows(conn, key, after, end, limit)
        if not sink(JoinedRows(low + 1, count, bodies, ids)):
            return None
        low = high
        size = min(size * 2, _JOINED_ROWS)
    return None


def _message_rows(conn: sqlite3.Connection, key: SessionKey, after: int, end: int,
                  limit: int | None) -> list[tuple[int, str, str]]:
    """Return ``(seq, message_id, body)`` after `after` up to `end`, oldest first (the newest `limit` of them)."""
    cursor = conn.cursor()
    cursor.row_factory = None  # plain tuples: a log may have many rows
    where = "FROM cp_messages WHERE tenant = ? AND session_id = ? AND seq > ? AND seq <= ?"
    if limit is None:
        return cursor.execute(f"SELECT seq, message_id, body {where} ORDER BY seq",
                              (key.tenant, key.id, after, end)).fetchall()
    rows: list[tuple[int, str, str]] = cursor.execute(f"SELECT seq, message_id, body {where} ORDER BY seq DESC LIMIT ?",
                                                      (key.tenant, key.id, after, end, limit)).fetchall()
    rows.reverse()
    return rows


def _existing_ids(conn: sqlite3.Connection, key: SessionKey, ids: list[str]) -> set[str]:
    known: set[str] = set()
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ",".join("?" * len(chunk))
        known.update(r["message_id"] for r in conn.execute(
            f"SELECT message_id FROM cp_messages WHERE tenant = ? AND session_id = ? AND message_id IN ({marks})",
            (key.tenant, key.id, *chunk)))
    return known


def _open_read_only(path: str, busy_ms: int) -> sqlite3.Connection:
    """Open an existing database for reading only, checking that it is a contextpipe database.

    A WAL database in a folder the user cannot write cannot get its shared-memory file; when no
    write-ahead log is pending, the main file holds everything, so it is read as immutable.
    """
    target = f"file:{quote(str(Path(path).resolve()))}"
    conn = sqlite3.connect(f"{target}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        conn.row_factory = sqlite3.Row  # rows read by name or position, like the writer's
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.OperationalError as exc:
            wal = Path(f"{path}-wal")
            if wal.exists() and wal.stat().st_size > 0:
                raise StoreError(f"{path} cannot be read: its write-ahead log holds recent writes, which SQLite can "
                                 f"only read with write access to the folder ({exc})", backend="sqlite") from exc
            conn.close()
            conn = sqlite3.connect(f"{target}?mode=ro&immutable=1", uri=True, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "cp_meta" not in tables:
            raise StoreError(f"{path} is not a contextpipe session database", backend="sqlite")
        row = conn.execute("SELECT value FROM cp_meta WHERE key = 'schema_version'").fetchone()
        if row is not None and not str(row[0]).isdigit():
            raise StoreError(f"{path}: unreadable schema version {row[0]!r}", backend="sqlite")
        if row is not None and int(row[0]) > SQLITE_SCHEMA_VERSION:
            raise StoreError(f"{path} was written by a newer contextpipe (schema {row[0]}, this release knows "
                             f"{SQLITE_SCHEMA_VERSION}); upgrade contextpipe", backend="sqlite")
    except BaseException:
        conn.close()
        raise
    return conn
