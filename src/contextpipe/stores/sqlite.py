"""`SQLiteStore`: the embedded default session store, one SQLite file (WAL), safe for several processes.

Every operation runs in one worker thread that owns the connection, so the event loop never blocks
on disk. Writes use ``BEGIN IMMEDIATE`` transactions: the check (lease, version, existing ids) and
the write happen atomically, also against other processes using the same file.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar
from urllib.parse import quote

from typing_extensions import override

from ..errors import StoreError
from ..messages import Message, dumps
from ..session import Session
from ._common import (
    SCHEMA_VERSION,
    busy,
    check_key,
    check_limit,
    checkpoint_past_end,
    concurrent_update,
    decode_checkpoint,
    decode_cursor,
    decode_state,
    decode_trace,
    duplicate_in_batch,
    encode_checkpoint,
    encode_cursor,
    encode_state,
    encode_trace,
    lease_lost,
    make_page,
)
from .base import Checkpoint, Lease, MessagePage, SessionInfo, SessionListing, SessionStore

__all__ = ["SQLiteStore"]

if TYPE_CHECKING:
    from ..vectors.stores import SQLiteVectorStore

T = TypeVar("T")

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

_ROW: Final = ("SELECT version, last_seq, lease_owner, lease_token, lease_expires, expires_at, state, created_at, ttl "
               "FROM cp_sessions WHERE tenant = ? AND session_id = ?")


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

    `synchronous` is SQLite's durability setting: ``NORMAL`` (the default) keeps every committed
    write through a process crash or kill; ``FULL`` also through a power loss, at the cost of an
    fsync per write. `busy_timeout` is how long a write waits for another process's transaction.
    `read_only` opens an existing file for reading only (``mode=ro``): nothing is created or
    migrated, writes fail with a `StoreError`, and a file the user may not write can still be read.
    """

    backend = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 30.0,
        read_only: bool = False,
    ) -> None:
        self.path = str(path)
        """The database file."""
        self.read_only = read_only
        """True when opened for reading only."""
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self._synchronous = synchronous
        self._busy_ms = int(busy_timeout * 1000)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextpipe-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    # --- plumbing ----------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError("the SQLite store is closed", backend=self.backend)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._call, fn, args)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite error on {self.path}: {exc}", backend=self.backend) from exc

    def _call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        return fn(self._connection(), *args)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None and self.read_only:
            self._conn = _open_read_only(self.path, self._busy_ms)
        if self._conn is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                row = conn.execute("SELECT value FROM cp_meta WHERE key = 'schema_version'").fetchone()
                if row is None or int(row[0]) < SCHEMA_VERSION:  # tables above are created as needed
                    conn.execute("INSERT OR REPLACE INTO cp_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                elif int(row[0]) > SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path} was written by a newer contextpipe (schema {row[0]}, this release knows "
                        f"{SCHEMA_VERSION}); upgrade contextpipe", backend=self.backend,
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                conn.close()
                raise
            self._conn = conn
        return self._conn

    @staticmethod
    def _tx(conn: sqlite3.Connection, body: Callable[[], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def _row(self, conn: sqlite3.Connection, tenant: str, session_id: str, now: float) -> tuple[Any, ...] | None:
        """Return the live session row (an expired session is deleted on the spot and reads as absent)."""
        row: tuple[Any, ...] | None = conn.execute(_ROW, (tenant, session_id)).fetchone()
        if row is not None and row[5] is not None and row[5] <= now:
            self._delete(conn, tenant, session_id)
            return None
        return row

    def _row_for_write(self, conn: sqlite3.Connection, tenant: str, session_id: str, now: float,
                       lease: Lease | None) -> tuple[Any, ...]:
        row = self._row(conn, tenant, session_id, now)
        if row is None:
            conn.execute("INSERT INTO cp_sessions (tenant, session_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                         (tenant, session_id, now, now))
            row = (0, 0, None, 0, 0.0, None, "{}", now, None)
        owner, token, expires = row[2], row[3], row[4]
        if lease is not None:
            if lease.token != token or lease.owner != owner:
                raise lease_lost(self.backend, lease, token)
        elif owner is not None and expires > now:
            raise busy(self.backend, tenant, session_id)
        return row

    @staticmethod
    def _touch(conn: sqlite3.Connection, tenant: str, session_id: str, now: float) -> None:
        conn.execute(
            "UPDATE cp_sessions SET updated_at = ?, expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE ? + ttl END "
            "WHERE tenant = ? AND session_id = ?", (now, now, tenant, session_id))

    @staticmethod
    def _delete(conn: sqlite3.Connection, tenant: str, session_id: str) -> bool:
        key = (tenant, session_id)
        conn.execute("DELETE FROM cp_messages WHERE tenant = ? AND session_id = ?", key)
        conn.execute("DELETE FROM cp_checkpoints WHERE tenant = ? AND session_id = ?", key)
        conn.execute("DELETE FROM cp_traces WHERE tenant = ? AND session_id = ?", key)
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'cp_vectors'").fetchone():
            # Memories recorded for the session (SemanticMemory through SQLiteStore.vectors()) go too.
            gone = conn.execute("DELETE FROM cp_vectors WHERE json_extract(metadata, '$.tenant') = ? "
                                "AND json_extract(metadata, '$.session_id') = ?", key).rowcount
            if gone:
                conn.execute("UPDATE cp_vector_versions SET version = version + 1")
        return conn.execute("DELETE FROM cp_sessions WHERE tenant = ? AND session_id = ?", key).rowcount > 0

    # --- session records ---------------------------------------------------------------------------

    @override
    async def get_session(self, tenant: str, session_id: str) -> Session | None:
        check_key(tenant, session_id)

        def op(conn: sqlite3.Connection) -> Session | None:
            row = conn.execute(_ROW, (tenant, session_id)).fetchone()
            if row is not None and row[5] is not None and row[5] <= time.time():
                row = self._tx(conn, lambda: self._row(conn, tenant, session_id, time.time()))
            if row is None or (row[0] == 0 and row[1] == 0):  # only a lease: not a session yet
                return None
            state = decode_state(self.backend, tenant, session_id, row[6])
            return Session(session_id, tenant, state, row[0], row[7], row[8])

        return await self._run(op)

    @override
    async def save_session(self, session: Session, *, lease: Lease | None = None) -> None:
        check_key(session.tenant, session.id)
        state = encode_state(session)

        def op(conn: sqlite3.Connection) -> int:
            def body() -> int:
                now = time.time()
                row = self._row_for_write(conn, session.tenant, session.id, now, lease)
                if row[0] != session.version:
                    raise concurrent_update(self.backend, session.tenant, session.id, row[0], session.version)
                created = session.created_at if row[0] == 0 else row[7]
                conn.execute(
                    "UPDATE cp_sessions SET state = ?, version = version + 1, ttl = ?, created_at = ?, updated_at = ?, "
                    "expires_at = ? WHERE tenant = ? AND session_id = ?",
                    (state, session.ttl, created, now, None if session.ttl is None else now + session.ttl,
                     session.tenant, session.id))
                return int(row[0]) + 1

            return self._tx(conn, body)

        session.version = await self._run(op)

    @override
    async def delete_session(self, tenant: str, session_id: str) -> bool:
        check_key(tenant, session_id)
        return await self._run(lambda conn: self._tx(conn, lambda: self._delete(conn, tenant, session_id)))

    @override
    async def list_sessions(self, tenant: str, *, limit: int = 50, cursor: str | None = None) -> SessionListing:
        check_limit(limit)
        after_time, after_id = decode_cursor(cursor) if cursor is not None else (float("inf"), "")

        def op(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT s.session_id, s.version, s.last_seq, s.created_at, s.updated_at FROM cp_sessions s "
                "WHERE s.tenant = ? AND (s.expires_at IS NULL OR s.expires_at > ?) "
                "AND (s.version > 0 OR s.last_seq > 0) "
                "AND (s.updated_at < ? OR (s.updated_at = ? AND s.session_id > ?)) "
                "ORDER BY s.updated_at DESC, s.session_id ASC LIMIT ?",
                (tenant, time.time(), after_time, after_time, after_id, limit + 1)).fetchall()

        rows = await self._run(op)
        page = rows[:limit]
        infos = [SessionInfo(tenant, r[0], r[1], r[2], r[3], r[4]) for r in page]
        next_cursor = encode_cursor(page[-1][4], page[-1][0]) if len(rows) > limit else None
        return SessionListing(infos, next_cursor)

    @override
    async def purge_expired(self) -> int:
        def op(conn: sqlite3.Connection) -> int:
            def body() -> int:
                rows = conn.execute("SELECT tenant, session_id FROM cp_sessions WHERE expires_at <= ?",
                                    (time.time(),)).fetchall()
                return sum(self._delete(conn, t, s) for t, s in rows)

            return self._tx(conn, body)

        return await self._run(op)

    # --- message log -------------------------------------------------------------------------------

    @override
    async def append(
        self, tenant: str, session_id: str, messages: Sequence[Message], *, lease: Lease | None = None
    ) -> int:
        check_key(tenant, session_id)
        encoded = [(m.id, dumps(m)) for m in messages]
        if len({mid for mid, _ in encoded}) != len(encoded):
            raise duplicate_in_batch(session_id)

        def op(conn: sqlite3.Connection) -> int:
            def body() -> int:
                now = time.time()
                row = self._row_for_write(conn, tenant, session_id, now, lease)
                last = int(row[1])
                fresh = encoded
                if last and encoded:
                    known = _existing_ids(conn, tenant, session_id, [mid for mid, _ in encoded])
                    fresh = [e for e in encoded if e[0] not in known]
                if fresh:
                    conn.executemany(
                        "INSERT INTO cp_messages (tenant, session_id, seq, message_id, body) VALUES (?, ?, ?, ?, ?)",
                        [(tenant, session_id, last + i, mid, body) for i, (mid, body) in enumerate(fresh, 1)])
                    last += len(fresh)
                    conn.execute("UPDATE cp_sessions SET last_seq = ? WHERE tenant = ? AND session_id = ?",
                                 (last, tenant, session_id))
                self._touch(conn, tenant, session_id, now)
                return last

            return self._tx(conn, body)

        return await self._run(op)

    @override
    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        limit: int | None = None,
        before: int | None = None,
        after: int | None = None,
    ) -> MessagePage:
        check_key(tenant, session_id)
        check_limit(limit)

        def op(conn: sqlite3.Connection) -> tuple[int, list[tuple[int, str, str]]]:
            row = conn.execute(
                "SELECT last_seq FROM cp_sessions WHERE tenant = ? AND session_id = ? "
                "AND (expires_at IS NULL OR expires_at > ?)", (tenant, session_id, time.time())).fetchone()
            if row is None:
                return 0, []
            end = int(row[0]) if before is None else max(0, min(before - 1, int(row[0])))
            floor = 0 if after is None else after
            rows = conn.execute(
                "SELECT seq, message_id, body FROM cp_messages WHERE tenant = ? AND session_id = ? "
                "AND seq > ? AND seq <= ? ORDER BY seq DESC LIMIT ?",
                (tenant, session_id, floor, end, -1 if limit is None else limit)).fetchall()
            rows.reverse()
            return end, rows

        end, rows = await self._run(op)
        return make_page(self.backend, tenant, session_id, end, after, rows)

    @override
    async def load_context(
        self, tenant: str, session_id: str, *, limit: int | None = None
    ) -> tuple[Checkpoint | None, MessagePage]:
        check_key(tenant, session_id)
        check_limit(limit)

        def op(conn: sqlite3.Connection) -> tuple[str | None, int, int, list[tuple[int, str, str]]]:
            conn.execute("BEGIN")  # one snapshot for the checkpoint and the messages
            try:
                row = conn.execute(
                    "SELECT last_seq FROM cp_sessions WHERE tenant = ? AND session_id = ? "
                    "AND (expires_at IS NULL OR expires_at > ?)", (tenant, session_id, time.time())).fetchone()
                if row is None:
                    return None, 0, 0, []
                ckpt = conn.execute("SELECT seq, body FROM cp_checkpoints WHERE tenant = ? AND session_id = ? "
                                    "ORDER BY seq DESC LIMIT 1", (tenant, session_id)).fetchone()
                floor = int(ckpt[0]) if ckpt else 0
                rows = conn.execute(
                    "SELECT seq, message_id, body FROM cp_messages WHERE tenant = ? AND session_id = ? "
                    "AND seq > ? ORDER BY seq DESC LIMIT ?",
                    (tenant, session_id, floor, -1 if limit is None else limit)).fetchall()
            finally:
                conn.execute("COMMIT")
            rows.reverse()
            return (str(ckpt[1]) if ckpt else None), floor, int(row[0]), rows

        body, floor, end, rows = await self._run(op)
        checkpoint = decode_checkpoint(self.backend, tenant, session_id, body) if body is not None else None
        return checkpoint, make_page(self.backend, tenant, session_id, end, floor or None, rows)

    # --- checkpoints -------------------------------------------------------------------------------

    @override
    async def save_checkpoint(
        self, tenant: str, session_id: str, checkpoint: Checkpoint, *, lease: Lease | None = None
    ) -> None:
        check_key(tenant, session_id)
        body_text = encode_checkpoint(checkpoint)

        def op(conn: sqlite3.Connection) -> None:
            def body() -> None:
                now = time.time()
                row = self._row_for_write(conn, tenant, session_id, now, lease)
                if not 1 <= checkpoint.seq <= row[1]:
                    raise checkpoint_past_end(self.backend, tenant, session_id, checkpoint.seq, row[1])
                conn.execute(
                    "INSERT OR REPLACE INTO cp_checkpoints (tenant, session_id, seq, body) VALUES (?, ?, ?, ?)",
                    (tenant, session_id, checkpoint.seq, body_text))
                self._touch(conn, tenant, session_id, now)

            self._tx(conn, body)

        await self._run(op)

    @override
    async def latest_checkpoint(self, tenant: str, session_id: str) -> Checkpoint | None:
        check_key(tenant, session_id)

        def op(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT c.body FROM cp_checkpoints c JOIN cp_sessions s USING (tenant, session_id) "
                "WHERE c.tenant = ? AND c.session_id = ? AND (s.expires_at IS NULL OR s.expires_at > ?) "
                "ORDER BY c.seq DESC LIMIT 1", (tenant, session_id, time.time())).fetchone()
            return None if row is None else str(row[0])

        text = await self._run(op)
        return None if text is None else decode_checkpoint(self.backend, tenant, session_id, text)

    # --- traces ------------------------------------------------------------------------------------

    @override
    async def append_traces(
        self, tenant: str, session_id: str, traces: Sequence[dict[str, Any]], *, lease: Lease | None = None
    ) -> None:
        check_key(tenant, session_id)
        bodies = [encode_trace(t) for t in traces]

        def op(conn: sqlite3.Connection) -> None:
            def body() -> None:
                self._row_for_write(conn, tenant, session_id, time.time(), lease)
                last = conn.execute("SELECT COALESCE(MAX(n), 0) FROM cp_traces WHERE tenant = ? AND session_id = ?",
                                    (tenant, session_id)).fetchone()[0]
                conn.executemany("INSERT INTO cp_traces (tenant, session_id, n, body) VALUES (?, ?, ?, ?)",
                                 [(tenant, session_id, last + i, b) for i, b in enumerate(bodies, 1)])

            self._tx(conn, body)

        await self._run(op)

    @override
    async def load_traces(self, tenant: str, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        check_key(tenant, session_id)
        check_limit(limit)

        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT t.body FROM cp_traces t JOIN cp_sessions s USING (tenant, session_id) WHERE t.tenant = ? "
                "AND t.session_id = ? AND (s.expires_at IS NULL OR s.expires_at > ?) ORDER BY t.n DESC LIMIT ?",
                (tenant, session_id, time.time(), -1 if limit is None else limit)).fetchall()
            return [str(r[0]) for r in reversed(rows)]

        return [decode_trace(self.backend, tenant, session_id, b) for b in await self._run(op)]

    # --- leases ------------------------------------------------------------------------------------

    @override
    async def try_acquire_lease(self, tenant: str, session_id: str, owner: str, ttl: float) -> Lease | None:
        check_key(tenant, session_id)

        def op(conn: sqlite3.Connection) -> Lease | None:
            def body() -> Lease | None:
                now = time.time()
                row = self._row(conn, tenant, session_id, now)
                if row is None:
                    conn.execute(
                        "INSERT INTO cp_sessions (tenant, session_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                        (tenant, session_id, now, now))
                    token = 0
                else:
                    if row[2] is not None and row[4] > now and row[2] != owner:
                        return None
                    token = int(row[3])
                conn.execute(
                    "UPDATE cp_sessions SET lease_owner = ?, lease_token = ?, lease_expires = ? "
                    "WHERE tenant = ? AND session_id = ?", (owner, token + 1, now + ttl, tenant, session_id))
                return Lease(tenant, session_id, owner, token + 1, now + ttl, ttl)

            return self._tx(conn, body)

        return await self._run(op)

    @override
    async def renew_lease(self, lease: Lease) -> Lease:
        def op(conn: sqlite3.Connection) -> Lease:
            expires = time.time() + lease.ttl
            updated = conn.execute(
                "UPDATE cp_sessions SET lease_expires = ? WHERE tenant = ? AND session_id = ? AND lease_token = ? "
                "AND lease_owner = ?", (expires, lease.tenant, lease.session_id, lease.token, lease.owner)).rowcount
            if not updated:
                raise lease_lost(self.backend, lease, None)
            return Lease(lease.tenant, lease.session_id, lease.owner, lease.token, expires, lease.ttl)

        return await self._run(op)

    @override
    async def release_lease(self, lease: Lease) -> None:
        await self._run(lambda conn: conn.execute(
            "UPDATE cp_sessions SET lease_owner = NULL, lease_expires = 0 WHERE tenant = ? AND session_id = ? "
            "AND lease_token = ? AND lease_owner = ?", (lease.tenant, lease.session_id, lease.token, lease.owner)))

    def vectors(self) -> SQLiteVectorStore:
        """Return a vector store in the same database file (deleting a session deletes its memories too)."""
        from ..vectors.stores import SQLiteVectorStore

        return SQLiteVectorStore(self.path, synchronous=self._synchronous)

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


def _existing_ids(conn: sqlite3.Connection, tenant: str, session_id: str, ids: list[str]) -> set[str]:
    known: set[str] = set()
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ",".join("?" * len(chunk))
        known.update(r[0] for r in conn.execute(
            f"SELECT message_id FROM cp_messages WHERE tenant = ? AND session_id = ? AND message_id IN ({marks})",
            (tenant, session_id, *chunk)))
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
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise StoreError(f"{path} was written by a newer contextpipe (schema {row[0]}, this release knows "
                             f"{SCHEMA_VERSION}); upgrade contextpipe", backend="sqlite")
    except BaseException:
        conn.close()
        raise
    return conn
