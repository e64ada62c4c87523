"""`SQLiteVectorStore`'s own recall: an estimate on the live collection, and the search depth that holds a target.

A graph search finds most, not all, of the true nearest records, and how many depends on the data:
the default depth (`search_depth`) was tuned on one distribution. So each collection checks itself.
Now and then an unfiltered search's query is looked up again, on the store's worker thread after the
search has answered, against a reference that finds the true top k (`reference_top`), and the share
of it the graph walk found goes into a window of the last `SAMPLES` checks. When the window is full:

- below the target, the depth grows by `GROW` (more expansion, more candidates re-scored); past the
  deepest walk worth making (`MAX_SCALE`), searches scan every 8-bit vector instead (`mode` ``scan``),
  which is what no affordable depth could match;
- at or above it, the same queries are tried at `SHRINK` times the depth as well: when that still
  holds the target, the depth shrinks.

After a change the window starts again, checking every search until it is full (20 to 30 ms of
background work each at 100,000 x 384, bench/results/vectors-tuning.json: a scan of the collection);
then one search in `check_every(size)`, so a check costs about 1 % of the searches. A collection that
grew or shrank by `REESTIMATE_SHARE` since its depth was chosen is estimated again, from that depth.

`DepthTuner` holds this per collection; `IndexStats` is what ``SQLiteVectorStore.stats`` reports.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ._hnsw import SCAN_BYTES, CollectionIndex, IndexSearch, approximate_top, exact_top, search_depth

__all__ = ["TARGET_RECALL", "DepthTuner", "IndexStats", "Tuners", "check_every", "check_later", "nearest",
           "reference_top", "scan_records"]

logger = logging.getLogger("contextpipe.vectors")

TARGET_RECALL = 0.98  # the share of the true top k a search should find, by default
SAMPLES = 16  # checked queries per estimate: 160 of the true top 10 (a standard error near 0.01 at 0.98)
CHECK_EVERY = 256  # once estimated, one unfiltered search in at least this many is checked again ...
RECORDS_PER_CHECK = 20  # ... and one in size / 20: a check scans the collection (30 ms at 100,000 x 384, a
#                         search 0.5 ms), so one in 5,000 searches there costs 1 % more work
WAITING = 64  # queries held for checking at most (the oldest dropped: a sample, not data)
GROW = 1.5  # depth times this when the estimate is below the target ...
SHRINK = 0.75  # ... and times this when the queries checked still find the target there
MAX_SCALE = 16.0  # the deepest walk: 16 times the default (at 100,000 records: expansion 800, 320 re-scored)
MIN_SCALE = 0.25
SHRINK_MARGIN = 0.015  # shrink only when the shallower walk finds this much more than the target: 16 checks of a
#                        top 10 have a standard error near 0.01, so a walk just at the target must not flip-flop
REESTIMATE_SHARE = 0.25  # a collection this much larger or smaller than when its depth was chosen starts again
REFERENCE_CANDIDATES = 64  # the reference re-scores at least this many of the 8-bit scan's best (and 8 k)


@dataclass(frozen=True, slots=True)
class IndexStats:
    """How one collection of a `SQLiteVectorStore` is searched, and how much of the true top k it finds."""

    records: int
    """Records in the collection (in this process's index)."""
    mode: Literal["scan", "graph"]
    """How an unfiltered search finds its candidates: ``graph`` walks the HNSW graph, ``scan`` reads every
    8-bit vector (a small collection, or one where no affordable depth reached the target)."""
    expansion: int
    """The graph walk's depth for a top 10 (usearch's ``expansion_search``)."""
    candidates: int
    """How many of the walk's candidates a top 10 re-scores exactly."""
    depth_scale: float
    """The depth chosen against the default for this size: 1.0 is the default, 2.0 twice as deep."""
    target_recall: float | None
    """The share of the true top k searches are held to (``None``: no checking)."""
    estimated_recall: float | None
    """The share of the true top k found, over the last `checked` queries at this depth (``None``: none checked yet)."""
    checked: int
    """Queries checked at the current depth and mode."""
    searches: int
    """Unfiltered searches of this collection by this store since it opened."""


def check_every(size: int) -> int:
    """Return how many unfiltered searches of a `size`-record collection go by between checks, once estimated."""
    return max(CHECK_EVERY, size // RECORDS_PER_CHECK)


def reference_top(c: CollectionIndex, q: np.ndarray[Any, Any], k: int, search: IndexSearch) -> list[int]:
    """Return the keys of the true top `k`: every 8-bit vector scanned, the best ``max(64, 8 k)`` re-scored.

    The 8-bit distances misrank only near neighbours by a little: the true top k is among their best
    8 k (a test holds this reference to `exact_top` over the float32 vectors). It costs one scan
    (20 to 30 ms at 100,000 x 384) where `exact_top` over the whole collection would copy
    every float32 vector first.
    """
    indexed = len(c.records) - len(c.pending)
    keys = search.keys(c.index, q, min(indexed, max(REFERENCE_CANDIDATES, 8 * k)), True) if indexed else []
    return [key for key, _ in exact_top(c, q, k, keys + list(c.pending))]


def scan_records(c: CollectionIndex, scan_limit: int | None) -> int:
    """Return up to how many records `c` is scanned, not walked (`scan_limit`, or as many as `SCAN_BYTES` hold)."""
    return scan_limit if scan_limit is not None else SCAN_BYTES // max(1, c.dim)


def nearest(c: CollectionIndex, q: np.ndarray[Any, Any], k: int, subset: set[int] | None, *, exact_limit: int,
            scan_limit: int | None, search: IndexSearch, scale: float = 1.0,
            scan: bool = False) -> list[tuple[int, float]]:
    """Return the `k` records (of `subset`) nearest to `q`: scored exactly when few, else through the index.

    `scale` and `scan` are the depth and the mode the collection chose (`_recall.DepthTuner`).
    """
    if subset is not None and not subset:
        return []
    if subset is not None and len(subset) <= exact_limit:
        return exact_top(c, q, k, subset)
    # The index: top 10 of 50,000 x 384 in 0.65 ms where `exact_top` takes 251 ms (bench/results/vectors.md).
    return approximate_top(c, q, k, subset, search, scan=scan or len(c.records) <= scan_records(c, scan_limit),
                           scale=scale)


class DepthTuner:
    """One collection's recall estimate and search depth (see the module's docstring).

    Not thread-safe by itself: the store calls it holding its worker lock (every search and every
    check does).
    """

    def __init__(self, target: float | None) -> None:
        if target is not None and not 0.0 < target <= 1.0:
            from ..errors import UsageError

            raise UsageError(f"target_recall must be in (0, 1] or None, got {target!r}")
        self.target = target
        self.scale = 1.0
        self.scan = False  # no affordable depth reached the target: scan every 8-bit vector
        self.searches = 0
        self._since_check = 0
        self._waiting: collections.deque[tuple[np.ndarray[Any, Any], int]] = collections.deque(maxlen=WAITING)
        self._found: list[tuple[float, float]] = []  # per checked query: recall at this depth, and at SHRINK times it
        self._size = 0  # the collection's size when this depth was chosen (0: not yet)

    def depth(self, size: int, k: int) -> tuple[int, int]:
        """Return the walk's expansion and re-scored candidates for `size` records and top `k`, at the chosen depth."""
        return search_depth(size, k, self.scale)

    def searched(self, q: np.ndarray[Any, Any], k: int, size: int, walked: bool) -> bool:
        """Count an unfiltered search of `size` records; return True when its query was kept for a check.

        Only a search that was not a small collection's scan (`walked`) is checked.
        """
        self.searches += 1
        if self.target is None or not walked:
            return False
        if self._size and abs(size - self._size) > REESTIMATE_SHARE * self._size:
            self._restart(size, self.scale, self.scan)  # (from the depth chosen: the data is likely as hard)
        elif not self._size:
            self._size = size
        self._since_check += 1
        if len(self._found) >= SAMPLES and self._since_check < check_every(size):
            return False
        self._since_check = 0
        self._waiting.append((q, k))
        return True

    @property
    def waiting(self) -> int:
        """Queries kept for a check and not checked yet."""
        return len(self._waiting)

    def check(self, c: CollectionIndex, search: IndexSearch, scan_limit: int) -> None:
        """Check the oldest query kept (on the worker thread, after its search answered); move the depth when due.

        One query per call: the store holds its one lock meanwhile (a scan of the collection), so a
        search or an upsert waits for one check at most, never for a batch of them.
        """
        if self._waiting and self.target is not None:
            q, k = self._waiting.popleft()
            if len(c.records) <= max(k, scan_limit) or c.index is None or q.shape[0] != c.dim:
                return  # (scanned anyway, or changed since)
            truth = set(reference_top(c, q, k, search))
            if not truth:
                return
            now = self._found_share(c, q, k, search, truth, self.scale, self.scan)
            # What a shallower walk finds (scanning: the walk at this depth), to know whether it would do.
            lower = self._found_share(c, q, k, search, truth,
                                      self.scale if self.scan else max(MIN_SCALE, self.scale * SHRINK), False)
            self._found.append((now, lower))
            self._found = self._found[-SAMPLES:]
            self._decide(len(c.records))

    @staticmethod
    def _found_share(c: CollectionIndex, q: np.ndarray[Any, Any], k: int, search: IndexSearch, truth: set[int],
                     scale: float, scan: bool) -> float:
        hits = approximate_top(c, q, k, None, search, scan=scan, scale=scale)
        return len(truth & {key for key, _ in hits}) / len(truth)

    def _decide(self, size: int) -> None:
        if len(self._found) < SAMPLES or self.target is None:
            return
        now = sum(f for f, _ in self._found) / len(self._found)
        lower = sum(f for _, f in self._found) / len(self._found)
        if self.scan:
            if lower >= min(1.0, self.target + SHRINK_MARGIN):  # the deepest walk holds it now (the data changed)
                self._restart(size, self.scale)
        elif now < self.target:
            self._restart(size, min(MAX_SCALE, self.scale * GROW), scan=self.scale >= MAX_SCALE)
        elif lower >= min(1.0, self.target + SHRINK_MARGIN) and self.scale > MIN_SCALE:
            self._restart(size, max(MIN_SCALE, self.scale * SHRINK))

    def _restart(self, size: int, scale: float, scan: bool = False) -> None:
        self.scan = scan
        self.scale = scale
        self._size = size
        self._found.clear()
        self._since_check = 0

    def stats(self, c: CollectionIndex | None, scan_limit: int) -> IndexStats:
        """Return what `SQLiteVectorStore.stats` reports for the collection `c` (``None``: nothing stored)."""
        size = len(c.records) if c is not None else 0
        expansion, candidates = self.depth(size, 10)
        mode: Literal["scan", "graph"] = "scan" if self.scan or size <= scan_limit else "graph"
        estimate = sum(f for f, _ in self._found) / len(self._found) if self._found else None
        return IndexStats(size, mode, expansion, candidates, self.scale, self.target, estimate, len(self._found),
                          self.searches)


class Tuners:
    """A store's `DepthTuner` per collection, all held to one `target` recall."""

    def __init__(self, target: float | None) -> None:
        DepthTuner(target)  # (a target out of range is refused here, not at the first search)
        self.target = target
        self._by_collection: dict[str, DepthTuner] = {}
        self._scheduled: set[str] = set()  # collections with a check job queued on the worker thread

    def schedule(self, collection: str) -> bool:
        """Return True when a check job must be queued for `collection` (at most one is, at any time)."""
        if collection in self._scheduled:
            return False
        self._scheduled.add(collection)
        return True

    def drain(self, collection: str, cached: CollectionIndex | None, search: IndexSearch,
              scan_limit: int | None) -> None:
        """Check every query `collection`'s tuner still holds (before `stats` answers)."""
        while self._check_one(collection, cached, search, scan_limit):
            pass  # (the job queued, if one is, clears the schedule itself when it finds nothing left)

    def __getitem__(self, collection: str) -> DepthTuner:
        tuner = self._by_collection.get(collection)
        if tuner is None:
            tuner = self._by_collection[collection] = DepthTuner(self.target)
        return tuner

    def check(self, collection: str, cached: CollectionIndex | None, search: IndexSearch,
              scan_limit: int | None) -> bool:
        """Check the oldest query `collection`'s tuner kept against its index `cached` (if it is still held).

        Return True when more wait (the job checking them queues itself again, so other work gets ahead
        between checks); False once none does, and the collection can be scheduled again.
        """
        if self._check_one(collection, cached, search, scan_limit):
            return True
        self._scheduled.discard(collection)
        return False

    def _check_one(self, collection: str, cached: CollectionIndex | None, search: IndexSearch,
                   scan_limit: int | None) -> bool:
        """Check the oldest query kept, or clear them all if none can be checked; return True if more wait."""
        tuner = self[collection]
        if cached is None or cached.index is None or tuner.target is None:
            tuner._waiting.clear()
        else:
            try:
                tuner.check(cached, search, scan_records(cached, scan_limit))
            except Exception:  # a check must never fail silently, nor fail a search: stop checking, and say so
                logger.exception("recall checks of vector collection %r failed: stopped, at the depth chosen",
                                 collection)
                tuner.target = None
                tuner._waiting.clear()
        return tuner.waiting > 0


def check_later(tuners: Tuners, collection: str, later: Callable[[Callable[[Any], None]], None],
                held: Callable[[str], CollectionIndex | None], search: IndexSearch, scan_limit: int | None) -> None:
    """Queue (`later`: on the store's worker thread) the job checking `collection`'s kept queries, one per turn.

    `held` finds the collection's index when the job runs; the job queues itself again while queries wait.
    """
    def job(conn: Any) -> None:
        if tuners.check(collection, held(collection), search, scan_limit):
            later(job)

    later(job)
