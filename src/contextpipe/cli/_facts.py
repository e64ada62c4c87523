"""``contextpipe inspect SESSION --facts``: the facts `FactMemory` keeps about a session's user, with their histories.

Each fact is shown with every version: when it was true, the text, and the messages it was
extracted from (read back from the session log where this file still holds them).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._preview import preview
from ..messages import Message
from ..providers._fact_records import Fact, user_facts
from ..session import user_id
from ..stores.sqlite import SQLiteStore
from ._shared import existing_session, fail, open_store, out, print_json, shown

__all__ = ["show_facts"]

Sources = dict[tuple[str, str], tuple[int, Message] | None]
"""Each source message by ``(session id, message id)``: its sequence and the message, or None when not found."""


def show_facts(db: Path, tenant: str, session: str, collection: str, as_json: bool) -> None:
    """Print the history of every fact about `session`'s user in `collection` of `db`."""

    async def run() -> tuple[str, list[list[Fact]], Sources]:
        async with open_store(db) as store:
            user = user_id(await existing_session(store, db, tenant, session))
            if user is None:
                raise fail(f"session {session!r} belongs to no user, and facts are kept per user; "
                           "FactMemory learns them in sessions given one with set_user_id(session, user)")
            if not _holds_vectors(db):  # (opening the vector store would add its tables to the file)
                return user, [], {}
            vectors = store.vectors()
            try:
                found = await user_facts(vectors, collection, {"tenant": tenant, "user_id": user})
            finally:
                await vectors.close()
            return user, found, await _sources(store, tenant, found)

    user, found, sources = asyncio.run(run())
    if as_json:
        print_json({"session_id": session, "tenant": tenant, "user_id": user, "collection": collection,
                    "facts": [{"lineage": versions[0].lineage,
                               "versions": [_version_json(v, sources) for v in versions]} for versions in found]})
        return
    if not found:
        out.print(f"no facts about user {shown(user)!r} in collection {shown(collection)!r} of {shown(str(db))}")
        return
    out.print(f"[bold]facts about user {shown(user)!r}[/bold] (collection {shown(collection)!r}): {len(found)} "
              f"fact(s), {sum(len(v) for v in found)} version(s)")
    for versions in found:
        out.print(f"\nfact {shown(versions[0].lineage)}")
        for number, version in enumerate(versions, 1):
            out.print(f"  {number}. {_when(version.valid_from, 'unknown')} -> {_when(version.valid_to, 'now')}  "
                      f"{shown(version.text)}  [dim]({shown(version.id)}, session {shown(str(version.session_id))})"
                      "[/dim]")
            for message_id in version.sources:
                out.print(f"       from {_source(version.session_id, message_id, sources)}")
            if version.ended_by:
                out.print(f"       ended by {shown(', '.join(version.ended_by))}")
            if not version.sources:
                out.print("       [dim](stored before facts kept their sources)[/dim]")


def _holds_vectors(db: Path) -> bool:
    """Whether `db` has vector tables (read-only: nothing is created)."""
    with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'cp_vectors'").fetchone() is not None


async def _sources(store: SQLiteStore, tenant: str, found: list[list[Fact]]) -> Sources:
    """Read every source message back from the session log: one lookup in the ids' index and one load each."""
    sources: Sources = {}
    for version in (v for versions in found for v in versions):
        for message_id in version.sources:
            key = (version.session_id or "", message_id)
            if key in sources:
                continue
            seq = await store.message_seq(tenant, key[0], message_id) if key[0] else None
            page = await store.load(tenant, key[0], before=seq + 1, after=seq - 1, limit=1) if seq is not None else None
            sources[key] = (seq, page.messages[0]) if seq is not None and page and page.messages else None
    return sources


def _when(at: float | None, absent: str) -> str:
    return absent if at is None else datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _source(session_id: str | None, message_id: str, sources: Sources) -> str:
    found = sources.get((session_id or "", message_id))
    if found is None:
        return f"{shown(message_id)} [dim](no longer in this database)[/dim]"
    seq, message = found
    return f"{shown(message_id)} [dim]#{seq}[/dim] {message.role}: {shown(preview(message, width=100))}"


def _version_json(version: Fact, sources: Sources) -> dict[str, Any]:
    messages = []
    for message_id in version.sources:
        found = sources.get((version.session_id or "", message_id))
        messages.append({"id": message_id, "seq": found[0] if found else None,
                         "role": found[1].role if found else None, "text": found[1].text if found else None})
    return {**version.to_dict(), "source_messages": messages}
