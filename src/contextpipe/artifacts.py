"""Artifacts: bytes stored beside a session's log, in every store, and read back by range.

A tool result too big to send to a model whole is kept as an artifact (`contextpipe.providers.Artifacts`
spills it), and the model reads the parts it needs. These functions are the store side, on any
`SessionStore` (memory, SQLite, PostgreSQL, Redis):

>>> import asyncio
>>> from contextpipe.stores import MemoryStore
>>> async def demo() -> tuple[Artifact, bytes | None]:
...     store = MemoryStore()
...     kept = await put_artifact(store, "acme", "chat-1", "report", b"0123456789", "text/plain")
...     return kept, await read_artifact(store, "acme", "chat-1", "report", offset=3, length=4)
>>> asyncio.run(demo())
(Artifact(id='report', media_type='text/plain', size=10), b'3456')

An artifact belongs to its session: deleting the session (`SessionStore.erase_session`, its TTL,
`Agent.forget_user`) deletes its artifacts, and `Erased.artifacts` counts them. Writing is
idempotent by id (the first bytes stay). See `contextpipe.stores._artifacts` for how each store
keeps them.
"""

from __future__ import annotations

from .stores._artifacts import (
    MAX_ARTIFACT_BYTES,
    Artifact,
    ArtifactTable,
    check_artifact,
    check_artifact_id,
    check_range,
)
from .stores._checks import key_of
from .stores.base import Lease, SessionStore

__all__ = ["MAX_ARTIFACT_BYTES", "Artifact", "artifact_info", "put_artifact", "read_artifact"]


def _table(store: SessionStore) -> ArtifactTable:
    from .stores._artifacts_sql import table_for

    return table_for(store)


async def put_artifact(store: SessionStore, tenant: str, session_id: str, artifact_id: str, data: bytes,
                       media_type: str, *, lease: Lease | None = None) -> Artifact:
    """Store `data` as artifact `artifact_id` of the session; return its record.

    Idempotent by id: when the session already has an artifact of that id, nothing is written and
    that artifact's record is returned. Fenced as the session's other writes are: with `lease`, a
    lease that was lost (the session taken over, erased or expired) raises `LeaseLost` and writes
    nothing; without one, a session another run holds raises `SessionBusy`. Raises `UsageError` for a
    bad key, id (1 to 200 characters of UTF-8 text, no NUL), data (bytes, at most 512 MiB:
    `MAX_ARTIFACT_BYTES`) or media type (printable ASCII with a ``/``, at most 200 characters), and
    `StoreError` when the store fails.
    """
    key = key_of(tenant, session_id)
    check_artifact(artifact_id, data, media_type)
    try:
        return await _table(store).put(key, artifact_id, data, media_type, lease)
    except Exception as exc:
        raise store._store_error(exc) from exc


async def artifact_info(store: SessionStore, tenant: str, session_id: str, artifact_id: str) -> Artifact | None:
    """Return the record of the session's artifact `artifact_id` (None: the session has none of that id).

    An id no artifact can have (empty, over 200 characters, with NUL or lone surrogates) returns None.
    """
    key = key_of(tenant, session_id)
    if not check_artifact_id(artifact_id, reading=True):
        return None
    try:
        return await _table(store).info(key, artifact_id)
    except Exception as exc:
        raise store._store_error(exc) from exc


async def read_artifact(store: SessionStore, tenant: str, session_id: str, artifact_id: str, *, offset: int = 0,
                        length: int) -> bytes | None:
    """Return up to `length` bytes of the artifact from byte `offset` (fewer at its end, none past it).

    None when the session has no artifact of that id. Only the range is read, not the whole
    artifact. Raises `UsageError` for a negative offset or a length below 1.
    """
    key = key_of(tenant, session_id)
    check_range(offset, length)
    if not check_artifact_id(artifact_id, reading=True):
        return None
    try:
        return await _table(store).read(key, artifact_id, offset, length)
    except Exception as exc:
        raise store._store_error(exc) from exc
