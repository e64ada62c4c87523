"""`MemoryStore`: the session store contract, in this process's memory.

Fast and dependency-free, for tests, prototypes and short-lived sessions; everything is gone when the
process exits. Messages are kept as the (immutable) `Message` objects themselves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import override

from ..messages import Message
from ..session import Session
from ._common import (
    busy,
    check_key,
    check_limit,
    checkpoint_past_end,
    concurrent_update,
    decode_cursor,
    decode_trace,
    duplicate_in_batch,
    encode_cursor,
    encode_trace,
    lease_lost,
)
from .base import Checkpoint, Lease, MessagePage, SessionInfo, SessionListing, SessionStore

__all__ = ["MemoryStore"]


@dataclass
class _Entry:
    created_at: float
    updated_at: float
    state_json: str = "{}"
    version: int = 0
    ttl: float | None = None
    log: list[Message] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    traces: list[str] = field(default_factory=list)
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires: float = 0.0

    def visible(self) -> bool:
        """Whether the session exists for readers: it has state or messages (not just a lease)."""
        return self.version > 0 or bool(self.log)

    def expired(self, now: float) -> bool:
        return self.ttl is not None and self.updated_at + self.ttl <= now


class MemoryStore(SessionStore):
    """Sessions and their logs in a dict; same contract as the durable stores.

    >>> import asyncio
    >>> store = MemoryStore()
    >>> asyncio.run(store.append("default", "chat-1", [Message.user("hi")]))
    1
    """

    backend = "memory"

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}

    def _entry(self, tenant: str, session_id: str, *, create: bool = False) -> _Entry | None:
        key = (tenant, session_id)
        entry = self._entries.get(key)
        if entry is None:
            check_key(tenant, session_id)
        elif entry.ttl is not None and entry.expired(time.time()):
            del self._entries[key]
            entry = None
        if entry is None and create:
            now = time.time()
            entry = self._entries[key] = _Entry(now, now)
        return entry

    def _check_lease(self, entry: _Entry, tenant: str, session_id: str, lease: Lease | None) -> None:
        if lease is not None:
            if lease.token != entry.lease_token or lease.owner != entry.lease_owner:
                raise lease_lost(self.backend, lease, entry.lease_token)
        elif entry.lease_owner is not None and entry.lease_expires > time.time():
            raise busy(self.backend, tenant, session_id)

    # --- session records ---------------------------------------------------------------------------

    @override
    async def get_session(self, tenant: str, session_id: str) -> Session | None:
        entry = self._entry(tenant, session_id)
        if entry is None or not entry.visible():
            return None
        return Session(session_id, tenant, json.loads(entry.state_json), entry.version, entry.created_at, entry.ttl)

    @override
    async def save_session(self, session: Session, *, lease: Lease | None = None) -> None:
        entry = self._entry(session.tenant, session.id, create=True)
        assert entry is not None
        self._check_lease(entry, session.tenant, session.id, lease)
        if entry.version != session.version:
            raise concurrent_update(self.backend, session.tenant, session.id, entry.version, session.version)
        entry.state_json = json.dumps(session.state_to_json(), separators=(",", ":"))
        entry.version += 1
        entry.ttl = session.ttl
        if entry.version == 1:
            entry.created_at = session.created_at
        entry.updated_at = time.time()
        session.version = entry.version

    @override
    async def delete_session(self, tenant: str, session_id: str) -> bool:
        check_key(tenant, session_id)
        return self._entries.pop((tenant, session_id), None) is not None

    @override
    async def list_sessions(self, tenant: str, *, limit: int = 50, cursor: str | None = None) -> SessionListing:
        check_limit(limit)
        now = time.time()
        rows = sorted(
            ((e.updated_at, sid, e) for (t, sid), e in self._entries.items()
             if t == tenant and e.visible() and not e.expired(now)),
            key=lambda r: (-r[0], r[1]),
        )
        if cursor is not None:
            after_time, after_id = decode_cursor(cursor)
            rows = [r for r in rows if (-r[0], r[1]) > (-after_time, after_id)]
        page = rows[:limit]
        infos = [SessionInfo(tenant, sid, e.version, len(e.log), e.created_at, e.updated_at) for _, sid, e in page]
        next_cursor = encode_cursor(page[-1][0], page[-1][1]) if len(rows) > limit else None
        return SessionListing(infos, next_cursor)

    @override
    async def purge_expired(self) -> int:
        now = time.time()
        expired = [key for key, e in self._entries.items() if e.expired(now)]
        for key in expired:
            del self._entries[key]
        return len(expired)

    # --- message log -------------------------------------------------------------------------------

    @override
    async def append(
        self, tenant: str, session_id: str, messages: Sequence[Message], *, lease: Lease | None = None
    ) -> int:
        entry = self._entry(tenant, session_id, create=True)
        assert entry is not None
        self._check_lease(entry, tenant, session_id, lease)
        if len({m.id for m in messages}) != len(messages):
            raise duplicate_in_batch(session_id)
        ids = entry.ids
        fresh = [m for m in messages if m.id not in ids]
        entry.log.extend(fresh)
        ids.update(m.id for m in fresh)
        entry.updated_at = time.time()
        return len(entry.log)

    @override
    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        limit: int | None = None,
        before: int | None = None,
        after: int | None = None,
    ) -> MessagePage:
        check_limit(limit)
        entry = self._entry(tenant, session_id)
        log = entry.log if entry is not None else []
        end = len(log) if before is None else max(0, min(before - 1, len(log)))
        floor = 0 if after is None else max(0, min(after, end))
        start = floor if limit is None else max(floor, end - limit)
        return MessagePage(log[start:end], start + 1, start > 0)

    # --- checkpoints -------------------------------------------------------------------------------

    @override
    async def save_checkpoint(
        self, tenant: str, session_id: str, checkpoint: Checkpoint, *, lease: Lease | None = None
    ) -> None:
        entry = self._entry(tenant, session_id, create=True)
        assert entry is not None
        self._check_lease(entry, tenant, session_id, lease)
        if checkpoint.seq > len(entry.log) or checkpoint.seq < 1:
            raise checkpoint_past_end(self.backend, tenant, session_id, checkpoint.seq, len(entry.log))
        entry.checkpoints = [c for c in entry.checkpoints if c.seq != checkpoint.seq] + [checkpoint]
        entry.checkpoints.sort(key=lambda c: c.seq)
        entry.updated_at = time.time()

    @override
    async def latest_checkpoint(self, tenant: str, session_id: str) -> Checkpoint | None:
        entry = self._entry(tenant, session_id)
        return entry.checkpoints[-1] if entry is not None and entry.checkpoints else None

    # --- traces ------------------------------------------------------------------------------------

    @override
    async def append_traces(
        self, tenant: str, session_id: str, traces: Sequence[dict[str, Any]], *, lease: Lease | None = None
    ) -> None:
        entry = self._entry(tenant, session_id, create=True)
        assert entry is not None
        self._check_lease(entry, tenant, session_id, lease)
        entry.traces.extend(encode_trace(t) for t in traces)

    @override
    async def load_traces(self, tenant: str, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        check_limit(limit)
        entry = self._entry(tenant, session_id)
        if entry is None:
            return []
        bodies = entry.traces if limit is None else entry.traces[-limit:]
        return [decode_trace(self.backend, tenant, session_id, b) for b in bodies]

    # --- leases ------------------------------------------------------------------------------------

    @override
    async def try_acquire_lease(self, tenant: str, session_id: str, owner: str, ttl: float) -> Lease | None:
        entry = self._entry(tenant, session_id, create=True)
        assert entry is not None
        now = time.time()
        if entry.lease_owner is not None and entry.lease_expires > now and entry.lease_owner != owner:
            return None
        entry.lease_owner = owner
        entry.lease_token += 1
        entry.lease_expires = now + ttl
        return Lease(tenant, session_id, owner, entry.lease_token, entry.lease_expires, ttl)

    @override
    async def renew_lease(self, lease: Lease) -> Lease:
        entry = self._entry(lease.tenant, lease.session_id)
        if entry is None or entry.lease_token != lease.token or entry.lease_owner != lease.owner:
            raise lease_lost(self.backend, lease, entry.lease_token if entry else None)
        entry.lease_expires = time.time() + lease.ttl
        return Lease(lease.tenant, lease.session_id, lease.owner, lease.token, entry.lease_expires, lease.ttl)

    @override
    async def release_lease(self, lease: Lease) -> None:
        entry = self._entry(lease.tenant, lease.session_id)
        if entry is not None and entry.lease_token == lease.token and entry.lease_owner == lease.owner:
            entry.lease_owner = None
            entry.lease_expires = 0.0
