"""The artifact tables (`contextpipe.stores._artifacts`) of SQLite and PostgreSQL, and `table_for`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..session import SessionKey
from ._artifacts import Artifact, ArtifactTable
from ._records import Lease

if TYPE_CHECKING:
    import sqlite3

    from .base import SessionStore
    from .postgres import PostgresStore
    from .sqlite import SQLiteStore

__all__ = ["copy_artifacts", "table_for"]


def table_for(store: SessionStore) -> ArtifactTable:
    """Return the artifact table of `store`'s backend."""
    match store.backend:
        case "memory":
            return store.artifact_table  # type: ignore[attr-defined, no-any-return]
        case "sqlite":
            return _SQLiteArtifacts(store)  # type: ignore[arg-type]
        case "postgres":
            return _PostgresArtifacts(store)  # type: ignore[arg-type]
        case "redis":
            from ._artifacts_redis import RedisArtifacts

            return RedisArtifacts(store)  # type: ignore[arg-type]
    from ..errors import UsageError

    raise UsageError(f"the {store.backend} store keeps no artifacts; use MemoryStore, SQLiteStore, PostgresStore "
                     "or RedisStore")


async def copy_artifacts(store: SessionStore, tenant: str, source: str, target: str, lease: Lease | None) -> int:
    """Copy the artifacts of session `source` into `target` (`rewind.fork`); 0 for a store that keeps none."""
    if store.backend not in ("memory", "sqlite", "postgres", "redis"):
        return 0
    try:
        return await table_for(store).copy(SessionKey(tenant, source), SessionKey(tenant, target), lease)
    except Exception as exc:
        raise store._store_error(exc) from exc


_SQLITE_INFO = "SELECT id, media_type, size FROM cp_artifacts WHERE tenant = ? AND session_id = ? AND artifact_id = ?"


class _SQLiteArtifacts:
    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    async def put(self, key: SessionKey, artifact_id: str, data: bytes, media_type: str,
                  lease: Lease | None) -> Artifact:
        return await self._store._write(key, lease, self._put, artifact_id, data, media_type)  # lease-fenced

    def _put(self, conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row, now: float, artifact_id: str,
             data: bytes, media_type: str) -> Artifact:
        conn.execute("INSERT OR IGNORE INTO cp_artifacts (tenant, session_id, artifact_id, media_type, size, body) "
                     "VALUES (?, ?, ?, ?, ?, ?)", (key.tenant, key.id, artifact_id, media_type, len(data), data))
        self._store._touch(conn, key, now)
        kept = conn.execute(_SQLITE_INFO, (key.tenant, key.id, artifact_id)).fetchone()
        return Artifact(artifact_id, kept["media_type"], kept["size"])

    async def copy(self, source: SessionKey, target: SessionKey, lease: Lease | None) -> int:
        return await self._store._write(target, lease, self._copy, source)

    def _copy(self, conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row, now: float, source: SessionKey) -> int:
        copied: int = conn.execute(
            "INSERT OR IGNORE INTO cp_artifacts (tenant, session_id, artifact_id, media_type, size, body) "
            "SELECT tenant, ?, artifact_id, media_type, size, body FROM cp_artifacts WHERE tenant = ? AND "
            "session_id = ?", (key.id, source.tenant, source.id)).rowcount
        self._store._touch(conn, key, now)
        return copied

    def _row(self, conn: sqlite3.Connection, key: SessionKey, artifact_id: str) -> sqlite3.Row | None:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'cp_artifacts'").fetchone():
            return None  # a file opened read-only that no writer of this release opened yet
        live = conn.execute("SELECT expires_at FROM cp_sessions WHERE tenant = ? AND session_id = ?",
                            (key.tenant, key.id)).fetchone()
        if live is None or (live[0] is not None and live[0] <= self._store._clock()):
            return None  # gone, or expired: its artifacts go with it
        row: sqlite3.Row | None = conn.execute(_SQLITE_INFO, (key.tenant, key.id, artifact_id)).fetchone()
        return row

    async def info(self, key: SessionKey, artifact_id: str) -> Artifact | None:
        def read(conn: sqlite3.Connection) -> Artifact | None:
            conn.execute("BEGIN")  # one snapshot for the session and its artifact
            try:
                row = self._row(conn, key, artifact_id)
            finally:
                conn.execute("COMMIT")
            return None if row is None else Artifact(artifact_id, row["media_type"], row["size"])

        return await self._store._run(read)

    async def read(self, key: SessionKey, artifact_id: str, offset: int, length: int) -> bytes | None:
        def read(conn: sqlite3.Connection) -> bytes | None:
            conn.execute("BEGIN")  # one snapshot: the row found is the row whose blob is read
            try:
                row = self._row(conn, key, artifact_id)
                if row is None:
                    return None
                if offset >= row["size"]:
                    return b""
                with conn.blobopen("cp_artifacts", "body", row["id"], readonly=True) as blob:  # reads only the range
                    blob.seek(offset)
                    return blob.read(min(length, row["size"] - offset))
            finally:
                conn.execute("COMMIT")

        return await self._store._run(read)


class _PostgresArtifacts:
    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def put(self, key: SessionKey, artifact_id: str, data: bytes, media_type: str,
                  lease: Lease | None) -> Artifact:
        store, p = self._store, self._store._p
        async with store._transaction() as conn:
            await store._locked_row(conn, key, lease)  # lease-fenced; created when missing; serialised with deletes
            await conn.execute(f"INSERT INTO {p}artifacts (tenant, session_id, artifact_id, media_type, size, body) "
                               "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, session_id, artifact_id) "
                               "DO NOTHING", key.tenant, key.id, artifact_id, media_type, len(data), data)
            await store._touch(conn, key)
            row = await conn.fetchrow(f"SELECT media_type, size FROM {p}artifacts WHERE tenant = $1 AND "
                                      "session_id = $2 AND artifact_id = $3", key.tenant, key.id, artifact_id)
        assert row is not None
        return Artifact(artifact_id, row["media_type"], row["size"])

    async def copy(self, source: SessionKey, target: SessionKey, lease: Lease | None) -> int:
        store, p = self._store, self._store._p
        async with store._transaction() as conn:
            await store._locked_row(conn, target, lease)
            status = await conn.execute(
                f"INSERT INTO {p}artifacts (tenant, session_id, artifact_id, media_type, size, body) "
                f"SELECT tenant, $3, artifact_id, media_type, size, body FROM {p}artifacts WHERE tenant = $1 AND "
                "session_id = $2 ON CONFLICT (tenant, session_id, artifact_id) DO NOTHING",
                source.tenant, source.id, target.id)
            await store._touch(conn, target)
        return int(str(status).split()[-1])

    def _live(self) -> str:
        p = self._store._p
        return (f"FROM {p}artifacts a JOIN {p}sessions s ON s.tenant = a.tenant AND s.session_id = a.session_id "
                "WHERE a.tenant = $1 AND a.session_id = $2 AND a.artifact_id = $3 "
                "AND (s.expires_at IS NULL OR s.expires_at > extract(epoch from clock_timestamp())::float8)")

    async def info(self, key: SessionKey, artifact_id: str) -> Artifact | None:
        async with self._store._connection() as conn:
            row = await conn.fetchrow(f"SELECT a.media_type, a.size {self._live()}", key.tenant, key.id, artifact_id)
        return None if row is None else Artifact(artifact_id, row["media_type"], row["size"])

    async def read(self, key: SessionKey, artifact_id: str, offset: int, length: int) -> bytes | None:
        async with self._store._connection() as conn:
            row = await conn.fetchrow(  # clamped to the artifact in bigint: substring takes int4 positions
                "SELECT substring(a.body from least($4::bigint, a.size + 1)::int "
                f"for greatest(least($5::bigint, a.size + 1 - $4::bigint), 0)::int) AS part {self._live()}",
                key.tenant, key.id, artifact_id, min(offset, 2**62) + 1, min(length, 2**62))
        return None if row is None else bytes(row["part"])
