"""`PgVectorStore`: vectors in PostgreSQL with pgvector (HNSW, cosine), for many workers on many machines.

Each collection is a table ``<table>_<collection>`` created on first use with the dimension of
its first vectors and an HNSW index (``vector_cosine_ops``); metadata is JSONB. Filtered searches
use pgvector's iterative index scans, so a selective filter still returns up to `k` matches.

Keyword search uses PostgreSQL's full-text search: a generated ``tsvector`` column (``english``
configuration: stemming, stopwords) over each record's `keywords` with a GIN index, ranked by BM25
(term rarity from the matching records' document frequencies, length-normalised; each word counted
once per record).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from .._compat import override
from ..errors import StoreError, UsageError
from .base import SearchHit, VectorRecord, VectorStore, Where, check_where, searched_terms

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PgVectorStore"]

_NAME_RE: Final = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
_K1, _B = 1.2, 0.75


@contextlib.asynccontextmanager
async def _sizes(collection: str) -> AsyncIterator[None]:
    """Turn pgvector's refusal of a vector of another size than the collection's into a `UsageError`."""
    import asyncpg

    try:
        yield
    except asyncpg.DataError as e:
        if not re.match(r"(expected \d+ dimensions, not \d+|different vector dimensions \d+ and \d+)", str(e)):
            raise
        raise UsageError(f"collection {collection!r} holds vectors of another size ({e}); use one embedder per "
                         "collection") from None


def _vector(values: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


class PgVectorStore(VectorStore):
    """Vectors in PostgreSQL + pgvector; give a DSN or an ``asyncpg`` pool."""

    def __init__(self, dsn: str | None = None, *, pool: asyncpg.Pool | None = None, table: str = "contextpipe_vectors",
                 ef_search: int = 100) -> None:
        if (dsn is None) == (pool is None):
            raise UsageError("PgVectorStore needs exactly one of dsn=... or pool=...")
        if not _NAME_RE.match(table):
            raise UsageError(f"invalid table name {table!r}: lowercase letters, digits and '_'")
        self._dsn, self._pool, self._owns = dsn, pool, pool is None
        self.table = table
        self.ef_search = ef_search
        self._ready: set[str] = set()

    async def _get_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                import asyncpg
            except ImportError as exc:
                raise UsageError('PgVectorStore needs asyncpg: pip install "contextpipe[postgres]"') from exc
            try:
                self._pool = await asyncpg.create_pool(self._dsn, min_size=1, max_size=8)
                async with self._pool.acquire() as conn:
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except (OSError, asyncpg.PostgresError) as exc:
                raise StoreError(f"cannot use pgvector at the given DSN: {exc}", backend="pgvector") from exc
        return self._pool

    def _name(self, collection: str) -> str:
        if not _NAME_RE.match(collection):
            raise UsageError(f"invalid collection name {collection!r}: lowercase letters, digits and '_'")
        return f"{self.table}_{collection}"

    async def _exists(self, conn: asyncpg.Connection, name: str) -> bool:
        if name in self._ready:
            return True
        found = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name)
        if found:
            has_keywords = await conn.fetchval(
                "SELECT count(*) = 2 FROM information_schema.columns WHERE table_name = $1 "
                "AND column_name IN ('keywords', 'tsv')", name)
            if not has_keywords:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", name)
                    await self._add_keywords(conn, name)
            self._ready.add(name)
        return bool(found)

    @override
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        if not records:
            return
        name = self._name(collection)
        dim = len(records[0].vector)
        if any(len(r.vector) != dim for r in records):
            raise UsageError("all vectors of one upsert must have the same dimension")
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            if not await self._exists(conn, name):
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", name)
                await conn.execute(f"CREATE TABLE IF NOT EXISTS {name} (id TEXT PRIMARY KEY, embedding vector({dim}) "
                                   "NOT NULL, text TEXT NOT NULL, metadata JSONB NOT NULL)")
                await conn.execute(f"CREATE INDEX IF NOT EXISTS {name}_hnsw ON {name} "
                                   "USING hnsw (embedding vector_cosine_ops)")
                await conn.execute(f"CREATE INDEX IF NOT EXISTS {name}_meta ON {name} USING gin (metadata)")
                await self._add_keywords(conn, name)
                self._ready.add(name)
            async with _sizes(collection):
                await conn.executemany(
                    f"INSERT INTO {name} (id, embedding, text, metadata, keywords) "
                    "VALUES ($1, $2::vector, $3, $4::jsonb, $5) "
                    "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, text = EXCLUDED.text, "
                    "metadata = EXCLUDED.metadata, keywords = EXCLUDED.keywords",
                    [(r.id, _vector(r.vector), r.text, json.dumps(dict(r.metadata), default=str),
                      r.text if r.keywords is None else r.keywords) for r in records])

    @staticmethod
    async def _add_keywords(conn: asyncpg.Connection, name: str) -> None:
        """Add the keyword column and its index (to tables made before keyword search existed too)."""
        await conn.execute(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS keywords TEXT")
        await conn.execute(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS tsv tsvector GENERATED ALWAYS AS "
                           "(to_tsvector('english', coalesce(keywords, text))) STORED")
        await conn.execute(f"CREATE INDEX IF NOT EXISTS {name}_tsv ON {name} USING gin (tsv)")

    @staticmethod
    def _filter(where: Where | None, start: int) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for key, value in (where or {}).items():
            # None stands for no value: the key missing or null.
            empty = f"coalesce(metadata -> '{key}', 'null'::jsonb) = 'null'::jsonb"
            if isinstance(value, list | tuple | set | frozenset):
                marks = []
                for v in value:
                    if v is not None:
                        params.append(json.dumps(v))
                        marks.append(f"${start + len(params)}::jsonb")
                clause = f"metadata -> '{key}' IN ({', '.join(marks)})" if marks else "false"
                clauses.append(f"({clause} OR {empty})" if len(marks) < len(value) else clause)
            elif value is None:
                clauses.append(empty)
            else:
                params.append(json.dumps({key: value}))
                clauses.append(f"metadata @> ${start + len(params)}::jsonb")
        return (" AND ".join(clauses) or "true"), params

    @override
    async def delete(self, collection: str, *, ids: Sequence[str] | None = None, where: Where | None = None) -> int:
        check_where(where)
        if (ids is None and where is None) or (ids is not None and not ids):
            return 0
        name = self._name(collection)
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            if not await self._exists(conn, name):
                return 0
            clause, params = self._filter(where, 1 if ids is not None else 0)
            if ids is not None:
                clause = f"id = ANY($1::text[]) AND {clause}"
                params = [list(ids), *params]
            status = await conn.execute(f"DELETE FROM {name} WHERE {clause}", *params)
            return int(str(status).split()[-1])

    @override
    async def vector_search(self, collection: str, vector: Sequence[float], *, k: int = 5,
                            where: Where | None = None, min_score: float | None = None) -> list[SearchHit]:
        check_where(where)
        name = self._name(collection)
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            if not await self._exists(conn, name):
                return []
            await conn.execute(f"SET LOCAL hnsw.ef_search = {int(self.ef_search)}")
            await conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            clause, params = self._filter(where, 2)
            async with _sizes(collection):
                rows = await conn.fetch(
                    f"SELECT id, text, metadata::text AS metadata, 1 - (embedding <=> $1::vector) AS score "
                    f"FROM {name} WHERE {clause} ORDER BY embedding <=> $1::vector LIMIT $2", _vector(vector), k,
                    *params)
        hits = [SearchHit(r["id"], float(r["score"]), r["text"], json.loads(r["metadata"])) for r in rows]
        hits.sort(key=lambda h: -h.score)  # relaxed order: restore exact order of the returned rows
        return [h for h in hits if min_score is None or h.score >= min_score]

    @override
    async def keyword_search(self, collection: str, text: str, *, k: int = 5,
                             where: Where | None = None) -> list[SearchHit]:
        if not (terms := searched_terms(text, k, where)):
            return []
        name = self._name(collection)
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            if not await self._exists(conn, name):
                return []
            clause, params = self._filter(where, 1)
            # Each word as a query of its own (stopwords drop out), with how many matching records hold it.
            stats = await conn.fetch(
                f"WITH words AS (SELECT DISTINCT plainto_tsquery('english', w) AS q FROM unnest($1::text[]) w), "
                f"terms AS (SELECT q FROM words WHERE numnode(q) > 0) "
                f"SELECT q::text AS q, (SELECT count(*) FROM {name} WHERE tsv @@ terms.q AND {clause}) AS n "
                f"FROM terms", terms, *params)
            stats = [s for s in stats if s["n"] > 0]
            if not stats:
                return []
            clause, params = self._filter(where, 0)
            total, average = await conn.fetchrow(
                f"SELECT count(*), coalesce(avg(length(tsv)), 1) FROM {name} WHERE {clause}", *params)
            # BM25 with each word counted once: sum of the present words' idf, length-normalised.
            start = 1 + len(params)
            queries = [s["q"] for s in stats]
            idfs = [math.log(1 + (int(total) - s["n"] + 0.5) / (s["n"] + 0.5)) for s in stats]
            present = " + ".join(f"(CASE WHEN tsv @@ ${start + 2 * i}::tsquery THEN ${start + 2 * i + 1}::float8 "
                                 f"ELSE 0 END)" for i in range(len(stats)))
            any_ = " || ".join(f"${start + 2 * i}::tsquery" for i in range(len(stats)))
            args: list[Any] = []
            for q, idf in zip(queries, idfs, strict=True):
                args += [q, idf]
            rows = await conn.fetch(
                f"SELECT id, text, metadata::text AS metadata, ({present}) * {(_K1 + 1)} / "
                f"(1 + {_K1} * (1 - {_B} + {_B} * length(tsv) / {float(average)})) AS score FROM {name} "
                f"WHERE tsv @@ ({any_}) AND {clause} ORDER BY score DESC, id LIMIT ${start + 2 * len(stats)}",
                *params, *args, k)
        return [SearchHit(r["id"], float(r["score"]), r["text"], json.loads(r["metadata"])) for r in rows]

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        name = self._name(collection)
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            if not await self._exists(conn, name):
                return 0
            clause, params = self._filter(where, 0)
            return int(await conn.fetchval(f"SELECT COUNT(*) FROM {name} WHERE {clause}", *params))

    @override
    async def records(self, collection: str, *, where: Where | None = None) -> list[SearchHit]:
        check_where(where)
        name = self._name(collection)
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            if not await self._exists(conn, name):
                return []
            clause, params = self._filter(where, 0)
            rows = await conn.fetch(f"SELECT id, text, metadata::text AS metadata FROM {name} WHERE {clause} "
                                    "ORDER BY id", *params)
        return [SearchHit(r["id"], 0.0, r["text"], json.loads(r["metadata"])) for r in rows]

    @override
    async def close(self) -> None:
        if self._pool is not None and self._owns:
            await self._pool.close()
            self._pool = None
