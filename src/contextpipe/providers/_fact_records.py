"""`Fact`: one version of a fact `FactMemory` keeps, as its vector store record holds it; and a user's histories.

A version's record keeps its time and provenance in its metadata, beside the scope (``tenant``,
``user_id``) and the ``session_id`` it was learned in: ``valid_from`` and ``valid_to`` (seconds
since the epoch; no ``valid_to`` while it is true), ``sources`` (the ids of the messages it was
extracted from), ``lineage`` (the id of the fact's first version), ``replaces`` / ``replaced_by``
(the versions before and after it), ``ended_by`` (the messages that ended it) and ``batch`` (the
extraction that last wrote it: the one that started it, or the one that ended it). A record stored
before these keys existed reads as a fact true from an unknown time, still true, with no sources:
its own first version.

Versions are records of the vector store, not entries of a session's log: a fact belongs to a user
across sessions and is recalled by similarity, so it lives where that search is; each names the
session and the messages it came from. Ending a version is the one change made to a record in place
(its ``valid_to``, ``ended_by``, ``replaced_by``, ``batch``), in the same write as its successor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import UsageError
from ..vectors.base import SearchHit, VectorStore, Where

__all__ = ["Fact", "histories", "seconds", "user_facts"]


@dataclass(frozen=True)
class Fact:
    """One version of a fact about a user: its text, when it was true, and the messages it came from.

    An update ends a version (`valid_to`) and starts the next one, of the same `lineage`; nothing is
    deleted. A fact stored before contextpipe kept histories is true from an unknown time
    (`valid_from` None) and has no `sources`.
    """

    id: str
    """This version's id (the one the extraction model is shown and the vector store keeps)."""
    text: str
    """The fact, a short sentence about the user."""
    lineage: str
    """The id of the fact's first version: every version of one fact has the same."""
    valid_from: float | None
    """When it became true (seconds since the epoch: when the turn it came from was taken); None: unknown."""
    valid_to: float | None
    """When it stopped being true; None while it is true."""
    sources: tuple[str, ...]
    """The ids of the messages it was extracted from (those of every turn of its extraction)."""
    ended_by: tuple[str, ...] = ()
    """The ids of the messages whose extraction ended it (empty while it is true)."""
    session_id: str | None = None
    """The session it was learned in."""
    replaces: str | None = None
    """The id of the version it replaced (None for a first version)."""
    replaced_by: str | None = None
    """The id of the version that replaced it (None while true, and when it ended without one)."""

    def true_at(self, when: float) -> bool:
        """Whether the fact was true at `when`; one true from an unknown time counts as true before it ended."""
        return (self.valid_from is None or self.valid_from <= when) and (self.valid_to is None or when < self.valid_to)

    @classmethod
    def from_hit(cls, hit: SearchHit) -> Fact:
        """Read the fact a record holds (a value of the wrong type reads as absent, as an older record's does)."""
        meta = hit.metadata
        return cls(hit.id, hit.text, _text(meta, "lineage") or hit.id, _time(meta, "valid_from"),
                   _time(meta, "valid_to"), _ids(meta, "sources"), _ids(meta, "ended_by"),
                   _text(meta, "session_id"), _text(meta, "replaces"), _text(meta, "replaced_by"))

    def to_dict(self) -> dict[str, Any]:
        """Return the fact as JSON (for ``contextpipe inspect --json`` and the server)."""
        return {"id": self.id, "text": self.text, "lineage": self.lineage, "valid_from": self.valid_from,
                "valid_to": self.valid_to, "sources": list(self.sources), "ended_by": list(self.ended_by),
                "session_id": self.session_id, "replaces": self.replaces, "replaced_by": self.replaced_by}


def _time(meta: Mapping[str, Any], key: str) -> float | None:
    value = meta.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(meta: Mapping[str, Any], key: str) -> str | None:
    value = meta.get(key)
    return value if isinstance(value, str) else None


def _ids(meta: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = meta.get(key)
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def seconds(when: float | datetime) -> float:
    """Return `when` as seconds since the epoch (a naive datetime is local time, as Python takes it)."""
    if isinstance(when, datetime):
        return when.timestamp()
    if isinstance(when, int | float) and not isinstance(when, bool):
        return float(when)
    raise UsageError(f"as_of must be a datetime or seconds since the epoch, got {type(when).__name__}")


def histories(facts: Iterable[Fact]) -> list[list[Fact]]:
    """Group versions into each fact's history, oldest version first; facts in the order they began."""
    by_lineage: dict[str, list[Fact]] = {}
    for fact in facts:
        by_lineage.setdefault(fact.lineage, []).append(fact)
    ordered = [_in_order(versions) for versions in by_lineage.values()]
    return sorted(ordered, key=lambda versions: _started(versions[0]))


def _in_order(versions: list[Fact]) -> list[Fact]:
    """Each version followed by the one that replaced it (versions may share a time: a retry ends one at once)."""
    by_id = {v.id: v for v in versions}
    ordered: list[Fact] = []
    for first in sorted((v for v in versions if v.replaces not in by_id), key=_started):
        version: Fact | None = first
        while version is not None and version not in ordered:
            ordered.append(version)
            version = by_id.get(version.replaced_by or "")
    # (two extractions that ended the same version at once each started a successor: the other one comes last)
    return ordered + sorted((v for v in versions if v not in ordered), key=_started)


def _started(fact: Fact) -> tuple[bool, float, str]:
    return fact.valid_from is not None, fact.valid_from or 0.0, fact.id


async def user_facts(vectors: VectorStore, collection: str, scope: Where) -> list[list[Fact]]:
    """Return the history of every fact in `collection` within `scope` (tenant and user), each oldest first."""
    return histories(Fact.from_hit(hit) for hit in await vectors.records(collection, where=scope))
