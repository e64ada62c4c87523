"""`MemoryVectorStore`: vectors, keywords and hybrid search in this process's memory, for tests."""

from __future__ import annotations

import functools
import math
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._compat import override
from ..errors import UsageError
from .base import SearchHit, VectorRecord, VectorStore, Where, check_where, keyword_terms, matches

__all__ = ["MemoryVectorStore"]

_K1, _B = 1.2, 0.75  # BM25's usual constants, as SQLite FTS5 uses them


class _Tokenizer:
    """Words as `SQLiteVectorStore` indexes them: SQLite FTS5's own ``porter unicode61 remove_diacritics 2``.

    Each text goes through an FTS5 table in an in-memory database, and its words are read back in
    order (``fts5vocab``), so they are the SQLite store's exactly: Porter stems, case folding,
    accents, digits and all.
    """

    def __init__(self) -> None:
        self._conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._conn.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='porter unicode61 remove_diacritics 2')")
        self._conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        self._lock = threading.Lock()

    def __call__(self, text: str) -> tuple[str, ...]:
        with self._lock:
            self._conn.execute("INSERT INTO t (rowid, x) VALUES (1, ?)", (text,))
            try:
                return tuple(r[0] for r in self._conn.execute("SELECT term FROM v WHERE doc = 1 ORDER BY offset"))
            finally:
                self._conn.execute("DELETE FROM t WHERE rowid = 1")


@functools.cache
def _tokenizer() -> _Tokenizer:
    return _Tokenizer()


def _tokens(text: str) -> tuple[str, ...]:
    return _tokenizer()(text)


os.register_at_fork(after_in_child=_tokenizer.cache_clear)  # (a child must not inherit a held lock)


def _idf(rows: int, holding: int) -> float:
    """Return FTS5's BM25 weight of a word `holding` of `rows` records hold (one most of them hold: almost 0)."""
    idf = math.log((rows - holding + 0.5) / (holding + 0.5))
    return idf if idf > 0 else 1e-6


def _unit(vector: Sequence[float]) -> np.ndarray[Any, Any]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0 else array


class _Row:
    __slots__ = ("meta", "terms", "text", "vector", "words")

    def __init__(self, vector: np.ndarray[Any, Any], text: str, meta: dict[str, Any], keywords: str) -> None:
        self.vector, self.text, self.meta = vector, text, meta
        self.words = _tokens(keywords)
        self.terms = Counter(self.words)

    def count(self, phrase: tuple[str, ...]) -> int:
        """How often `phrase` (one word or several in a row) occurs in the record's keywords."""
        if len(phrase) == 1:
            return self.terms[phrase[0]]
        n, words = len(phrase), self.words
        return sum(1 for i in range(len(words) - n + 1) if words[i:i + n] == phrase)


def _bm25_scores(rows: dict[str, _Row], phrases: list[tuple[str, ...]]) -> dict[str, float]:
    """BM25 of every record holding one of `phrases` at least, with FTS5's weights (the collection's statistics)."""
    average = sum(len(r.words) for r in rows.values()) / len(rows) or 1.0
    counts = {i: [r.count(p) for p in phrases] for i, r in rows.items()}
    idf = [_idf(len(rows), sum(1 for c in counts.values() if c[n])) for n in range(len(phrases))]
    scores = {}
    for i, hits in counts.items():
        if any(hits):
            norm = _K1 * (1 - _B + _B * len(rows[i].words) / average)
            scores[i] = sum(weight * tf * (_K1 + 1) / (tf + norm) for tf, weight in zip(hits, idf, strict=True) if tf)
    return scores


class MemoryVectorStore(VectorStore):
    """Vectors in this process's memory; same contract (and the same hybrid ranking) as the durable stores.

    Searches exactly; keyword search ranks as SQLite FTS5's ``bm25()`` does in `SQLiteVectorStore`:
    the same words (FTS5's own tokenizer: Porter stems, so "baking" finds "baked"), weights and scores.
    """

    def __init__(self) -> None:
        self._data: dict[str, dict[str, _Row]] = {}

    @override
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        rows = self._data.setdefault(collection, {})
        dims = {len(r.vector) for r in records}
        if rows:
            dims.add(next(iter(rows.values())).vector.shape[0])
        if len(dims) > 1:
            raise UsageError(f"collection {collection!r} would mix vector sizes {sorted(dims)}; "
                             "use one embedder per collection")
        made = [(r.id, _Row(_unit(r.vector), r.text, dict(r.metadata), r.text if r.keywords is None else r.keywords))
                for r in records]  # (all or nothing: a text that cannot be read stores none of them)
        rows.update(made)

    @override
    async def delete(self, collection: str, *, ids: Sequence[str] | None = None, where: Where | None = None) -> int:
        check_where(where)
        if ids is None and where is None:
            return 0
        rows = self._data.get(collection, {})
        doomed = [i for i, row in rows.items()
                  if (ids is None or i in ids) and (where is None or matches(row.meta, where))]
        for i in doomed:
            del rows[i]
        return len(doomed)

    @override
    async def vector_search(self, collection: str, vector: Sequence[float], *, k: int = 5,
                            where: Where | None = None, min_score: float | None = None) -> list[SearchHit]:
        check_where(where)
        rows = [(i, r) for i, r in self._data.get(collection, {}).items() if matches(r.meta, where)]
        if not rows or k <= 0:
            return []
        q = _unit(vector)
        if q.shape[0] != rows[0][1].vector.shape[0]:
            raise UsageError(f"query vector has {q.shape[0]} dimensions, the collection "
                             f"{rows[0][1].vector.shape[0]}")
        scores = np.stack([r.vector for _, r in rows]) @ q
        order = np.argsort(-scores, kind="stable")[:k]
        return [SearchHit(rows[n][0], float(scores[n]), rows[n][1].text, rows[n][1].meta) for n in order
                if min_score is None or scores[n] >= min_score]

    @override
    async def keyword_search(self, collection: str, text: str, *, k: int = 5,
                             where: Where | None = None) -> list[SearchHit]:
        check_where(where)
        # Each query word is a phrase, as SQLiteVectorStore asks FTS5 (two words of one stem count twice).
        phrases = [p for p in (_tokens(t) for t in keyword_terms(text)) if p]
        everything = self._data.get(collection, {})
        if not phrases or not everything or k <= 0:
            return []
        scores = _bm25_scores(everything, phrases)
        scored = sorted(((score, i) for i, score in scores.items() if matches(everything[i].meta, where)),
                        key=lambda s: -s[0])
        return [SearchHit(i, score, r.text, r.meta) for score, i in scored[:k] for r in (everything[i],)]

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        return sum(1 for r in self._data.get(collection, {}).values() if matches(r.meta, where))

    @override
    async def records(self, collection: str, *, where: Where | None = None) -> list[SearchHit]:
        check_where(where)
        rows = self._data.get(collection, {})
        return [SearchHit(i, 0.0, rows[i].text, rows[i].meta) for i in sorted(rows) if matches(rows[i].meta, where)]
