"""The message queue (`contextpipe.stores._queue`) of Redis.

Two keys in the session's hash tag: a list of the ids not settled and a hash of every id to its body
(emptied when settled, kept so that a retried enqueue adds nothing). The writes are Lua scripts; the
keys expire and are deleted with the session's other keys (`RedisStore._keys` 8 and 9).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..session import SessionKey

if TYPE_CHECKING:
    from ._records import Lease
    from .redis import RedisStore

__all__ = ["RedisQueue"]


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

    async def rows(self, key: SessionKey) -> list[tuple[str, str, str]]:
        """Return the entries not settled, in order."""
        keys = self._store._keys(key)
        ids = [i.decode() for i in await self._store._client.lrange(keys[7], 0, -1)]
        if not ids:
            return []
        bodies = await self._store._client.hmget(keys[8], ids)
        found: list[tuple[str, str, str]] = []
        for entry_id, raw in zip(ids, bodies, strict=True):
            if raw:  # settled meanwhile: skipped
                when, body = json.loads(raw)
                found.append((entry_id, when, body))
        return found

    def nothing_queued(self, key: SessionKey, lease: Lease) -> bool:
        """Not known without a round trip: the boundary reads the list."""
        return False

    async def settle(self, key: SessionKey, entry_ids: Sequence[str]) -> None:
        """Mark entries settled."""
        if entry_ids:
            keys = self._store._keys(key)
            await self._scripts["settle"](keys=[keys[7], keys[8]], args=list(entry_ids))
