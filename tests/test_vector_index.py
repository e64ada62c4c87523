"""The embedded vector store's HNSW index kept in step with SQLite, and hybrid search on every store."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import UsageError
from contextpipe.stores import SQLiteStore
from contextpipe.vectors import MemoryVectorStore, SQLiteVectorStore, VectorRecord, VectorStore, _hnsw
from contextpipe.vectors._hnsw import PENDING_MAX, IndexSearch, public_search, search_depth
from contextpipe.vectors.base import SearchHit, combmnz, fuse, keyword_terms, matches, rrf
from helpers import vector_store

WORKER = Path(__file__).parent / "fixtures" / "vector_crash_worker.py"


@pytest.fixture(params=["memory", "sqlite", "pgvector"])
async def vectors(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    store = vector_store(request.param, tmp_path, "h")
    yield store
    await store.close()


NOTES = {
    "n1": ("Maya: I signed up for a pottery class at the arts centre.", [1.0, 0.0, 0.0, 0.0]),
    "n2": ("Daniel: Pottery, wow, that sounds relaxing!", [0.0, 1.0, 0.0, 0.0]),
    "n3": ("Maya: My dog Biscuit ate a whole loaf of bread.", [0.0, 0.0, 1.0, 0.0]),
    "n4": ("Daniel: I bake sourdough bread every weekend.", [0.7, 0.0, 0.7, 0.1]),
}


_WORDS = ["bake", "baking", "baked", "bakery", "pottery", "potter", "class", "classes", "running", "runner",
          "café", "cafe", "naïve", "über", "Zürich", "the", "a", "and", "of", "I", "2023", "4", "Maya", "Maya's",
          "don't", "well-known", "e-mail", "connection", "connected", "relational", "happiness", "happy",
          "generalization", "generous", "Omar", "shelter", "cat", "cats", "adopted", "adoption", "1990s", "mp3s",
          "3ds", "straße", "weißes", "œuvres", "søsters", "cafe\u0301s", "İstanbul", "ὈΔΥΣΣΕΎΣ", "Οδυσσευς",
          "\ue000x", "ᏣᎳᎩ", "ႠႡ", "北京大学", "हिन्दी", "naïveté", "ÉCOLE", "école", "q\u19b0q", "\u19b0\u19b1"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=25), min_size=1, max_size=12),
       query=st.lists(st.sampled_from(_WORDS), min_size=1, max_size=5), who=st.sampled_from(["a", "b", None]))
def test_the_in_memory_store_ranks_keywords_as_sqlite_fts5_does(texts: list[list[str]], query: list[str],
                                                                who: str | None) -> None:
    async def scores(store: VectorStore) -> dict[str, float]:
        await store.upsert("c", [VectorRecord(f"r{i}", [1.0, float(i)], ", ".join(words) + ".",
                                              {"who": "ab"[i % 2]}) for i, words in enumerate(texts)])
        await store.upsert("other", [VectorRecord("o", [1.0, 0.0], "bake bake bake pottery cats")])
        where = None if who is None else {"who": who}
        hits = await store.keyword_search("c", " ".join(query), k=len(texts), where=where)
        await store.close()
        return {h.id: h.score for h in hits}

    memory, sqlite = asyncio.run(scores(MemoryVectorStore())), asyncio.run(scores(SQLiteVectorStore(":memory:")))
    assert memory == {i: pytest.approx(score, rel=1e-9, abs=1e-12) for i, score in sqlite.items()}


_ABSENT = object()  # a record without the field
_WANTED = st.sampled_from([None, "x", "y", 3])
_HELD = st.one_of(_WANTED, st.sampled_from([_ABSENT, ("x", "y")]))  # (a list value: not hashable)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.lists(_HELD, min_size=1, max_size=8), min_size=1, max_size=2),
       wanted=st.one_of(_WANTED, st.lists(_WANTED, max_size=3)))
async def test_a_filter_matches_the_same_records_in_every_search(vectors: VectorStore, rounds: list[list[object]],
                                                                  wanted: object) -> None:
    """Vector, keyword and hybrid search, count and delete keep the records `matches` keeps; None is "no value".

    A filter on None keeps records whose field is null or missing, alike on every store and every path
    (SQLite answers from its in-memory postings once a collection is loaded, from SQL before). A second
    round writes the same ids again with other values.
    """
    collection = f"c{uuid.uuid4().hex[:8]}"
    where = {"agent": wanted}
    for values in rounds:
        records = [VectorRecord(f"r{i}", [1.0, float(i)], f"shared words {i}",
                                {"n": i} if value is _ABSENT else {"n": i, "agent": list(value)
                                                                   if isinstance(value, tuple) else value})
                   for i, value in enumerate(values)]
        await vectors.delete(collection, ids=[f"r{i}" for i in range(len(values), 8)])
        await vectors.upsert(collection, records)
        want = {r.id for r in records if matches(r.metadata, where)}
        searches = [lambda s: s.search(collection, [1.0, 0.5], k=8, where=where),  # (8: every record)
                    lambda s: s.search(collection, text="shared words", k=8, where=where),
                    lambda s: s.search(collection, [1.0, 0.5], text="shared", k=8, where=where)]
        for search in searches:
            if isinstance(vectors, SQLiteVectorStore):  # a store that has not loaded the collection: SQL
                cold = SQLiteVectorStore(vectors.path)
                assert {h.id for h in await search(cold)} == want
                await cold.close()
            assert {h.id for h in await search(vectors)} == want
        assert await vectors.count(collection, where=where) == len(want)
    assert await vectors.delete(collection, where=where) == len(want)
    assert await vectors.count(collection) == len(records) - len(want)


async def test_keyword_search_finds_words_with_combining_marks(vectors: VectorStore) -> None:
    """Hindi's vowel signs and Arabic's short vowels are part of their words, in the query too."""
    store = vectors
    await store.upsert("c", [VectorRecord("hi", [1.0, 0.0], "मुझे हिन्दी फ़िल्में पसंद हैं"),
                             VectorRecord("ar", [0.0, 1.0], "كَتَبَ الوَلَدُ رِسالَةً طَوِيلَةً"),
                             VectorRecord("en", [0.5, 0.5], "I like films and long letters")])
    assert [h.id for h in await store.keyword_search("c", "हिन्दी फ़िल्में?", k=3)] == ["hi"]
    assert [h.id for h in await store.keyword_search("c", "رِسالَةً", k=3)] == ["ar"]


async def test_keyword_and_hybrid_search_with_filters(vectors: VectorStore) -> None:
    await vectors.upsert("notes", [VectorRecord(i, v, t, {"who": t.split(":")[0]}) for i, (t, v) in NOTES.items()])
    found = await vectors.search("notes", text="Which class did Maya sign up for? pottery", k=4)
    assert found[0].id == "n1" and {h.id for h in found} == {"n1", "n2", "n3"}  # "maya", "pottery"
    assert found[0].keyword_score == found[0].score and found[0].vector_score is None
    only_daniel = await vectors.search("notes", text="pottery bread", k=4, where={"who": "Daniel"})
    assert {h.id for h in only_daniel} == {"n2", "n4"}
    assert await vectors.search("notes", text="the of and", k=4) == []  # stopwords only: nothing to look for
    # Hybrid: the vector ranking says n4, n1, n3; the keywords say n3 (bread + biscuit), n4 (bread).
    hybrid = await vectors.search("notes", [1.0, 0.0, 0.6, 0.0], text="Biscuit bread", k=3)
    assert [h.id for h in hybrid][:2] == ["n3", "n4"]  # found by both first (n3 the best keyword match)
    assert hybrid[0].vector_score is not None and hybrid[0].keyword_score is not None
    # The store's fusion (CombMNZ by default) of its own two rankings, each `candidates` deep.
    sides = (await vectors.vector_search("notes", [1.0, 0.0, 0.6, 0.0], k=vectors.candidates),
             await vectors.keyword_search("notes", "Biscuit bread", k=vectors.candidates))
    assert [(h.id, h.score) for h in hybrid] == [(h.id, pytest.approx(h.score)) for h in combmnz(*sides, k=3)]
    vectors.fusion = "rrf"
    hybrid = await vectors.search("notes", [1.0, 0.0, 0.6, 0.0], text="Biscuit bread", k=3)
    assert [h.id for h in hybrid][:2] == ["n4", "n3"] and hybrid[0].score == pytest.approx(1 / 61 + 1 / 62)
    vectors.fusion = "combmnz"
    filtered = await vectors.search("notes", [1.0, 0.0, 0.6, 0.0], text="Biscuit bread", k=3, where={"who": "Maya"})
    assert [h.id for h in filtered] == ["n3", "n1"]
    # The keyword index holds `keywords` when given, and follows deletes and replacements.
    await vectors.upsert("notes", [VectorRecord("n5", [0, 0, 0, 1], "Maya: Yes!", {"who": "Maya"},
                                                keywords="Daniel: Did you finish the marathon?\nMaya: Yes!")])
    assert [h.id for h in await vectors.search("notes", text="marathon", k=3)] == ["n5"]
    assert (await vectors.search("notes", text="marathon", k=3))[0].text == "Maya: Yes!"
    await vectors.upsert("notes", [VectorRecord("n5", [0, 0, 0, 1], "Maya: Yes!", {"who": "Maya"})])
    assert await vectors.search("notes", text="marathon", k=3) == []
    assert await vectors.delete("notes", ids=["n3"]) == 1
    assert "n3" not in {h.id for h in await vectors.search("notes", [0, 0, 1, 0], text="Biscuit", k=5)}
    with pytest.raises(UsageError, match="vector, a text"):
        await vectors.search("notes")


def test_rrf_and_keyword_terms() -> None:
    def hits(*ids: str) -> list[SearchHit]:
        return [SearchHit(i, 1.0 / (n + 1), i, {}) for n, i in enumerate(ids)]

    fused = rrf(hits("a", "b", "c"), hits("c", "d"), k=3)
    assert [h.id for h in fused] == ["c", "a", "b"]  # 1/63 + 1/61 beats 1/61 alone
    assert fused[0].vector_score == pytest.approx(1 / 3) and fused[0].keyword_score == pytest.approx(1.0)
    with pytest.raises(UsageError, match="fusion must be"):
        fuse(hits("a"), method="borda")  # type: ignore[arg-type]
    assert keyword_terms("Was MAYA's dog, Biscuit, at the finish line? dog") == ["maya", "dog", "biscuit", "finish",
                                                                                  "line"]


def test_combmnz_scales_each_ranking_and_rewards_agreement() -> None:
    def hits(*pairs: tuple[str, float]) -> list[SearchHit]:
        return [SearchHit(i, score, i, {}) for i, score in pairs]

    by_vector = hits(("a", 0.9), ("b", 0.5), ("c", 0.1))
    by_keywords = hits(("c", 12.0), ("d", 2.0))
    fused = combmnz(by_vector, by_keywords, k=4)
    # c: (0 + 1) x 2 rankings; a: 1 x 1; b: 0.5 x 1; d: 0 x 1 (the worst of its ranking).
    assert [(h.id, h.score) for h in fused] == [("c", 2.0), ("a", 1.0), ("b", 0.5), ("d", 0.0)]
    assert (fused[0].vector_score, fused[0].keyword_score) == (0.1, 12.0)
    assert (fused[1].vector_score, fused[1].keyword_score) == (0.9, None)
    weighted = combmnz(by_vector, by_keywords, k=3, weights=(1.0, 0.2))  # c: (0 + 0.2) x 2 falls below b
    assert [(h.id, h.score) for h in weighted] == [("a", 1.0), ("b", 0.5), ("c", pytest.approx(0.4))]
    assert [(h.id, h.score) for h in combmnz(hits(("x", 3.0), ("y", 3.0)), [])] == [("x", 1.0), ("y", 1.0)]
    assert combmnz([], []) == [] and fuse(by_vector, by_keywords, k=4) == fused
    # A ranking weighted 0 is off: the order is the other ranking's, as with `rrf`.
    by_vector, by_keywords = hits(("a", 0.9), ("b", 0.8), ("c", 0.1)), hits(("b", 7.0), ("z", 1.0))
    assert [h.id for h in combmnz(by_vector, by_keywords, k=4, weights=(1.0, 0.0))] == ["a", "b", "c", "z"]
    assert combmnz(by_vector, by_keywords, k=1, weights=(0.0, 1.0))[0].id == "b"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(-10, 10)), max_size=8), max_size=3),
       st.integers(1, 8))
def test_combmnz_ranks_every_record_once_and_whatever_k_first_the_same(
        rankings: list[list[tuple[str, float]]], k: int) -> None:
    lists = [[SearchHit(i, score, i, {}) for i, score in ranking] for ranking in rankings]
    everything = combmnz(*lists, k=100)
    ids = [h.id for h in everything]
    assert sorted(ids) == sorted({h.id for ranking in lists for h in ranking})
    assert [h.id for h in combmnz(*lists, k=k)] == ids[:k]
    assert all(0.0 <= h.score <= len(lists) ** 2 for h in everything)
    assert [h.score for h in everything] == sorted((h.score for h in everything), reverse=True)


# --- the HNSW index and SQLite ---------------------------------------------------------------------------


async def settled(store: SQLiteVectorStore) -> None:
    """Return once the store's worker thread has added the records of quick upserts to the HNSW graph,
    and has checked the recall of the searches kept for that (the worker thread is idle then).

    A quick upsert asks for that once the event loop gets control back (`asyncio.sleep(0)` gives it),
    and a call queued on the worker thread after that runs after it. A recall check holds the store's
    lock and queues itself again while searches wait to be checked: a test stalling the worker thread
    to keep the lock free waits for the checks first.
    """
    await asyncio.sleep(0)
    await store._run(lambda conn: None)
    for _ in range(100):  # (a check job runs one kept search per turn, at most 64 of them)
        if not store._tuners._scheduled and not store._worker.lock.locked():
            return
        await store._run(lambda conn: None)
    raise AssertionError("the store's recall checks never finished")


def exact_ids(rows: dict[str, np.ndarray], query: np.ndarray, k: int) -> list[str]:
    q = query / np.linalg.norm(query)
    scored = sorted(rows, key=lambda i: -float(rows[i] @ q / np.linalg.norm(rows[i])))
    return scored[:k]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


ops = st.lists(st.tuples(st.sampled_from(["put", "put", "put", "batch", "delete", "reopen", "save", "other", "held"]),
                         st.integers(0, 30), st.integers(0, 2**32 - 1)), min_size=1, max_size=40)


@pytest.mark.parametrize("scan_limit", [0, None])  # the graph walk, the scan of a small collection
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=ops)
async def test_index_matches_exact_search_through_any_sequence(tmp_path_factory: pytest.TempPathFactory,
                                                                script: list[tuple[str, int, int]],
                                                                scan_limit: int | None) -> None:
    """Upserts, deletes, another process's writes, saves and reopenings: the index answers like exact search.

    Each hit's text and metadata are the record's as last written (they are held beside the index).
    ``held``: quick upserts while the worker thread is stalled, so their records are not in the HNSW
    graph yet (searched exactly beside it) until the worker adds them.
    """
    db = tmp_path_factory.mktemp("hnsw") / "v.db"
    store = SQLiteVectorStore(db, exact_limit=0, scan_limit=scan_limit)  # always the index, never the rows
    other = SQLiteVectorStore(db, exact_limit=0, scan_limit=scan_limit)
    truth: dict[str, np.ndarray] = {}
    written: dict[str, tuple[str, dict[str, int]]] = {}  # each record's text and metadata

    async def searched_as_exact(query: np.ndarray) -> None:
        hits = await store.search("c", query, k=5)
        want = exact_ids(truth, query, 5)  # small collections: HNSW is exact (ties in any order)
        assert len(hits) == len(want) and all(h.id in truth for h in hits)
        assert [h.score for h in hits] == pytest.approx([cosine(truth[i], query) for i in want], abs=1e-5)
        assert all(h.score == pytest.approx(cosine(truth[h.id], query), abs=1e-5) for h in hits)
        assert all((h.text, h.metadata) == written[h.id] for h in hits)

    try:
        for op, n, seed in script:
            rng = np.random.default_rng(seed)
            cached = store._cache.get("c")
            if op == "held" and cached is not None and cached.version is not None and cached.records:
                await settled(store)  # (no recall check holds the lock meanwhile)
                gate = threading.Event()  # (the worker thread waits; the store's lock stays free)
                store._executor.submit(gate.wait, 60)  # (a bound, so that a fallback to it fails, not hangs)
                try:
                    for j in range(3):
                        vector = rng.standard_normal(6).astype(np.float32)
                        written[f"r{(n + j) % 31}"] = (f"r{(n + j) % 31} by held {seed}", {"seed": seed})
                        await store.upsert("c", [VectorRecord(f"r{(n + j) % 31}", vector,
                                                              *written[f"r{(n + j) % 31}"], keywords=f"words {seed}")])
                        truth[f"r{(n + j) % 31}"] = vector
                    assert cached.pending  # (committed, searched exactly, not yet in the graph)
                    assert not any(key in cached.index for key in cached.pending)
                    await searched_as_exact(rng.standard_normal(6).astype(np.float32))
                finally:
                    gate.set()
            elif op in ("put", "other"):
                vector = rng.standard_normal(6).astype(np.float32)
                written[f"r{n}"] = (f"r{n} by {op} {seed}", {"seed": seed})
                record = VectorRecord(f"r{n}", vector, *written[f"r{n}"], keywords=f"words {seed}")
                await (other if op == "other" else store).upsert("c", [record])
                truth[f"r{n}"] = vector
            elif op == "batch":  # one transaction naming a record twice: the last one stays
                first, second, last = (rng.standard_normal(6).astype(np.float32) for _ in range(3))
                await store.upsert("c", [VectorRecord(f"r{n}", first, "first", {"seed": -1}),
                                         VectorRecord(f"r{n + 1}", second, "b", {"seed": seed}),
                                         VectorRecord(f"r{n}", last, "last", {"seed": seed})])
                truth[f"r{n}"], truth[f"r{n + 1}"] = last, second
                written[f"r{n}"], written[f"r{n + 1}"] = ("last", {"seed": seed}), ("b", {"seed": seed})
            elif op == "delete":
                await store.delete("c", ids=[f"r{n}"])
                truth.pop(f"r{n}", None)
            elif op == "save":
                await store.save_indexes()
            else:
                await store.close()
                store = SQLiteVectorStore(db, exact_limit=0, scan_limit=scan_limit)
            await searched_as_exact(rng.standard_normal(6).astype(np.float32))
            by_words = await store.keyword_search("c", "words", k=50)  # (the records `put` wrote last)
            assert all((h.text, h.metadata) == written[h.id] for h in by_words)
            assert {h.id for h in by_words} == {i for i, (text, _) in written.items() if i in truth and " by " in text}
            await settled(store)
            if (cached := store._cache.get("c")) is not None and cached.index is not None:
                assert not cached.pending and len(cached.index) >= len(cached.records)
    finally:
        await store.close()
        await other.close()


async def test_saved_index_is_loaded_and_brought_up_to_date(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data = {f"v{i}": rng.standard_normal(16).astype(np.float32) for i in range(300)}
    store = SQLiteVectorStore(tmp_path / "v.db")
    await store.upsert("c", [VectorRecord(i, v, i, {"even": int(i[1:]) % 2 == 0}) for i, v in data.items()])
    await store.search("c", data["v0"], k=1)
    await store.close()
    files = sorted(p.name for p in (tmp_path / "v.db.vectors").iterdir())
    assert len(files) == 1 and files[0].startswith("c.")  # saved on close, named by the change it reflects
    # Another writer changes the rows while no index is open; the saved file is now behind.
    writer = SQLiteVectorStore(tmp_path / "v.db")
    await writer.delete("c", ids=["v0", "v1"])
    await writer.upsert("c", [VectorRecord("v2", -data["v2"], "v2 flipped", {"even": True})])
    writer._executor.shutdown()  # gone without saving, like a crash
    reader = SQLiteVectorStore(tmp_path / "v.db")
    hits = await reader.search("c", data["v0"], k=300)
    assert {h.id for h in hits} == set(data) - {"v0", "v1"}
    assert (await reader.search("c", -data["v2"], k=1))[0].text == "v2 flipped"
    assert all(h.metadata["even"] for h in await reader.search("c", data["v3"], k=10, where={"even": True}))
    await reader.close()
    # An unreadable index file is rebuilt from the rows.
    [saved] = (tmp_path / "v.db.vectors").iterdir()
    saved.write_bytes(b"not an index")
    again = SQLiteVectorStore(tmp_path / "v.db")
    assert len(await again.search("c", data["v5"], k=500)) == 298
    await again.close()


async def test_filtered_search_large_and_small_subsets(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    store = SQLiteVectorStore(tmp_path / "v.db", exact_limit=50)
    data = {f"v{i}": rng.standard_normal(8).astype(np.float32) for i in range(2000)}
    await store.upsert("c", [VectorRecord(i, v, i, {"group": int(i[1:]) % 40, "tags": ["x"]})
                             for i, v in data.items()])
    query = rng.standard_normal(8).astype(np.float32)
    small = {i: v for i, v in data.items() if int(i[1:]) % 40 == 3}  # 50 records: searched exactly
    assert [h.id for h in await store.search("c", query, k=5, where={"group": 3})] == exact_ids(small, query, 5)
    large = {i: v for i, v in data.items() if int(i[1:]) % 40 < 20}  # 1,000: the HNSW index, searched deeper
    got = [h.id for h in await store.search("c", query, k=10, where={"group": list(range(20))})]
    assert len(got) == 10 and all(i in large for i in got)
    assert len(set(got) & set(exact_ids(large, query, 10))) >= 9
    # A filter on a value that is not a plain scalar still works (looked for record by record).
    assert len(await store.search("c", query, k=3, where={"tags": [["x"]]})) == 3
    await store.close()


async def searchable(db: Path, k: int) -> set[str]:
    store = SQLiteVectorStore(db, exact_limit=0, scan_limit=0)
    try:
        return {h.id for h in await store.search("c", [1.0] * 8, k=k)}
    finally:
        await store.close()


def test_a_killed_writer_never_loses_or_resurrects_a_vector(tmp_path: Path) -> None:
    """SIGKILL a process mid-stream (several times, at changing points); then search equals the committed rows."""
    db = tmp_path / "v.db"
    committed: set[str] = set()
    for round_ in range(4):
        proc = subprocess.Popen([sys.executable, str(WORKER), str(db), str(round_)], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None
        lines = 40 + random.Random(round_).randrange(60)  # kill after a varying number of committed steps
        for _ in range(lines):
            line = proc.stdout.readline().strip()
            assert line, "the worker stopped early"
            (committed.add if line[0] == "+" else committed.discard)(line[1:])
        os.kill(proc.pid, signal.SIGKILL)
        for line in proc.stdout.read().split():  # what it committed after our last read, before dying
            (committed.add if line[0] == "+" else committed.discard)(line[1:])
        proc.stdout.close()
        proc.wait()
        with sqlite3.connect(db) as conn:
            rows = {r[0] for r in conn.execute("SELECT id FROM cp_vectors WHERE collection = 'c'")}
        # A step printed is committed; the one in flight (an insert or a delete) may or may not be.
        assert len(committed ^ rows) <= 1
        committed = rows
        assert asyncio.run(searchable(db, len(rows) + 10)) == rows


async def test_session_deletion_reaches_the_index(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    store = SQLiteStore(db)
    await store.load_or_create("default", "s0")  # the memories' session (deletion cascades from a real one)
    vectors = store.vectors()
    await vectors.upsert("memory", [VectorRecord(f"n{i}", vector, text, {"tenant": "default",
                                                                          "session_id": f"s{i % 2}"})
                                    for i, (text, vector) in enumerate(NOTES.values())])
    assert {h.id for h in await vectors.search("memory", text="pottery", k=5)} == {"n0", "n1"}
    assert await vectors.count("memory") == 4
    await store.delete_session("default", "s0")  # deletes its memories in the same file
    assert {h.id for h in await vectors.search("memory", [1, 1, 1, 1], k=5)} == {"n1", "n3"}
    assert [h.id for h in await vectors.search("memory", text="pottery", k=5)] == ["n1"]
    await vectors.close()
    await store.close()


# Another collection of the same file, full of words the notes use: under shared word statistics
# "pottery" and "bread" become common and the notes' BM25 scores move.
_MANUALS = [VectorRecord(f"m{i}", [0.5, 0.5, 0.5, 0.5], f"Manual {i}: pottery wheel and bread oven, page {i}.")
            for i in range(40)]


# Notes that share no word with the questions below, so the words asked about are rare among the notes.
_SMALL_TALK = [VectorRecord(f"t{i}", [0.1 * i, 0.2, 0.3, 0.4], text) for i, text in enumerate([
    "Maya: Morning! Did you sleep well?", "Daniel: Not really, the neighbours had a party.",
    "Maya: Ugh, Saturday nights on our street.", "Daniel: Anyway, how was the drive up north?",
    "Maya: Long. The motorway was closed near Leeds.", "Daniel: Typical. Coffee later?",
    "Maya: Yes please, around four?", "Daniel: Four works, see you at the usual place."])]


def _keyword_ranking(hits: list[SearchHit]) -> list[tuple[str, float]]:
    return [(h.id, pytest.approx(h.score)) for h in hits]


async def test_keyword_statistics_are_each_collections_own(tmp_path: Path) -> None:
    alone = SQLiteVectorStore(tmp_path / "alone.db")
    shared = SQLiteVectorStore(tmp_path / "shared.db")
    notes = [VectorRecord(i, v, t, {"who": t.split(":")[0]}) for i, (t, v) in NOTES.items()]
    notes += [VectorRecord(r.id, r.vector, r.text, {"who": r.text.split(":")[0]}) for r in _SMALL_TALK]
    await alone.upsert("notes", notes)
    await shared.upsert("notes", notes)
    await shared.upsert("manuals", _MANUALS)
    for query in ("pottery bread", "Maya's dog Biscuit", "sourdough bread every weekend"):
        for where in (None, {"who": "Maya"}):
            expected = [(h.id, h.score) for h in await alone.keyword_search("notes", query, k=4, where=where)]
            assert expected
            assert _keyword_ranking(await shared.keyword_search("notes", query, k=4, where=where)) == expected
    # The same with the collection's index loaded (ids, texts and filters answered from memory).
    await shared.search("notes", [1, 0, 0, 0], k=1)
    for where in (None, {"who": "Daniel"}):
        expected = [(h.id, h.score) for h in await alone.keyword_search("notes", "pottery bread", k=4, where=where)]
        assert _keyword_ranking(await shared.keyword_search("notes", "pottery bread", k=4, where=where)) == expected
    assert len(await shared.keyword_search("manuals", "bread", k=50)) == 40
    await alone.close()
    await shared.close()


@pytest.mark.parametrize("encoding", ["UTF-16le", "UTF-16be"])
async def test_keyword_indexes_work_in_a_utf16_file(tmp_path: Path, encoding: str) -> None:
    db = tmp_path / "v.db"
    with sqlite3.connect(db) as conn:  # (a file another program made, in its own text encoding)
        conn.execute(f"PRAGMA encoding = '{encoding}'")
        conn.execute("CREATE TABLE other (x)")
    store = SQLiteVectorStore(db, allow_other_tables=True)  # shared on purpose
    for name in ("notes", "it's\x00odd"):
        await store.upsert(name, [VectorRecord(i, v, t) for i, (t, v) in NOTES.items()])
        assert [h.id for h in await store.keyword_search(name, "Biscuit", k=4)] == ["n3"]
    await store.close()


async def test_rows_written_by_other_means_stay_in_their_keyword_index(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    store = SQLiteVectorStore(db)
    await store.upsert("notes", [VectorRecord(i, v, t) for i, (t, v) in NOTES.items()])
    with sqlite3.connect(db) as conn:  # another program edits the rows with SQL
        conn.execute("UPDATE cp_vectors SET keywords = 'zebra crossing' WHERE id = 'n2'")
        conn.execute("DELETE FROM cp_vectors WHERE id = 'n3'")
        # A collection another program writes: it has no keyword index yet.
        conn.execute("INSERT INTO cp_vectors (collection, id, dim, vector, text, metadata, keywords) "
                     "VALUES ('older', 'o1', 4, ?, 'zebra', '{}', 'zebra')",
                     (np.ones(4, dtype=np.float32).tobytes(),))
    assert [h.id for h in await store.keyword_search("notes", "zebra", k=4)] == ["n2"]
    assert [h.id for h in await store.keyword_search("notes", "pottery", k=4)] == ["n1"]  # (n2's words replaced)
    assert [h.id for h in await store.keyword_search("notes", "Biscuit", k=4)] == []
    assert [h.id for h in await store.keyword_search("older", "zebra", k=4)] == ["o1"]
    assert await store.keyword_search("never stored", "zebra", k=4) == []
    # A record moved to another collection by SQL leaves the first one's keywords and vectors.
    assert "n4" in {h.id for h in await store.search("notes", [0.7, 0.0, 0.7, 0.1], k=4)}
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE cp_vectors SET collection = 'older' WHERE id = 'n4'")
    assert await store.keyword_search("notes", "sourdough", k=4) == []
    assert [h.id for h in await store.keyword_search("older", "sourdough", k=4)] == ["n4"]
    assert "n4" not in {h.id for h in await store.search("notes", [0.7, 0.0, 0.7, 0.1], k=4)}
    assert "n4" in {h.id for h in await store.search("older", [0.7, 0.0, 0.7, 0.1], k=4)}
    # Any name, even one SQL could not quote.
    for name in ("bad\x00name", "x';\nEND; DROP TABLE cp_vectors; --", "{t}{c}", "", "\x00", "é" * 300):
        await store.upsert(name, [VectorRecord("w", [1, 0, 0, 0], f"walrus of {name}")])
        assert [h.text for h in await store.keyword_search(name, "walrus", k=4)] == [f"walrus of {name}"]
    await store.upsert("notes", [VectorRecord("n1", [1, 0, 0, 0], "Maya: glazing class now.")])
    assert await store.delete("notes", ids=["n2"]) == 1
    assert [h.id for h in await store.keyword_search("notes", "glazing", k=4)] == ["n1"]
    assert await store.keyword_search("notes", "pottery", k=4) == []
    # A collection's first upsert fails after its keyword index was made: both are rolled back, and
    # the next upsert makes the index again.
    with pytest.raises(UnicodeEncodeError):
        await store.upsert("fresh", [VectorRecord("f0", [1, 0, 0, 0], "bad \ud800 text")])
    await store.upsert("fresh", [VectorRecord("f1", [1, 0, 0, 0], "zebra")])
    assert [h.id for h in await store.keyword_search("fresh", "zebra", k=4)] == ["f1"]
    await store.close()


async def test_inserts_do_not_copy_the_collection(tmp_path: Path) -> None:
    """Growing the collection one record at a time leaves the vectors already held where they are."""
    store = SQLiteVectorStore(tmp_path / "v.db")
    rng = np.random.default_rng(3)
    await store.upsert("c", [VectorRecord(f"v{i}", rng.standard_normal(4), "x") for i in range(100)])
    await store.search("c", [1, 0, 0, 0], k=1)
    records = store._cache["c"].records
    held = {key: record[3] for key, record in records.items()}
    for i in range(100, 300):
        await store.upsert("c", [VectorRecord(f"v{i}", rng.standard_normal(4), "x")])
    assert all(records[key][3] is vector for key, vector in held.items())  # the same objects, not copies
    assert await store.count("c") == len(records) == 300
    await store.close()


OTHER_PROCESS = """
import asyncio, sqlite3, sys
from contextpipe.vectors import SQLiteVectorStore, VectorRecord

async def main() -> None:
    store = SQLiteVectorStore(sys.argv[1])
    await store.upsert("c", [VectorRecord("new", [0.0] * 7 + [1.0], "from another process")])
    await store.delete("c", ids=["v3"])
    await store.close()

asyncio.run(main())
with sqlite3.connect(sys.argv[1]) as conn:  # a plain SQL delete (as a session's cascade may do)
    conn.execute("DELETE FROM cp_vectors WHERE id = 'v4'")
"""


async def test_unchanged_file_skips_the_change_log_yet_other_processes_writes_are_seen(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    store = SQLiteVectorStore(db, exact_limit=0, scan_limit=0)
    rng = np.random.default_rng(4)
    data = {f"v{i}": rng.standard_normal(8).astype(np.float32) for i in range(60)}
    await store.upsert("c", [VectorRecord(i, v, i) for i, v in data.items()])
    assert (await store.search("c", data["v3"], k=1))[0].id == "v3"
    statements: list[str] = []
    store._connection().set_trace_callback(statements.append)
    for i in range(5):  # nothing changed: no read of the change log, the same answers
        assert (await store.search("c", data[f"v{i}"], k=1))[0].id == f"v{i}"
    assert statements and not any("cp_vector_changes" in s for s in statements)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", OTHER_PROCESS, str(db))
    assert await proc.wait() == 0
    hits = await store.search("c", [0.0] * 7 + [1.0], k=70)
    assert hits[0].id == "new" and hits[0].text == "from another process"
    assert {h.id for h in hits} == set(data) - {"v3", "v4"} | {"new"}
    assert any("cp_vector_changes" in s for s in statements)
    # This store's own writes are seen at once too (they do not move its connection's data_version).
    await store.delete("c", ids=["v5"])
    await store.upsert("c", [VectorRecord("mine", [0.0] * 6 + [1.0, 0.0], "mine")])
    assert [h.id for h in await store.search("c", [0.0] * 6 + [1.0, 0.0], k=1)] == ["mine"]
    assert "v5" not in {h.id for h in await store.search("c", data["v5"], k=70)}
    await store.close()


async def test_searches_on_the_calling_thread_never_overlap_the_worker(tmp_path: Path) -> None:
    """Searches (run on the event loop when the index is current) interleaved with upserts and deletes."""
    store = SQLiteVectorStore(tmp_path / "v.db", exact_limit=0, scan_limit=0)
    rng = np.random.default_rng(5)
    data = {f"v{i}": rng.standard_normal(8).astype(np.float32) for i in range(200)}
    await store.upsert("c", [VectorRecord(i, v, i) for i, v in list(data.items())[:20]])

    async def write(i: int) -> None:
        await store.upsert("c", [VectorRecord(f"v{i}", data[f"v{i}"], f"v{i}")])
        if i % 7 == 0:
            await store.delete("c", ids=[f"v{i - 3}"])

    async def read(i: int) -> list[SearchHit]:
        return await store.search("c", data[f"v{i % 20}"], k=5)

    results = await asyncio.gather(*(coro for i in range(20, 200) for coro in (write(i), read(i))))
    assert all(isinstance(r, list) and all(h.id in data for h in r) for r in results if r is not None)
    deleted = {f"v{i - 3}" for i in range(21, 200, 7)}  # each written (FIFO worker) before it was deleted
    kept = {i: v for i, v in data.items() if i not in deleted}
    query = rng.standard_normal(8).astype(np.float32)
    hits = await store.search("c", query, k=5)
    assert [h.id for h in hits] == exact_ids(kept, query, 5)
    assert await store.count("c") == len(kept)
    await store.close()


async def test_search_of_a_clustered_collection_finds_the_exact_top_k_with_exact_scores(tmp_path: Path) -> None:
    """Clustered vectors (like text embeddings) through the HNSW index: recall@10 against exact search."""
    rng = np.random.default_rng(8)
    centres = rng.standard_normal((60, 48)).astype(np.float32)

    def draw(m: int) -> np.ndarray:
        x = centres[rng.integers(0, len(centres), m)] + 0.6 * rng.standard_normal((m, 48)).astype(np.float32)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    matrix, queries = draw(6000), draw(40)
    store = SQLiteVectorStore(tmp_path / "v.db", exact_limit=0, scan_limit=0)  # always the index
    await store.upsert("c", [VectorRecord(f"v{i}", v, f"t{i}") for i, v in enumerate(matrix)])
    found = 0
    for q in queries:
        hits = await store.search("c", q, k=10)
        exact = matrix @ q
        found += len({f"v{i}" for i in np.argsort(-exact)[:10].tolist()} & {h.id for h in hits})
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert all(abs(h.score - float(exact[int(h.id[1:])])) <= 1e-5 for h in hits)  # re-scored exactly
    assert found / (10 * len(queries)) >= 0.97
    await store.close()


@given(st.integers(0, 10**8), st.integers(0, 10**8), st.integers(1, 100))
def test_search_depth_grows_with_the_collection(small: int, large: int, k: int) -> None:
    small, large = min(small, large), max(small, large)
    (e1, c1), (e2, c2) = search_depth(small, k), search_depth(large, k)
    assert c1 >= 2 * k and e1 >= c1 and e2 >= c2  # usearch needs expansion >= candidates
    assert c1 <= c2 and e1 <= e2


async def test_a_small_collection_is_scanned_and_finds_the_exact_top_k(tmp_path: Path) -> None:
    """A few vectors per cluster: walking the graph misses some of the true top 10; the scan finds them all."""
    rng = np.random.default_rng(9)
    centres = rng.standard_normal((1000, 48)).astype(np.float32)
    x = centres[rng.integers(0, len(centres), 6000)] + 0.6 * rng.standard_normal((6000, 48)).astype(np.float32)
    matrix = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    queries = rng.standard_normal((30, 48)).astype(np.float32) + centres[:30]
    scanned = SQLiteVectorStore(tmp_path / "v.db")  # 6,000 x 48: under the default scan limit
    walked = SQLiteVectorStore(tmp_path / "v.db", scan_limit=0)
    await scanned.upsert("c", [VectorRecord(f"v{i}", v, f"t{i}", {"odd": i % 2}) for i, v in enumerate(matrix)])
    found = {"scan": 0, "walk": 0}
    for q in queries:
        exact = matrix @ q / np.linalg.norm(q)
        want = [f"v{i}" for i in np.argsort(-exact)[:10].tolist()]
        hits = await scanned.search("c", q, k=10)
        assert [h.id for h in hits] == want
        assert all(abs(h.score - float(exact[int(h.id[1:])])) <= 1e-5 for h in hits)
        found["scan"] += len(set(want) & {h.id for h in hits})
        found["walk"] += len(set(want) & {h.id for h in await walked.search("c", q, k=10)})
        odd = [f"v{i}" for i in np.argsort(-exact).tolist() if i % 2][:5]  # a filter keeping half: scanned too
        assert [h.id for h in await scanned.search("c", q, k=5, where={"odd": 1})] == odd
    assert found["scan"] == 300 and found["walk"] < 300  # (the walk's misses are why small collections are scanned)
    await scanned.close()
    await walked.close()


def on_threads(store: SQLiteVectorStore) -> list[tuple[bool, str]]:
    """Record each statement the store's connection runs, and whether it ran on this (the event loop's) thread."""
    import threading

    ran: list[tuple[bool, str]] = []
    here = threading.get_ident()
    store._connection().set_trace_callback(lambda sql: ran.append((threading.get_ident() == here, sql)))
    return ran


def inserts(ran: list[tuple[bool, str]]) -> list[bool]:
    """Where each committed write transaction ran (these tests write only upserts)."""
    committed, writing = [], False
    for here, sql in ran:
        if sql.startswith("BEGIN"):
            writing = sql == "BEGIN IMMEDIATE"
        elif sql == "COMMIT" and writing:
            committed.append(here)
    return committed


async def test_small_upserts_into_a_current_index_run_on_the_calling_thread_and_never_miss_other_writers(
        tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    store, other = SQLiteVectorStore(db, scan_limit=0), SQLiteVectorStore(db)
    rng = np.random.default_rng(6)
    data = {f"v{i}": rng.standard_normal(8).astype(np.float32) for i in range(40)}
    await store.upsert("c", [VectorRecord(i, v, i) for i, v in list(data.items())[:20]])
    await store.search("c", data["v0"], k=1)
    await settled(store)  # (the recall check that search queued holds the lock while it runs)
    ran = on_threads(store)
    await store.upsert("c", [VectorRecord("v20", data["v20"], "v20")])  # the index is current: done here
    assert inserts(ran) == [True]
    # Another connection commits: the next upsert must not take its own records for all that changed.
    await other.upsert("c", [VectorRecord("v21", data["v21"], "from the other")])
    await store.upsert("c", [VectorRecord("v22", data["v22"], "v22")])
    assert inserts(ran) == [True, False]  # on the worker thread, which reads the change log back
    assert any("cp_vector_changes" in sql and not here for here, sql in ran)
    hits = await store.search("c", data["v21"], k=1)
    assert [(h.id, h.text) for h in hits] == [("v21", "from the other")]
    assert {h.id for h in await store.search("c", data["v0"], k=40)} == set(list(data)[:23])
    # Another connection holds the write lock: the upsert waits for it on the worker thread, not here.
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("DELETE FROM cp_vectors WHERE id = 'v1'")
    task = asyncio.ensure_future(store.upsert("c", [VectorRecord("v23", data["v23"], "v23")]))
    await asyncio.sleep(0)  # the upsert runs up to its hand-off to the worker (it would block here if it waited)
    assert not task.done()
    holder.execute("COMMIT")
    holder.close()
    await task
    assert inserts(ran)[-1] is False
    assert {h.id for h in await store.search("c", data["v0"], k=40)} == set(list(data)[:24]) - {"v1"}
    # Several records (more than a few): the worker thread.
    await store.upsert("c", [VectorRecord(i, v, i) for i, v in list(data.items())[24:40]])
    assert inserts(ran)[-1] is False
    await store.close()
    await other.close()


async def test_the_wal_is_checkpointed_on_the_worker_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Upserts on the calling thread never wait for a checkpoint's fsyncs; the worker checkpoints the WAL."""
    db = tmp_path / "v.db"
    store = SQLiteVectorStore(db)
    rng = np.random.default_rng(7)
    await store.upsert("c", [VectorRecord("first", rng.standard_normal(8), "first")])
    await store.search("c", [1.0] * 8, k=1)
    ran = on_threads(store)
    flushes: list[bool] = []  # where records went into the HNSW graph after quick upserts
    flush = _hnsw.CollectionIndex.flush

    def recorded(self: _hnsw.CollectionIndex) -> None:
        flushes.append(threading.get_ident() == threading.main_thread().ident)
        flush(self)

    monkeypatch.setattr(_hnsw.CollectionIndex, "flush", recorded)
    for i in range(450):
        await store.upsert("c", [VectorRecord(f"v{i}", rng.standard_normal(8), f"v{i}")])
        await settled(store)  # (its record is in the graph: the next upsert finds the lock free)
    await store.count("c")  # (after the checkpoints queued on the worker thread)
    checkpoints = [here for here, sql in ran if "wal_checkpoint" in sql]
    assert checkpoints and not any(checkpoints)  # (a second one is queued only once the first has run)
    assert flushes and not any(flushes)
    # (an upsert meeting the connection busy with a queued checkpoint goes to the worker thread)
    assert len(inserts(ran)) == 450 and inserts(ran).count(False) <= len(checkpoints)
    with sqlite3.connect(db) as conn:  # everything committed is in the file or the WAL, nothing lost
        assert conn.execute("SELECT COUNT(*) FROM cp_vectors").fetchone()[0] == 451
    assert len(await store.search("c", [1.0] * 8, k=500)) == 451
    await store.close()


async def test_records_waiting_for_the_graph_are_found_at_once_saved_whole_and_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quick upsert returns before its record is in the HNSW graph: a search finds it at once, scored
    exactly; saving the index adds the waiting records first; at most `PENDING_MAX` ever wait."""
    from usearch.index import Index

    store = SQLiteVectorStore(tmp_path / "v.db", scan_limit=0)
    rng = np.random.default_rng(9)
    data = {f"v{i}": rng.standard_normal(8).astype(np.float32) for i in range(400)}
    await store.upsert("c", [VectorRecord(i, v, i) for i, v in list(data.items())[:50]])
    await store.search("c", data["v0"], k=1)
    await settled(store)  # (the recall check that search queued holds the lock while it runs)
    cached = store._cache["c"]
    queued: list[object] = []
    monkeypatch.setattr(store, "_queue_on_worker", queued.append)  # (the worker thread is left idle: never adds them)
    extra = PENDING_MAX + 20
    for i in range(50, 50 + extra):
        await store.upsert("c", [VectorRecord(f"v{i}", data[f"v{i}"], f"text {i}", {"n": i})])
        assert len(cached.pending) <= PENDING_MAX
    # From the one that would have made it PENDING_MAX + 1, each upsert added its own to the graph.
    assert list(cached.pending) == [key for key in cached.records if key not in cached.index]
    assert len(cached.pending) == PENDING_MAX and len(cached.index) == 50 + extra - PENDING_MAX
    for i in (60, 50 + PENDING_MAX - 1, 50 + extra - 1):  # in the graph, waiting, in the graph
        [hit] = await store.search("c", data[f"v{i}"], k=1)
        assert (hit.id, hit.text, hit.metadata) == (f"v{i}", f"text {i}", {"n": i})
        assert hit.score == pytest.approx(1.0, abs=1e-6)
        [hit] = await store.search("c", data[f"v{i}"], k=1, where={"n": i})
        assert hit.id == f"v{i}"
    assert queued  # (adding them to the graph was asked for)
    waiting = f"v{50 + PENDING_MAX - 1}"
    store.scan_limit = None  # (a scan of the whole graph, besides the waiting records: every record, once)
    hits = await store.search("c", data[waiting], k=len(data))
    assert sorted(h.id for h in hits) == sorted(list(data)[:50 + extra]) and hits[0].id == waiting
    await store.save_indexes()
    assert not cached.pending
    [saved] = (store.index_dir or tmp_path).glob("c.*.usearch")
    restored = Index.restore(str(saved))
    assert restored is not None and len(restored) == 50 + extra  # the file stands for every change it names
    await store.close()


@pytest.mark.parametrize("scan_limit", [0, None])
async def test_records_waiting_for_the_graph_never_stop_a_filtered_search_before_its_best(
        tmp_path: Path, scan_limit: int | None) -> None:
    """A broad filtered search (the graph searched deeper) finding k waiting records still finds the graph's best k."""
    store = SQLiteVectorStore(tmp_path / "v.db", exact_limit=100, scan_limit=scan_limit)
    rng = np.random.default_rng(11)
    query = np.zeros(16, dtype=np.float32)
    query[0] = 1.0
    near = [VectorRecord(f"a{i}", query + 0.05 * rng.standard_normal(16), "", {"tag": "a"}) for i in range(200)]
    spread = {f"b{i}": rng.standard_normal(16).astype(np.float32) for i in range(800)}
    await store.upsert("c", near + [VectorRecord(i, v, "", {"tag": "b"}) for i, v in spread.items()])
    await store.search("c", query, k=1)
    await settled(store)  # (the recall check that search queued is done: it holds the lock while it runs)
    gate = threading.Event()
    store._executor.submit(gate.wait, 60)  # (the worker thread waits; the store's lock stays free)
    try:
        search = asyncio.ensure_future(store.search("c", query, k=5, where={"tag": "b"}))
        await asyncio.sleep(0)  # (805 records pass the filter: queued on the worker thread)
        assert not search.done()
        for i in range(5):  # quick upserts passing the filter, far from the query: waiting for the graph
            await store.upsert("c", [VectorRecord(f"p{i}", -query + 0.05 * rng.standard_normal(16), "", {"tag": "b"})])
        assert len(store._cache["c"].pending) == 5
    finally:
        gate.set()
    hits = await search
    # (the graph's own best: records near the query, never the 5 waiting ones at about -1; the walk is
    # approximate, so which of the true top 10 it finds may vary)
    assert len(hits) == 5 and all(h.id in spread and h.score > 0.3 for h in hits)
    assert len({h.id for h in hits} & set(exact_ids(spread, query, 10))) >= 4
    await store.close()


async def test_a_waiting_record_deleted_or_replaced_before_the_graph_takes_it(tmp_path: Path) -> None:
    """A delete queued before a quick upsert, or another connection's replacement caught up with before the
    graph insert: the record is found once, as last written, or not at all."""
    db = tmp_path / "v.db"
    store, other = SQLiteVectorStore(db), SQLiteVectorStore(db)
    rng = np.random.default_rng(12)
    await store.upsert("c", [VectorRecord(f"a{i}", rng.standard_normal(8), "a") for i in range(20)])
    await store.search("c", [1.0] * 8, k=1)
    await settled(store)  # (no recall check holds the lock meanwhile)
    cached = store._cache["c"]
    gate = threading.Event()
    store._executor.submit(gate.wait, 60)
    try:
        deleting = asyncio.ensure_future(store.delete("c", ids=["p0"]))
        await asyncio.sleep(0)  # (queued on the worker thread, behind the gate)
        await store.upsert("c", [VectorRecord("p0", [1.0] * 8, "p0")])  # (quick: its record waits for the graph)
        assert list(store._cache["c"].pending) and not deleting.done()
    finally:
        gate.set()
    assert await deleting == 1
    assert [h.id for h in await store.search("c", [1.0] * 8, k=30) if h.id.startswith("p")] == []
    await settled(store)  # (p0's graph insert, queued behind the delete, must not take p1 below)
    gate = threading.Event()
    store._executor.submit(gate.wait, 60)
    try:
        catching_up = asyncio.ensure_future(store.keyword_search("c", "zzz"))  # (reads the change log first)
        await asyncio.sleep(0)
        await store.upsert("c", [VectorRecord("p1", [1.0] * 8, "p1 first")])
        await other.upsert("c", [VectorRecord("p1", [-1.0] * 8, "p1 again")])
        assert list(store._cache["c"].pending)
    finally:
        gate.set()
    await catching_up
    hits = await store.search("c", [1.0] * 8, k=30)
    assert [(h.id, h.text, round(h.score, 4)) for h in hits if h.id.startswith("p")] == [("p1", "p1 again", -1.0)]
    assert not cached.pending and len(hits) == 21
    assert store._cache["c"] is cached  # (kept in step all along: never dropped and rebuilt from the rows)
    await store.close()
    await other.close()


async def test_a_failure_adding_records_to_the_graph_rebuilds_the_index_from_the_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLiteVectorStore(tmp_path / "v.db")
    rng = np.random.default_rng(10)
    data = {f"v{i}": rng.standard_normal(8).astype(np.float32) for i in range(30)}
    await store.upsert("c", [VectorRecord(i, v, i) for i, v in list(data.items())[:20]])
    await store.search("c", data["v0"], k=1)

    def fails(self: _hnsw.CollectionIndex) -> None:
        raise MemoryError("no room in the graph")

    monkeypatch.setattr(_hnsw.CollectionIndex, "flush", fails)
    await store.upsert("c", [VectorRecord("v20", data["v20"], "v20")])
    await settled(store)
    assert await store.count("c") == 21
    assert "c" not in store._cache  # dropped: the next search builds it from the rows
    monkeypatch.undo()
    assert {h.id for h in await store.search("c", data["v0"], k=30)} == set(list(data)[:21])
    assert not store._cache["c"].pending and len(store._cache["c"].index) == 21
    await store.close()


@pytest.mark.parametrize("exact", [False, True])
async def test_usearch_compiled_search_answers_as_its_public_search(tmp_path: Path, exact: bool) -> None:
    """The store calls usearch's compiled search directly when it can; it must find what `Index.search` finds."""
    store = SQLiteVectorStore(tmp_path / "v.db")
    rng = np.random.default_rng(5)
    await store.upsert("c", [VectorRecord(f"v{i}", rng.standard_normal(16), "x") for i in range(500)])
    await store.search("c", [1.0] * 16, k=1)
    index = store._cache["c"].index
    search = IndexSearch()
    for _ in range(20):
        q = rng.standard_normal(16).astype(np.float32)
        direct = search.keys(index, q, 20, exact)
        assert direct == index.search(q, 20, threads=1, exact=exact).keys.tolist()
        assert len(direct) == 20
    assert search.keys(index, q, 1000, exact=True) == index.search(q, 1000, threads=1, exact=True).keys.tolist()
    assert search.compiled  # the usearch installed here is called directly (else 5-9 µs more a search)
    assert store._index_search.compiled
    assert IndexSearch(compiled=False).keys(index, q, 20, exact) == direct  # (as with a usearch it cannot call so)
    await store.close()


async def test_a_search_filtered_to_few_records_runs_on_the_calling_thread(tmp_path: Path) -> None:
    """With the worker thread busy, a search filtered to a few records still answers; a broad filter waits."""
    store = SQLiteVectorStore(tmp_path / "v.db")
    rng = np.random.default_rng(8)
    data = {f"v{i}": rng.standard_normal(8).astype(np.float32) for i in range(1000)}
    await store.upsert("c", [VectorRecord(i, v, f"text {i}", {"few": int(i[1:]) % 100 == 0, "half": int(i[1:]) % 2})
                             for i, v in data.items()])
    query = rng.standard_normal(8).astype(np.float32)
    await store.search("c", query, k=1)  # (the index is loaded and current)
    await settled(store)  # (the recall check that search queued is done: it holds the lock while it runs)
    release = threading.Event()
    busy = store._executor.submit(release.wait)  # the worker thread is taken
    try:
        few = asyncio.ensure_future(store.search("c", query, k=3, where={"few": True}))
        broad = asyncio.ensure_future(store.search("c", query, k=3, where={"half": 1}))
        await asyncio.sleep(0)
        assert few.done() and not broad.done()
        kept = {i: v for i, v in data.items() if int(i[1:]) % 100 == 0}
        assert [h.id for h in few.result()] == exact_ids(kept, query, 3)
        assert all(h.text == f"text {h.id}" and h.metadata["few"] is True for h in few.result())
    finally:
        release.set()
    busy.result()
    half = {i: v for i, v in data.items() if int(i[1:]) % 2 == 1}
    assert [h.id for h in await broad] == exact_ids(half, query, 3)
    await store.close()


# --- each fast path against its plain version ---------------------------------------------------------------


def _usearch_index(size: int, dim: int, seed: int) -> object:
    """A usearch index made as a collection's is, holding `size` random vectors (keys 0 to size - 1)."""
    from usearch.index import Index

    index = Index(ndim=dim, metric="cos", dtype=_hnsw.DTYPE, connectivity=_hnsw.CONNECTIVITY,
                  expansion_add=_hnsw.EXPANSION_ADD, expansion_search=_hnsw.EXPANSION_SEARCH)
    vectors = np.random.default_rng(seed).standard_normal((size, dim)).astype(np.float32)
    index.add(np.arange(size, dtype=np.uint64), vectors, threads=1)
    return index


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(size=st.integers(1, 400), dim=st.integers(2, 40), count=st.integers(1, 80), exact=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_the_compiled_usearch_search_equals_the_public_one(size: int, dim: int, count: int, exact: bool,
                                                           seed: int) -> None:
    """`IndexSearch`'s shortcut through usearch's compiled search: the keys and distances of `Index.search`."""
    index = _usearch_index(size, dim, seed)
    search = IndexSearch()
    for q in np.random.default_rng(seed + 1).standard_normal((4, dim)).astype(np.float32):
        found = search.compiled_search(index, q, count, exact)
        assert found is not None  # (the usearch installed here has the compiled search)
        keys, distances = public_search(index, q, count, exact)
        assert found[0].tolist() == keys.tolist()
        assert found[1].tolist() == distances.tolist()
        assert search.keys(index, q, count, exact) == keys.tolist()
    assert search.compiled


def test_a_usearch_without_the_compiled_search_is_asked_through_its_public_one() -> None:
    index = _usearch_index(50, 8, 1)
    q = np.ones(8, dtype=np.float32)
    want = public_search(index, q, 5, False)[0].tolist()

    class Other:  # another usearch: its compiled search takes other arguments
        class _compiled:
            @staticmethod
            def search_many(*args: object, **kwargs: object) -> None:
                raise TypeError("search_many() got an unexpected keyword argument 'dtype'")

        search = index.search

    search = IndexSearch()
    assert search.keys(Other(), q, 5, False) == want and not search.compiled  # (never tried again)
    assert search.keys(index, q, 5, False) == want


def _clustered(size: int, dim: int, clusters: int, spread: float, seed: int) -> tuple[_hnsw.CollectionIndex,
                                                                                     np.ndarray]:
    """A collection of `size` clustered unit vectors, added to its graph 64 at a time (one thread: the same graph
    on every run), and 20 queries drawn the same way."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)

    def draw(m: int) -> np.ndarray:
        x = centres[rng.integers(0, clusters, m)] + spread * rng.standard_normal((m, dim)).astype(np.float32)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    matrix = draw(size)
    c = _hnsw.CollectionIndex(0)
    rows = [(i + 1, f"v{i}", dim, matrix[i].tobytes(), f"t{i}", "{}") for i in range(size)]
    for start in range(0, size, 64):
        c.put(rows[start:start + 64])
    return c, draw(20)


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(size=st.integers(200, 3000), dim=st.sampled_from([8, 16, 32, 64]), clusters=st.integers(1, 1000),
       spread=st.floats(0.2, 1.0), seed=st.integers(0, 2**32 - 1))
def test_the_graph_search_finds_the_documented_share_of_the_exact_top_k(size: int, dim: int, clusters: int,
                                                                        spread: float, seed: int) -> None:
    """`approximate_top` against `exact_top`: at least the recall its docstring states, with exact scores."""
    c, queries = _clustered(size, dim, clusters, spread, seed)
    search = IndexSearch()
    found = {"walk": 0, "scan": 0}
    for q in queries:
        exact = _hnsw.exact_top(c, q, 10, None)
        want = {key for key, _ in exact}
        for way in found:
            hits = _hnsw.approximate_top(c, q, 10, None, search, scan=way == "scan")
            assert len(hits) == 10 and [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
            scores = dict(_hnsw.exact_top(c, q, size, None))
            assert all(s == pytest.approx(scores[key], abs=1e-6) for key, s in hits)  # re-scored exactly
            found[way] += len(want & {key for key, _ in hits})
    assert found["walk"] / (10 * len(queries)) >= _hnsw.WALK_RECALL
    assert found["scan"] / (10 * len(queries)) >= _hnsw.SCAN_RECALL


def _same_hits(fast: list[SearchHit], plain: list[SearchHit], truth: dict[str, VectorRecord]) -> None:
    """The same hits (records tied at a score in any order), but for which of several tied at the last made the cut."""
    assert [h.score for h in fast] == [h.score for h in plain]
    last = plain[-1].score if plain else None
    by_id = {h.id: h for h in plain}
    assert all(by_id.get(h.id) == h for h in fast if h.score != last)
    assert all((h.text, h.metadata) == (truth[h.id].text, truth[h.id].metadata) for h in fast)


_KEYWORD_WORDS = ["pottery", "bread", "class", "dog", "biscuit", "bake", "maya", "walrus"]


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.one_of(st.integers(1, 30), st.integers(300, 700)), seed=st.integers(0, 2**32 - 1),
       query=st.lists(st.sampled_from(_KEYWORD_WORDS), min_size=1, max_size=3), k=st.integers(1, 20),
       where=st.sampled_from([None, {"g": 1}, {"g": [0, 2]}, {"g": None}, {"h": [1]}, {"g": 3}, *[
           {"g": 1, "h": 0}, {"g": "x", "h": 0}, {"g": [2, "x"], "h": 1}] * 3]),  # (some keeping few records)
       ceiling=st.sampled_from([None, 100, 100]))
async def test_keyword_search_from_the_held_index_equals_the_search_from_the_rows(
        tmp_path_factory: pytest.TempPathFactory, n: int, seed: int, query: list[str], k: int,
        where: dict[str, object] | None, ceiling: int | None) -> None:
    """`search_held` (ids, texts and filters from memory) against `search_rows` (all read from SQLite).

    With `ceiling`, both let SQLite filter all the matches after the first hundred (else after thousands).
    """
    from unittest.mock import patch

    from contextpipe.vectors import _keywords

    rng = random.Random(seed)
    groups: list[object] = [None, 0, 1, 1, 2, "x", [1, 2]]
    records = []
    for i in range(n):
        group = rng.choice(groups)
        meta = {"h": i % 3} if group is None else {"g": group, "h": i % 3}
        text = " ".join(rng.choice(_KEYWORD_WORDS[:4] * 3 + _KEYWORD_WORDS) for _ in range(rng.randint(1, 6)))
        records.append(VectorRecord(f"r{i}", [1.0, float(i), 0.5], text, meta))
    store = SQLiteVectorStore(tmp_path_factory.mktemp("kw") / "v.db")
    await store.upsert("c", records)
    await store.search("c", [1.0, 0.0, 0.0], k=1)  # (the index is held)
    fts = _keywords.fts_query(keyword_terms(" ".join(query)))

    def both(conn: sqlite3.Connection) -> tuple[list[SearchHit], list[SearchHit]]:
        table = store._keyword_tables.table(conn, "c")
        assert table is not None
        held = store._indexes.sync(conn, "c")
        return (_keywords.search_held(conn, held, table, fts, k, where),
                _keywords.search_rows(conn, table, "c", fts, k, where))

    try:
        with patch.object(_keywords, "_HELD_MAX", ceiling or _keywords._HELD_MAX), \
                patch.object(_keywords, "_ROWS_MAX", ceiling or _keywords._ROWS_MAX):
            fast, plain = await store._run(both)
        _same_hits(fast, plain, {r.id: r for r in records})
        assert all(matches(h.metadata, where) for h in fast)
    finally:
        await store.close()
