"""`SQLiteVectorStore`: the embedded vector store — SQLite rows, an HNSW index (usearch), FTS5 keywords.

SQLite is the source of truth. Every record is a row of ``cp_vectors`` (in the same file as the
sessions with `SQLiteStore.vectors()`, so deleting a session's rows, by any means, deletes its
memories). Triggers keep two things in step inside the same transaction as the row: the
collection's own FTS5 keyword index (``cp_keywords_<number>``: BM25's word statistics are the
collection's, whatever else the file holds) and a change log (``cp_vector_changes``: which row keys
changed, in order). Each process keeps one usearch HNSW index per collection in memory, tagged with
the last change it reflects; before every search it applies the changes logged since (its own and
other processes'), reading the rows back from SQLite, so a crash at any point can neither lose a
committed vector nor bring back a deleted one. (The log is read only when SQLite's ``data_version``
shows that another connection committed, or after this store's own writes.) The index holds 8-bit
copies of the vectors; a search takes a few dozen candidates from it (a few hundred in a collection
of millions) and scores them exactly against the float32 vectors held beside it, so scores are exact
cosine similarities.
Beside the index each record's id, text and metadata are held too (one entry per record, with its
float32 vector), so a search reads nothing from SQLite but ``data_version``.
The index is saved next to the database file (``<file>.vectors/``, named by the change it reflects)
when the store closes, so the next process loads it and applies only newer changes; a missing, stale
(its changes pruned) or unreadable file is rebuilt from the rows.

A search (filtered to at most 256 records, or not filtered), and an upsert of a few records under
``synchronous=NORMAL``, runs on the calling thread
when the index is up to date and the connection idle (an upsert also needs SQLite's write lock free
at once): handing it to the store's worker thread and back would cost more than the work. Whatever
may wait — another writer's lock, a catch-up, saving the index, a WAL checkpoint, an fsync — runs on
the worker thread (this connection checkpoints the WAL there itself, every few hundred records).
Such an upsert returns once its rows are committed: its records are held beside the index at once,
and every search scores them exactly until the worker thread adds them to the HNSW graph (most of an
upsert's work), as soon as the caller gives the event loop back (upserts made back to back until then
go in together). Saving the index adds them first, so a saved file holds every change it is named
by; a crash before they are added loses nothing, since the rows are in SQLite.

A small collection (``scan_limit``: about 4 MB of 8-bit vectors, 10,000 of 384 dimensions) is
searched by scanning every vector of the index instead of walking its graph: a graph walk through a
few thousand records finds only about 90% of the true top 10 (clustered vectors: the rest of the top
10 lies in other clusters), a scan finds them all, for about half a millisecond more at 10,000.

Metadata filters are answered from in-memory postings; a filter that keeps few records
(``exact_limit``) is searched exactly over just those vectors, a larger one by searching the HNSW
index deeper (or scanning it) until `k` of them are found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from typing_extensions import override

from .._sqlite import use_wal
from ..errors import UsageError
from .base import SearchHit, VectorRecord, VectorStore, Where, check_where, keyword_terms, matches

if TYPE_CHECKING:
    from ..session import SessionKey
    from ..stores.base import SessionStore

__all__ = ["SQLiteVectorStore"]

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
CREATE TABLE IF NOT EXISTS cp_vector_versions (collection TEXT PRIMARY KEY, version INTEGER NOT NULL);
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
END;
CREATE VIRTUAL TABLE IF NOT EXISTS cp_vectors_fts USING fts5(keywords, content='');
CREATE TRIGGER IF NOT EXISTS cp_vectors_inserted AFTER INSERT ON cp_vectors WHEN 0 BEGIN SELECT 1; END;
CREATE TRIGGER IF NOT EXISTS cp_vectors_deleted AFTER DELETE ON cp_vectors WHEN 0 BEGIN SELECT 1; END;
CREATE TRIGGER IF NOT EXISTS cp_vectors_updated AFTER UPDATE ON cp_vectors WHEN 0 BEGIN SELECT 1; END
"""

# Each collection has its own FTS5 table (``cp_keywords_<number>``, numbered in ``cp_vector_keywords``),
# so BM25's word statistics (how many records hold a word, how long they are) are the collection's
# own, whatever else the file holds; three triggers keep it in step with the collection's rows.
_KEYWORDS = """
CREATE VIRTUAL TABLE {t} USING fts5(
    keywords, content='cp_vectors', content_rowid='key', tokenize='porter unicode61 remove_diacritics 2');
CREATE TRIGGER {t}_insert AFTER INSERT ON cp_vectors WHEN new.collection = {c} BEGIN
    INSERT INTO {t} (rowid, keywords) VALUES (new.key, new.keywords);
END;
CREATE TRIGGER {t}_delete AFTER DELETE ON cp_vectors WHEN old.collection = {c} BEGIN
    INSERT INTO {t} ({t}, rowid, keywords) VALUES ('delete', old.key, old.keywords);
END;
CREATE TRIGGER {t}_update AFTER UPDATE ON cp_vectors WHEN old.collection = {c} OR new.collection = {c} BEGIN
    INSERT INTO {t} ({t}, rowid, keywords) SELECT 'delete', old.key, old.keywords WHERE old.collection = {c};
    INSERT INTO {t} (rowid, keywords) SELECT new.key, new.keywords WHERE new.collection = {c};
END
"""
# Earlier versions kept one FTS5 table for every collection (``cp_vectors_fts``, its content the rows),
# kept in step by the change log's triggers. Opening such a file replaces them with empty, inert objects
# of the same names (last in `_SCHEMA`): an earlier version that opens the file afterwards finds them
# there, so it cannot create its own again (whose triggers would fail every later update and delete,
# whoever made them); its keyword searches find nothing.
_SHARED_KEYWORDS = ("cp_vectors_fts", ("cp_vectors_inserted", "cp_vectors_deleted", "cp_vectors_updated"))

# The index holds 8-bit copies of the (unit) vectors: a quarter of the memory and the fastest distance
# kernels; each search takes candidates from it and re-scores them exactly from the float32 rows held
# beside it. Both the candidates and the search expansion grow with the collection (`_depth`): the
# denser the collection, the closer its nearest neighbours, and the more of the true top k the 8-bit
# distances rank below the first few dozen. Up to 100,000 records: 20 candidates (at least 2 k),
# expansion 40 to 50. At 100,000 x 384 expansion 50 finds 0.999 of the true top 10 (1,000 queries)
# whether its 8-bit top 20 or top 40 are re-scored, expansion 40 only 0.994 (and 0.995 at 30,000,
# again with 20 or 40 re-scored): the expansion finds them, and re-scoring 20 instead of 40 halves the
# float32 rows a search reads. At 1,000,000: 200 candidates, expansion 500 (bench/vector_bench.py,
# bench/ann_compare.py). The graph is built with expansion 64, which keeps an insert near half a
# millisecond (128 doubles it for no recall gain once candidates are re-scored; 40 saves a quarter of
# it but finds 0.982 of the true top 10 at 100,000), with connectivity 16 (12 or 8 find less at every
# search expansion, 24 costs more per search for the same recall).
_DTYPE, _CONNECTIVITY, _EXPANSION_ADD, _EXPANSION_SEARCH, _CANDIDATES = "i8", 16, 64, 40, 20
_RECORDS_PER_CANDIDATE, _RECORDS_PER_EXPANSION, _EXPANSION_MAX = 5000, 2000, 1024
# Up to this many bytes of 8-bit vectors a search scans them all (usearch's exhaustive search, SIMD)
# instead of walking the graph. The two cost the same near 2,000 x 384 (0.2 ms of CPU for the index
# alone); at 10,000 a scan costs 0.55 ms and finds the whole true top 10, a walk 0.3 ms and finds 0.93
# of it (clustered vectors), and from about 25,000 the walk finds 0.99 at a fraction of a scan's cost
# (1.7 ms at 20,000). So: a scan up to about 10,000 x 384, where a search through the store costs
# about half a millisecond more than with a walk, for the whole top 10 instead of nine tenths of it.
_SCAN_BYTES = 4_000_000
# An upsert of at most this many records, with ``synchronous=NORMAL`` (no fsync at commit), into an
# index that is up to date runs on the calling thread when the connection is idle and no other
# connection holds the write lock: a fraction of a millisecond per record, less than handing it to the
# worker thread and back costs. It never waits there: a busy file, a stale index (catching up may read
# many rows), a save of the index or a WAL checkpoint (fsyncs) go to the worker thread.
_QUICK_RECORDS = 4
# A search filtered to at most this many records (scored exactly) runs on the calling thread too, as an
# unfiltered one does: about as much work (their float32 rows read once), less than the hand-off.
_QUICK_SUBSET = 256
# A quick upsert's records are added to the HNSW graph on the worker thread after it returns (searches
# score them exactly meanwhile); with this many waiting (the worker thread kept busy), a quick upsert
# adds its own to the graph itself, so a search never scores more than this many besides the graph's.
_PENDING_MAX = 256
# How long work for the calling thread may wait for the worker thread to finish adding a few records
# to a graph (`_take_lock`): far longer than that takes (well under a millisecond per record).
_FLUSH_WAIT = 0.005
# This connection checkpoints the WAL itself, on the worker thread, after this many records written
# (instead of SQLite's automatic checkpoint at 1,000 pages, which a commit on the calling thread would
# wait for): about the same amount of WAL for one-record upserts.
_CHECKPOINT_RECORDS = 200


def _depth(size: int, k: int) -> tuple[int, int]:
    """Return the search expansion and the number of candidates to re-score, for `size` records and top `k`."""
    candidates = max(_CANDIDATES, 2 * k, size // _RECORDS_PER_CANDIDATE)
    return max(_EXPANSION_SEARCH, min(_EXPANSION_MAX, size // _RECORDS_PER_EXPANSION), candidates), candidates


# Changes applied (a rebuild, a long catch-up, many upserts) worth saving the index for: at least 20,000
# and a quarter of the collection, so saving (which writes the whole index) costs a bounded share of
# the inserts however large the collection grows, and a crash leaves at most that much to catch up.
_SAVE_AFTER, _SAVE_SHARE = 20_000, 4


def _unit(vector: Sequence[float]) -> np.ndarray[Any, Any]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.sqrt(array @ array)) if array.ndim == 1 else float(np.linalg.norm(array))
    return array / norm if norm > 0 else array


def _index_keys(index: Any, q: np.ndarray[Any, Any], count: int, exact: bool) -> list[int]:
    """Return the keys of the `count` vectors of the usearch `index` nearest to `q` (with `exact`: a scan).

    Through usearch's compiled search when it has the shape this was written against: its Python
    wrapper builds result objects a search does not need (about 30 µs, a twentieth of a search at
    100,000 records); through the public `Index.search` otherwise.
    """
    global _direct
    search_many = getattr(getattr(index, "_compiled", None), "search_many", None) if _direct else None
    if search_many is not None:
        try:
            if not _unknown:
                from usearch.compiled import ScalarKind

                _unknown.append(ScalarKind.Unknown)
            keys, _, counts = search_many(q.reshape(1, -1), count=count, exact=exact, threads=1,
                                          dtype=_unknown[0])[:3]
            return list(keys[0, :int(counts[0])].tolist())
        except (ImportError, AttributeError, TypeError, ValueError, IndexError):  # another usearch
            _direct = False
    return list(index.search(q, count, threads=1, exact=exact).keys.tolist())


_direct = True  # `_index_keys` may call usearch's compiled search (until it fails once)
_unknown: list[Any] = []  # usearch's ``ScalarKind.Unknown`` (the query's own dtype), once imported


def _hashable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


_Record = tuple[str, str, dict[str, Any], bytes]
"""A record as held beside the index: its id, text, metadata and float32 vector (the row's own blob)."""


class _Collection:
    """One collection's HNSW index, records and metadata postings, as of change `seq`.

    `records` holds, per row key, what a search returns and the float32 vector it re-scores with: one
    ``bytes`` per record, the row's blob as SQLite returns it (no conversion, no copy), so growing never
    copies the collection, gathering a search's candidates is one ``join``, and the hits' ids, texts
    and metadata are found in the entries the re-scoring has just read.

    `pending` holds the keys of records held but not yet added to the HNSW graph (a quick upsert's,
    until the worker thread adds them, `flush`): every search scores them exactly besides the graph's
    candidates, so a record is found from the moment its row is committed. Every other known key is
    in the index.
    """

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.index: Any = None  # usearch.index.Index, made with the first vector
        self.dim = 0
        self.records: dict[int, _Record] = {}
        self.pending: dict[int, None] = {}  # held, not yet in the graph (in order of arrival)
        self.flush_queued = False  # a `flush` is queued on the worker thread (or ran since)
        self.postings: dict[str, dict[Any, set[int]]] = {}
        self.holding: dict[str, int] = {}  # field -> how many records' metadata has it (any value)
        self.unposted: dict[str, set[int]] = {}  # field -> the keys whose value there is not hashable
        self.changed = 0  # changes applied since the index was last saved or loaded
        self.dirty = False  # differs from the saved file (or there is none)
        self.version: int | None = None  # the connection's ``data_version`` when last found up to date

    def _make(self, dim: int) -> None:
        from usearch.index import Index

        self.dim = dim
        self.index = Index(ndim=dim, metric="cos", dtype=_DTYPE, connectivity=_CONNECTIVITY,
                           expansion_add=_EXPANSION_ADD, expansion_search=_EXPANSION_SEARCH)

    def _post(self, key: int, meta: dict[str, Any], add: bool) -> None:
        for field, value in meta.items():
            self.holding[field] = self.holding.get(field, 0) + (1 if add else -1)
            if not _hashable(value):
                unposted = self.unposted.setdefault(field, set())
                if add:
                    unposted.add(key)
                else:
                    unposted.discard(key)
                continue
            by_value = self.postings.setdefault(field, {})
            if add:
                by_value.setdefault(value, set()).add(key)
            else:
                keys = by_value.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del by_value[value]

    def forget(self, key: int) -> None:
        record = self.records.pop(key, None)
        if record is not None:
            self._post(key, record[2], add=False)
        self.pending.pop(key, None)
        if self.index is not None and key in self.index:  # (a loaded index may hold keys since deleted)
            self.index.remove(key)

    def _drop(self, keys: np.ndarray[Any, Any]) -> None:
        """Forget `keys` before they are added again (replaced rows, or keys a loaded index holds)."""
        for key in keys.tolist():
            if key in self.records:
                self.forget(key)
        # Every known key but the pending ones is in the index (`put` adds both; a loaded index gets its
        # missing keys added): when the index holds no more keys than that, it holds none of the others.
        if self.index is not None and len(self.index) > len(self.records) - len(self.pending):
            held = np.asarray(self.index.contains(keys), dtype=bool).reshape(-1)
            if held.any():
                self.index.remove(keys[held])

    def put(self, rows: Sequence[tuple[int, str, int, bytes, str, str]], *, defer: bool = False) -> None:
        """Add or replace rows ``(key, id, dim, vector, text, metadata)``.

        With `defer`, the rows are held and searched exactly, and added to the graph by the next `flush`.
        """
        if not rows:
            return
        keys = np.fromiter((r[0] for r in rows), dtype=np.uint64, count=len(rows))
        self._drop(keys)
        dim = rows[0][2]
        if self.index is None:
            self._make(dim)
        if any(r[2] != self.dim for r in rows):
            raise UsageError(f"a collection mixes vector sizes {sorted({r[2] for r in rows} | {self.dim})}; "
                             "use one embedder per collection")
        if defer:
            self.describe(rows)
            self.pending.update(dict.fromkeys(keys.tolist()))
            return
        matrix = np.frombuffer(b"".join(r[3] for r in rows), dtype=np.float32).reshape(len(rows), self.dim)
        self.index.add(keys, matrix, threads=0 if len(rows) > 64 else 1)
        self.describe(rows)

    def flush(self) -> None:
        """Add the pending records to the graph."""
        self.flush_queued = False
        if not self.pending:
            return
        keys = list(self.pending)
        matrix = self.gather(keys)
        self.index.add(np.asarray(keys, dtype=np.uint64), matrix, threads=0 if len(keys) > 64 else 1)
        self.pending.clear()

    def describe(self, rows: Iterable[tuple[int, str, int, bytes, str, str]]) -> None:
        """Hold rows ``(key, id, dim, vector, text, metadata)`` whose vectors the index holds."""
        for key, id_, _, vector, text, meta_json in rows:
            meta = json.loads(meta_json)
            self.records[key] = (id_, text, meta, vector)
            self._post(key, meta, add=True)

    def gather(self, keys: Iterable[int]) -> np.ndarray[Any, Any]:
        """Return the float32 vectors of `keys` (known keys), one row each."""
        records = self.records
        return np.frombuffer(b"".join([records[key][3] for key in keys]), dtype=np.float32).reshape(-1, self.dim)

    def _field_keys(self, field: str, wanted: Any) -> set[int]:
        """Return the keys whose `field` is `wanted` (or one of them); may be a live posting set."""
        values = list(wanted) if isinstance(wanted, list | tuple | set | frozenset) else [wanted]
        if not all(_hashable(v) for v in values):
            return {k for k, r in self.records.items() if matches(r[2], {field: wanted})}
        by_value = self.postings.get(field, {})
        found = [by_value[v] for v in dict.fromkeys(values) if v in by_value]  # (None: the field null)
        if None in values and self.holding.get(field, 0) < len(self.records):  # and the records without it
            found.append(self.records.keys() - set().union(*by_value.values(), self.unposted.get(field, ())))
        if not found:
            return set()
        return found[0] if len(found) == 1 else set().union(*found)

    def keys_matching(self, where: Where) -> set[int] | None:
        """Return the keys of the records matching `where`, or ``None`` when all records match.

        From the postings (a scan for values that are not simple); the result may be a live posting
        set: read it, never change it.
        """
        parts = [self._field_keys(field, wanted) for field, wanted in where.items()]
        parts = [p for p in parts if len(p) < len(self.records)]  # keeps every record: no constraint
        if not parts:
            return None
        parts.sort(key=len)
        result = parts[0]
        for other in parts[1:]:
            result = result & other
            if not result:
                break
        return result


class SQLiteVectorStore(VectorStore):
    """Vectors in a SQLite file with an HNSW index (usearch) and FTS5 keyword search.

    Made by `SQLiteStore.vectors()` (same file as the sessions) or directly. `exact_limit`: a metadata
    filter keeping at most this many records is searched exactly. `scan_limit`: a collection of at most
    this many records is searched by scanning all its (8-bit) vectors instead of walking the HNSW graph,
    then re-scoring the best exactly (default: as many as 4 MB holds, 10,416 of 384 dimensions; 0 always
    walks the graph). `index_dir` is where the HNSW indexes
    are saved (default: ``<path>.vectors`` next to the database; ``None`` for a ``:memory:`` database).
    `synchronous` is SQLite's durability setting: ``NORMAL`` keeps every committed write through a
    process crash (WAL), ``FULL`` also through a power loss, at an fsync per write.

    Each collection has a keyword index of its own (an FTS5 table, and three triggers that every
    write to the file checks): keep per-user or per-tenant records in one collection with metadata
    filters rather than a collection each.
    """

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0, exact_limit: int = 4096,
                 scan_limit: int | None = None, index_dir: str | Path | None = None,
                 synchronous: Literal["NORMAL", "FULL"] = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise UsageError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.synchronous = synchronous
        self.path = str(path)
        self.exact_limit = exact_limit
        self.scan_limit = scan_limit
        self._busy_ms = int(busy_timeout * 1000)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextpipe-vectors")
        self._lock = threading.Lock()  # held by whichever thread uses the connection and the indexes
        self._conn: sqlite3.Connection | None = None
        self._cache: dict[str, _Collection] = {}
        self._keyword_tables: dict[str, str] = {}  # collection -> its FTS5 table (numbers never change)
        self._unchecked = 0  # records written by this connection since its last WAL checkpoint
        self._flushing = False  # the worker thread holds the lock only to add a few records to a graph
        self._checkpoint_queued = False
        memory = self.path == ":memory:" or self.path.startswith("file::memory:")
        default = None if memory else Path(self.path + ".vectors")
        self.index_dir = Path(index_dir) if index_dir is not None else default

    # --- connection and schema ---------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            use_wal(conn, self._busy_ms)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # (`_wrote` checkpoints, on the worker thread)
            conn.execute("BEGIN IMMEDIATE")
            try:
                columns = [r[1] for r in conn.execute("PRAGMA table_info(cp_vectors)")]
                before_keys = bool(columns) and "key" not in columns  # before the HNSW index and keywords
                if before_keys:
                    conn.execute("ALTER TABLE cp_vectors RENAME TO cp_vectors_before_keys")
                shared, triggers = _SHARED_KEYWORDS
                row = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (shared,)).fetchone()
                before_own = row is not None and "content='cp_vectors'" in row[0]
                if before_own:  # one keyword index for all collections: each gets its own below
                    for trigger in triggers:
                        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
                    conn.execute(f"DROP TABLE {shared}")
                for statement in _statements(_SCHEMA):
                    conn.execute(statement)
                if before_keys:
                    conn.execute("INSERT INTO cp_vectors (collection, id, dim, vector, text, metadata, keywords) "
                                 "SELECT collection, id, dim, vector, text, metadata, text FROM cp_vectors_before_keys")
                    conn.execute("DROP TABLE cp_vectors_before_keys")
                if before_keys or before_own:
                    for (collection,) in conn.execute("SELECT DISTINCT collection FROM cp_vectors").fetchall():
                        _build_keywords(conn, collection)
            except BaseException:
                conn.execute("ROLLBACK")
                conn.close()
                raise
            conn.execute("COMMIT")
            self._conn = conn
        return self._conn

    def _keywords(self, conn: sqlite3.Connection, collection: str, *, create: bool = False) -> str | None:
        """Return the name of `collection`'s FTS5 table (`create`: in the open write transaction, if it has none).

        Without `create`, a collection with rows but no table (written by an earlier version of this
        store since this file was last opened) gets one too, in a transaction of its own. A name is
        remembered only once its table is committed (a transaction that made it may still roll back).
        """
        table = self._keyword_tables.get(collection) or _keyword_table(conn, collection)
        if table is None:
            if create:  # (remembered when the next call finds it committed)
                return _build_keywords(conn, collection)
            if not conn.execute("SELECT 1 FROM cp_vectors WHERE collection = ? LIMIT 1", (collection,)).fetchone():
                return None
            conn.execute("BEGIN IMMEDIATE")
            try:  # (another connection may have made it meanwhile)
                table = _keyword_table(conn, collection) or _build_keywords(conn, collection)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        self._keyword_tables[collection] = table
        return table

    def _take_lock(self) -> bool:
        """Take the lock for work on the calling thread: if it is free, or held only to add a few records to a graph.

        The worker thread adds a quick upsert's records to the graph soon after it (`_flush`): an
        upsert or search that meets that waits for it (a fraction of a millisecond per record, at most
        `_QUICK_RECORDS` of them; `_FLUSH_WAIT` at the very most) rather than going to the worker
        thread, which would wait for it too and then hand the result back. Held for anything else (a
        checkpoint, a save, a catch-up, another upsert), it is not waited for.
        """
        if self._lock.acquire(blocking=False):
            return True
        return self._flushing and self._lock.acquire(timeout=_FLUSH_WAIT)

    async def _run(self, fn: Any, *args: Any) -> Any:
        def call() -> Any:
            with self._lock:
                return fn(self._connection(), *args)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _quick(self, collection: str, fn: Any) -> Any:
        """Run the read ``fn(connection, collection's index)`` on the calling thread when it cannot take long.

        Return ``None`` (without running it) otherwise; `fn` returns ``None`` itself when its work turns
        out not to be cheap (a filter keeping many records).

        That is when the connection is idle and `collection`'s index is up to date (no catch-up, which
        may read many rows): an unfiltered search, or one filtered to a few hundred records, is then a
        fraction of a millisecond, less than handing it to the worker thread and back costs on a busy
        machine.
        """
        if self._conn is None or not self._take_lock():
            return None
        try:
            cached = self._cache.get(collection)
            conn = self._conn
            if conn is None or cached is None or cached.version != conn.execute("PRAGMA data_version").fetchone()[0]:
                return None
            return fn(conn, cached)  # (found up to date just now)
        finally:
            self._lock.release()

    # --- writes ------------------------------------------------------------------------------------

    @override
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        if not records:
            return
        prepared = [(collection, r.id, *self._encode(r)) for r in records]
        dims = {p[2] for p in prepared}
        if len(dims) > 1:
            raise UsageError(f"one upsert mixes vector sizes {sorted(dims)}; use one embedder per collection")

        if len(prepared) <= _QUICK_RECORDS and self.synchronous == "NORMAL" and self._conn is not None \
                and self._take_lock():
            try:
                if self._conn is not None and self._write(self._conn, collection, prepared, dims, quick=True):
                    return
            finally:
                self._lock.release()
        await self._run(lambda conn: self._write(conn, collection, prepared, dims, quick=False))

    def _write(self, conn: sqlite3.Connection, collection: str, prepared: list[tuple[Any, ...]], dims: set[int],
               quick: bool) -> bool:
        """Commit `prepared` rows, then bring the index up to date; return whether it was done.

        With `quick` (on the calling thread) nothing is done and ``False`` returned unless the index is
        up to date and the write lock is free at once.
        """
        cached = self._cache.get(collection)
        version = cached.version if cached is not None else None
        current = self._begin(conn, collection, cached, version, quick)
        if current is None:
            return False
        try:
            logged = self._insert(conn, collection, prepared, dims, cached if current else None)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._wrote(conn, len(prepared), quick)
        if cached is None:
            return True
        if not current or len(logged) != len(prepared):  # (one change per record: else read them back)
            self._sync(conn, collection)  # the index follows the file, not the other way round
            return True
        try:
            self._put_own(conn, collection, cached, prepared, logged, quick)
        except BaseException:
            self._cache.pop(collection, None)  # rebuilt (or loaded) from the file by the next search
            raise
        cached.version = version  # own commits leave ``data_version`` as it was
        return True

    def _begin(self, conn: sqlite3.Connection, collection: str, cached: _Collection | None, version: int | None,
               quick: bool) -> bool | None:
        """Begin the write transaction; return whether the index is current (``None``: `quick`, and not now).

        The index is current when no other connection committed since it was last found so (this one
        holds the write lock now): then the changes the transaction logs are the only ones it lacks,
        and it takes them from the rows written instead of reading them back.
        """
        if quick:
            if cached is None or version is None or not cached.records or not self._begin_at_once(conn, version):
                return None
            self._writing(collection)
            return True
        self._writing(collection)
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

    def _insert(self, conn: sqlite3.Connection, collection: str, prepared: list[tuple[Any, ...]], dims: set[int],
                current: _Collection | None) -> list[tuple[int, int]]:
        """Insert or replace the rows (in the open transaction); return the changes logged since `current`'s."""
        self._keywords(conn, collection, create=True)
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

    def _put_own(self, conn: sqlite3.Connection, collection: str, cached: _Collection,
                 prepared: list[tuple[Any, ...]], logged: list[tuple[int, int]], quick: bool) -> None:
        """Apply this connection's own committed rows (`prepared`, logged as `logged`) to the index.

        With `quick` (on the calling thread) the rows are held and searched exactly at once, and added
        to the HNSW graph on the worker thread (`_flush`) as soon as the caller next waits: the graph
        insert is most of an upsert's work, and the caller need not wait for it. With `_PENDING_MAX`
        rows held already (the worker thread kept busy), a quick upsert adds its own rows to the graph
        itself; an upsert on the worker thread adds every held row.
        """
        rows = {key: (key, p[1], p[2], p[3], p[4], p[5]) for (_, key), p in zip(logged, prepared, strict=True)}
        defer = quick and len(cached.pending) + len(rows) <= _PENDING_MAX
        cached.put(list(rows.values()), defer=defer)  # (a record given twice: the last one, as in the file)
        if not quick:  # (and those of quick upserts before, when here first)
            cached.flush()
        cached.seq = logged[-1][0]
        cached.changed += len(logged)
        cached.dirty = True
        if quick and cached.pending and not cached.flush_queued:
            cached.flush_queued = True
            # Once the caller gives the event loop back: upserts made back to back until then go into
            # the graph together, and none of them meets the graph insert of the one before.
            asyncio.get_running_loop().call_soon(self._later, lambda c: self._flush(collection, cached))
        if not quick:
            self._maybe_save(conn, collection, cached)
        elif self._save_due(cached):  # (writing the whole index: not on the calling thread)
            self._later(lambda c: self._maybe_save(c, collection, self._cache.get(collection)))

    def _flush(self, collection: str, cached: _Collection) -> None:
        """Add `cached`'s pending records to its graph (on the worker thread, holding the lock)."""
        if self._cache.get(collection) is not cached:
            return  # (dropped or replaced since: the one there now was built from the rows)
        self._flushing = len(cached.pending) <= _QUICK_RECORDS
        try:
            cached.flush()
        except BaseException:
            self._cache.pop(collection, None)  # rebuilt (or loaded) from the file by the next search
            raise
        finally:
            self._flushing = False

    def _wrote(self, conn: sqlite3.Connection, records: int, quick: bool) -> None:
        """After a commit of `records` rows: checkpoint the WAL when due (later, on the worker thread, if `quick`)."""
        self._unchecked += records
        if self._unchecked < _CHECKPOINT_RECORDS:
            return
        if quick:
            if not self._checkpoint_queued:
                self._checkpoint_queued = True
                self._later(self._checkpoint)
        else:
            self._checkpoint(conn)

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        self._unchecked, self._checkpoint_queued = 0, False
        with contextlib.suppress(sqlite3.Error):  # the write is saved already; the next one is due soon
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # (never waits for other connections)

    def _later(self, fn: Any) -> None:
        """Run ``fn(connection)`` on the worker thread, after what is queued there (a WAL checkpoint, an index save).

        Its SQLite and file errors are dropped: a checkpoint or a save that failed is made again when
        next due, and SQLite, not the saved index, holds the vectors.
        """
        def call() -> None:
            with self._lock, contextlib.suppress(sqlite3.Error, OSError):
                if self._conn is not None:
                    fn(self._conn)

        with contextlib.suppress(RuntimeError):  # (closed meanwhile: `close` saved what needed saving)
            self._executor.submit(call)

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
        sql_where, sql_params = _json_where(where)
        clauses += sql_where
        params += sql_params

        def op(conn: sqlite3.Connection) -> int:
            self._writing(collection)
            conn.execute("BEGIN IMMEDIATE")
            try:
                n = conn.execute(f"DELETE FROM cp_vectors WHERE {' AND '.join(clauses)}", params).rowcount
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            self._wrote(conn, n, quick=False)
            if collection in self._cache:
                self._sync(conn, collection)
            return int(n)

        return int(await self._run(op))

    # --- keeping the in-memory index in step with the file -----------------------------------------

    @staticmethod
    def _latest(conn: sqlite3.Connection, collection: str) -> tuple[int, int]:
        """Return the last change logged for `collection`, and the change below which the log was pruned."""
        row = conn.execute("SELECT MAX(seq) FROM cp_vector_changes WHERE collection = ?", (collection,)).fetchone()
        pruned = conn.execute("SELECT below FROM cp_vector_pruned WHERE collection = ?", (collection,)).fetchone()
        below = int(pruned[0]) if pruned else 0
        return max(int(row[0] or 0), below), below

    def _sync(self, conn: sqlite3.Connection, collection: str) -> _Collection:
        """Bring this process's index of `collection` up to the file's latest change (one read snapshot).

        SQLite's ``data_version`` changes whenever another connection (of any process) commits; when it
        has not moved since this collection was last found up to date, and this connection wrote nothing
        to it since (its own writes clear `version` before they commit), nothing can have changed.
        """
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        cached = self._cache.get(collection)
        if cached is not None and cached.version == version:
            return cached
        conn.execute("BEGIN")
        try:
            latest, below = self._latest(conn, collection)
            cached = self._cache.get(collection)
            if cached is None or cached.seq < below:
                cached = self._open(conn, collection, latest, below)
            elif cached.seq != latest:
                self._apply(conn, collection, cached, latest)
        finally:
            conn.execute("COMMIT")
        self._maybe_save(conn, collection, cached)
        cached.version = version  # read before the snapshot: a commit in between only costs a check
        return cached

    @staticmethod
    def _save_due(cached: _Collection) -> bool:
        return cached.changed >= max(_SAVE_AFTER, len(cached.records) // _SAVE_SHARE)

    def _maybe_save(self, conn: sqlite3.Connection, collection: str, cached: _Collection | None) -> None:
        if cached is not None and cached.dirty and self._save_due(cached):
            self._save(conn, collection, cached)

    def _writing(self, collection: str) -> None:
        """Before this connection commits to `collection`: the next search checks the change log."""
        cached = self._cache.get(collection)
        if cached is not None:
            cached.version = None

    def _apply(self, conn: sqlite3.Connection, collection: str, cached: _Collection, latest: int) -> None:
        keys = [r[0] for r in conn.execute(
            "SELECT DISTINCT key FROM cp_vector_changes WHERE collection = ? AND seq > ? AND seq <= ?",
            (collection, cached.seq, latest))]
        self._reload(conn, collection, cached, keys)
        cached.seq = latest

    def _reload(self, conn: sqlite3.Connection, collection: str, cached: _Collection, keys: Sequence[int]) -> None:
        """Make `keys` in the index match their rows now: re-read the rows, drop keys that have none.

        (A row moved to another collection, by SQL, has none here any more.)
        """
        step = min(5000, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 1)
        for start in range(0, len(keys), step):
            part = keys[start:start + step]
            rows = conn.execute(f"SELECT key, id, dim, vector, text, metadata FROM cp_vectors WHERE collection = ? "
                                f"AND key IN ({','.join('?' * len(part))})", [collection, *part]).fetchall()
            present = {r[0] for r in rows}
            for key in part:
                if key not in present:
                    cached.forget(key)
            cached.put(rows)
            cached.changed += len(part)
            cached.dirty = True

    def _open(self, conn: sqlite3.Connection, collection: str, latest: int, below: int) -> _Collection:
        """Load the saved index when there is a usable one (then apply newer changes), else build it."""
        self._cache.pop(collection, None)
        loaded = self._load_saved(collection, latest, below)
        if loaded is not None:
            cached, seq = loaded
            self._cache[collection] = cached
            self._catch_up(conn, collection, cached, seq, latest)
            return cached
        cached = _Collection(latest)
        self._cache[collection] = cached
        batch: list[tuple[int, str, int, bytes, str, str]] = []
        for row in conn.execute("SELECT key, id, dim, vector, text, metadata FROM cp_vectors WHERE collection = ? "
                                "ORDER BY key", (collection,)):
            batch.append(row)
            if len(batch) == 5000:
                cached.put(batch)
                batch = []
        cached.put(batch)
        cached.changed = len(cached.records) if len(cached.records) >= _SAVE_AFTER else 0
        cached.dirty = True
        return cached

    def _catch_up(self, conn: sqlite3.Connection, collection: str, cached: _Collection, seq: int,
                  latest: int) -> None:
        """Fill a loaded index's vectors and metadata from the rows, then apply the changes after `seq`."""
        cursor = conn.execute("SELECT key, id, dim, vector, text, metadata FROM cp_vectors WHERE collection = ?",
                              (collection,))
        while chunk := cursor.fetchmany(8192):
            cached.describe(r for r in chunk if r[2] == cached.dim)
        stale = [r[0] for r in conn.execute(
            "SELECT DISTINCT key FROM cp_vector_changes WHERE collection = ? AND seq > ? AND seq <= ?",
            (collection, seq, latest))]
        # (np.asarray: iterating usearch's key view element by element is quadratic)
        indexed = set(np.asarray(cached.index.keys).tolist()) if cached.index is not None else set()
        missing = [k for k in cached.records if k not in indexed]  # rows the file does not hold (defensive)
        self._reload(conn, collection, cached, sorted(set(stale) | set(missing) | (indexed - set(cached.records))))
        cached.seq = latest

    # --- the saved index ---------------------------------------------------------------------------

    def _files(self, collection: str) -> list[tuple[int, Path]]:
        if self.index_dir is None or not self.index_dir.is_dir():
            return []
        found = []
        for path in self.index_dir.glob(f"{collection}.*.usearch"):
            seq = path.name[len(collection) + 1:-len(".usearch")]
            if seq.isdigit():
                found.append((int(seq), path))
        return sorted(found)

    def _load_saved(self, collection: str, latest: int, below: int) -> tuple[_Collection, int] | None:
        from usearch.index import Index

        for seq, path in reversed(self._files(collection)):
            if seq > latest or seq < below:
                continue  # from a file that was since replaced, or too old for the change log
            try:
                index = Index.restore(str(path), view=False, expansion_add=_EXPANSION_ADD,
                                      expansion_search=_EXPANSION_SEARCH)
            except Exception:  # unreadable (a crash while an older version wrote it): rebuild instead
                continue
            if index is None:
                continue
            cached = _Collection(seq)
            cached.index, cached.dim = index, int(index.ndim)
            return cached, seq
        return None

    def _save(self, conn: sqlite3.Connection, collection: str, cached: _Collection) -> None:
        """Write the index atomically as ``<collection>.<seq>.usearch``, then prune what no one needs."""
        if self.index_dir is None or cached.index is None:
            cached.changed, cached.dirty = 0, False
            return
        cached.flush()  # (the file stands for every change up to `seq`)
        self.index_dir.mkdir(parents=True, exist_ok=True)
        final = self.index_dir / f"{collection}.{cached.seq}.usearch"
        temporary = self.index_dir / f".{collection}.{cached.seq}.{os.getpid()}.tmp"
        cached.index.save(str(temporary))
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        cached.changed, cached.dirty = 0, False
        for seq, path in self._files(collection):
            if seq < cached.seq:
                with contextlib.suppress(OSError):
                    path.unlink()
        # Changes older than the saved index are needed by no one who can load it.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT INTO cp_vector_pruned VALUES (?, ?) ON CONFLICT (collection) DO UPDATE SET "
                         "below = MAX(below, excluded.below)", (collection, cached.seq))
            conn.execute("DELETE FROM cp_vector_changes WHERE collection = ? AND seq < ?", (collection, cached.seq))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # --- searches ----------------------------------------------------------------------------------

    @override
    async def vector_search(self, collection: str, vector: Sequence[float], *, k: int = 5,
                            where: Where | None = None, min_score: float | None = None) -> list[SearchHit]:
        check_where(where)
        q = _unit(vector)

        def search(c: _Collection, subset: set[int] | None) -> list[SearchHit]:
            if c.index is None or not c.records or k <= 0:
                return []
            if q.shape[0] != c.dim:
                raise UsageError(f"query vector has {q.shape[0]} dimensions, the collection {c.dim}")
            records = c.records
            return [SearchHit(r[0], s, r[1], r[2], vector_score=s) for key, s in self._nearest(c, q, k, subset)
                    if min_score is None or s >= min_score for r in (records[key],)]

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            c = self._sync(conn, collection)
            return search(c, c.keys_matching(where) if where else None)

        def small(conn: sqlite3.Connection, current: _Collection) -> list[SearchHit] | None:
            subset = current.keys_matching(where) if where else None
            if subset is not None and len(subset) > min(_QUICK_SUBSET, self.exact_limit):
                return None  # (not cheap: on the worker thread)
            return search(current, subset)

        quick: list[SearchHit] | None = self._quick(collection, small)
        if quick is not None:
            return quick
        hits: list[SearchHit] = await self._run(op)
        return hits

    def _nearest(self, c: _Collection, q: np.ndarray[Any, Any], k: int,
                 subset: set[int] | None) -> list[tuple[int, float]]:
        if subset is not None and not subset:
            return []
        if subset is not None and len(subset) <= self.exact_limit:
            return self._exact(c, q, k, subset)
        limit = self.scan_limit if self.scan_limit is not None else _SCAN_BYTES // max(1, c.dim)
        return self._approximate(c, q, k, subset, scan=len(c.records) <= limit)

    @staticmethod
    def _exact(c: _Collection, q: np.ndarray[Any, Any], k: int,
               subset: Iterable[int] | None) -> list[tuple[int, float]]:
        """Score every record (of `subset`) against `q` from the float32 rows."""
        keys = subset if isinstance(subset, list) else list(subset if subset is not None else c.records)
        if not keys:
            return []
        scores = c.gather(keys) @ q
        if len(scores) <= 64:  # (a search's candidates: fewer numpy calls and temporaries than below)
            listed = scores.tolist()
            order = sorted(range(len(listed)), key=listed.__getitem__, reverse=True)[:k]
            return [(keys[i], listed[i]) for i in order]
        if len(scores) > 4 * k:
            top = np.argpartition(-scores, k)[:k]
            top = top[np.argsort(-scores[top])]
        else:
            top = (-scores).argsort()[:k]
        return list(zip(map(keys.__getitem__, top.tolist()), scores[top].tolist(), strict=True))

    @classmethod
    def _approximate(cls, c: _Collection, q: np.ndarray[Any, Any], k: int, subset: set[int] | None,
                     scan: bool = False) -> list[tuple[int, float]]:
        """Take candidates from the HNSW index (more while too few are in `subset`), re-score them exactly.

        With `scan`, the candidates are the nearest by the 8-bit vectors over the whole index (no graph walk).
        """
        total = len(c.records)
        expansion, want = _depth(total, k)
        if subset is not None:  # about 2 k of the subset expected among the candidates
            want = min(total, max(want, k * max(2, 2 * total // len(subset)) + 16))
        if not scan and c.index.expansion_search != expansion:
            c.index.expansion_search = expansion
        indexed = total - len(c.pending)
        # Records not in the graph yet are scored exactly with its candidates, but never counted among
        # what the graph found: k of them must not stop the search before the graph's own best k.
        pending = [key for key in c.pending if subset is None or key in subset]
        while True:
            keys = _index_keys(c.index, q, want, scan) if indexed else []
            if subset is not None:
                keys = [key for key in keys if key in subset]
            if len(keys) >= k or want >= indexed:
                return cls._exact(c, q, k, keys + pending)
            want = min(indexed, want * 4)

    @override
    async def keyword_search(self, collection: str, text: str, *, k: int = 5,
                             where: Where | None = None) -> list[SearchHit]:
        check_where(where)
        terms = keyword_terms(text)
        if not terms or k <= 0:
            return []
        query = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)

        def op(conn: sqlite3.Connection) -> list[SearchHit]:
            table = self._keywords(conn, collection)
            if table is None:  # (nothing was ever stored in it)
                return []
            # The collection's FTS table ranks on its own (fast); with a filter, the best few hundred are
            # then checked against it, asking for more while too few pass.
            limit = k if not where else max(2 * k, 100)
            if collection in self._cache:  # ids, metadata and filter postings are in memory already
                return self._keyword_hits(conn, self._sync(conn, collection), table, query, k, where, limit)
            while True:
                ranked = conn.execute(f"SELECT rowid, -bm25({table}) AS score FROM {table} WHERE {table} MATCH ? "
                                      "ORDER BY score DESC LIMIT ?", (query, limit)).fetchall()
                rows = {r[0]: r[1:] for r in conn.execute(
                    f"SELECT key, id, text, metadata FROM cp_vectors WHERE collection = ? AND key IN "
                    f"({','.join('?' * len(ranked))})", [collection, *(r[0] for r in ranked)])} if ranked else {}
                hits = []
                for key, score in ranked:
                    row = rows.get(key)
                    if row is None:
                        continue
                    meta = json.loads(row[2])
                    if where and not matches(meta, where):
                        continue
                    hits.append(SearchHit(row[0], float(score), row[1], meta))
                    if len(hits) == k:
                        return hits
                if len(ranked) < limit:
                    return hits
                if limit >= 12_800:
                    break
                limit *= 4
            # A filter that keeps few of the matches: let SQLite filter them all.
            sql_where, params = _json_where(where, "v.metadata")
            clause = " AND ".join([f"{table} MATCH ?", *sql_where])
            found = conn.execute(
                f"SELECT v.id, v.text, v.metadata, -bm25({table}) AS score FROM {table} "
                f"JOIN cp_vectors v ON v.key = {table}.rowid WHERE {clause} ORDER BY score DESC LIMIT ?",
                [query, *params, k]).fetchall()
            return [SearchHit(r[0], float(r[3]), r[1], json.loads(r[2])) for r in found]

        hits: list[SearchHit] = await self._run(op)
        return hits

    def _keyword_hits(self, conn: sqlite3.Connection, c: _Collection, table: str, query: str, k: int,
                      where: Where | None, limit: int) -> list[SearchHit]:
        """Keyword search of a collection whose index is loaded: filtered with its postings, texts from memory."""
        subset = c.keys_matching(where) if where else None
        if subset is not None and not subset:
            return []
        pool: set[int] | dict[int, Any] = c.records if subset is None else subset  # (postings hold known keys)
        found: list[tuple[int, float]] = []
        while True:
            ranked = conn.execute(f"SELECT rowid, -bm25({table}) AS score FROM {table} WHERE {table} MATCH ? "
                                  "ORDER BY score DESC LIMIT ?", (query, limit)).fetchall()
            found = [(key, score) for key, score in ranked if key in pool][:k]
            if len(found) == k or len(ranked) < limit:
                break
            if limit >= 6_400 and subset is not None:  # a filter that keeps few of the matches
                found = _ranked_within(conn, c, table, query, k, subset)
                break
            limit *= 4
        records = c.records
        return [SearchHit(r[0], float(score), r[1], r[2]) for key, score in found for r in (records[key],)]

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        sql_where, params = _json_where(where)
        clause = " AND ".join(["collection = ?", *sql_where])
        return int(await self._run(lambda conn: conn.execute(f"SELECT COUNT(*) FROM cp_vectors WHERE {clause}",
                                                              [collection, *params]).fetchone()[0]))

    async def save_indexes(self) -> None:
        """Save every collection's HNSW index that has changed (also done by `close`)."""
        def op(conn: sqlite3.Connection) -> None:
            for name, cached in list(self._cache.items()):
                if cached.dirty:
                    self._save(conn, name, cached)

        await self._run(op)

    def forget_sessions_deleted_by(self, sessions: SessionStore) -> None:
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
                for name in list(self._cache):
                    with contextlib.suppress(OSError, sqlite3.Error):
                        cached = self._sync(conn, name)
                        if cached.dirty:
                            self._save(conn, name, cached)
            finally:
                conn.close()
                self._conn = None

        if self._conn is not None:
            await self._run(shut)
        self._executor.shutdown(wait=True)


def _ranked_within(conn: sqlite3.Connection, c: _Collection, table: str, query: str, k: int,
                   subset: set[int]) -> list[tuple[int, float]]:
    """Return the best `k` keyword matches among the records `subset` (SQLite filters them all)."""
    ranked = conn.execute(
        f"SELECT rowid, -bm25({table}) AS score FROM {table} WHERE {table} MATCH ? "
        "AND rowid IN (SELECT value FROM json_each(?)) ORDER BY score DESC LIMIT ?",
        (query, json.dumps(sorted(subset)), k)).fetchall()
    return [(key, score) for key, score in ranked if key in c.records]


def _keyword_table(conn: sqlite3.Connection, collection: str) -> str | None:
    """Return the name of `collection`'s FTS5 table as the file records it (``None``: it has none)."""
    row = conn.execute("SELECT number FROM cp_vector_keywords WHERE collection = ?", (collection,)).fetchone()
    return None if row is None else f"cp_keywords_{int(row[0])}"


def _build_keywords(conn: sqlite3.Connection, collection: str) -> str:
    """(Re)build `collection`'s FTS5 table and its triggers from its rows, in the open write transaction."""
    table = _keyword_table(conn, collection)
    if table is None:
        number = int(conn.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM cp_vector_keywords").fetchone()[0])
        conn.execute("INSERT INTO cp_vector_keywords (collection, number) VALUES (?, ?)", (collection, number))
        table = f"cp_keywords_{number}"
    for trigger in ("insert", "delete", "update"):
        conn.execute(f"DROP TRIGGER IF EXISTS {table}_{trigger}")
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    for statement in _statements(_KEYWORDS.format(t=table, c=_sql_text(collection))):
        conn.execute(statement)
    conn.execute(f"INSERT INTO {table} (rowid, keywords) SELECT key, keywords FROM cp_vectors WHERE collection = ?",
                 (collection,))
    return table


def _sql_text(value: str) -> str:
    """`value` as an SQL expression: quoted pieces, with ``char(0)`` for NUL (which no SQL literal may hold).

    Unlike a blob cast to text, it means the same in a UTF-8 or a UTF-16 database.
    """
    return " || char(0) || ".join("'" + piece.replace("'", "''") + "'" for piece in value.split("\x00"))


def _statements(script: str) -> list[str]:
    """Split a SQL script into statements (triggers hold ``;`` inside them)."""
    out, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _json_where(where: Where | None, column: str = "metadata") -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in (where or {}).items():
        # None stands for no value: the key missing or null (json_extract gives NULL for both).
        if isinstance(value, list | tuple | set | frozenset):
            values = [v for v in value if v is not None]
            clause = f"json_extract({column}, ?) IN ({','.join('?' * len(values))})"
            params += [f"$.{key}", *values]
            if len(values) < len(value):
                clause = f"({clause} OR json_extract({column}, ?) IS NULL)"
                params.append(f"$.{key}")
            clauses.append(clause)
        elif value is None:
            clauses.append(f"json_extract({column}, ?) IS NULL")
            params.append(f"$.{key}")
        else:
            clauses.append(f"json_extract({column}, ?) = ?")
            params += [f"$.{key}", value]
    return clauses, params
