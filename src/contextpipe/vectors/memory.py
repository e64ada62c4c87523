"""`MemoryVectorStore`: vectors, keywords and hybrid search in this process's memory, for tests."""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
from typing_extensions import override

from ..errors import UsageError
from ._stem import stem
from .base import SearchHit, VectorRecord, VectorStore, Where, check_where, keyword_terms, matches

__all__ = ["MemoryVectorStore"]

_WORD_RE: Final = re.compile(r"[^\W_]+", re.UNICODE)
_K1, _B = 1.2, 0.75  # BM25's usual constants, as SQLite FTS5 uses them


def _token(word: str) -> str:
    """Return a lower-cased word as SQLite FTS5's ``porter unicode61 remove_diacritics 2`` indexes it."""
    folded = "".join(c for c in unicodedata.normalize("NFD", word) if not unicodedata.combining(c))
    return stem(unicodedata.normalize("NFC", folded))


def _idf(rows: int, holding: int) -> float:
    """Return FTS5's BM25 weight of a word `holding` of `rows` records hold (one most of them hold: almost 0)."""
    idf = math.log((rows - holding + 0.5) / (holding + 0.5))
    return idf if idf > 0 else 1e-6


def _unit(vector: Sequence[float]) -> np.ndarray[Any, Any]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0 else array


class _Row:
    __slots__ = ("length", "meta", "terms", "text", "vector")

    def __init__(self, vector: np.ndarray[Any, Any], text: str, meta: dict[str, Any], keywords: str) -> None:
        self.vector, self.text, self.meta = vector, text, meta
        words = [_token(w) for w in _WORD_RE.findall(keywords.lower())]  # (every word counts in the length)
        self.terms = Counter(words)
        self.length = len(words)


def _bm25(row: _Row, idf: list[tuple[str, float]], average: float) -> float:
    norm = _K1 * (1 - _B + _B * row.length / average)
    return sum(weight * row.terms[t] * (_K1 + 1) / (row.terms[t] + norm) for t, weight in idf if t in row.terms)


class MemoryVectorStore(VectorStore):
    """Vectors in this process's memory; same contract (and the same hybrid ranking) as the durable stores.

    Searches exactly; keyword search ranks as SQLite FTS5's ``bm25()`` does in `SQLiteVectorStore`
    (the same words, Porter-stemmed as its ``porter`` tokenizer stems them, so "baking" finds
    "baked"; the same weights and scores).
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
        for r in records:
            rows[r.id] = _Row(_unit(r.vector), r.text, dict(r.metadata), r.text if r.keywords is None else r.keywords)

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
        terms = [_token(t) for t in keyword_terms(text)]  # (two words of one stem count twice, as in FTS5)
        everything = self._data.get(collection, {})
        if not terms or not everything or k <= 0:
            return []
        total = len(everything)
        average = sum(r.length for r in everything.values()) / total or 1.0
        idf = [(t, _idf(total, sum(1 for r in everything.values() if t in r.terms))) for t in terms]
        scored = [(score, i, r) for i, r in everything.items()
                  if matches(r.meta, where) and (score := _bm25(r, idf, average)) > 0]
        scored.sort(key=lambda s: -s[0])
        return [SearchHit(i, score, r.text, r.meta) for score, i, r in scored[:k]]

    @override
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        check_where(where)
        return sum(1 for r in self._data.get(collection, {}).values() if matches(r.meta, where))
