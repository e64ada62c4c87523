"""`MemoryStore`: the session store contract, in this process's memory.

Fast and dependency-free, for tests, prototypes and short-lived sessions; everything is gone when the
process exits. Messages are kept as the (immutable) `Message` objects themselves, so any text comes
back exactly as it was given.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._compat import override
from ..errors import ConcurrentUpdate
from ..messages import Message
from ..outbox import OutboxEntry, outbox_rows
from ..session import Session, SessionKey
from ._checks import not_empty
from ._common import (
    bounded_expiry,
    check_lease,
    checkpoint_past_end,
    decode_trace,
    encode_trace,
    lease_is_free,
    lease_lost,
)
from ._records import Artifact
from .base import Checkpoint, Erased, Lease, MessagePage, SessionInfo, SessionStore

__all__ = ["MemoryArtifacts", "MemoryQueue", "MemoryStore"]


@dataclass
class _Entry:
    created_at: float
    updated_at: float
    state_json: str = "{}"
    version: int = 0
    ttl: float | None = None
    log: list[Message] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)  # message id -> sequence
    checkpoints: list[Checkpoint] = field(default_factory=list)
    traces: list[str] = field(default_factory=list)
    outbox: dict[str, tuple[int, OutboxEntry]] = field(default_factory=dict)
    """Outbox entries not marked delivered, by key, with their place in the store's order of writes."""
    delivered: set[str] = field(default_factory=set)
    queue: dict[str, tuple[str, str, bool]] = field(default_factory=dict)  # `MemoryQueue`
    artifacts: dict[str, tuple[Artifact, bytes]] = field(default_factory=dict)  # `MemoryArtifacts`
    lease_owner: str | None = None
    lease_token: int = 0
    lease_expires: float = 0.0
    lease_ttl: float = 0.0
    kept_until: float = 0.0
    """The session lives at least until then: the expiry its lease's last acquisition or renewal gave it."""

    def visible(self) -> bool:
        """Whether the session exists for readers: it has state or messages (not just a lease)."""
        return self.version > 0 or bool(self.log)

    def expired(self, now: float) -> bool:
        return self.ttl is not None and max(self.updated_at + self.ttl, self.kept_until) <= now

    def held_lease_expiry(self, now: float) -> float:
        """Return the held lease's expiry, bounded by its ttl from `now` (`bounded_expiry`), and keep it so."""
        self.lease_expires = bounded_expiry(self.lease_expires, self.lease_ttl, now)
        return self.lease_expires

    def hold(self, now: float, expires: float) -> None:
        """Let the lease run until `expires`; the session lives at least as long, and its TTL counts from now."""
        self.lease_expires = expires
        self.kept_until = max(expires, now + (self.ttl or 0.0))


def steady_clock() -> Callable[[], float]:
    """Return a clock reading seconds since the epoch off the monotonic clock: the system clock's steps do not move it.

    It reads the wall clock once, when made, and counts from there with ``time.monotonic``.
    """
    start = time.time() - time.monotonic()
    return lambda: start + time.monotonic()


class MemoryStore(SessionStore):
    """Sessions and their logs in a dict; same contract as the durable stores.

    >>> import asyncio
    >>> store = MemoryStore()
    >>> asyncio.run(store.append("default", "chat-1", [Message.user("hi")]))
    1

    `clock` (seconds since the epoch) is what TTLs and leases are measured with. By default it is
    the monotonic clock counted from the wall clock's time when the store was made (`steady_clock`),
    so a step of the system clock (by NTP or by hand) moves no lease and no TTL; tests pass a fake
    one to expire sessions and leases exactly and at once. Whatever the clock does, a lease whose
    holder died blocks its session for at most its ttl after the clock last stepped back
    (`_common.bounded_expiry`).
    """

    backend = "memory"
    keeps_outbox = True

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._entries: dict[SessionKey, _Entry] = {}
        self._order = itertools.count()  # of outbox entries, as they are written
        self._clock = clock if clock is not None else steady_clock()
        self.queue_table = MemoryQueue(self)
        """The store's message queue (`contextpipe.queue`)."""
        self.artifact_table = MemoryArtifacts(self)
        """The store's artifacts (`contextpipe.artifacts`)."""

    async def _entry(self, key: SessionKey, *, create: bool = False) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.ttl is not None and entry.expired(self._clock()):
            del self._entries[key]
            entry = None
            await self._notify_restarted([key])
        if entry is None and create:
            now = self._clock()
            entry = self._entries[key] = _Entry(now, now)
        return entry

    async def _writable(self, key: SessionKey, lease: Lease | None) -> _Entry:
        entry = await self._entry(key)
        now = self._clock()
        if entry is None and lease is not None:  # the session is gone (deleted, or expired after the lease lapsed)
            raise lease_lost(self.backend, key, lease, None, now)
        entry = entry or await self._entry(key, create=True)
        assert entry is not None
        check_lease(self.backend, key, lease, entry.lease_owner, entry.lease_token, entry.held_lease_expiry(now), now)
        return entry

    # --- session records ---------------------------------------------------------------------------

    @override
    async def _get(self, key: SessionKey) -> Session | None:
        entry = await self._entry(key)
        if entry is None or not entry.visible():
            return None
        return Session(key.id, key.tenant, json.loads(entry.state_json), entry.version, entry.created_at, entry.ttl)

    @override
    async def _save(self, key: SessionKey, session: Session, lease: Lease | None) -> int:
        state_json = json.dumps(session.state_to_json(), separators=(",", ":"))
        entry = await self._writable(key, lease)
        if entry.version != session.version:
            raise ConcurrentUpdate.stale(self.backend, key, entry.version, session.version)
        entry.state_json = state_json
        entry.version += 1
        entry.ttl = session.ttl
        if entry.version == 1:
            entry.created_at = session.created_at
        entry.updated_at = self._clock()
        return entry.version

    @override
    async def _delete(self, key: SessionKey) -> Erased | None:
        entry = self._entries.pop(key, None)
        return None if entry is None else Erased(len(entry.log), len(entry.checkpoints), len(entry.traces),
                                                 len(entry.artifacts))

    @override
    async def _list(self, tenant: str, limit: int, after: tuple[float, str]) -> list[SessionInfo]:
        now = self._clock()
        rows = sorted(
            ((e.updated_at, k.id, e) for k, e in self._entries.items()
             if k.tenant == tenant and e.visible() and not e.expired(now)),
            key=lambda r: (-r[0], r[1]),
        )
        after_time, after_id = after
        return [SessionInfo(tenant, sid, e.version, len(e.log), e.created_at, e.updated_at) for t, sid, e in rows
                if (-t, sid) > (-after_time, after_id)]

    @override
    async def _purge(self) -> list[SessionKey]:
        now = self._clock()
        expired = [key for key, e in self._entries.items() if e.expired(now)]
        for key in expired:
            del self._entries[key]
        return expired

    # --- message log -------------------------------------------------------------------------------

    @override
    async def _append(self, key: SessionKey, messages: Sequence[Message], lease: Lease | None, durable: bool) -> int:
        entry = await self._writable(key, lease)
        ids, log = entry.ids, entry.log
        fresh = [m for m in messages if m.id not in ids]
        entries = outbox_rows(fresh)  # checked before anything is written: the append is atomic
        ids.update((m.id, seq) for seq, m in enumerate(fresh, len(log) + 1))
        log.extend(fresh)
        for mid, k, topic, body in entries:
            if not self._outboxed(key.tenant, k):  # unique by tenant and key, as in the SQL stores
                made = json.loads(body)
                outboxed = OutboxEntry(k, key.tenant, key.id, ids[mid], made["call_id"], topic, made["payload"])
                entry.outbox[k] = (next(self._order), outboxed)
        entry.updated_at = self._clock()
        return len(entry.log)

    def _outboxed(self, tenant: str, entry_key: str) -> bool:
        """Whether a live session of `tenant` holds the outbox entry `entry_key` (pending or delivered)."""
        now = self._clock()
        return any(k.tenant == tenant and not e.expired(now) and (entry_key in e.outbox or entry_key in e.delivered)
                   for k, e in self._entries.items())

    @override
    async def _copy_view(self, source: SessionKey, target: SessionKey, kept: list[tuple[int, int]],
                         lease: Lease | None) -> int:
        entry, into = await self._entry(source), await self._entry(target)
        if into is not None and into.log:
            raise not_empty(target, len(into.log))
        log = entry.log if entry is not None else []
        batch = [m for lo, hi in kept for m in log[lo - 1:hi]]  # the messages themselves: nothing to decode
        if batch:
            await self._append(target, batch, lease, True)
        return len(batch)

    @override
    async def _load(self, key: SessionKey, limit: int | None, before: int | None, after: int | None) -> MessagePage:
        entry = await self._entry(key)
        log = entry.log if entry is not None else []
        end = len(log) if before is None else max(0, min(before - 1, len(log)))
        floor = 0 if after is None else max(0, min(after, end))
        start = floor if limit is None else max(floor, end - limit)
        return MessagePage(log[start:end], start + 1, start > 0)

    @override
    async def _message_seq(self, key: SessionKey, message_id: str) -> int | None:
        entry = await self._entry(key)
        return entry.ids.get(message_id) if entry is not None else None

    # --- checkpoints -------------------------------------------------------------------------------

    @override
    async def _save_checkpoint(self, key: SessionKey, checkpoint: Checkpoint, lease: Lease | None) -> None:
        entry = await self._writable(key, lease)
        if checkpoint.seq > len(entry.log) or checkpoint.seq < 1:
            raise checkpoint_past_end(self.backend, key, checkpoint.seq, len(entry.log))
        entry.checkpoints = [c for c in entry.checkpoints if c.seq != checkpoint.seq] + [checkpoint]
        entry.checkpoints.sort(key=lambda c: c.seq)
        entry.updated_at = self._clock()

    @override
    async def _latest_checkpoint(self, key: SessionKey) -> Checkpoint | None:
        entry = await self._entry(key)
        return entry.checkpoints[-1] if entry is not None and entry.checkpoints else None

    # --- traces ------------------------------------------------------------------------------------

    @override
    async def _append_traces(self, key: SessionKey, traces: Sequence[dict[str, Any]], lease: Lease | None) -> None:
        entry = await self._writable(key, lease)
        entry.traces.extend(encode_trace(t) for t in traces)

    @override
    async def _load_traces(self, key: SessionKey, limit: int | None) -> list[dict[str, Any]]:
        entry = await self._entry(key)
        if entry is None:
            return []
        bodies = entry.traces if limit is None else entry.traces[-limit:]
        return [decode_trace(self.backend, key, b) for b in bodies]

    # --- outbox ------------------------------------------------------------------------------------

    @override
    async def _outbox(self, tenant: str, topic: str | None, limit: int) -> list[OutboxEntry]:
        now = self._clock()
        found = sorted(kept for k, e in self._entries.items() if k.tenant == tenant and not e.expired(now)
                       for kept in e.outbox.values() if topic is None or kept[1].topic == topic)
        return [outboxed for _, outboxed in found[:limit]]

    @override
    async def _mark_delivered(self, tenant: str, keys: list[str]) -> int:
        marked = 0
        for k, entry in self._entries.items():
            if k.tenant == tenant and entry.outbox:
                for done in keys:
                    if entry.outbox.pop(done, None) is not None:
                        entry.delivered.add(done)
                        marked += 1
        return marked

    # --- leases ------------------------------------------------------------------------------------

    @override
    async def _try_acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        entry = await self._entry(key, create=True)
        assert entry is not None
        now = self._clock()
        if not lease_is_free(entry.lease_owner, entry.held_lease_expiry(now), now, owner):
            return None
        entry.lease_owner = owner
        entry.lease_token += 1
        entry.lease_ttl = ttl
        entry.hold(now, now + ttl)
        return Lease(key.tenant, key.id, owner, entry.lease_token, entry.lease_expires, ttl)

    @override
    async def _renew_lease(self, lease: Lease) -> Lease:
        entry = await self._entry(lease.key)
        now = self._clock()
        if entry is None or entry.lease_token != lease.token or entry.lease_owner != lease.owner:
            raise lease_lost(self.backend, lease.key, lease, entry.lease_token if entry else None, now)
        entry.lease_ttl = lease.ttl
        entry.hold(now, now + lease.ttl)
        return lease.renewed(entry.lease_expires)

    @override
    async def _release_lease(self, lease: Lease) -> None:
        entry = await self._entry(lease.key)
        if entry is not None and entry.lease_token == lease.token and entry.lease_owner == lease.owner:
            entry.lease_owner = None
            entry.lease_expires = 0.0


class MemoryQueue:
    """The queue of a `MemoryStore` (`contextpipe.stores._queue.QueueTable`): kept in each session's entry."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def add(self, key: SessionKey, entry_id: str, when: str, body: str) -> None:
        """Write the entry (idempotent by id)."""
        entry = await self._store._entry(key, create=True)
        assert entry is not None
        entry.queue.setdefault(entry_id, (when, body, False))
        entry.updated_at = self._store._clock()

    async def rows(self, key: SessionKey) -> list[tuple[str, str, str]]:
        """Return the entries not settled, in order."""
        entry = await self._store._entry(key)
        return [] if entry is None else [(i, w, b) for i, (w, b, done) in entry.queue.items() if not done]

    def nothing_queued(self, key: SessionKey, lease: Lease) -> bool:
        """Return True when no entry of the session is waiting (exact: the queue is in this dict)."""
        entry = self._store._entries.get(key)
        return entry is None or not entry.queue or all(done for _, _, done in entry.queue.values())

    async def settle(self, key: SessionKey, entry_ids: Sequence[str]) -> None:
        """Mark entries settled."""
        entry = await self._store._entry(key)
        queue = entry.queue if entry is not None else {}
        for i in entry_ids:
            if (kept := queue.get(i)) is not None:
                queue[i] = (kept[0], kept[1], True)


class MemoryArtifacts:
    """The artifacts of a `MemoryStore` (`stores._artifacts.ArtifactTable`), kept in each session's entry."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def put(self, key: SessionKey, artifact_id: str, data: bytes, media_type: str,
                  lease: Lease | None) -> Artifact:
        """Keep the bytes (idempotent by id, lease-fenced) and touch the session."""
        entry = await self._store._writable(key, lease)
        kept = entry.artifacts.setdefault(artifact_id, (Artifact(artifact_id, media_type, len(data)), data))
        entry.updated_at = self._store._clock()
        return kept[0]

    async def copy(self, source: SessionKey, target: SessionKey, lease: Lease | None) -> int:
        """Copy the source's artifacts into the target's entry (lease-fenced) and touch it."""
        kept = await self._store._entry(source)
        entry = await self._store._writable(target, lease)
        for artifact_id, artifact in (kept.artifacts if kept is not None else {}).items():
            entry.artifacts.setdefault(artifact_id, artifact)
        entry.updated_at = self._store._clock()
        return len(kept.artifacts) if kept is not None else 0

    async def info(self, key: SessionKey, artifact_id: str) -> Artifact | None:
        """Return the record, or None."""
        entry = await self._store._entry(key)
        kept = None if entry is None else entry.artifacts.get(artifact_id)
        return None if kept is None else kept[0]

    async def read(self, key: SessionKey, artifact_id: str, offset: int, length: int) -> bytes | None:
        """Return the range, or None."""
        entry = await self._store._entry(key)
        kept = None if entry is None else entry.artifacts.get(artifact_id)
        return None if kept is None else kept[1][offset:offset + length]
