"""A collection's own recall: the reference it checks against, the depth it chooses, what `stats` reports."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpipe.errors import UsageError
from contextpipe.vectors import SQLiteVectorStore, VectorRecord, _hnsw, _recall

SEARCH = _hnsw.IndexSearch()


def _index(matrix: np.ndarray) -> _hnsw.CollectionIndex:
    c = _hnsw.CollectionIndex(0)
    rows = [(i + 1, f"v{i}", matrix.shape[1], matrix[i].tobytes(), f"t{i}", "{}") for i in range(len(matrix))]
    for start in range(0, len(rows), 64):  # (64 at a time: one thread, the same graph on every run)
        c.put(rows[start:start + 64])
    return c


def _uniform(size: int, dim: int, seed: int) -> np.ndarray:
    m = np.random.default_rng(seed).standard_normal((size, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _clustered(size: int, dim: int, clusters: int, spread: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, clusters, size)] + spread * rng.standard_normal((size, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _found(c: _hnsw.CollectionIndex, queries: np.ndarray, tuner: _recall.DepthTuner) -> float:
    """The share of the true (float32, exact) top 10 the store's search finds at the tuner's depth and mode."""
    found = 0
    for q in queries:
        truth = {key for key, _ in _hnsw.exact_top(c, q, 10, None)}
        hits = _recall.nearest(c, q, 10, None, exact_limit=0, scan_limit=0, search=SEARCH, scale=tuner.scale,
                               scan=tuner.scan)
        found += len(truth & {key for key, _ in hits})
    return found / (10 * len(queries))


def _tune(c: _hnsw.CollectionIndex, queries: np.ndarray, tuner: _recall.DepthTuner) -> None:
    for q in queries:
        if tuner.searched(q, 10, len(c.records), walked=True):
            tuner.check(c, SEARCH, scan_limit=0)


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(size=st.integers(100, 3000), dim=st.sampled_from([8, 32, 96]), clusters=st.integers(1, 300),
       spread=st.floats(0.05, 1.0), k=st.integers(1, 20), seed=st.integers(0, 2**32 - 1))
def test_the_reference_finds_the_true_top_k(size: int, dim: int, clusters: int, spread: float, k: int,
                                            seed: int) -> None:
    """The 8-bit scan's best 8 k, re-scored, hold the float32 top k (by score: ties may pick other keys)."""
    matrix = _clustered(size + 10, dim, clusters, spread, seed)
    c = _index(matrix[:size])
    for q in matrix[size:]:
        exact = [s for _, s in _hnsw.exact_top(c, q, k, None)]
        scores = dict(_hnsw.exact_top(c, q, size, None))
        assert [scores[key] for key in _recall.reference_top(c, q, k, SEARCH)] == pytest.approx(exact, abs=1e-6)


def test_a_collection_where_the_default_walk_misses_deepens_it_to_the_target() -> None:
    matrix = _uniform(5000 + 400, 64, seed=7)
    c, queries = _index(matrix[:5000]), matrix[5000:]
    tuner = _recall.DepthTuner(0.98)
    assert _found(c, queries[200:], tuner) < 0.9  # (the fixture: uniform vectors defeat the default depth)
    _tune(c, queries[:200], tuner)
    stats = tuner.stats(c, scan_limit=0)
    assert stats.depth_scale > 1 and stats.checked == _recall.SAMPLES
    assert stats.estimated_recall is not None and stats.estimated_recall >= 0.98
    assert _found(c, queries[200:], tuner) >= 0.96  # held-out queries: the estimate was not of its own sample only


def test_an_easy_collection_walks_less_deep_and_keeps_the_target() -> None:
    matrix = _clustered(5000 + 400, 64, clusters=200, spread=0.25, seed=3)
    c, queries = _index(matrix[:5000]), matrix[5000:]
    tuner = _recall.DepthTuner(0.98)
    assert _found(c, queries[200:], tuner) >= 0.995  # (the fixture: the default depth finds nearly all)
    _tune(c, queries[:200], tuner)
    stats = tuner.stats(c, scan_limit=0)
    assert stats.depth_scale < 1 and stats.mode == "graph"
    assert stats.expansion < _hnsw.search_depth(5000, 10)[0]
    assert _found(c, queries[200:], tuner) >= 0.96


def test_where_no_affordable_walk_reaches_the_target_every_vector_is_scanned() -> None:
    matrix = _uniform(8000 + 300, 256, seed=11)
    c, queries = _index(matrix[:8000]), matrix[8000:]
    tuner = _recall.DepthTuner(0.999)
    _tune(c, queries[:200], tuner)
    assert tuner.stats(c, scan_limit=0).mode == "scan" and tuner.scale == _recall.MAX_SCALE
    assert _found(c, queries[200:], tuner) >= 0.98


def test_a_collection_grown_by_a_quarter_is_estimated_again() -> None:
    tuner = _recall.DepthTuner(0.98)
    q = _uniform(1, 8, seed=1)[0]
    tuner.scale = 2.0
    assert tuner.searched(q, 10, 1000, walked=True)
    tuner._found = [(1.0, 1.0)] * _recall.SAMPLES  # (as if estimated: the next searches are not checked)
    assert not tuner.searched(q, 10, 1200, walked=True)
    assert tuner.searched(q, 10, 1300, walked=True)  # 30 % more: estimated again (from the depth it had), checked
    assert tuner.scale == 2.0 and tuner.stats(None, 0).checked == 0
    assert not tuner.searched(q, 10, 1300, walked=False)  # (a small collection's scan is never checked)


async def test_the_store_checks_itself_in_the_background_and_reports_it() -> None:
    matrix = _uniform(3000 + 100, 48, seed=5)
    store = SQLiteVectorStore(":memory:", scan_limit=0)
    untuned = SQLiteVectorStore(":memory:", scan_limit=0, target_recall=None)

    async def found(s: SQLiteVectorStore, queries: np.ndarray) -> float:
        share = 0
        for q in queries:
            truth = {f"r{i}" for i in np.argsort(-(matrix[:3000] @ q))[:10].tolist()}
            share += len(truth & {h.id for h in await s.vector_search("notes", q.tolist(), k=10)})
        return share / (10 * len(queries))

    try:
        records = [VectorRecord(f"r{i}", matrix[i].tolist(), f"text {i}") for i in range(3000)]
        for s in (store, untuned):
            await s.upsert("notes", records)
        before = await store.stats("notes")
        assert (before.records, before.mode, before.checked, before.estimated_recall) == (3000, "graph", 0, None)
        for q in matrix[3000:3050]:  # searches whose queries the store checks in the background
            for s in (store, untuned):
                await s.vector_search("notes", q.tolist(), k=10)
        stats, plain = await store.stats("notes"), await untuned.stats("notes")
        assert stats.searches == plain.searches == 50 and stats.depth_scale > 1  # (every query checked by now)
        assert (plain.estimated_recall, plain.checked, plain.depth_scale) == (None, 0, 1.0)
        held_out = matrix[3050:]
        assert await found(untuned, held_out) < 0.95  # (the fixture: the default depth misses)
        assert await found(store, held_out) >= 0.96
    finally:
        await store.close()
        await untuned.close()


@pytest.mark.parametrize("target", [0.0, 1.5, -1.0])
def test_a_target_recall_out_of_range_is_refused(target: float) -> None:
    with pytest.raises(UsageError, match="target_recall"):
        SQLiteVectorStore(":memory:", target_recall=target)


async def test_a_failing_check_stops_the_checks_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    matrix = _uniform(600 + 20, 16, seed=9)
    store = SQLiteVectorStore(":memory:", scan_limit=0)
    try:
        await store.upsert("notes", [VectorRecord(f"r{i}", matrix[i].tolist(), f"t{i}") for i in range(600)])

        def broken(*args: object) -> list[int]:
            raise RuntimeError("a check that fails")

        monkeypatch.setattr(_recall, "reference_top", broken)
        tuner = _recall.DepthTuner(0.98)  # (first, without the store: a failed check leaves nothing waiting)
        tuners = _recall.Tuners(0.98)
        tuners._by_collection["x"] = tuner
        for q in matrix[600:603]:
            tuner.searched(q, 5, 600, walked=True)
        c = _index(matrix[:600])
        assert not tuners.check("x", c, SEARCH, 0) and tuner.waiting == 0 and tuner.target is None
        caplog.clear()
        searches = [store.vector_search("notes", q.tolist(), k=5) for q in matrix[600:]]
        for hits in await asyncio.gather(*searches):  # (concurrent: checks wait while searches go on)
            assert len(hits) == 5  # searches answer as ever
        stats = await store.stats("notes")  # returns: nothing left waiting for a check that cannot run
        assert stats.target_recall is None and stats.checked == 0 and stats.searches == 20
        assert [r.name for r in caplog.records if "recall checks" in r.getMessage()] == ["contextpipe.vectors"]
        assert (await store.vector_search("notes", matrix[0].tolist(), k=1))[0].id == "r0"
    finally:
        await store.close()


def test_a_collection_has_one_check_job_queued_at_most() -> None:
    tuners = _recall.Tuners(0.98)
    assert tuners.schedule("notes") and not tuners.schedule("notes") and tuners.schedule("other")
    c = _index(_uniform(300, 8, seed=2))
    q = _uniform(2, 8, seed=3)
    for row in q:
        assert tuners["notes"].searched(row, 5, 300, walked=True)
    assert tuners.check("notes", c, SEARCH, 0)  # one checked, one waits: the job goes on
    assert not tuners.check("notes", c, SEARCH, 0) and tuners["notes"].stats(c, 0).checked == 2
    assert tuners.schedule("notes")  # none queued any more
    assert tuners["notes"].searched(q[0], 5, 300, walked=False) is False  # (a scan is never checked)
    tuners["notes"]._found.clear()
    assert tuners["notes"].searched(q[0], 5, 300, walked=True)
    tuners.drain("notes", c, SEARCH, 0)  # stats' drain checks what waits, and leaves the job's schedule alone
    assert tuners["notes"].waiting == 0 and not tuners.schedule("notes")
