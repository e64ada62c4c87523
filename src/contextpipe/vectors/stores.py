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
from typing import Any

import numpy as np
from typing_extensions import override

from ..errors import UsageError
from .base import SearchHit, VectorRecord, VectorStore, Where, check_where, matches

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


class SQLiteVectorStore(VectorStore):
    """Vectors in a SQLite file, searched exactly with numpy; made by `SQLiteStore.vectors()` or directly."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        self.path = str(path)
        self._busy_ms = int(busy_timeout * 1000)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextpipe-vectors")
        self._conn: sqlite3.Connection | None = None
        self._cache: dict[str, tuple[int, list[str], np.ndarray[Any, Any], list[str], list[dict[str, Any]]]] = {}

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
    def _bump(conn: sqlite3.Connection, collection: str) -> None:
        conn.execute("INSERT INTO cp_vector_versions VALUES (?, 1) ON CONFLICT (collection) "
                      "DO UPDATE SET version = version + 1", (collection,))

    @override
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        rows = []
        for r in records:
            vector = _normalise(r.vector)
            rows.append((collection, r.id, int(vector.shape[0]), vector.tobytes(), r.text,
                         json.dumps(dict(r.metadata), ensure_ascii=False, default=str)))

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR REPLACE INTO cp_vectors VALUES (?, ?, ?, ?, ?, ?)", rows)
                self._bump(conn, collection)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

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
            return int(n)

        return int(await self._run(op))

    def _load(self, conn: sqlite3.Connection, collection: str) -> tuple[int, list[str], np.ndarray[Any, Any],
                                                                        list[str], list[dict[str, Any]]]:
        row = conn.execute("SELECT version FROM cp_vector_versions WHERE collection = ?", (collection,)).fetchone()
        version = int(row[0]) if row else 0
        cached = self._cache.get(collection)
        if cached is not None and cached[0] == version:
            return cached
        rows = conn.execute("SELECT id, dim, vector, text, metadata FROM cp_vectors WHERE collection = ?",
                            (collection,)).fetchall()
        if rows:
            dims = {r[1] for r in rows}
            if len(dims) > 1:
                raise UsageError(f"collection {collection!r} mixes vector sizes {sorted(dims)}; use one embedder "
                                 "per collection")
            matrix = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.float32).reshape(len(rows), rows[0][1])
        else:
            matrix = np.zeros((0, 0), dtype=np.float32)
        loaded = (version, [r[0] for r in rows], matrix, [r[3] for r in rows], [json.loads(r[4]) for r in rows])
        self._cache[collection] = loaded
        return loaded

    @override
    async def search(self, collection: str, vector: Sequence[float], *, k: int = 5, where: Where | None = None,
                     min_score: float | None = None) -> list[SearchHit]:
        check_where(where)

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            _, ids, matrix, texts, metas = self._load(conn, collection)
            if where:
                keep = [i for i, m in enumerate(metas) if matches(m, where)]
                sub = matrix[keep] if keep else np.zeros((0, matrix.shape[1] if matrix.ndim == 2 else 0))
                return [SearchHit(ids[keep[i]], s, texts[keep[i]], metas[keep[i]])
                        for i, s in _top(sub, vector, k, min_score)]
            return [SearchHit(ids[i], s, texts[i], metas[i]) for i, s in _top(matrix, vector, k, min_score)]

        hits: list[SearchHit] = await self._run(op)
        return hits

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        sql_where, params = _json_where(where)
        clause = " AND ".join(["collection = ?", *sql_where])
        return int(await self._run(lambda conn: conn.execute(f"SELECT COUNT(*) FROM cp_vectors WHERE {clause}",
                                                              [collection, *params]).fetchone()[0]))

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
