"""The `Embedder` and `VectorStore` contracts shared by memory and search providers."""

from __future__ import annotations

import abc
import asyncio
import inspect
import re
import unicodedata
from collections.abc import Awaitable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, Protocol, runtime_checkable

from ..errors import UsageError

__all__ = ["EMBEDDER_KEY", "Embedder", "Fusion", "SearchHit", "VectorRecord", "VectorStore", "Where",
           "check_embedder", "combmnz", "delete_user", "embed_queries", "embed_query", "fuse", "keyword_terms", "rrf"]

Where = Mapping[str, Any]
"""Metadata filter: every key must equal its value (or be one of the values, for a list); None matches a
record without the key (or with it null)."""

Fusion = Literal["combmnz", "rrf"]
"""How a hybrid search fuses its rankings: `combmnz` (scores, the default) or `rrf` (ranks)."""

_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of a fixed dimension."""

    @property
    def name(self) -> str:
        """Which model (for errors and to keep collections apart)."""
        ...

    @property
    def dimension(self) -> int:
        """Length of every vector."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed `texts` (batched as the embedder sees fit), one vector per text, in order."""
        ...


@dataclass(frozen=True)
class VectorRecord:
    """A text, its vector and its metadata (scope, source, time ...).

    `keywords` is the text the keyword index holds for the record (default: `text`); a memory
    indexes a turn together with the turn before it, for example, and still returns the turn alone.
    """

    id: str
    vector: Sequence[float]
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    keywords: str | None = None


@dataclass(frozen=True)
class SearchHit:
    """A search result: the record's id, text and metadata, and how well it matched.

    `score` is the cosine similarity for a vector search, the keyword score (BM25, higher is
    better) for a keyword search, and the fused score for a hybrid one; `vector_score` and
    `keyword_score` keep each side's score (``None`` when that side did not find the record).
    """

    id: str
    score: float
    text: str
    metadata: Mapping[str, Any]
    vector_score: float | None = None
    keyword_score: float | None = None


def check_where(where: Where | None) -> None:
    """Refuse filter keys that are not plain identifiers (they become JSON paths in SQL)."""
    for key in where or {}:
        if not _KEY_RE.match(key):
            raise UsageError(f"metadata filter key {key!r} must be a plain identifier (letters, digits, '_')")


def matches(metadata: Mapping[str, Any], where: Where | None) -> bool:
    """Whether `metadata` satisfies `where`."""
    if not where:
        return True
    for key, wanted in where.items():
        value = metadata.get(key)
        if isinstance(wanted, list | tuple | set | frozenset):
            if not any(value == v for v in wanted):  # (not `in`: a list value in a set of values)
                return False
        elif value != wanted:
            return False
    return True


class VectorStore(abc.ABC):
    """Vectors with text and metadata in named collections; vector, keyword and hybrid top-k search.

    `search` with a vector ranks by cosine similarity, with `text` by keywords (the engine's own
    full-text search: SQLite FTS5, PostgreSQL ``tsvector``), and with both by fusing the two rankings
    (`fusion`: `combmnz` of their scores by default, or `rrf` of their ranks), each side drawing
    `candidates` records that match `where`.
    """

    candidates: int = 50
    """How many records each side of a hybrid search ranks before fusion."""
    weights: tuple[float, float] = (1.0, 1.0)
    """Weights of the vector and the keyword ranking in the fusion."""
    fusion: Fusion = "combmnz"
    """How a hybrid search fuses the two rankings (`combmnz` or `rrf`; see `fuse`)."""

    @abc.abstractmethod
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        """Insert `records`, replacing any with the same id."""

    @abc.abstractmethod
    async def delete(self, collection: str, *, ids: Sequence[str] | None = None, where: Where | None = None) -> int:
        """Delete the records with these ids and/or matching `where`; return how many went."""

    async def search(self, collection: str, vector: Sequence[float] | Awaitable[Sequence[float]] | None = None, *,
                     k: int = 5, where: Where | None = None, min_score: float | None = None,
                     text: str | None = None, exclude: Collection[str] = ()) -> list[SearchHit]:
        """Return up to `k` records matching `where`, best first.

        Give `vector` (similarity; none below `min_score`), `text` (keywords) or both (hybrid:
        the vector side still drops records below `min_score`). `vector` may be an awaitable — the
        query still being embedded, as `SemanticMemory` passes it — so the keyword side runs meanwhile.
        Records whose ids are in `exclude` are left out of each ranking before it is cut and fused, so
        they change nothing about the others.
        """
        try:
            check_where(where)
            if text is not None and not keyword_terms(text):
                text = None if vector is not None else text
            if vector is None and text is None:
                raise UsageError("search needs a vector, a text, or both")
        except UsageError:
            if inspect.iscoroutine(vector):
                vector.close()
            raise
        if k <= 0:
            await _resolve(vector)
            return []
        skip = frozenset(exclude)
        if text is None:
            query = await _resolve(vector)
            assert query is not None
            hits = await self.vector_search(collection, query, k=k + len(skip), where=where, min_score=min_score)
            return [h if h.vector_score == h.score else replace(h, vector_score=h.score)
                    for h in _without(hits, skip, k)]
        return await self._keywords_first(collection, vector, text, k, where, min_score, skip)

    async def _keywords_first(self, collection: str, vector: Sequence[float] | Awaitable[Sequence[float]] | None,
                              text: str, k: int, where: Where | None, min_score: float | None,
                              skip: frozenset[str]) -> list[SearchHit]:
        """Start the keyword side, then (once the vector is there) the vector side, and fuse them."""
        depth = k if vector is None else max(k, self.candidates)
        keywords = asyncio.ensure_future(self.keyword_search(collection, text, k=depth + len(skip), where=where))
        try:
            query = await _resolve(vector)
            if query is None:
                return [replace(h, keyword_score=h.score) for h in _without(await keywords, skip, depth)]
            by_vector = await self.vector_search(collection, query, k=depth + len(skip), where=where,
                                                 min_score=min_score)
        except BaseException:
            keywords.cancel()
            raise
        return fuse(_without(by_vector, skip, depth), _without(await keywords, skip, depth), k=k,
                    weights=self.weights, method=self.fusion)

    @abc.abstractmethod
    async def vector_search(self, collection: str, vector: Sequence[float], *, k: int = 5,
                            where: Where | None = None, min_score: float | None = None) -> list[SearchHit]:
        """Return up to `k` records matching `where`, most similar first, none below `min_score`."""

    @abc.abstractmethod
    async def keyword_search(self, collection: str, text: str, *, k: int = 5,
                             where: Where | None = None) -> list[SearchHit]:
        """Return up to `k` records matching `where` that share words with `text`, best (BM25) first."""

    @abc.abstractmethod
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        """Return how many records match `where`."""

    async def records(self, collection: str, *, where: Where | None = None) -> list[SearchHit]:
        """Return every record of `collection` matching `where`, by id (each ``score`` 0.0: nothing was compared).

        What reads a whole scope rather than its best matches uses it (`FactMemory.history`, for one
        user's facts). The built-in stores implement it; a store of your own may, to support those.
        """
        raise UsageError(f"{type(self).__name__} cannot list its records: implement VectorStore.records() "
                         "to read a fact's history from it")

    async def erase_deleted(self, collection: str) -> None:  # noqa: B027 - optional hook
        """Make the deleted records' words unreadable from the store's indexes too (after a user's erasure).

        A keyword index may keep a deleted record's words until it merges (SQLite FTS5 does): this
        merges it now. The built-in stores with nothing left behind do nothing.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources the store owns."""


async def delete_user(vectors: VectorStore, collection: str, tenant: str, user_id: str,
                      session_ids: Sequence[str] = ()) -> int:
    """Delete the records of `collection` that name `user_id`, or one of `session_ids`, in `tenant`; return how many."""
    gone = await vectors.delete(collection, where={"tenant": tenant, "user_id": user_id})
    if session_ids:
        gone += await vectors.delete(collection, where={"tenant": tenant, "session_id": list(session_ids)})
    await vectors.erase_deleted(collection)
    return gone


def _without(hits: list[SearchHit], skip: frozenset[str], k: int) -> list[SearchHit]:
    """Return the first `k` of `hits` whose ids are not in `skip`."""
    return [h for h in hits if h.id not in skip][:k] if skip else hits[:k]


# Words that carry no meaning for keyword search (questions are full of them).
STOPWORDS: Final = frozenset([
    "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any", "are", "as",
    "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could",
    "did", "do", "does", "doing", "down", "during", "each", "ever", "few", "for", "from", "further", "get",
    "got", "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his",
    "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "myself",
    "no", "nor", "not", "now", "of", "off", "on", "once", "one", "only", "or", "other", "our", "ours",
    "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the",
    "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to",
    "too", "under", "until", "up", "very", "was", "we", "were", "what", "when", "where", "which", "while",
    "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself", "yourselves",
])


def _words(text: str) -> Iterator[str]:
    """Yield the runs of letters and digits in `text`, with the combining marks inside them (Hindi's vowel signs)."""
    start = None
    for at, char in enumerate(text):
        if char.isalnum() or (start is not None and unicodedata.category(char)[0] == "M"):
            if start is None:
                start = at
        elif start is not None:
            yield text[start:at]
            start = None
    if start is not None:
        yield text[start:]


def keyword_terms(text: str) -> list[str]:
    """Return the words of `text` that a keyword search looks for: lower-cased, no stopwords, each once.

    >>> keyword_terms("What did Maya make in the pottery class?")
    ['maya', 'make', 'pottery', 'class']
    >>> keyword_terms("मुझे हिन्दी फ़िल्में पसंद हैं")
    ['मुझे', 'हिन्दी', 'फ़िल्में', 'पसंद', 'हैं']
    """
    seen: dict[str, None] = {}
    for word in _words(text.lower()):
        if word not in STOPWORDS and word not in seen and (len(word) > 1 or word.isdigit()):
            seen[word] = None
    return list(seen)[:64]


def searched_terms(text: str, k: int, where: Where | None) -> list[str]:
    """Return what a store's keyword search of `text` looks for (`keyword_terms`), after checking `where`.

    Empty when there is nothing to search: no such words, or `k` below 1.
    """
    check_where(where)
    return keyword_terms(text) if k > 0 else []


def rrf(*rankings: Sequence[SearchHit], k: int = 5, constant: int = 60,
        weights: Sequence[float] | None = None) -> list[SearchHit]:
    """Reciprocal rank fusion: each record scores the sum of ``weight / (constant + rank)`` over the rankings.

    The first ranking is the vector one and the second the keyword one (their scores are kept in
    `vector_score` / `keyword_score`).
    """
    fused: dict[str, float] = {}
    first: dict[str, SearchHit] = {}
    sides: dict[str, dict[int, float]] = {}
    for side, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[side]
        for rank, hit in enumerate(ranking, 1):
            fused[hit.id] = fused.get(hit.id, 0.0) + weight / (constant + rank)
            first.setdefault(hit.id, hit)
            sides.setdefault(hit.id, {})[side] = hit.score
    order = sorted(fused, key=lambda i: -fused[i])[:k]
    return [replace(first[i], score=fused[i], vector_score=sides[i].get(0), keyword_score=sides[i].get(1))
            for i in order]


def combmnz(*rankings: Sequence[SearchHit], k: int = 5, weights: Sequence[float] | None = None) -> list[SearchHit]:
    """Score fusion (CombMNZ): each ranking's scores scaled to 0..1, summed, times how many rankings found the record.

    Within each ranking the best score becomes 1 and the worst 0 (a ranking whose scores are all
    equal gives each 1), times the ranking's weight (a ranking weighted 0 counts for nothing), so
    cosine similarities and BM25 scores add up on one scale, and a record both sides found outranks
    one that only one side liked as much. As with `rrf`, the first ranking is the vector one and the
    second the keyword one (their own scores are kept).

    >>> from contextpipe.vectors import SearchHit
    >>> by_vector = [SearchHit("a", 0.9, "", {}), SearchHit("b", 0.8, "", {}), SearchHit("c", 0.1, "", {})]
    >>> by_keywords = [SearchHit("c", 7.0, "", {}), SearchHit("b", 5.0, "", {}), SearchHit("d", 1.0, "", {})]
    >>> [(h.id, round(h.score, 3)) for h in combmnz(by_vector, by_keywords, k=4)]
    [('b', 3.083), ('c', 2.0), ('a', 1.0), ('d', 0.0)]
    """
    fused: dict[str, float] = {}
    found: dict[str, int] = {}
    first: dict[str, SearchHit] = {}
    sides: dict[str, dict[int, float]] = {}
    for side, ranking in enumerate(rankings):
        if not ranking:
            continue
        weight = 1.0 if weights is None else weights[side]
        low, high = min(h.score for h in ranking), max(h.score for h in ranking)
        for hit in ranking:
            if side in sides.get(hit.id, {}):
                continue  # a record twice in one ranking counts once, at its better place
            scaled = (hit.score - low) / (high - low) if high > low else 1.0
            fused[hit.id] = fused.get(hit.id, 0.0) + weight * scaled
            found[hit.id] = found.get(hit.id, 0) + (weight > 0)  # a ranking weighted 0 is off
            first.setdefault(hit.id, hit)
            sides.setdefault(hit.id, {})[side] = hit.score
    total = {i: fused[i] * found[i] for i in fused}
    order = sorted(total, key=lambda i: -total[i])[:k]
    return [replace(first[i], score=total[i], vector_score=sides[i].get(0), keyword_score=sides[i].get(1))
            for i in order]


def fuse(*rankings: Sequence[SearchHit], k: int = 5, weights: Sequence[float] | None = None,
         method: Fusion = "combmnz") -> list[SearchHit]:
    """Fuse rankings with `method`: `combmnz` (scores; the default) or `rrf` (ranks)."""
    if method == "combmnz":
        return combmnz(*rankings, k=k, weights=weights)
    if method == "rrf":
        return rrf(*rankings, k=k, weights=weights)
    raise UsageError(f"fusion must be 'combmnz' or 'rrf', got {method!r}")


async def _resolve(vector: Sequence[float] | Awaitable[Sequence[float]] | None) -> Sequence[float] | None:
    if inspect.isawaitable(vector):
        return await vector
    return vector


EMBEDDER_KEY: Final = "embedder"
"""The metadata key naming the model that embedded a record (`Embedder.name`).

`SemanticMemory`, `FactMemory` and `ingest_folder` write it on every record, and `check_embedder`
reads it: vectors of two models cannot be compared, even when they have the same size.
"""


async def check_embedder(vectors: VectorStore, collection: str, embedder: Embedder, *,
                         fix: str = "use the embedder that made them, or another collection") -> None:
    """Refuse to use `embedder` on `collection` when the collection holds vectors another model made.

    A record's model is its `EMBEDDER_KEY` metadata; records without one (stored before contextpipe
    wrote it, or by the application) are taken to be `embedder`'s. Raises `UsageError` saying how
    many records another model made (and which, when one of the nearest to a probe vector says
    so), and `fix`, what to do.

    >>> import asyncio
    >>> from contextpipe.vectors import HashEmbedder, MemoryVectorStore
    >>> store = MemoryVectorStore()
    >>> asyncio.run(store.upsert("notes", [VectorRecord("a", [1.0] * 64, "hi", {EMBEDDER_KEY: "model-a"})]))
    >>> asyncio.run(check_embedder(store, "notes", HashEmbedder(64)))
    Traceback (most recent call last):
    ...
    contextpipe.errors.UsageError: the 'notes' collection holds 1 record embedded by model-a, not hash-64, ...
    """
    name = embedder.name
    # The total is counted before and after `embedder`'s records: the same twice, nothing was written or
    # deleted meanwhile. While records keep coming or going, the smaller is taken, so that they cannot
    # make others appear (a refusal is for records another model made, never for a busy collection).
    for _ in range(3):
        before = await vectors.count(collection)
        mine = await vectors.count(collection, where={EMBEDDER_KEY: [name, None]})
        after = await vectors.count(collection)
        if before == after:
            break
    others = min(before, after) - mine
    if others <= 0:
        return
    by = "another model"
    try:
        probe = [1.0] + [0.0] * (embedder.dimension - 1)
        hits = await vectors.search(collection, probe, k=50)
    except UsageError:  # vectors of another size
        hits, by = [], "another model, of another vector size"
    by = next((str(m) for h in hits if (m := h.metadata.get(EMBEDDER_KEY)) not in (None, name)), by)
    raise UsageError(f"the {collection!r} collection holds {others:,} record{'s' * (others != 1)} embedded by {by}, "
                     f"not {name}, and vectors of two models cannot be compared: {fix}")


async def embed_query(embedder: Embedder, text: str) -> list[float]:
    """Embed a search query.

    Uses the embedder's ``embed_query`` when it has one (query and passage differ for
    retrieval-trained models), else ``embed``.
    """
    special = getattr(embedder, "embed_query", None)
    if special is not None:
        vector: list[float] = await special(text)
        return vector
    [vector] = await embedder.embed([text])
    return vector


async def embed_queries(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """Embed several search queries, in one batch where the embedder can.

    Uses the embedder's ``embed_queries`` when it has one (one forward pass for all of them), else
    its ``embed_query`` for each, else one ``embed`` call.
    """
    batched = getattr(embedder, "embed_queries", None)
    if batched is not None:
        vectors: list[list[float]] = await batched(list(texts))
        return vectors
    if getattr(embedder, "embed_query", None) is not None:
        return [await embed_query(embedder, text) for text in texts]
    return await embedder.embed(list(texts))
