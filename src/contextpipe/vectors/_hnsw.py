"""`SQLiteVectorStore`'s in-memory side: one usearch HNSW index per collection, kept in step with the rows.

Each process keeps, per collection, a `CollectionIndex`: a usearch HNSW graph over 8-bit copies of the
vectors, and beside it every record's id, text, metadata and float32 vector, with metadata postings
for filters. A search takes candidates from the graph (or, in a small collection, from a scan of the
8-bit vectors) and re-scores them exactly from the float32 vectors (`approximate_top`), or scores a
small filtered subset exactly (`exact_top`, also the reference the graph search is tested against).

`Indexes` keeps a store's indexes in step with the file (the change log), loads and saves them
(``<file>.vectors/<collection>.<seq>.usearch``), and `WorkerThread` decides where work runs: on the
calling thread when it cannot take long, else on the store's one worker thread.

The tuning constants below carry the reason for each in a line; the measurements behind them are in
``bench/results/vectors.md`` (``bench/vector_bench.py``, ``bench/ann_compare.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from .base import Where, matches

# The graph and its search depth (bench/results/vectors.md, "Graph and search depth").
DTYPE = "i8"  # 8-bit copies: a quarter of float32's memory and the fastest kernels (candidates re-scored exactly)
CONNECTIVITY = 16  # edges per node: 8 or 12 find less at every expansion, 24 costs more for the same recall
EXPANSION_ADD = 64  # build depth: an insert near 0.5 ms; 128 doubles it for no recall, 40 finds 0.982 at 100,000
EXPANSION_SEARCH = 40  # least search depth: 0.994 of the true top 10 at 100,000 x 384 (grows with the size)
CANDIDATES = 20  # least candidates re-scored: as many of the top 10 as 40 at 100,000, half the float32 rows read
RECORDS_PER_CANDIDATE = 5000  # one candidate more per 5,000 records: 200 at 1,000,000 (denser: closer neighbours)
RECORDS_PER_EXPANSION = 2000  # one expansion step more per 2,000 records: 50 at 100,000, 500 at 1,000,000
EXPANSION_MAX = 1024  # the deepest a search walks, whatever the size
SCAN_BYTES = 4_000_000  # scan, not walk, up to this many bytes (10,416 x 384): all of the top 10 for 0.5 ms more
WALK_RECALL = 0.9  # the share of the true top 10 a graph walk finds at the least (clustered, a few thousand)
SCAN_RECALL = 0.99  # the share a scan finds at the least (its 8-bit top candidates, re-scored)

# Where work runs (bench/results/vectors.md, "Calling thread or worker thread").
QUICK_RECORDS = 4  # an upsert of up to this many may run on the calling thread (less than the hand-off)
QUICK_SUBSET = 256  # a search filtered to up to this many (scored exactly) may run on the calling thread
PENDING_MAX = 256  # at most this many quick upserts' records wait for the graph (each search scores them)
FLUSH_WAIT = 0.005  # how long the calling thread waits for the worker adding a few records to a graph
CHECKPOINT_RECORDS = 200  # records written between this connection's own WAL checkpoints (on the worker thread)

# Saving the index (bench/results/vectors.md, "Saving the index"): due after this many changes applied ...
SAVE_AFTER = 20_000  # ... at least (a crash leaves at most about that many to catch up) ...
SAVE_SHARE = 4  # ... and a quarter of the collection: saving the whole index costs a bounded share of the inserts

Row = tuple[int, str, int, bytes, str, str]
"""A row as read from ``cp_vectors``: its key, id, vector size, float32 vector, text and metadata (JSON)."""

HeldRecord = tuple[str, str, dict[str, Any], bytes]
"""A record as held beside the index: its id, text, metadata and float32 vector (the row's own blob)."""

_ROWS = "SELECT key, id, dim, vector, text, metadata FROM cp_vectors WHERE collection = ?"
_CHANGED_KEYS = "SELECT DISTINCT key FROM cp_vector_changes WHERE collection = ? AND seq > ? AND seq <= ?"


def search_depth(size: int, k: int, scale: float = 1.0) -> tuple[int, int]:
    """Return the search expansion and the number of candidates to re-score, for `size` records and top `k`.

    Both grow with the collection: the denser it is, the more of the true top k the 8-bit distances
    rank below the first few dozen. `scale` multiplies both (the depth a collection chose to hold its
    target recall, `_recall.DepthTuner`); neither goes below `k`.
    """
    candidates = max(CANDIDATES, 2 * k, size // RECORDS_PER_CANDIDATE)
    expansion = max(EXPANSION_SEARCH, min(EXPANSION_MAX, size // RECORDS_PER_EXPANSION), candidates)
    if scale == 1.0:
        return expansion, candidates
    deepest = 4 * EXPANSION_MAX  # (a deeper walk than this costs about what a scan does at 1,000,000)
    return max(k, min(deepest, round(expansion * scale))), max(k, min(deepest, round(candidates * scale)))


# --- asking usearch for keys: the public search, and the compiled shortcut ---------------------------


def public_search(index: Any, q: np.ndarray[Any, Any], count: int,
                  exact: bool) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Return the keys and distances of the `count` vectors of `index` nearest to `q`, through usearch's `Index.search`.

    The reference the compiled shortcut (`IndexSearch`) must equal; with `exact`, a scan instead of a walk.
    """
    found = index.search(q, count, threads=1, exact=exact)
    return found.keys, found.distances


class IndexSearch:
    """How a store asks a usearch index for the keys nearest a query: compiled shortcut, or the public search.

    `compiled_search` calls usearch's compiled ``search_many`` directly, as its Python wrapper does,
    without the result objects the wrapper builds; `public_search` is the plain version it must equal
    (a property test holds them to the same keys and distances). `compiled` says whether to try the
    shortcut; the first failure (another usearch, of another shape) turns it off for this object.
    """

    def __init__(self, compiled: bool = True) -> None:
        self.compiled = compiled
        self._query_kind: Any = None  # usearch's ``ScalarKind.Unknown`` (the query's own dtype), once imported

    def compiled_search(self, index: Any, q: np.ndarray[Any, Any], count: int,
                        exact: bool) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
        """Return what `public_search` returns, through usearch's compiled search (``None``: `index` has none)."""
        search_many = getattr(getattr(index, "_compiled", None), "search_many", None)
        if search_many is None:
            return None
        if self._query_kind is None:
            from usearch.compiled import ScalarKind

            self._query_kind = ScalarKind.Unknown
        keys, distances, counts = search_many(q.reshape(1, -1), count=count, exact=exact, threads=1,
                                              dtype=self._query_kind)[:3]
        found = int(counts[0])
        return keys[0, :found], distances[0, :found]

    def keys(self, index: Any, q: np.ndarray[Any, Any], count: int, exact: bool) -> list[int]:
        """Return the keys of the `count` vectors of `index` nearest to `q` (with `exact`: a scan), nearest first."""
        if self.compiled:
            # The shortcut saves 5 to 9 µs a search, 1 to 3 % of one through the store (bench/results/vectors.md).
            try:
                found = self.compiled_search(index, q, count, exact)
                if found is not None:
                    return list(found[0].tolist())
            except (ImportError, AttributeError, TypeError, ValueError, IndexError):  # another usearch
                self.compiled = False
        return list(public_search(index, q, count, exact)[0].tolist())


# --- one collection's index -------------------------------------------------------------------------


def _hashable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


class CollectionIndex:
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
        self.records: dict[int, HeldRecord] = {}
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
        self.index = Index(ndim=dim, metric="cos", dtype=DTYPE, connectivity=CONNECTIVITY,
                           expansion_add=EXPANSION_ADD, expansion_search=EXPANSION_SEARCH)

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
        """Drop `key` from the records, the postings and the graph."""
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

    def put(self, rows: Sequence[Row], *, defer: bool = False) -> None:
        """Add or replace `rows`.

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

    def describe(self, rows: Iterable[Row]) -> None:
        """Hold `rows` whose vectors the index holds."""
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


# --- searching one collection: exact (the reference) and through the graph -------------------------


def exact_top(c: CollectionIndex, q: np.ndarray[Any, Any], k: int,
              subset: Iterable[int] | None) -> list[tuple[int, float]]:
    """Return the `k` records (of `subset`) nearest to `q` as ``(key, cosine)``, each scored from its float32 vector."""
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


def approximate_top(c: CollectionIndex, q: np.ndarray[Any, Any], k: int, subset: set[int] | None,
                    search: IndexSearch, scan: bool = False, scale: float = 1.0) -> list[tuple[int, float]]:
    """Return about what `exact_top` returns: candidates from the HNSW index (more while too few are in `subset`).

    The candidates are re-scored exactly, so every score is the exact cosine and the order exact; what
    may differ is which records are found. Over clustered collections of a few thousand records a
    graph walk finds at least `WALK_RECALL` of the true top 10 (0.935 the least seen over 40 such
    collections; bench/results/vectors.md has 0.99 and more at 100,000 and 1,000,000 records). With
    `scan`, the candidates are the nearest by the 8-bit vectors over the whole index (no walk): at
    least `SCAN_RECALL` of the true top 10 (all of it in every such collection tried). A property test
    holds both bounds on generated collections. `scale` multiplies the default depth (`search_depth`).
    """
    total = len(c.records)
    expansion, want = search_depth(total, k, scale)
    if subset is not None:  # about 2 k of the subset expected among the candidates
        want = min(total, max(want, k * max(2, 2 * total // len(subset)) + 16))
    if not scan and c.index.expansion_search != expansion:
        c.index.expansion_search = expansion
    indexed = total - len(c.pending)
    # Records not in the graph yet are scored exactly with its candidates, but never counted among
    # what the graph found: k of them must not stop the search before the graph's own best k.
    pending = [key for key in c.pending if subset is None or key in subset]
    while True:
        keys = search.keys(c.index, q, want, scan) if indexed else []
        if subset is not None:
            keys = [key for key in keys if key in subset]
        if len(keys) >= k or want >= indexed:
            return exact_top(c, q, k, keys + pending)
        want = min(indexed, want * 4)


# --- a store's indexes: in step with the file, loaded and saved ---------------------------------------


class Indexes:
    """A store's `CollectionIndex` per collection, brought up to date from the change log, saved in `index_dir`."""

    def __init__(self, index_dir: Path | None) -> None:
        self.index_dir = index_dir
        self.cache: dict[str, CollectionIndex] = {}

    def writing(self, collection: str) -> None:
        """Before this connection commits to `collection`: the next search checks the change log."""
        cached = self.cache.get(collection)
        if cached is not None:
            cached.version = None

    def sync(self, conn: sqlite3.Connection, collection: str) -> CollectionIndex:
        """Bring this process's index of `collection` up to the file's latest change (one read snapshot).

        SQLite's ``data_version`` changes whenever another connection (of any process) commits; when it
        has not moved since this collection was last found up to date, and this connection wrote nothing
        to it since (its own writes clear `version` before they commit), nothing can have changed.
        """
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        cached = self.cache.get(collection)
        if cached is not None and cached.version == version:
            return cached
        conn.execute("BEGIN")
        try:
            latest, below = _latest(conn, collection)
            cached = self.cache.get(collection)
            if cached is None or cached.seq < below:
                cached = self._open(conn, collection, latest, below)
            elif cached.seq != latest:
                self.reload(conn, collection, cached, [r[0] for r in conn.execute(
                    _CHANGED_KEYS, (collection, cached.seq, latest))])
                cached.seq = latest
        finally:
            conn.execute("COMMIT")
        self.maybe_save(conn, collection, cached)
        cached.version = version  # read before the snapshot: a commit in between only costs a check
        return cached

    def reload(self, conn: sqlite3.Connection, collection: str, cached: CollectionIndex, keys: Sequence[int]) -> None:
        """Make `keys` in the index match their rows now: re-read the rows, drop keys that have none.

        (A row moved to another collection, by SQL, has none here any more.)
        """
        step = min(5000, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 1)
        for start in range(0, len(keys), step):
            part = keys[start:start + step]
            rows = conn.execute(f"{_ROWS} AND key IN ({','.join('?' * len(part))})", [collection, *part]).fetchall()
            present = {r[0] for r in rows}
            for key in part:
                if key not in present:
                    cached.forget(key)
            cached.put(rows)
            cached.changed += len(part)
            cached.dirty = True

    def _open(self, conn: sqlite3.Connection, collection: str, latest: int, below: int) -> CollectionIndex:
        """Load the saved index when there is a usable one (then apply newer changes), else build it."""
        self.cache.pop(collection, None)
        loaded = self._load_saved(collection, latest, below)
        if loaded is not None:
            self.cache[collection] = loaded
            self._catch_up(conn, collection, loaded, latest)
            return loaded
        cached = CollectionIndex(latest)
        self.cache[collection] = cached
        batch: list[Row] = []
        for row in conn.execute(f"{_ROWS} ORDER BY key", (collection,)):
            batch.append(row)
            if len(batch) == 5000:
                cached.put(batch)
                batch = []
        cached.put(batch)
        cached.changed = len(cached.records) if len(cached.records) >= SAVE_AFTER else 0
        cached.dirty = True
        return cached

    def _catch_up(self, conn: sqlite3.Connection, collection: str, cached: CollectionIndex, latest: int) -> None:
        """Fill a loaded index's vectors and metadata from the rows, then apply the changes after its own."""
        cursor = conn.execute(_ROWS, (collection,))
        while chunk := cursor.fetchmany(8192):
            cached.describe(r for r in chunk if r[2] == cached.dim)
        stale = [r[0] for r in conn.execute(_CHANGED_KEYS, (collection, cached.seq, latest))]
        # (np.asarray: iterating usearch's key view element by element is quadratic)
        indexed = set(np.asarray(cached.index.keys).tolist()) if cached.index is not None else set()
        missing = [k for k in cached.records if k not in indexed]  # rows the file does not hold (defensive)
        self.reload(conn, collection, cached, sorted(set(stale) | set(missing) | (indexed - set(cached.records))))
        cached.seq = latest

    def _files(self, collection: str) -> list[tuple[int, Path]]:
        if self.index_dir is None or not self.index_dir.is_dir():
            return []
        found = []
        for path in self.index_dir.glob(f"{collection}.*.usearch"):
            seq = path.name[len(collection) + 1:-len(".usearch")]
            if seq.isdigit():
                found.append((int(seq), path))
        return sorted(found)

    def _load_saved(self, collection: str, latest: int, below: int) -> CollectionIndex | None:
        from usearch.index import Index

        for seq, path in reversed(self._files(collection)):
            if seq > latest or seq < below:
                continue  # from a file that was since replaced, or too old for the change log
            try:
                index = Index.restore(str(path), view=False, expansion_add=EXPANSION_ADD,
                                      expansion_search=EXPANSION_SEARCH)
            except Exception:  # unreadable (a crash while an older version wrote it): rebuild instead
                continue
            if index is None:
                continue
            cached = CollectionIndex(seq)
            cached.index, cached.dim = index, int(index.ndim)
            return cached
        return None

    @staticmethod
    def save_due(cached: CollectionIndex) -> bool:
        """Whether `cached` changed enough since it was last saved or loaded to be saved again."""
        return cached.changed >= max(SAVE_AFTER, len(cached.records) // SAVE_SHARE)

    def maybe_save(self, conn: sqlite3.Connection, collection: str, cached: CollectionIndex | None) -> None:
        """Save `cached` if it differs from its file and is due (`save_due`)."""
        if cached is not None and cached.dirty and self.save_due(cached):
            self.save(conn, collection, cached)

    def save(self, conn: sqlite3.Connection, collection: str, cached: CollectionIndex) -> None:
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


def _latest(conn: sqlite3.Connection, collection: str) -> tuple[int, int]:
    """Return the last change logged for `collection`, and the change below which the log was pruned."""
    row = conn.execute("SELECT MAX(seq) FROM cp_vector_changes WHERE collection = ?", (collection,)).fetchone()
    pruned = conn.execute("SELECT below FROM cp_vector_pruned WHERE collection = ?", (collection,)).fetchone()
    below = int(pruned[0]) if pruned else 0
    return max(int(row[0] or 0), below), below


# --- where work runs: the calling thread or the worker thread -----------------------------------------


class WorkerThread:
    """A store's one worker thread and the lock on its connection and indexes; what may run on the calling thread.

    Whatever may wait (another writer's lock, a catch-up, saving an index, a WAL checkpoint, an fsync)
    runs on the worker thread (`run`, `later`). Work that cannot take long runs on the calling thread
    when the lock is free at once (`take_lock`): handing it to the worker and back would cost more.
    """

    def __init__(self, connection: Callable[[], sqlite3.Connection]) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="contextpipe-vectors")
        self.lock = threading.Lock()  # held by whichever thread uses the connection and the indexes
        self.flushing = False  # the worker thread holds the lock only to add a few records to a graph
        self._connection = connection

    def take_lock(self) -> bool:
        """Take the lock for work on the calling thread: if it is free, or held only to add a few records to a graph.

        The worker thread adds a quick upsert's records to the graph soon after it (`flush`): an
        upsert or search that meets that waits for it (a fraction of a millisecond per record, at most
        `QUICK_RECORDS` of them; `FLUSH_WAIT` at the very most) rather than going to the worker
        thread, which would wait for it too and then hand the result back. Held for anything else (a
        checkpoint, a save, a catch-up, another upsert), it is not waited for.
        """
        if self.lock.acquire(blocking=False):
            return True
        return self.flushing and self.lock.acquire(timeout=FLUSH_WAIT)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(connection, *args)`` on the worker thread, holding the lock, and return what it returns."""
        def call() -> Any:
            with self.lock:
                return fn(self._connection(), *args)

        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    def later(self, fn: Callable[[sqlite3.Connection], Any],
              connection: Callable[[], sqlite3.Connection | None]) -> None:
        """Run ``fn(connection)`` on the worker thread, after what is queued there (a WAL checkpoint, an index save).

        Its SQLite and file errors are dropped: a checkpoint or a save that failed is made again when
        next due, and SQLite, not the saved index, holds the vectors. Nothing runs once the connection
        is closed.
        """
        def call() -> None:
            with self.lock, contextlib.suppress(sqlite3.Error, OSError):
                conn = connection()
                if conn is not None:
                    fn(conn)

        with contextlib.suppress(RuntimeError):  # (closed meanwhile: `close` saved what needed saving)
            self.executor.submit(call)

    def flush(self, indexes: Indexes, collection: str, cached: CollectionIndex) -> None:
        """Add `cached`'s pending records to its graph (on the worker thread, holding the lock)."""
        if indexes.cache.get(collection) is not cached:
            return  # (dropped or replaced since: the one there now was built from the rows)
        self.flushing = len(cached.pending) <= QUICK_RECORDS
        try:
            cached.flush()
        except BaseException:
            indexes.cache.pop(collection, None)  # rebuilt (or loaded) from the file by the next search
            raise
        finally:
            self.flushing = False
