"""`SQLiteVectorStore`: the embedded vector store — SQLite rows, an HNSW index (usearch), FTS5 keywords.

SQLite is the source of truth. Every record is a row of ``cp_vectors`` (in the same file as the
sessions with `SQLiteStore.vectors()`, so deleting a session's rows, by any means, deletes its
memories). Triggers keep two things in step inside the same transaction as the row: the
collection's own FTS5 keyword index (``_keywords``) and a change log (``cp_vector_changes``: which
row keys changed, in order). Each process keeps one usearch HNSW index per collection in memory
(``_hnsw``), tagged with the last change it reflects; before every search it applies the changes
logged since (its own and other processes'), reading the rows back from SQLite, so a crash at any
point can neither lose a committed vector nor bring back a deleted one. (The log is read only when
SQLite's ``data_version`` shows that another connection committed, or after this store's own
writes.) The index holds 8-bit copies of the vectors; a search takes a few dozen candidates from it
(a few hundred in a collection of millions) and scores them exactly against the float32 vectors held
beside it, so scores are exact cosine similarities. Beside the index each record's id, text and
metadata are held too, so a search reads nothing from SQLite but ``data_version``.
The index is saved next to the database file (``<file>.vectors/``, named by the change it reflects)
when the store closes, so the next process loads it and applies only newer changes; a missing, stale
(its changes pruned) or unreadable file is rebuilt from the rows.

A search (filtered to at most 256 records, or not filtered), and an upsert of a few records under
``synchronous=NORMAL``, runs on the calling thread when the index is up to date and the connection
idle (an upsert also needs SQLite's write lock free at once): handing it to the store's worker thread
and back would cost more than the work. Whatever may wait — another writer's lock, a catch-up,
saving the index, a WAL checkpoint, an fsync — runs on the worker thread (this connection
checkpoints the WAL there itself, every few hundred records). Such an upsert returns once its rows
are committed: its records are held beside the index at once, and every search scores them exactly
until the worker thread adds them to the HNSW graph (most of an upsert's work), as soon as the
caller gives the event loop back (upserts made back to back until then go in together). Saving the
index adds them first, so a saved file holds every change it is named by; a crash before they are
added loses nothing, since the rows are in SQLite.

A small collection (``scan_limit``: about 4 MB of 8-bit vectors, 10,000 of 384 dimensions) is
searched by scanning every vector of the index instead of walking its graph: a graph walk through a
few thousand records finds only about 90% of the true top 10 (clustered vectors: the rest of the top
10 lies in other clusters), a scan finds them all, for about half a millisecond more at 10,000.

Metadata filters are answered from in-memory postings; a filter that keeps few records
(``exact_limit``) is searched exactly over just those vectors, a larger one by searching the HNSW
index deeper (or scanning it) until `k` of them are found.

Each collection checks its own recall now and then, in the background (`target_recall`, 0.98 by
default): it deepens or shallows its graph walk to hold the target, or scans where no affordable
depth reaches it; `stats` reports the estimate and the depth (`_recall`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from .._compat import override
from .._sqlite import OpenedFile, opened_file, refuse_other_applications, use_wal
from ..errors import UsageError
from . import _keywords
from ._hnsw import (
    CHECKPOINT_RECORDS,
    PENDING_MAX,
    QUICK_RECORDS,
    QUICK_SUBSET,
    CollectionIndex,
    Indexes,
    IndexSearch,
    WorkerThread,
)
from ._recall import TARGET_RECALL, IndexStats, Tuners, check_later, nearest, scan_records
from ._sql import json_where, statements
from .base import SearchHit, VectorRecord, VectorStore, Where, check_where, searched_terms

if TYPE_CHECKING:
    from ..session import SessionKey


__all__ = ["SQLiteVectorStore"]


class DeletesSessions(Protocol):
    """What `SQLiteVectorStore.forget_sessions_deleted_by` needs of a session store (`SessionStore` has it)."""

    def on_session_deleted(self, hook: Callable[[SessionKey], Awaitable[None]]) -> Callable[[], None]:
        """Call `hook` with the key of every session the store deletes; return a function that unregisters it."""
        ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS cp_vectors (
    key INTEGER PRIMARY KEY AUTOINCREMENT,
    collection TEXT NOT NULL,
    id TEXT NOT NULL,
    dim INTEGER NOT NULL,
    vector BLOB NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    keywords TEXT NOT NULL DEFAULT '',
    UNIQUE (collection, id)
);
CREATE TABLE IF NOT EXISTS cp_vector_keywords (collection TEXT PRIMARY KEY, number INTEGER NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS cp_vector_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, collection TEXT NOT NULL, key INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS cp_vector_changes_by_collection ON cp_vector_changes (collection, seq);
CREATE TABLE IF NOT EXISTS cp_vector_pruned (collection TEXT PRIMARY KEY, below INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS cp_vector_changes_insert AFTER INSERT ON cp_vectors BEGIN
    INSERT INTO cp_vector_changes (collection, key) VALUES (new.collection, new.key);
END;
CREATE TRIGGER IF NOT EXISTS cp_vector_changes_delete AFTER DELETE ON cp_vectors BEGIN
    INSERT INTO cp_vector_changes (collection, key) VALUES (old.collection, old.key);
END;
CREATE TRIGGER IF NOT EXISTS cp_vector_changes_update AFTER UPDATE ON cp_vectors BEGIN
    INSERT INTO cp_vector_changes (collection, key) SELECT old.collection, old.key
        WHERE old.collection IS NOT new.collection;
    INSERT INTO cp_vector_changes (collection, key) VALUES (new.collection, new.key);
END
"""

Prepared = tuple[str, str, int, bytes, str, str, str]
"""A record ready to insert: its collection, id, vector size, float32 vector, text, metadata (JSON), keywords."""


def _unit(vector: Sequence[float]) -> np.ndarray[Any, Any]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.sqrt(array @ array)) if array.ndim == 1 else float(np.linalg.norm(array))
    return array / norm if norm > 0 else array


class SQLiteVectorStore(VectorStore):
    """Vectors in a SQLite file with an HNSW index (usearch) and FTS5 keyword search.

    Made by `SQLiteStore.vectors()` (same file as the sessions) or directly. `exact_limit`: a metadata
    filter keeping at most this many records is searched exactly. `target_recall`: the share of the true
    top k each collection holds its walks to, checking itself in the background (``None``: no checks).
    `scan_limit`: a collection of at most this many records is searched by scanning all its (8-bit)
    vectors instead of walking the HNSW graph, then re-scoring the best exactly (default: as many as
    4 MB holds, 10,416 of 384 dimensions; 0 always walks the graph). `index_dir` is where the HNSW indexes
    are saved (default: ``<path>.vectors`` next to the database; ``None`` for a ``:memory:`` database).
    `synchronous` is SQLite's durability setting: ``NORMAL`` keeps every committed write through a
    process crash (WAL), ``FULL`` also through a power loss, at an fsync per write.
    A file holding another application's tables and no contextpipe data is refused (a `StoreError`)
    unless `allow_other_tables`.

    Each collection has a keyword index of its own (an FTS5 table, and three triggers that every
    write to the file checks): keep per-user or per-tenant records in one collection with metadata
    filters rather than a collection each.
    """

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0, exact_limit: int = 4096,
                 scan_limit: int | None = None, index_dir: str | Path | None = None,
                 synchronous: Literal["NORMAL", "FULL"] = "NORMAL", allow_other_tables: bool = False,
                 target_recall: float | None = TARGET_RECALL) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise UsageError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.synchronous = synchronous
        self.path = str(path)
        self.allow_other_tables = allow_other_tables
        """Whether the store may add its tables to a file that holds another application's tables."""
        self.exact_limit = exact_limit
        self.scan_limit = scan_limit
        self._tuners = Tuners(target_recall)
        self._busy_ms = int(busy_timeout * 1000)
        self._conn: sqlite3.Connection | None = None
        self._file: OpenedFile | None = None  # the file opened (each commit checks it is still at the path)
        self._worker = WorkerThread(self._connection)
        self._executor = self._worker.executor
        memory = self.path == ":memory:" or self.path.startswith("file::memory:")
        default = None if memory else Path(self.path + ".vectors")
        self._indexes = Indexes(Path(index_dir) if index_dir is not None else default)
        self._cache = self._indexes.cache  # collection -> its index (the same dict)
        self._index_search = IndexSearch()
        self._keyword_tables = _keywords.KeywordTables()
        self._unchecked = 0  # records written by this connection since its last WAL checkpoint
        self._checkpoint_queued = False

    @property
    def index_dir(self) -> Path | None:
        """Where the HNSW indexes are saved (``None``: they are not)."""
        return self._indexes.index_dir

    @index_dir.setter
    def index_dir(self, value: Path | None) -> None:
        self._indexes.index_dir = value

    # --- connection, and where work runs -----------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            if not self.allow_other_tables:
                try:
                    refuse_other_applications(conn, self.path)
                except BaseException:
                    conn.close()
                    raise
            use_wal(conn, self._busy_ms)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # (`_checkpoint_when_due`, on the worker thread)
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in statements(_SCHEMA):
                    conn.execute(statement)
            except BaseException:
                conn.execute("ROLLBACK")
                conn.close()
                raise
            conn.execute("COMMIT")
            self._file = opened_file(conn, self.path)
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(connection, *args)`` on the worker thread and return what it returns."""
        self._refuse_lost_file()
        return await self._worker.run(fn, *args)

    def _refuse_lost_file(self) -> None:
        """Raise `StoreError` once a commit found the file deleted, replaced or moved (`OpenedFile`)."""
        if self._file is not None:
            self._file.refuse()

    def _check_file(self) -> None:
        """Before and after each commit: the file at the path must still be the one opened, or the write is refused."""
        if self._file is not None:
            self._file.check()

    def _queue_on_worker(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        """Run ``fn(connection)`` on the worker thread later, dropping its SQLite and file errors."""
        self._worker.later(fn, lambda: None if self._file is not None and self._file.lost else self._conn)

    def _on_calling_thread(self, collection: str,
                           fn: Callable[[sqlite3.Connection, CollectionIndex], Any]) -> Any:
        """Run the read ``fn(connection, collection's index)`` on the calling thread when it cannot take long.

        Return ``None`` (without running it) otherwise; `fn` returns ``None`` itself when its work turns
        out not to be cheap (a filter keeping many records).

        That is when the connection is idle and `collection`'s index is up to date (no catch-up, which
        may read many rows): an unfiltered search, or one filtered to a few hundred records, is then a
        fraction of a millisecond, less than handing it to the worker thread and back costs on a busy
        machine.
        """
        self._refuse_lost_file()
        if self._conn is None or not self._worker.take_lock():
            return None
        try:
            cached = self._cache.get(collection)
            conn = self._conn
            if conn is None or cached is None or cached.version != conn.execute("PRAGMA data_version").fetchone()[0]:
                return None
            return fn(conn, cached)  # (found up to date just now)
        finally:
            self._worker.lock.release()

    # --- writes ------------------------------------------------------------------------------------

    @override
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        if not records:
            return
        prepared = [(collection, r.id, *self._encode(r)) for r in records]
        dims = {p[2] for p in prepared}
        if len(dims) > 1:
            raise UsageError(f"one upsert mixes vector sizes {sorted(dims)}; use one embedder per collection")
        if len(prepared) <= QUICK_RECORDS and self.synchronous == "NORMAL" and self._conn is not None \
                and self._worker.take_lock():
            try:
                if self._conn is not None and self._write(self._conn, collection, prepared, dims, calling_thread=True):
                    return
            finally:
                self._worker.lock.release()
        await self._run(lambda conn: self._write(conn, collection, prepared, dims, calling_thread=False))

    def _write(self, conn: sqlite3.Connection, collection: str, prepared: list[Prepared], dims: set[int],
               calling_thread: bool) -> bool:
        """Commit `prepared` rows, then bring the index up to date; return whether it was done.

        On the `calling_thread` nothing is done and ``False`` returned unless the index is up to date
        and the write lock is free at once.
        """
        cached = self._cache.get(collection)
        version = cached.version if cached is not None else None
        current = self._begin(conn, collection, cached, version, calling_thread)
        if current is None:
            return False
        try:
            logged = self._insert(conn, collection, prepared, dims, cached if current else None)
            self._check_file()  # (and after the commit: a write into a file taken away is rolled back here)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._check_file()
        self._checkpoint_when_due(conn, len(prepared), calling_thread)
        if cached is None:
            return True
        if not current or len(logged) != len(prepared):  # (one change per record: else read them back)
            self._indexes.sync(conn, collection)  # the index follows the file, not the other way round
            return True
        try:
            self._put_own(conn, collection, cached, prepared, logged, calling_thread)
        except BaseException:
            self._cache.pop(collection, None)  # rebuilt (or loaded) from the file by the next search
            raise
        cached.version = version  # own commits leave ``data_version`` as it was
        return True

    def _begin(self, conn: sqlite3.Connection, collection: str, cached: CollectionIndex | None, version: int | None,
               calling_thread: bool) -> bool | None:
        """Begin the write transaction; return whether the index is current (``None``: on the calling thread, not now).

        The index is current when no other connection committed since it was last found so (this one
        holds the write lock now): then the changes the transaction logs are the only ones it lacks,
        and it takes them from the rows written instead of reading them back.
        """
        if calling_thread:
            if cached is None or version is None or not cached.records or not self._begin_at_once(conn, version):
                return None
            self._indexes.writing(collection)
            return True
        self._indexes.writing(collection)
        conn.execute("BEGIN IMMEDIATE")
        try:
            return (cached is not None and version is not None and bool(cached.records)
                    and conn.execute("PRAGMA data_version").fetchone()[0] == version)
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _begin_at_once(self, conn: sqlite3.Connection, version: int) -> bool:
        """Begin a write transaction if the lock is free now and no other connection committed since `version`."""
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:  # another connection is writing: wait for it on the worker thread
            return False
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        if conn.execute("PRAGMA data_version").fetchone()[0] != version:  # another connection committed
            conn.execute("ROLLBACK")
            return False
        return True

    def _insert(self, conn: sqlite3.Connection, collection: str, prepared: list[Prepared], dims: set[int],
                current: CollectionIndex | None) -> list[tuple[int, int]]:
        """Insert or replace the rows (in the open transaction); return the changes logged since `current`'s."""
        self._keyword_tables.table(conn, collection, create=True)
        held = current.dim if current is not None else None
        if held is None:
            row = conn.execute("SELECT dim FROM cp_vectors WHERE collection = ? LIMIT 1", (collection,)).fetchone()
            held = None if row is None else row[0]
        if held is not None and held not in dims:
            raise UsageError(f"collection {collection!r} holds {held}-dimension vectors, these have "
                             f"{dims.pop()}; use one embedder per collection")
        conn.executemany(
            "INSERT INTO cp_vectors (collection, id, dim, vector, text, metadata, keywords) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (collection, id) DO UPDATE SET dim = excluded.dim, "
            "vector = excluded.vector, text = excluded.text, metadata = excluded.metadata, "
            "keywords = excluded.keywords", prepared)
        if current is None:
            return []
        return conn.execute("SELECT seq, key FROM cp_vector_changes WHERE collection = ? AND seq > ? ORDER BY seq",
                            (collection, current.seq)).fetchall()

    def _put_own(self, conn: sqlite3.Connection, collection: str, cached: CollectionIndex,
                 prepared: list[Prepared], logged: list[tuple[int, int]], calling_thread: bool) -> None:
        """Apply this connection's own committed rows (`prepared`, logged as `logged`) to the index.

        On the `calling_thread` the rows are held and searched exactly at once, and added to the HNSW
        graph on the worker thread (`WorkerThread.flush`) as soon as the caller next waits: the graph
        insert is most of an upsert's work, and the caller need not wait for it. With `PENDING_MAX`
        rows held already (the worker thread kept busy), such an upsert adds its own rows to the graph
        itself; an upsert on the worker thread adds every held row.
        """
        rows = {key: (key, p[1], p[2], p[3], p[4], p[5]) for (_, key), p in zip(logged, prepared, strict=True)}
        defer = calling_thread and len(cached.pending) + len(rows) <= PENDING_MAX
        cached.put(list(rows.values()), defer=defer)  # (a record given twice: the last one, as in the file)
        if not calling_thread:  # (and those of upserts on the calling thread before, when here first)
            cached.flush()
        cached.seq = logged[-1][0]
        cached.changed += len(logged)
        cached.dirty = True
        if calling_thread and cached.pending and not cached.flush_queued:
            cached.flush_queued = True
            # Once the caller gives the event loop back: upserts made back to back until then go into
            # the graph together, and none of them meets the graph insert of the one before.
            asyncio.get_running_loop().call_soon(
                self._queue_on_worker, lambda c: self._worker.flush(self._indexes, collection, cached))
        if not calling_thread:
            self._indexes.maybe_save(conn, collection, cached)
        elif self._indexes.save_due(cached):  # (writing the whole index: not on the calling thread)
            self._queue_on_worker(lambda c: self._indexes.maybe_save(c, collection, self._cache.get(collection)))

    def _checkpoint_when_due(self, conn: sqlite3.Connection, records: int, calling_thread: bool) -> None:
        """After a commit of `records` rows: checkpoint the WAL when due (on the worker thread, later if not on it)."""
        self._unchecked += records
        if self._unchecked < CHECKPOINT_RECORDS:
            return
        if calling_thread:
            if not self._checkpoint_queued:
                self._checkpoint_queued = True
                self._queue_on_worker(self._checkpoint)
        else:
            self._checkpoint(conn)

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        self._unchecked, self._checkpoint_queued = 0, False
        with contextlib.suppress(sqlite3.Error):  # the write is saved already; the next one is due soon
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # (never waits for other connections)

    @staticmethod
    def _encode(record: VectorRecord) -> tuple[int, bytes, str, str, str]:
        vector = _unit(record.vector)
        if vector.ndim != 1 or vector.shape[0] == 0:
            raise UsageError(f"record {record.id!r}: a vector must be a non-empty list of numbers")
        meta = json.dumps(dict(record.metadata), ensure_ascii=False, default=str)
        keywords = record.text if record.keywords is None else record.keywords
        return int(vector.shape[0]), vector.tobytes(), record.text, meta, keywords

    @override
    async def delete(self, collection: str, *, ids: Sequence[str] | None = None, where: Where | None = None) -> int:
        check_where(where)
        if (ids is None and where is None) or (ids is not None and not ids):
            return 0
        clauses, params = ["collection = ?"], [collection]
        if ids is not None:
            clauses.append(f"id IN ({','.join('?' * len(ids))})")
            params += list(ids)
        sql_where, sql_params = json_where(where)
        clauses += sql_where
        params += sql_params

        def op(conn: sqlite3.Connection) -> int:
            self._indexes.writing(collection)
            conn.execute("BEGIN IMMEDIATE")
            try:
                n = conn.execute(f"DELETE FROM cp_vectors WHERE {' AND '.join(clauses)}", params).rowcount
                self._check_file()
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            self._check_file()
            self._checkpoint_when_due(conn, n, calling_thread=False)
            if collection in self._cache:
                self._indexes.sync(conn, collection)
            return int(n)

        return int(await self._run(op))

    # --- searches ----------------------------------------------------------------------------------

    @override
    async def vector_search(self, collection: str, vector: Sequence[float], *, k: int = 5,
                            where: Where | None = None, min_score: float | None = None) -> list[SearchHit]:
        check_where(where)
        q = _unit(vector)

        def search(c: CollectionIndex, subset: set[int] | None) -> list[SearchHit]:
            if c.index is None or not c.records or k <= 0:
                return []
            if q.shape[0] != c.dim:
                raise UsageError(f"query vector has {q.shape[0]} dimensions, the collection {c.dim}")
            records, tuner = c.records, self._tuners[collection]
            walked = len(records) > scan_records(c, self.scan_limit)
            found = nearest(c, q, k, subset, exact_limit=self.exact_limit, scan_limit=self.scan_limit,
                            search=self._index_search, scale=tuner.scale, scan=tuner.scan)
            if subset is None and tuner.searched(q, k, len(records), walked) and self._tuners.schedule(collection):
                check_later(self._tuners, collection, self._queue_on_worker, self._cache.get, self._index_search,
                            self.scan_limit)
            return [SearchHit(r[0], s, r[1], r[2], vector_score=s) for key, s in found
                    if min_score is None or s >= min_score for r in (records[key],)]

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            c = self._indexes.sync(conn, collection)
            return search(c, c.keys_matching(where) if where else None)

        def small(conn: sqlite3.Connection, current: CollectionIndex) -> list[SearchHit] | None:
            subset = current.keys_matching(where) if where else None
            if subset is not None and len(subset) > min(QUICK_SUBSET, self.exact_limit):
                return None  # (not cheap: on the worker thread)
            return search(current, subset)

        hits: list[SearchHit] | None = self._on_calling_thread(collection, small)
        if hits is None:
            hits = await self._run(op)
        return hits

    async def stats(self, collection: str) -> IndexStats:
        """Return how `collection` is searched and how much of the true top k its searches find.

        The estimate comes from queries checked in the background since the store opened (those still
        waiting are checked first); ``None`` until one was, and right after the depth changed. A check
        scans the collection holding the store's lock (30 ms at 100,000 x 384): searches wait for it. Example:
        docs/guides/memory.md, "How much of the true top k a search finds".
        """
        def op(conn: sqlite3.Connection) -> IndexStats:
            cached = self._indexes.sync(conn, collection)
            self._tuners.drain(collection, cached, self._index_search, self.scan_limit)
            return self._tuners[collection].stats(cached, scan_records(cached, self.scan_limit))

        stats: IndexStats = await self._run(op)
        return stats

    @override
    async def keyword_search(self, collection: str, text: str, *, k: int = 5,
                             where: Where | None = None) -> list[SearchHit]:
        if not (terms := searched_terms(text, k, where)):
            return []
        query = _keywords.fts_query(terms)

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            table = self._keyword_tables.table(conn, collection)
            if table is None:  # (nothing was ever stored in it)
                return []
            if collection in self._cache:
                # From memory: 1.1 ms where the rows take 17.7 ms, at 50,000 records (bench/results/vectors.md).
                return _keywords.search_held(conn, self._indexes.sync(conn, collection), table, query, k, where)
            return _keywords.search_rows(conn, table, collection, query, k, where)

        hits: list[SearchHit] = await self._run(op)
        return hits

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        sql_where, params = json_where(where)
        clause = " AND ".join(["collection = ?", *sql_where])
        return int(await self._run(lambda conn: conn.execute(f"SELECT COUNT(*) FROM cp_vectors WHERE {clause}",
                                                              [collection, *params]).fetchone()[0]))

    @override
    async def erase_deleted(self, collection: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            table = self._keyword_tables.table(conn, collection)
            if table is not None:  # FTS5 keeps a deleted row's terms in its segments until they merge
                conn.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")

        await self._run(op)

    @override
    async def records(self, collection: str, *, where: Where | None = None) -> list[SearchHit]:
        check_where(where)
        sql_where, params = json_where(where)
        clause = " AND ".join(["collection = ?", *sql_where])
        rows = await self._run(lambda conn: conn.execute(
            f"SELECT id, text, metadata FROM cp_vectors WHERE {clause} ORDER BY id", [collection, *params]).fetchall())
        return [SearchHit(i, 0.0, text, json.loads(meta)) for i, text, meta in rows]

    async def save_indexes(self) -> None:
        """Save every collection's HNSW index that has changed (also done by `close`)."""
        def op(conn: sqlite3.Connection) -> None:
            for name, cached in list(self._cache.items()):
                if cached.dirty:
                    self._indexes.save(conn, name, cached)

        await self._run(op)

    def forget_sessions_deleted_by(self, sessions: DeletesSessions) -> None:
        """Delete a session's records whenever `sessions` deletes or expires it.

        Records whose metadata names the session (``tenant`` and ``session_id``), in any collection, are
        deleted through `delete` (so the HNSW and keyword indexes stay in step), from `sessions`'
        `on_session_deleted` hook. The hook opens the file itself, so it works after this instance is closed.
        """
        path, index_dir, synchronous = self.path, self.index_dir, self.synchronous

        async def hook(key: SessionKey) -> None:
            vectors = SQLiteVectorStore(path, index_dir=index_dir, synchronous=synchronous)
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
        def shut(conn: sqlite3.Connection) -> None:
            try:
                # (the indexes of a file no longer at the path are not saved beside the one there now)
                for name in [] if self._file is not None and self._file.lost else list(self._cache):
                    with contextlib.suppress(OSError, sqlite3.Error):
                        cached = self._indexes.sync(conn, name)
                        if cached.dirty:
                            self._indexes.save(conn, name, cached)
            finally:
                conn.close()
                self._conn = None

        if self._conn is not None:
            await self._worker.run(shut)
        self._executor.shutdown(wait=True)
