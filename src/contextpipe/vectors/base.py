"""The `Embedder` and `VectorStore` contracts shared by memory and search providers."""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

from ..errors import UsageError

__all__ = ["Embedder", "SearchHit", "VectorRecord", "VectorStore", "Where"]

Where = Mapping[str, Any]
"""Metadata filter: every key must equal its value (or be one of the values, for a list)."""

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
    """A text, its vector and its metadata (scope, source, time ...)."""

    id: str
    vector: Sequence[float]
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchHit:
    """A search result: the record's id, text and metadata, and its cosine similarity to the query."""

    id: str
    score: float
    text: str
    metadata: Mapping[str, Any]


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
            if value not in wanted:
                return False
        elif value != wanted:
            return False
    return True


class VectorStore(abc.ABC):
    """Vectors with text and metadata in named collections; exact or approximate top-k search."""

    @abc.abstractmethod
    async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
        """Insert `records`, replacing any with the same id."""

    @abc.abstractmethod
    async def delete(self, collection: str, *, ids: Sequence[str] | None = None, where: Where | None = None) -> int:
        """Delete the records with these ids and/or matching `where`; return how many went."""

    @abc.abstractmethod
    async def search(self, collection: str, vector: Sequence[float], *, k: int = 5, where: Where | None = None,
                     min_score: float | None = None) -> list[SearchHit]:
        """Return up to `k` records matching `where`, most similar first, none below `min_score`."""

    @abc.abstractmethod
    async def count(self, collection: str, *, where: Where | None = None) -> int:
        """Return how many records match `where`."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources the store owns."""
