"""`PostgresStore`: sessions in PostgreSQL, for many workers on many machines.

Uses the async driver `asyncpg` with a connection pool (given, or created from a DSN on first use).
The schema is created or migrated on first use, under an advisory lock so that many workers
starting together do it once; its version is kept in ``<prefix>schema``. Every write runs in one
transaction that locks the session's row, so the checks (lease, version, existing ids) and the
write are atomic. Lease expiry uses the database's clock, not the workers'.

A server that stops answering (a network partition, a hung host) never hangs a run: connecting,
each command and closing have timeouts, connections use TCP keepalives, and a connection whose
command timed out or was cancelled is dropped at once (the server rolls its transaction back), so
cancellation returns promptly. The error is a `StoreError` naming the server.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from .._compat import override
from ..errors import ConcurrentUpdate, ContextPipeError, StoreError, UsageError, shorten
from ..messages import Message
from ..outbox import OutboxEntry, outbox_rows
from ..session import Session, SessionKey
from . import _artifacts as artifacts
from . import _common as common
from . import _copy as copy
from . import _outbox as outbox
from . import _queue as queue
from . import _rows as row_codec
from .base import Checkpoint, Erased, Lease, MessagePage, SessionInfo, SessionStore

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresStore"]

_NOW: Final = "extract(epoch from clock_timestamp())::float8"
_RESTARTED: ContextVar[list[SessionKey] | None] = ContextVar("contextpipe_pg_restarted", default=None)
"""Expired sessions the running transaction met and started afresh (their hooks run after it commits)."""
_PREFIX_RE: Final = re.compile(r"[a-z_][a-z0-9_]{0,30}")
_LOCK_KEY: Final = 0x636F6E74  # advisory lock id for schema migrations ("cont")
_ROW: Final = "version, last_seq, lease_owner, lease_token, lease_expires, expires_at, created_at"
_EXPIRY_AFTER_WRITE: Final = (f"CASE WHEN ttl IS NULL THEN NULL ELSE GREATEST({_NOW} + ttl, "
                              "CASE WHEN lease_owner IS NULL THEN NULL ELSE lease_expires END) END")
"""A session's expiry after a write: its TTL from now, never before the lease it holds."""


def _migrations(p: str) -> list[list[str]]:
    """Return the schema steps by version: index 0 brings an empty database to version 1, and so on."""
    return [[
        f"""CREATE TABLE {p}sessions (
            tenant TEXT NOT NULL, session_id TEXT NOT NULL, state TEXT NOT NULL DEFAULT '{{}}',
            version BIGINT NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL, ttl DOUBLE PRECISION, expires_at DOUBLE PRECISION,
            last_seq BIGINT NOT NULL DEFAULT 0, lease_owner TEXT, lease_token BIGINT NOT NULL DEFAULT 0,
            lease_expires DOUBLE PRECISION NOT NULL DEFAULT 0, PRIMARY KEY (tenant, session_id))""",
        f"CREATE INDEX {p}sessions_recent ON {p}sessions (tenant, updated_at DESC, session_id)",
        f"CREATE INDEX {p}sessions_expiry ON {p}sessions (expires_at) WHERE expires_at IS NOT NULL",
        f"""CREATE TABLE {p}messages (
            tenant TEXT NOT NULL, session_id TEXT NOT NULL, seq BIGINT NOT NULL, message_id TEXT NOT NULL,
            body TEXT NOT NULL, PRIMARY KEY (tenant, session_id, seq))""",
        f"CREATE UNIQUE INDEX {p}messages_id ON {p}messages (tenant, session_id, message_id)",
        f"""CREATE TABLE {p}checkpoints (
            tenant TEXT NOT NULL, session_id TEXT NOT NULL, seq BIGINT NOT NULL, body TEXT NOT NULL,
            PRIMARY KEY (tenant, session_id, seq))""",
    ], [
        f"""CREATE TABLE {p}traces (
            tenant TEXT NOT NULL, session_id TEXT NOT NULL, n BIGINT NOT NULL, body TEXT NOT NULL,
            PRIMARY KEY (tenant, session_id, n))""",
    ], outbox.postgres_migration(p), queue.postgres_migration(p), artifacts.postgres_migration(p)]


class PostgresStore(SessionStore):
    """Sessions in PostgreSQL.

    Give a DSN (``postgresql://user:pass@host:5432/db``) or an existing ``asyncpg`` pool (then the
    store does not close it). Tables are named ``<prefix>sessions``, ``<prefix>messages``,
    ``<prefix>checkpoints``, ``<prefix>traces``, ``<prefix>outbox`` and ``<prefix>schema``.

    `connect_timeout` bounds opening a connection (and waiting for a free one in the pool),
    `command_timeout` each command, `close_timeout` closing the pool; past them the call raises a
    `StoreError` naming the server, and saying whether the server did not answer or every pooled
    connection stayed busy. The store's own pool has the server stop a statement at 0.9x
    `command_timeout` (a wait for a lock at 0.8x), so that a statement that is slow or blocked fails
    with the server's reason (a pooler such as PgBouncer, or a server, that refuses these settings
    gets connections without them). Errors the driver reports carry its own text. `keepalive` (seconds of
    silence before TCP keepalive probes) lets the OS notice a dead peer on idle connections.
    """

    backend = "postgres"
    driver = "asyncpg"
    keeps_outbox = True

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        prefix: str = "contextpipe_",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        command_timeout: float = 10.0,
        close_timeout: float = 5.0,
        keepalive: int = 30,
    ) -> None:
        if (dsn is None) == (pool is None):
            raise UsageError("PostgresStore needs exactly one of dsn=... or pool=...")
        if not _PREFIX_RE.fullmatch(prefix):
            raise UsageError(f"invalid table prefix {shorten(prefix)}: use lowercase letters, digits and '_'")
        for name, value in (("connect_timeout", connect_timeout), ("command_timeout", command_timeout),
                            ("close_timeout", close_timeout), ("keepalive", keepalive)):
            if value <= 0:
                raise UsageError(f"{name} must be positive, got {value}")
        self._dsn = dsn
        self._pool = pool
        self._owns_pool = pool is None
        self._sizes = (min_size, max_size)
        self._p = prefix
        self._ready = False
        self._connect_timeout = connect_timeout
        self.answer_timeout = command_timeout
        self._close_timeout = close_timeout
        self._keepalive = keepalive
        self._server = _address(dsn) if dsn is not None else "the given pool's server"

    @property
    @override
    def server(self) -> str:
        return self._server

    # --- plumbing ----------------------------------------------------------------------------------

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            asyncpg = _import_asyncpg()
            try:
                timeouts = self._server_timeouts()
                try:
                    self._pool = await self._create_pool(asyncpg, timeouts)
                except asyncpg.PostgresError as exc:
                    # PgBouncer says "unsupported startup parameter: statement_timeout" (a
                    # ProtocolViolationError), a server "unrecognized configuration parameter ...":
                    # only a refusal naming one of these settings is retried, a DSN's own bad setting
                    # is reported as the server said it. The client's command_timeout still bounds
                    # every call made without them.
                    if not any(name in str(exc) for name in timeouts):
                        raise
                    self._pool = await self._create_pool(asyncpg, {})
            except TimeoutError as exc:
                raise StoreError.unreachable(self.backend, self._server, self._connect_timeout, "connecting") from exc
            except (OSError, asyncpg.PostgresError) as exc:
                raise StoreError(f"cannot connect to PostgreSQL at {self._server}: {exc}", backend=self.backend,
                                 server=self._server) from exc
        if not self._ready:
            await self._migrate(self._pool)
            self._ready = True
        return self._pool

    async def _create_pool(self, asyncpg: Any, server_settings: dict[str, str]) -> asyncpg.Pool:
        """Open a pool and one connection in it, so that a refused setting shows here even with min_size=0."""
        pool: asyncpg.Pool = await asyncpg.create_pool(
            self._dsn, min_size=self._sizes[0], max_size=self._sizes[1], timeout=self._connect_timeout,
            command_timeout=self.answer_timeout, init=self._init_connection, server_settings=server_settings)
        if self._sizes[0] == 0:
            try:
                async with pool.acquire(timeout=self._connect_timeout):
                    pass
            except BaseException:
                pool.terminate()
                raise
        return pool

    def _server_timeouts(self) -> dict[str, str]:
        """Have the server stop a statement, or its wait for a lock, a little before the client gives up on it.

        The error then says why, in the server's own words ("canceling statement due to lock
        timeout": another transaction held the session's row), over a connection that still works,
        instead of "did not answer", which only a silent server (a partition, a hung host) deserves.
        """
        assert self.answer_timeout is not None
        return {"statement_timeout": str(max(1, int(self.answer_timeout * 900))),
                "lock_timeout": str(max(1, int(self.answer_timeout * 800)))}

    async def _init_connection(self, conn: asyncpg.Connection) -> None:
        """Turn TCP keepalives on for a new connection, so the OS notices a peer that went away."""
        transport: Any = getattr(conn, "_transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", self._keepalive), ("TCP_KEEPINTVL", max(1, self._keepalive // 3)),
                              ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)

    @asynccontextmanager
    async def _connection(self, pool: asyncpg.Pool | None = None) -> AsyncIterator[asyncpg.Connection]:
        """Lend a pooled connection; one that failed, timed out or was cancelled mid-command is dropped."""
        if pool is None:
            pool = await self._get_pool()
        try:
            conn = await pool.acquire(timeout=self._connect_timeout)
        except TimeoutError as exc:
            if pool.get_size() >= pool.get_max_size() and pool.get_idle_size() == 0:  # the server is not to blame
                raise StoreError(f"{self.backend} store ({self._server}): all {pool.get_max_size()} pooled "
                                 f"connections stayed busy for {self._connect_timeout:g} s; pass a larger max_size "
                                 "(or connect_timeout), or make fewer calls at once",
                                 backend=self.backend, server=self._server) from exc
            raise StoreError.unreachable(self.backend, self._server, self._connect_timeout,
                                         "connecting") from exc
        healthy = False
        try:
            yield conn
            healthy = True
        except ContextPipeError:
            healthy = True
            raise
        finally:
            if not healthy:
                conn.terminate()  # no goodbye over a link that may be dead; the server rolls back
            await pool.release(conn, timeout=self._close_timeout)

    @asynccontextmanager
    async def _transaction(self, *, readonly: bool = False, pool: asyncpg.Pool | None = None
                           ) -> AsyncIterator[asyncpg.Connection]:
        """Run one transaction; rolled back on contextpipe's own errors, dropped with the connection otherwise."""
        restarted: list[SessionKey] = []
        token = _RESTARTED.set(restarted)
        try:
            async with self._connection(pool) as conn:
                await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if readonly else "BEGIN")
                try:
                    yield conn
                except ContextPipeError:
                    await conn.execute("ROLLBACK")
                    raise
                await conn.execute("COMMIT")
        finally:
            _RESTARTED.reset(token)
        if restarted:
            await self._notify_restarted(restarted)

    async def _migrate(self, pool: asyncpg.Pool) -> None:
        p = self._p
        async with self._transaction(pool=pool) as conn:
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute(f"CREATE TABLE IF NOT EXISTS {p}schema (id INT PRIMARY KEY CHECK (id = 1), "
                               "version INT NOT NULL)")
            current = await conn.fetchval(f"SELECT version FROM {p}schema WHERE id = 1") or 0
            if current > common.SCHEMA_VERSION:
                raise StoreError(f"the database holds contextpipe schema {current}, newer than this release's "
                                 f"{common.SCHEMA_VERSION}; upgrade contextpipe",
                                 backend=self.backend, server=self._server)
            for version, steps in enumerate(_migrations(p), start=1):
                if version <= current:
                    continue
                for step in steps:
                    await conn.execute(step)
                await conn.execute(f"INSERT INTO {p}schema (id, version) VALUES (1, $1) "
                                   "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version", version)

    async def _locked_row(self, conn: asyncpg.Connection, key: SessionKey, lease: Lease | None, *,
                          check: bool = True) -> asyncpg.Record:
        """Return the session's row, created if missing, locked for this transaction, with ``now``."""
        p = self._p
        row = await conn.fetchrow(
            f"INSERT INTO {p}sessions (tenant, session_id, created_at, updated_at) VALUES ($1, $2, {_NOW}, {_NOW}) "
            f"ON CONFLICT (tenant, session_id) DO UPDATE SET tenant = EXCLUDED.tenant "
            f"RETURNING {_ROW}, {_NOW} AS now", key.tenant, key.id)
        assert row is not None
        held = row["lease_owner"] is not None and row["lease_expires"] > row["now"]  # never expires under a live lease
        if row["expires_at"] is not None and row["expires_at"] <= row["now"] and not held:
            await self._delete_rows(conn, key, keep_row=True)
            restarted = _RESTARTED.get()
            if restarted is not None:  # the transaction runs the deletion hooks once it has committed
                restarted.append(key)
            row = await conn.fetchrow(f"SELECT {_ROW}, {_NOW} AS now FROM {p}sessions WHERE tenant = $1 "
                                      "AND session_id = $2", key.tenant, key.id)
            assert row is not None
        if check:
            common.check_lease(self.backend, key, lease, row["lease_owner"], row["lease_token"], row["lease_expires"],
                        row["now"])
        return row

    async def _delete_rows(self, conn: asyncpg.Connection, key: SessionKey, *,
                           keep_row: bool = False) -> Erased | None:
        p = self._p
        if not keep_row:  # wait for a write holding the row: the DELETEs below then see what it committed
            await conn.execute(f"SELECT 1 FROM {p}sessions WHERE tenant = $1 AND session_id = $2 FOR UPDATE",
                               key.tenant, key.id)
        counts = [int(str(await conn.execute(f"DELETE FROM {p}{table} WHERE tenant = $1 AND session_id = $2",
                                             key.tenant, key.id)).split()[-1])
                  for table in ("messages", "checkpoints", "traces", "artifacts", "outbox", "queue")]
        if keep_row:
            status = await conn.execute(
                f"UPDATE {p}sessions SET state = '{{}}', version = 0, ttl = NULL, expires_at = NULL, last_seq = 0, "
                f"lease_owner = NULL, lease_expires = 0, created_at = {_NOW}, updated_at = {_NOW} "
                "WHERE tenant = $1 AND session_id = $2", key.tenant, key.id)
        else:
            status = await conn.execute(f"DELETE FROM {p}sessions WHERE tenant = $1 AND session_id = $2",
                                        key.tenant, key.id)
        return None if str(status).split()[-1] == "0" else Erased(*counts[:4])

    async def _touch(self, conn: asyncpg.Connection, key: SessionKey) -> None:
        await conn.execute(
            f"UPDATE {self._p}sessions SET updated_at = {_NOW}, expires_at = {_EXPIRY_AFTER_WRITE} "
            "WHERE tenant = $1 AND session_id = $2", key.tenant, key.id)

    # --- session records ---------------------------------------------------------------------------

    @override
    async def _get(self, key: SessionKey) -> Session | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(
                f"SELECT state, version, created_at, ttl FROM {self._p}sessions WHERE tenant = $1 AND session_id = $2 "
                f"AND (expires_at IS NULL OR expires_at > {_NOW}) AND (version > 0 OR last_seq > 0)",
                key.tenant, key.id)
        if row is None:
            return None
        state = common.decode_state(self.backend, key, row["state"])
        return Session(key.id, key.tenant, state, row["version"], row["created_at"], row["ttl"])

    @override
    async def _save(self, key: SessionKey, session: Session, lease: Lease | None) -> int:
        state = common.encode_state(session)
        async with self._transaction() as conn:
            row = await self._locked_row(conn, key, lease)
            if row["version"] != session.version:
                raise ConcurrentUpdate.stale(self.backend, key, row["version"], session.version)
            created = session.created_at if row["version"] == 0 else row["created_at"]
            await conn.execute(
                f"UPDATE {self._p}sessions SET state = $3, version = version + 1, ttl = $4, created_at = $5, "
                f"updated_at = {_NOW}, expires_at = CASE WHEN $4::float8 IS NULL THEN NULL ELSE GREATEST({_NOW} + $4, "
                "CASE WHEN lease_owner IS NULL THEN NULL ELSE lease_expires END) END "
                "WHERE tenant = $1 AND session_id = $2", key.tenant, key.id, state, session.ttl, created)
        return int(row["version"]) + 1

    @override
    async def _delete(self, key: SessionKey) -> Erased | None:
        async with self._transaction() as conn:
            return await self._delete_rows(conn, key)

    @override
    async def _list(self, tenant: str, limit: int, after: tuple[float, str]) -> list[SessionInfo]:
        after_time, after_id = after
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT session_id, version, last_seq, created_at, updated_at FROM {self._p}sessions "
                f"WHERE tenant = $1 AND (expires_at IS NULL OR expires_at > {_NOW}) "
                "AND (version > 0 OR last_seq > 0) "
                "AND (updated_at < $2 OR (updated_at = $2 AND session_id > $3)) "
                "ORDER BY updated_at DESC, session_id ASC LIMIT $4", tenant, after_time, after_id, limit + 1)
        return [SessionInfo(tenant, r["session_id"], r["version"], r["last_seq"], r["created_at"], r["updated_at"])
                for r in rows]

    @override
    async def _purge(self) -> list[SessionKey]:
        async with self._transaction() as conn:
            rows = await conn.fetch(f"SELECT tenant, session_id FROM {self._p}sessions WHERE expires_at <= {_NOW} "
                                    f"AND NOT (lease_owner IS NOT NULL AND lease_expires > {_NOW}) "
                                    "FOR UPDATE SKIP LOCKED")
            keys = [SessionKey(r["tenant"], r["session_id"]) for r in rows]
            return [key for key in keys if await self._delete_rows(conn, key)]

    # --- message log -------------------------------------------------------------------------------

    @override
    async def _append(self, key: SessionKey, messages: Sequence[Message], lease: Lease | None, durable: bool) -> int:
        encoded = row_codec.encode_batch(messages)
        entries = outbox_rows(messages)
        ids = [mid for mid, _ in encoded]
        bodies = [body for _, body in encoded]
        p = self._p
        async with self._transaction() as conn:
            row = await self._locked_row(conn, key, lease)
            last = int(row["last_seq"])
            # The unique index on message ids does the de-duplication (no query plan involved); the
            # session's row stays locked, so nobody else appends in between.
            done = await conn.fetchrow(
                f"WITH ins AS (INSERT INTO {p}messages (tenant, session_id, seq, message_id, body) "
                "SELECT $1, $2, $3 + n, i, b FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS t(i, b, n) "
                "ON CONFLICT (tenant, session_id, message_id) DO NOTHING RETURNING message_id), "
                f"upd AS (UPDATE {p}sessions SET last_seq = $3 + (SELECT count(*) FROM ins), updated_at = {_NOW}, "
                f"expires_at = {_EXPIRY_AFTER_WRITE} "
                "WHERE tenant = $1 AND session_id = $2 RETURNING last_seq) "
                "SELECT (SELECT last_seq FROM upd) AS last_seq, (SELECT array_agg(message_id) FROM ins) AS fresh",
                key.tenant, key.id, last, ids, bodies)
            assert done is not None
            fresh = set(done["fresh"] or ())
            if len(fresh) != len(ids):
                # A retry with some messages already stored left gaps in the new sequences: renumber.
                await conn.execute(f"DELETE FROM {p}messages WHERE tenant = $1 AND session_id = $2 AND seq > $3",
                                   key.tenant, key.id, last)
                kept = [(i, b) for i, b in encoded if i in fresh]
                await conn.execute(
                    f"INSERT INTO {p}messages (tenant, session_id, seq, message_id, body) "
                    "SELECT $1, $2, $3 + n, i, b FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS t(i, b, n)",
                    key.tenant, key.id, last, [i for i, _ in kept], [b for _, b in kept])
            if entries:  # the entries of the messages stored now, in the same transaction
                stored = [i for i in ids if i in fresh]
                await outbox.postgres_insert(conn, p, key, {i: last + n for n, i in enumerate(stored, 1)}, entries)
        return int(done["last_seq"])

    @override
    async def _copy_view(self, source: SessionKey, target: SessionKey, kept: list[tuple[int, int]],
                         lease: Lease | None) -> int | None:
        async with self._transaction() as conn:
            row = await self._locked_row(conn, target, lease)
            last = await copy.postgres_copy(conn, self._p, target, int(row["last_seq"]), source, kept)
            if last is None:
                return None  # a row not JSON to PostgreSQL: `rewind.fork` copies page by page
            await conn.execute(f"UPDATE {self._p}sessions SET last_seq = $3, updated_at = {_NOW}, "
                               f"expires_at = {_EXPIRY_AFTER_WRITE} WHERE tenant = $1 AND session_id = $2",
                               target.tenant, target.id, last)
        return last

    @override
    async def _load(self, key: SessionKey, limit: int | None, before: int | None, after: int | None) -> MessagePage:
        async with self._transaction(readonly=True) as conn:
            last = await conn.fetchval(
                f"SELECT last_seq FROM {self._p}sessions WHERE tenant = $1 AND session_id = $2 "
                f"AND (expires_at IS NULL OR expires_at > {_NOW})", key.tenant, key.id)
            if last is None:
                return MessagePage([], 1, False)
            end = int(last) if before is None else max(0, min(before - 1, int(last)))
            rows = await conn.fetch(
                f"SELECT seq, message_id, body FROM {self._p}messages WHERE tenant = $1 AND session_id = $2 "
                "AND seq > $3 AND seq <= $4 ORDER BY seq DESC LIMIT $5",
                key.tenant, key.id, after or 0, end, limit)
        ordered = [(r["seq"], r["message_id"], r["body"]) for r in reversed(rows)]
        return row_codec.make_page(self.backend, key, end, ordered)

    @override
    async def _load_context(self, key: SessionKey, limit: int | None) -> tuple[Checkpoint | None, MessagePage]:
        p = self._p
        async with self._transaction(readonly=True) as conn:
            head = await conn.fetchrow(
                f"SELECT s.last_seq, c.seq AS ckpt_seq, c.body AS ckpt_body FROM {p}sessions s "
                f"LEFT JOIN LATERAL (SELECT seq, body FROM {p}checkpoints c WHERE c.tenant = s.tenant "
                "AND c.session_id = s.session_id ORDER BY seq DESC LIMIT 1) c ON true "
                f"WHERE s.tenant = $1 AND s.session_id = $2 AND (s.expires_at IS NULL OR s.expires_at > {_NOW})",
                key.tenant, key.id)
            if head is None:
                return None, MessagePage([], 1, False)
            floor = int(head["ckpt_seq"] or 0)
            rows = await conn.fetch(
                f"SELECT seq, message_id, body FROM {p}messages WHERE tenant = $1 AND session_id = $2 "
                "AND seq > $3 ORDER BY seq DESC LIMIT $4", key.tenant, key.id, floor, limit)
        checkpoint = (row_codec.decode_checkpoint(self.backend, key, head["ckpt_body"])
                      if head["ckpt_body"] is not None else None)
        ordered = [(r["seq"], r["message_id"], r["body"]) for r in reversed(rows)]
        return checkpoint, row_codec.make_page(self.backend, key, int(head["last_seq"]), ordered)

    @override
    async def _message_seq(self, key: SessionKey, message_id: str) -> int | None:
        async with self._connection() as conn:
            seq = await conn.fetchval(
                f"SELECT m.seq FROM {self._p}messages m JOIN {self._p}sessions s USING (tenant, session_id) "
                "WHERE m.tenant = $1 AND m.session_id = $2 AND m.message_id = $3 "
                f"AND (s.expires_at IS NULL OR s.expires_at > {_NOW})", key.tenant, key.id, message_id)
        return None if seq is None else int(seq)

    # --- checkpoints -------------------------------------------------------------------------------

    @override
    async def _save_checkpoint(self, key: SessionKey, checkpoint: Checkpoint, lease: Lease | None) -> None:
        body = row_codec.encode_checkpoint(checkpoint)
        async with self._transaction() as conn:
            row = await self._locked_row(conn, key, lease)
            if not 1 <= checkpoint.seq <= row["last_seq"]:
                raise common.checkpoint_past_end(self.backend, key, checkpoint.seq, row["last_seq"])
            await conn.execute(
                f"INSERT INTO {self._p}checkpoints (tenant, session_id, seq, body) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (tenant, session_id, seq) DO UPDATE SET body = EXCLUDED.body",
                key.tenant, key.id, checkpoint.seq, body)
            await self._touch(conn, key)

    @override
    async def _latest_checkpoint(self, key: SessionKey) -> Checkpoint | None:
        async with self._connection() as conn:
            body = await conn.fetchval(
                f"SELECT c.body FROM {self._p}checkpoints c JOIN {self._p}sessions s USING (tenant, session_id) "
                f"WHERE c.tenant = $1 AND c.session_id = $2 AND (s.expires_at IS NULL OR s.expires_at > {_NOW}) "
                "ORDER BY c.seq DESC LIMIT 1", key.tenant, key.id)
        return None if body is None else row_codec.decode_checkpoint(self.backend, key, body)

    # --- traces ------------------------------------------------------------------------------------

    @override
    async def _append_traces(self, key: SessionKey, traces: Sequence[dict[str, Any]], lease: Lease | None) -> None:
        bodies = [common.encode_trace(t) for t in traces]
        async with self._transaction() as conn:
            await self._locked_row(conn, key, lease)
            await conn.execute(
                f"INSERT INTO {self._p}traces (tenant, session_id, n, body) "
                f"SELECT $1, $2, (SELECT COALESCE(MAX(n), 0) FROM {self._p}traces WHERE tenant = $1 "
                "AND session_id = $2) + k, b FROM unnest($3::text[]) WITH ORDINALITY AS t(b, k)",
                key.tenant, key.id, bodies)

    @override
    async def _load_traces(self, key: SessionKey, limit: int | None) -> list[dict[str, Any]]:
        async with self._connection() as conn:
            rows = await conn.fetch(
                f"SELECT t.body FROM {self._p}traces t JOIN {self._p}sessions s USING (tenant, session_id) "
                f"WHERE t.tenant = $1 AND t.session_id = $2 AND (s.expires_at IS NULL OR s.expires_at > {_NOW}) "
                "ORDER BY t.n DESC LIMIT $3", key.tenant, key.id, limit)
        return [common.decode_trace(self.backend, key, r["body"]) for r in reversed(rows)]

    # --- outbox ------------------------------------------------------------------------------------

    @override
    async def _outbox(self, tenant: str, topic: str | None, limit: int) -> list[OutboxEntry]:
        async with self._connection() as conn:
            return await outbox.postgres_pending(conn, self._p, tenant, topic, limit)

    @override
    async def _mark_delivered(self, tenant: str, keys: list[str]) -> int:
        async with self._transaction() as conn:
            return await outbox.postgres_mark(conn, self._p, tenant, keys)

    # --- leases ------------------------------------------------------------------------------------

    @override
    async def _try_acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        async with self._transaction() as conn:
            row = await self._locked_row(conn, key, None, check=False)
            if not common.lease_is_free(row["lease_owner"], row["lease_expires"], row["now"], owner):
                return None
            token = int(row["lease_token"]) + 1
            expires = await conn.fetchval(
                f"UPDATE {self._p}sessions SET lease_owner = $3, lease_token = $4, lease_expires = {_NOW} + $5, "
                f"expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE GREATEST({_NOW} + ttl, {_NOW} + $5) END "
                "WHERE tenant = $1 AND session_id = $2 RETURNING lease_expires", key.tenant, key.id, owner, token,
                float(ttl))
        return Lease(key.tenant, key.id, owner, token, float(expires), ttl)

    @override
    async def _renew_lease(self, lease: Lease) -> Lease:
        p = self._p
        live = f"tenant = $1 AND session_id = $2 AND (expires_at IS NULL OR expires_at > {_NOW})"
        async with self._connection() as conn:
            # The session's expiry moves with its lease, so a session never expires while a run holds it.
            expires = await conn.fetchval(
                f"UPDATE {p}sessions SET lease_expires = {_NOW} + $5, "
                f"expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE GREATEST({_NOW} + ttl, {_NOW} + $5) END "
                f"WHERE {live} AND lease_token = $3 AND lease_owner = $4 RETURNING lease_expires",
                lease.tenant, lease.session_id, lease.token, lease.owner, float(lease.ttl))
            if expires is None:
                found = await conn.fetchrow(f"SELECT (SELECT lease_token FROM {p}sessions WHERE {live}) AS token, "
                                            f"{_NOW} AS now", lease.tenant, lease.session_id)
        if expires is None:
            assert found is not None
            raise common.lease_lost(self.backend, lease.key, lease, found["token"], found["now"])
        return lease.renewed(float(expires))

    @override
    async def _release_lease(self, lease: Lease) -> None:
        async with self._connection() as conn:
            await conn.execute(
                f"UPDATE {self._p}sessions SET lease_owner = NULL, lease_expires = 0 WHERE tenant = $1 "
                "AND session_id = $2 AND lease_token = $3 AND lease_owner = $4",
                lease.tenant, lease.session_id, lease.token, lease.owner)

    @override
    async def close(self) -> None:
        """Close the pool (if the store made it), within `close_timeout`; past it, drop the connections."""
        pool, self._pool = self._pool, None
        self._ready = False
        if pool is None or not self._owns_pool:
            self._pool = pool
            return
        try:
            await asyncio.wait_for(pool.close(), self._close_timeout)
        except TimeoutError:
            pool.terminate()


def _address(dsn: str) -> str:
    """``host:port`` of a DSN, for errors (never the password)."""
    try:
        parts = urlsplit(dsn)
        return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
    except ValueError:
        return "the PostgreSQL server"


def _import_asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError as exc:
        raise UsageError('PostgresStore needs asyncpg: pip install "contextpipe[postgres]"') from exc
    return asyncpg
