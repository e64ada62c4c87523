"""Vector stores: `MemoryVectorStore` (tests) and `SQLiteVectorStore` (the embedded default).

Both search exactly (cosine similarity over normalised vectors, with numpy). `SQLiteVectorStore`
keeps its vectors in the same SQLite file as the sessions (`SQLiteStore.vectors()`), so deleting or
expiring a session also removes the memories recorded for it (records whose metadata carries its
``tenant`` and ``session_id``). It holds each collection's matrix in memory between searches and
reloads it only when the collection changed (also when another process changed it).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from typing_extensions import override

from ..errors import UsageError
from .base import SearchHit, VectorRecord, VectorStore, Where, check_where, matches

if TYPE_CHECKING:
    from ..session import SessionKey
    from ..stores.base import SessionStore

__all__ = ["MemoryVectorStore", "SQLiteVectorStore"]


def _normalise(vector: Sequence[float]) -> np.ndarray[Any, Any]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0 else array


def _top(matrix: np.ndarray[Any, Any], query: Sequence[float], k: int,
         min_score: float | None) -> list[tuple[int, float]]:
    if matrix.shape[0] == 0:
        return []
    q = _normalise(query)
    if q.shape[0] != matrix.shape[1]:
        raise UsageError(f"query vector has {q.shape[0]} dimensions, the collection {matrix.shape[1]}")
    scores = matrix @ q
    if k < len(scores):
        idx = np.argpartition(-scores, k)[:k]
        idx = idx[np.argsort(-scores[idx])]
    else:
        idx = np.argsort(-scores)
    return [(int(i), float(scores[i])) for i in idx if min_score is None or scores[i] >= min_score]


class MemoryVectorStore(VectorStore):
    """Vectors in this process's memory; same contract as the durable stores."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, tuple[np.ndarray[Any, Any], str, dict[str, Any]]]] = {}

    @override
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        rows = self._data.setdefault(collection, {})
        for r in records:
            rows[r.id] = (_normalise(r.vector), r.text, dict(r.metadata))

    @override
    async def delete(self, collection: str, *, ids: Sequence[str] | None = None, where: Where | None = None) -> int:
        check_where(where)
        if ids is None and where is None:
            return 0
        rows = self._data.get(collection, {})
        doomed = [i for i, (_, _, meta) in rows.items()
                  if (ids is None or i in ids) and (where is None or matches(meta, where))]
        for i in doomed:
            del rows[i]
        return len(doomed)

    @override
    async def search(self, collection: str, vector: Sequence[float], *, k: int = 5, where: Where | None = None,
                     min_score: float | None = None) -> list[SearchHit]:
        check_where(where)
        rows = [(i, v, t, m) for i, (v, t, m) in self._data.get(collection, {}).items() if matches(m, where)]
        if not rows:
            return []
        matrix = np.stack([r[1] for r in rows])
        return [SearchHit(rows[i][0], score, rows[i][2], rows[i][3]) for i, score in _top(matrix, vector, k, min_score)]

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        return sum(1 for _, _, m in self._data.get(collection, {}).values() if matches(m, where))


_SCHEMA = """
CREATE TABLE IF NOT EXISTS cp_vectors (
    collection TEXT NOT NULL,
    id TEXT NOT NULL,
    dim INTEGER NOT NULL,
    vector BLOB NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    PRIMARY KEY (collection, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cp_vector_versions (collection TEXT PRIMARY KEY, version INTEGER NOT NULL);
"""


class _Matrix:
    """One collection held in memory: ids, normalised vectors, texts, metadata, and filter results."""

    def __init__(self, version: int, ids: list[str], matrix: np.ndarray[Any, Any], texts: list[str],
                 metas: list[dict[str, Any]]) -> None:
        self.version, self.ids, self.matrix, self.texts, self.metas = version, ids, matrix, texts, metas
        self.position = {i: n for n, i in enumerate(ids)}
        self.filters: dict[str, np.ndarray[Any, Any]] = {}

    def apply(self, version: int, rows: list[tuple[str, np.ndarray[Any, Any], str, dict[str, Any]]]) -> None:
        """Bring the cache up to date with this process's own upsert."""
        new = []
        for id_, vector, text, meta in rows:
            n = self.position.get(id_)
            if n is None:
                new.append((id_, vector, text, meta))
            else:
                self.matrix[n], self.texts[n], self.metas[n] = vector, text, meta
        if new:
            block = np.stack([r[1] for r in new])
            self.matrix = block if self.matrix.size == 0 else np.vstack([self.matrix, block])
            for id_, _, text, meta in new:
                self.position[id_] = len(self.ids)
                self.ids.append(id_)
                self.texts.append(text)
                self.metas.append(meta)
        self.version = version
        self.filters.clear()

    def rows_matching(self, where: Where) -> np.ndarray[Any, Any]:
        """Positions of the rows matching `where` (remembered until the collection changes)."""
        key = json.dumps(where, sort_keys=True, default=str)
        found = self.filters.get(key)
        if found is None:
            found = np.fromiter((n for n, m in enumerate(self.metas) if matches(m, where)), dtype=np.int64)
            if len(self.filters) > 256:
                self.filters.clear()
            self.filters[key] = found
        return found


class SQLiteVectorStore(VectorStore):
    """Vectors in a SQLite file, searched exactly with numpy; made by `SQLiteStore.vectors()` or directly."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        self.path = str(path)
        self._busy_ms = int(busy_timeout * 1000)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextpipe-vectors")
        self._conn: sqlite3.Connection | None = None
        self._cache: dict[str, _Matrix] = {}

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            self._conn = conn
        return self._conn

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: fn(self._connection(), *args))

    @staticmethod
    def _version(conn: sqlite3.Connection, collection: str) -> int:
        row = conn.execute("SELECT version FROM cp_vector_versions WHERE collection = ?", (collection,)).fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def _bump(conn: sqlite3.Connection, collection: str) -> None:
        conn.execute("INSERT INTO cp_vector_versions VALUES (?, 1) ON CONFLICT (collection) "
                     "DO UPDATE SET version = version + 1", (collection,))

    @override
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        prepared = [(r.id, _normalise(r.vector), r.text, dict(r.metadata)) for r in records]
        rows = [(collection, id_, int(v.shape[0]), v.tobytes(), text, json.dumps(meta, ensure_ascii=False, default=str))
                for id_, v, text, meta in prepared]

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                before = self._version(conn, collection)
                conn.executemany("INSERT OR REPLACE INTO cp_vectors VALUES (?, ?, ?, ?, ?, ?)", rows)
                self._bump(conn, collection)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            cached = self._cache.get(collection)
            if cached is None:
                return
            same_shape = cached.matrix.size == 0 or (prepared and cached.matrix.shape[1] == prepared[0][1].shape[0])
            if cached.version == before and same_shape:
                cached.apply(before + 1, prepared)  # in step with the file: update in place, no reload
            else:
                del self._cache[collection]

        await self._run(op)

    @override
    async def delete(self, collection: str, *, ids: Sequence[str] | None = None, where: Where | None = None) -> int:
        check_where(where)
        if (ids is None and where is None) or (ids is not None and not ids):
            return 0
        clauses, params = ["collection = ?"], [collection]
        if ids is not None:
            clauses.append(f"id IN ({','.join('?' * len(ids))})")
            params += list(ids)
        sql_where, sql_params = _json_where(where)
        clauses += sql_where
        params += sql_params

        def op(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                n = conn.execute(f"DELETE FROM cp_vectors WHERE {' AND '.join(clauses)}", params).rowcount
                self._bump(conn, collection)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            self._cache.pop(collection, None)
            return int(n)

        return int(await self._run(op))

    def _load(self, conn: sqlite3.Connection, collection: str) -> _Matrix:
        version = self._version(conn, collection)
        cached = self._cache.get(collection)
        if cached is not None and cached.version == version:
            return cached
        rows = conn.execute("SELECT id, dim, vector, text, metadata FROM cp_vectors WHERE collection = ?",
                            (collection,)).fetchall()
        if rows:
            dims = {r[1] for r in rows}
            if len(dims) > 1:
                raise UsageError(f"collection {collection!r} mixes vector sizes {sorted(dims)}; use one embedder "
                                 "per collection")
            matrix = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(len(rows), rows[0][1])
            matrix = matrix.copy()  # writable: this process's upserts update it in place
        else:
            matrix = np.zeros((0, 0), dtype=np.float32)
        loaded = _Matrix(version, [r[0] for r in rows], matrix, [r[3] for r in rows], [json.loads(r[4]) for r in rows])
        self._cache[collection] = loaded
        return loaded

    @override
    async def search(self, collection: str, vector: Sequence[float], *, k: int = 5, where: Where | None = None,
                     min_score: float | None = None) -> list[SearchHit]:
        check_where(where)

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            m = self._load(conn, collection)
            if where:
                keep = m.rows_matching(where)
                if keep.size == 0:
                    return []
                return [SearchHit(m.ids[int(keep[i])], s, m.texts[int(keep[i])], m.metas[int(keep[i])])
                        for i, s in _top(m.matrix[keep], vector, k, min_score)]
            return [SearchHit(m.ids[i], s, m.texts[i], m.metas[i]) for i, s in _top(m.matrix, vector, k, min_score)]

        hits: list[SearchHit] = await self._run(op)
        return hits

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        sql_where, params = _json_where(where)
        clause = " AND ".join(["collection = ?", *sql_where])
        return int(await self._run(lambda conn: conn.execute(f"SELECT COUNT(*) FROM cp_vectors WHERE {clause}",
                                                              [collection, *params]).fetchone()[0]))

    def forget_sessions_deleted_by(self, sessions: SessionStore) -> None:
        """Delete a session's records whenever `sessions` deletes or expires it.

        Records whose metadata names the session (``tenant`` and ``session_id``), in any collection, are
        deleted through `delete`, from `sessions`' `on_session_deleted` hook. The hook opens the file
        itself, so it works after this instance is closed.
        """
        path = self.path

        async def hook(key: SessionKey) -> None:
            vectors = SQLiteVectorStore(path)
            try:
                collections = await vectors._run(lambda conn: [r[0] for r in conn.execute(
                    "SELECT DISTINCT collection FROM cp_vectors WHERE json_extract(metadata, '$.tenant') = ? "
                    "AND json_extract(metadata, '$.session_id') = ?", (key.tenant, key.id))])
                for collection in collections:
                    await vectors.delete(collection, where={"tenant": key.tenant, "session_id": key.id})
            finally:
                await vectors.close()

        sessions.on_session_deleted(hook)

    @override
    async def close(self) -> None:
        def shut(_: sqlite3.Connection) -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        if self._conn is not None:
            await self._run(shut)
        self._executor.shutdown(wait=True)


def _json_where(where: Where | None) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in (where or {}).items():
        if isinstance(value, list | tuple | set | frozenset):
            values = list(value)
            clauses.append(f"json_extract(metadata, ?) IN ({','.join('?' * len(values))})")
            params += [f"$.{key}", *values]
        else:
            clauses.append("json_extract(metadata, ?) = ?")
            params += [f"$.{key}", value]
    return clauses, params
