"""The message queue (`contextpipe.stores._queue`) of the memory store and of Redis.

Memory: each session's entry keeps its queue as a dict in the order of writes (id to when, body and
whether it is settled), deleted with the session. Redis: two keys in the session's hash tag, a list
of the ids not settled and a hash of every id to its body (emptied when settled, kept so that a
retried enqueue adds nothing); the writes are Lua scripts, the keys expire and are deleted with the
session's other keys.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..session import SessionKey
from ._queue import QueueRow

if TYPE_CHECKING:
    from .memory import MemoryStore
    from .redis import RedisStore

__all__ = ["MemoryQueue", "RedisQueue"]


class MemoryQueue:
    """`QueueTable` of `MemoryStore`."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def add(self, key: SessionKey, entry_id: str, when: str, body: str) -> None:
        """Write the entry (idempotent by id)."""
        entry = await self._store._entry(key, create=True)
        assert entry is not None
        entry.queue.setdefault(entry_id, (when, body, False))
        entry.updated_at = self._store._clock()

    async def rows(self, key: SessionKey) -> list[QueueRow]:
        """Return the entries not settled, in order."""
        entry = await self._store._entry(key)
        return [] if entry is None else [(i, w, b) for i, (w, b, done) in entry.queue.items() if not done]

    async def settle(self, key: SessionKey, entry_ids: Sequence[str]) -> None:
        """Mark entries settled."""
        entry = await self._store._entry(key)
        queue = entry.queue if entry is not None else {}
        for i in entry_ids:
            if (kept := queue.get(i)) is not None:
                queue[i] = (kept[0], kept[1], True)


# KEYS as `RedisStore._keys` (8: the ids not settled, 9: id -> body); ARGV[4] entry id, ARGV[5] its body.
_ENQUEUE_TAIL: Final = """
if redis.call('HSETNX', KEYS[9], ARGV[4], ARGV[5]) == 1 then redis.call('RPUSH', KEYS[8], ARGV[4]) end
touch()
return {'ok', ''}
"""

# KEYS[1] the ids not settled, KEYS[2] id -> body; ARGV the ids to settle.
_SETTLE: Final = """
for _, id in ipairs(ARGV) do
  local body = redis.call('HGET', KEYS[2], id)
  if body and body ~= '' then
    redis.call('HSET', KEYS[2], id, '')
    redis.call('LREM', KEYS[1], 1, id)
  end
end
return 1
"""


class RedisQueue:
    """`QueueTable` of `RedisStore`."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        scripts: dict[str, Any] | None = store.__dict__.get("_queue_scripts")
        if scripts is None:  # registered once per store
            from .redis import _PROLOGUE

            client = store._client
            scripts = store.__dict__["_queue_scripts"] = {
                "enqueue": client.register_script(_PROLOGUE + _ENQUEUE_TAIL),
                "settle": client.register_script(_SETTLE)}
        self._scripts = scripts

    async def add(self, key: SessionKey, entry_id: str, when: str, body: str) -> None:
        """Write the entry (idempotent by id) and touch the session, as a write does."""
        await self._scripts["enqueue"](keys=self._store._keys(key),
                                       args=[key.id, "", "0", entry_id, json.dumps([when, body])])

    async def rows(self, key: SessionKey) -> list[QueueRow]:
        """Return the entries not settled, in order."""
        keys = self._store._keys(key)
        ids = [i.decode() for i in await self._store._client.lrange(keys[7], 0, -1)]
        if not ids:
            return []
        bodies = await self._store._client.hmget(keys[8], ids)
        found: list[QueueRow] = []
        for entry_id, raw in zip(ids, bodies, strict=True):
            if raw:  # settled meanwhile: skipped
                when, body = json.loads(raw)
                found.append((entry_id, when, body))
        return found

    async def settle(self, key: SessionKey, entry_ids: Sequence[str]) -> None:
        """Mark entries settled."""
        if entry_ids:
            keys = self._store._keys(key)
            await self._scripts["settle"](keys=[keys[7], keys[8]], args=list(entry_ids))
