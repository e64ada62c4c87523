"""`PostgresStore`: sessions in PostgreSQL, for many workers on many machines.

Uses the async driver `asyncpg` with a connection pool (given, or created from a DSN on first use).
The schema is created or migrated on first use, under an advisory lock so that many workers
starting together do it once; its version is kept in ``<prefix>schema``. Every write runs in one
transaction that locks the session's row, so the checks (lease, version, existing ids) and the
write are atomic. Lease expiry uses the database's clock, not the workers'.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from typing_extensions import override

from ..errors import StoreError, UsageError
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
    translate_errors,
)
from .base import Checkpoint, Lease, MessagePage, SessionInfo, SessionListing, SessionStore

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresStore"]

_NOW: Final = "extract(epoch from clock_timestamp())::float8"
_PREFIX_RE: Final = re.compile(r"^[a-z_][a-z0-9_]{0,30}$")
_LOCK_KEY: Final = 0x636F6E74  # advisory lock id for schema migrations ("cont")
_translated = translate_errors("postgres", "asyncpg")


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
    ]]


class PostgresStore(SessionStore):
    """Sessions in PostgreSQL.

    Give a DSN (``postgresql://user:pass@host:5432/db``) or an existing ``asyncpg`` pool (then the
    store does not close it). Tables are named ``<prefix>sessions``, ``<prefix>messages``,
    ``<prefix>checkpoints`` and ``<prefix>schema``.
    """

    backend = "postgres"

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        prefix: str = "contextpipe_",
        min_size: int = 1,
        max_size: int = 10,
    ) -> None:
        if (dsn is None) == (pool is None):
            raise UsageError("PostgresStore needs exactly one of dsn=... or pool=...")
        if not _PREFIX_RE.match(prefix):
            raise UsageError(f"invalid table prefix {prefix!r}: use lowercase letters, digits and '_'")
        self._dsn = dsn
        self._pool = pool
        self._owns_pool = pool is None
        self._sizes = (min_size, max_size)
        self._p = prefix
        self._ready = False

    # --- plumbing ----------------------------------------------------------------------------------

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            asyncpg = _import_asyncpg()
            try:
                self._pool = await asyncpg.create_pool(self._dsn, min_size=self._sizes[0], max_size=self._sizes[1])
            except (OSError, asyncpg.PostgresError) as exc:
                raise StoreError(f"cannot connect to PostgreSQL: {exc}", backend=self.backend) from exc
        if not self._ready:
            await self._migrate(self._pool)
            self._ready = True
        return self._pool

    async def _migrate(self, pool: asyncpg.Pool) -> None:
        p = self._p
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await conn.execute(f"CREATE TABLE IF NOT EXISTS {p}schema (id INT PRIMARY KEY CHECK (id = 1), "
                               "version INT NOT NULL)")
            current = await conn.fetchval(f"SELECT version FROM {p}schema WHERE id = 1") or 0
            if current > SCHEMA_VERSION:
                raise StoreError(f"the database holds contextpipe schema {current}, newer than this release's "
                                 f"{SCHEMA_VERSION}; upgrade contextpipe", backend=self.backend)
            for version, steps in enumerate(_migrations(p), start=1):
                if version <= current:
                    continue
                for step in steps:
                    await conn.execute(step)
                await conn.execute(f"INSERT INTO {p}schema (id, version) VALUES (1, $1) "
                                   "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version", version)

    async def _locked_row(self, conn: asyncpg.Connection, tenant: str, session_id: str,
                          lease: Lease | None, *, check: bool = True) -> asyncpg.Record:
        """Return the session's row, created if missing, locked for this transaction, with ``now``."""
        p = self._p
        row = await conn.fetchrow(
            f"INSERT INTO {p}sessions (tenant, session_id, created_at, updated_at) VALUES ($1, $2, {_NOW}, {_NOW}) "
            f"ON CONFLICT (tenant, session_id) DO UPDATE SET tenant = EXCLUDED.tenant "
            f"RETURNING version, last_seq, lease_owner, lease_token, lease_expires, expires_at, created_at, "
            f"{_NOW} AS now", tenant, session_id)
        assert row is not None
        if row["expires_at"] is not None and row["expires_at"] <= row["now"]:
            await self._delete(conn, tenant, session_id, keep_row=True)
            row = await conn.fetchrow(
                f"SELECT version, last_seq, lease_owner, lease_token, lease_expires, expires_at, created_at, "
                f"{_NOW} AS now FROM {p}sessions WHERE tenant = $1 AND session_id = $2", tenant, session_id)
            assert row is not None
        if check:
            if lease is not None:
                if lease.token != row["lease_token"] or lease.owner != row["lease_owner"]:
                    raise lease_lost(self.backend, lease, row["lease_token"])
            elif row["lease_owner"] is not None and row["lease_expires"] > row["now"]:
                raise busy(self.backend, tenant, session_id)
        return row

    async def _delete(self, conn: asyncpg.Connection, tenant: str, session_id: str, *, keep_row: bool = False) -> bool:
        p = self._p
        await conn.execute(f"DELETE FROM {p}messages WHERE tenant = $1 AND session_id = $2", tenant, session_id)
        await conn.execute(f"DELETE FROM {p}checkpoints WHERE tenant = $1 AND session_id = $2", tenant, session_id)
        await conn.execute(f"DELETE FROM {p}traces WHERE tenant = $1 AND session_id = $2", tenant, session_id)
        if keep_row:
            status = await conn.execute(
                f"UPDATE {p}sessions SET state = '{{}}', version = 0, ttl = NULL, expires_at = NULL, last_seq = 0, "
                f"lease_owner = NULL, lease_expires = 0, created_at = {_NOW}, updated_at = {_NOW} "
                "WHERE tenant = $1 AND session_id = $2", tenant, session_id)
        else:
            status = await conn.execute(f"DELETE FROM {p}sessions WHERE tenant = $1 AND session_id = $2",
                                        tenant, session_id)
        return str(status).split()[-1] != "0"

    async def _touch(self, conn: asyncpg.Connection, tenant: str, session_id: str, last_seq: int | None = None) -> None:
        await conn.execute(
            f"UPDATE {self._p}sessions SET updated_at = {_NOW}, last_seq = COALESCE($3, last_seq), "
            f"expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE {_NOW} + ttl END "
            "WHERE tenant = $1 AND session_id = $2", tenant, session_id, last_seq)

    # --- session records ---------------------------------------------------------------------------

    @override
    @_translated
    async def get_session(self, tenant: str, session_id: str) -> Session | None:
        check_key(tenant, session_id)
        pool = await self._get_pool()
        row = await pool.fetchrow(
            f"SELECT state, version, created_at, ttl FROM {self._p}sessions WHERE tenant = $1 AND session_id = $2 "
            f"AND (expires_at IS NULL OR expires_at > {_NOW}) AND (version > 0 OR last_seq > 0)",
            tenant, session_id)
        if row is None:
            return None
        state = decode_state(self.backend, tenant, session_id, row["state"])
        return Session(session_id, tenant, state, row["version"], row["created_at"], row["ttl"])

    @override
    @_translated
    async def save_session(self, session: Session, *, lease: Lease | None = None) -> None:
        check_key(session.tenant, session.id)
        state = encode_state(session)
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            row = await self._locked_row(conn, session.tenant, session.id, lease)
            if row["version"] != session.version:
                raise concurrent_update(self.backend, session.tenant, session.id, row["version"], session.version)
            created = session.created_at if row["version"] == 0 else row["created_at"]
            await conn.execute(
                f"UPDATE {self._p}sessions SET state = $3, version = version + 1, ttl = $4, created_at = $5, "
                f"updated_at = {_NOW}, expires_at = CASE WHEN $4::float8 IS NULL THEN NULL ELSE {_NOW} + $4 END "
                "WHERE tenant = $1 AND session_id = $2", session.tenant, session.id, state, session.ttl, created)
        session.version = int(row["version"]) + 1

    @override
    @_translated
    async def delete_session(self, tenant: str, session_id: str) -> bool:
        check_key(tenant, session_id)
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            return await self._delete(conn, tenant, session_id)

    @override
    @_translated
    async def list_sessions(self, tenant: str, *, limit: int = 50, cursor: str | None = None) -> SessionListing:
        check_limit(limit)
        after_time, after_id = decode_cursor(cursor) if cursor is not None else (float("inf"), "")
        pool = await self._get_pool()
        rows = await pool.fetch(
            f"SELECT session_id, version, last_seq, created_at, updated_at FROM {self._p}sessions "
            f"WHERE tenant = $1 AND (expires_at IS NULL OR expires_at > {_NOW}) "
            "AND (version > 0 OR last_seq > 0) "
            "AND (updated_at < $2 OR (updated_at = $2 AND session_id > $3)) "
            "ORDER BY updated_at DESC, session_id ASC LIMIT $4", tenant, after_time, after_id, limit + 1)
        page = rows[:limit]
        infos = [SessionInfo(tenant, r["session_id"], r["version"], r["last_seq"], r["created_at"], r["updated_at"])
                 for r in page]
        next_cursor = encode_cursor(page[-1]["updated_at"], page[-1]["session_id"]) if len(rows) > limit else None
        return SessionListing(infos, next_cursor)

    @override
    @_translated
    async def purge_expired(self) -> int:
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(f"SELECT tenant, session_id FROM {self._p}sessions WHERE expires_at <= {_NOW} "
                                    "FOR UPDATE SKIP LOCKED")
            return sum([await self._delete(conn, r["tenant"], r["session_id"]) for r in rows])

    # --- message log -------------------------------------------------------------------------------

    @override
    @_translated
    async def append(
        self, tenant: str, session_id: str, messages: Sequence[Message], *, lease: Lease | None = None
    ) -> int:
        check_key(tenant, session_id)
        ids = [m.id for m in messages]
        bodies = [dumps(m) for m in messages]
        if len(set(ids)) != len(ids):
            raise duplicate_in_batch(session_id)
        pool = await self._get_pool()
        p = self._p
        async with pool.acquire() as conn, conn.transaction():
            row = await self._locked_row(conn, tenant, session_id, lease)
            last = int(row["last_seq"])
            # The unique index on message ids does the de-duplication (no query plan involved); the
            # session's row stays locked, so nobody else appends in between.
            done = await conn.fetchrow(
                f"WITH ins AS (INSERT INTO {p}messages (tenant, session_id, seq, message_id, body) "
                "SELECT $1, $2, $3 + n, i, b FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS t(i, b, n) "
                "ON CONFLICT (tenant, session_id, message_id) DO NOTHING RETURNING message_id), "
                f"upd AS (UPDATE {p}sessions SET last_seq = $3 + (SELECT count(*) FROM ins), updated_at = {_NOW}, "
                f"expires_at = CASE WHEN ttl IS NULL THEN NULL ELSE {_NOW} + ttl END "
                "WHERE tenant = $1 AND session_id = $2 RETURNING last_seq) "
                "SELECT (SELECT last_seq FROM upd) AS last_seq, (SELECT array_agg(message_id) FROM ins) AS fresh",
                tenant, session_id, last, ids, bodies)
            assert done is not None
            fresh = set(done["fresh"] or ())
            if len(fresh) != len(ids):
                # A retry with some messages already stored left gaps in the new sequences: renumber.
                await conn.execute(f"DELETE FROM {p}messages WHERE tenant = $1 AND session_id = $2 AND seq > $3",
                                   tenant, session_id, last)
                kept = [(i, b) for i, b in zip(ids, bodies, strict=True) if i in fresh]
                await conn.execute(
                    f"INSERT INTO {p}messages (tenant, session_id, seq, message_id, body) "
                    "SELECT $1, $2, $3 + n, i, b FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS t(i, b, n)",
                    tenant, session_id, last, [i for i, _ in kept], [b for _, b in kept])
            last = int(done["last_seq"])
        return last

    @override
    @_translated
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
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            last = await conn.fetchval(
                f"SELECT last_seq FROM {self._p}sessions WHERE tenant = $1 AND session_id = $2 "
                f"AND (expires_at IS NULL OR expires_at > {_NOW})", tenant, session_id)
            if last is None:
                return MessagePage([], 1, False)
            end = int(last) if before is None else max(0, min(before - 1, int(last)))
            rows = await conn.fetch(
                f"SELECT seq, message_id, body FROM {self._p}messages WHERE tenant = $1 AND session_id = $2 "
                "AND seq > $3 AND seq <= $4 ORDER BY seq DESC LIMIT $5",
                tenant, session_id, after or 0, end, limit)
        ordered = [(r["seq"], r["message_id"], r["body"]) for r in reversed(rows)]
        return make_page(self.backend, tenant, session_id, end, after, ordered)

    @override
    @_translated
    async def load_context(
        self, tenant: str, session_id: str, *, limit: int | None = None
    ) -> tuple[Checkpoint | None, MessagePage]:
        check_key(tenant, session_id)
        check_limit(limit)
        p = self._p
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            head = await conn.fetchrow(
                f"SELECT s.last_seq, c.seq AS ckpt_seq, c.body AS ckpt_body FROM {p}sessions s "
                f"LEFT JOIN LATERAL (SELECT seq, body FROM {p}checkpoints c WHERE c.tenant = s.tenant "
                "AND c.session_id = s.session_id ORDER BY seq DESC LIMIT 1) c ON true "
                f"WHERE s.tenant = $1 AND s.session_id = $2 AND (s.expires_at IS NULL OR s.expires_at > {_NOW})",
                tenant, session_id)
            if head is None:
                return None, MessagePage([], 1, False)
            floor = int(head["ckpt_seq"] or 0)
            rows = await conn.fetch(
                f"SELECT seq, message_id, body FROM {p}messages WHERE tenant = $1 AND session_id = $2 "
                "AND seq > $3 ORDER BY seq DESC LIMIT $4", tenant, session_id, floor, limit)
        checkpoint = (decode_checkpoint(self.backend, tenant, session_id, head["ckpt_body"])
                      if head["ckpt_body"] is not None else None)
        ordered = [(r["seq"], r["message_id"], r["body"]) for r in reversed(rows)]
        return checkpoint, make_page(self.backend, tenant, session_id, int(head["last_seq"]), floor or None, ordered)

    # --- checkpoints -------------------------------------------------------------------------------

    @override
    @_translated
    async def save_checkpoint(
        self, tenant: str, session_id: str, checkpoint: Checkpoint, *, lease: Lease | None = None
    ) -> None:
        check_key(tenant, session_id)
        body = encode_checkpoint(checkpoint)
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            row = await self._locked_row(conn, tenant, session_id, lease)
            if not 1 <= checkpoint.seq <= row["last_seq"]:
                raise checkpoint_past_end(self.backend, tenant, session_id, checkpoint.seq, row["last_seq"])
            await conn.execute(
                f"INSERT INTO {self._p}checkpoints (tenant, session_id, seq, body) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (tenant, session_id, seq) DO UPDATE SET body = EXCLUDED.body",
                tenant, session_id, checkpoint.seq, body)
            await self._touch(conn, tenant, session_id)

    @override
    @_translated
    async def latest_checkpoint(self, tenant: str, session_id: str) -> Checkpoint | None:
        check_key(tenant, session_id)
        pool = await self._get_pool()
        body = await pool.fetchval(
            f"SELECT c.body FROM {self._p}checkpoints c JOIN {self._p}sessions s USING (tenant, session_id) "
            f"WHERE c.tenant = $1 AND c.session_id = $2 AND (s.expires_at IS NULL OR s.expires_at > {_NOW}) "
            "ORDER BY c.seq DESC LIMIT 1", tenant, session_id)
        return None if body is None else decode_checkpoint(self.backend, tenant, session_id, body)

    # --- traces ------------------------------------------------------------------------------------

    @override
    @_translated
    async def append_traces(
        self, tenant: str, session_id: str, traces: Sequence[dict[str, Any]], *, lease: Lease | None = None
    ) -> None:
        check_key(tenant, session_id)
        bodies = [encode_trace(t) for t in traces]
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            await self._locked_row(conn, tenant, session_id, lease)
            await conn.execute(
                f"INSERT INTO {self._p}traces (tenant, session_id, n, body) "
                f"SELECT $1, $2, (SELECT COALESCE(MAX(n), 0) FROM {self._p}traces WHERE tenant = $1 "
                "AND session_id = $2) + k, b FROM unnest($3::text[]) WITH ORDINALITY AS t(b, k)",
                tenant, session_id, bodies)

    @override
    @_translated
    async def load_traces(self, tenant: str, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        check_key(tenant, session_id)
        check_limit(limit)
        pool = await self._get_pool()
        rows = await pool.fetch(
            f"SELECT t.body FROM {self._p}traces t JOIN {self._p}sessions s USING (tenant, session_id) "
            f"WHERE t.tenant = $1 AND t.session_id = $2 AND (s.expires_at IS NULL OR s.expires_at > {_NOW}) "
            "ORDER BY t.n DESC LIMIT $3", tenant, session_id, limit)
        return [decode_trace(self.backend, tenant, session_id, r["body"]) for r in reversed(rows)]

    # --- leases ------------------------------------------------------------------------------------

    @override
    @_translated
    async def try_acquire_lease(self, tenant: str, session_id: str, owner: str, ttl: float) -> Lease | None:
        check_key(tenant, session_id)
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            row = await self._locked_row(conn, tenant, session_id, None, check=False)
            if row["lease_owner"] is not None and row["lease_expires"] > row["now"] and row["lease_owner"] != owner:
                return None
            token = int(row["lease_token"]) + 1
            expires = await conn.fetchval(
                f"UPDATE {self._p}sessions SET lease_owner = $3, lease_token = $4, lease_expires = {_NOW} + $5 "
                "WHERE tenant = $1 AND session_id = $2 RETURNING lease_expires", tenant, session_id, owner, token,
                float(ttl))
        return Lease(tenant, session_id, owner, token, float(expires), ttl)

    @override
    @_translated
    async def renew_lease(self, lease: Lease) -> Lease:
        pool = await self._get_pool()
        expires = await pool.fetchval(
            f"UPDATE {self._p}sessions SET lease_expires = {_NOW} + $5 WHERE tenant = $1 AND session_id = $2 "
            "AND lease_token = $3 AND lease_owner = $4 RETURNING lease_expires",
            lease.tenant, lease.session_id, lease.token, lease.owner, float(lease.ttl))
        if expires is None:
            raise lease_lost(self.backend, lease, None)
        return Lease(lease.tenant, lease.session_id, lease.owner, lease.token, float(expires), lease.ttl)

    @override
    @_translated
    async def release_lease(self, lease: Lease) -> None:
        pool = await self._get_pool()
        await pool.execute(
            f"UPDATE {self._p}sessions SET lease_owner = NULL, lease_expires = 0 WHERE tenant = $1 "
            "AND session_id = $2 AND lease_token = $3 AND lease_owner = $4",
            lease.tenant, lease.session_id, lease.token, lease.owner)

    @override
    async def close(self) -> None:
        if self._pool is not None and self._owns_pool:
            await self._pool.close()
            self._pool = None
            self._ready = False


def _import_asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError as exc:
        raise UsageError('PostgresStore needs asyncpg: pip install "contextpipe[postgres]"') from exc
    return asyncpg
