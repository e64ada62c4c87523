"""The artifacts (`contextpipe.stores._artifacts`) of Redis.

Two keys in the session's hash tag (`RedisStore._keys` 10 and 11): a hash of every artifact's id to
its record (media type and size, JSON) and a hash of its bytes in chunks of `CHUNK` bytes (field
``<id>#<n>``), so a range read fetches only the chunks it covers. The write (idempotent by id, fenced
by the lease) and the read are each one Lua script; the keys expire and are deleted with the
session's other keys.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from ..session import SessionKey
from ._artifacts import Artifact
from ._records import Lease

if TYPE_CHECKING:
    from .redis import RedisStore

__all__ = ["CHUNK", "RedisArtifacts"]

CHUNK: Final = 64 * 1024
"""Bytes per stored chunk of an artifact."""

# KEYS as `RedisStore._keys` (10: id -> record, 11: '<id>#<n>' -> chunk n); ARGV[2], ARGV[3] the lease (owner, token),
# ARGV[4] the id, ARGV[5] its record,
# ARGV[6...] its chunks.
_PUT_TAIL: Final = """
local bad = check_lease()
if bad then return bad end
local kept = redis.call('HGET', KEYS[10], ARGV[4])
if not kept then
  for i = 6, #ARGV do redis.call('HSET', KEYS[11], ARGV[4] .. '#' .. (i - 6), ARGV[i]) end
  redis.call('HSET', KEYS[10], ARGV[4], ARGV[5])
  kept = ARGV[5]
end
touch()
return {'ok', kept}
"""


# KEYS[1] id -> record, KEYS[2] chunks; ARGV: the id, offset, length, chunk size. One script: no write between the
# record and its chunks, and a missing chunk is said, not skipped (the bytes after it would come back shifted).
_READ: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'none'} end
local size = cjson.decode(raw)[2]
local offset, chunk = tonumber(ARGV[2]), tonumber(ARGV[4])
local stop = math.min(offset + tonumber(ARGV[3]), size)
local out = {'ok', raw}
if offset >= stop then return out end
for n = math.floor(offset / chunk), math.floor((stop - 1) / chunk) do
  local part = redis.call('HGET', KEYS[2], ARGV[1] .. '#' .. n)
  if not part then return {'missing', raw, tostring(n)} end
  out[#out + 1] = part
end
return out
"""


class RedisArtifacts:
    """`ArtifactTable` of `RedisStore`."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        script: Any = store.__dict__.get("_artifact_put")
        if script is None:  # registered once per store
            from .redis import _PROLOGUE

            script = store.__dict__["_artifact_put"] = store._client.register_script(_PROLOGUE + _PUT_TAIL)
        self._put = script

    async def put(self, key: SessionKey, artifact_id: str, data: bytes, media_type: str,
                  lease: Lease | None) -> Artifact:
        """Write the chunks and the record (idempotent by id, lease-fenced) and touch the session, as a write does."""
        store, record = self._store, json.dumps([media_type, len(data)])
        chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
        result = await self._put(keys=store._keys(key), args=[key.id, *store._lease_args(lease), artifact_id, record,
                                                               *chunks])
        store._raise(result, key, lease)
        media, size = json.loads(result[1])
        return Artifact(artifact_id, media, size)

    async def copy(self, source: SessionKey, target: SessionKey, lease: Lease | None) -> int:
        """Copy one artifact at a time (the sessions' keys are in different hash tags: no one script for both)."""
        copied = 0
        for raw_id, raw in (await self._store._client.hgetall(self._store._keys(source)[9])).items():
            media, size = json.loads(raw)
            data = await self.read(source, raw_id.decode(), 0, max(size, 1))  # a missing chunk: CorruptRecord
            if data is None:
                continue  # the source went meanwhile (erased or expired): nothing to copy
            await self.put(target, raw_id.decode(), data, media, lease)
            copied += 1
        return copied

    async def info(self, key: SessionKey, artifact_id: str) -> Artifact | None:
        """Return the record, or None."""
        raw = await self._store._client.hget(self._store._keys(key)[9], artifact_id)
        if raw is None:
            return None
        media, size = json.loads(raw)
        return Artifact(artifact_id, media, size)

    async def read(self, key: SessionKey, artifact_id: str, offset: int, length: int) -> bytes | None:
        """Return the range from the chunks it covers, read with the record in one script, or None."""
        store, keys = self._store, self._store._keys(key)
        script: Any = store.__dict__.get("_artifact_read")
        if script is None:
            script = store.__dict__["_artifact_read"] = store._client.register_script(_READ)
        result = await script(keys=keys[9:11], args=[artifact_id, offset, min(length, 2**50), CHUNK])
        if result[0] == b"none":
            return None
        if result[0] == b"missing":
            from ..errors import CorruptRecord

            raise CorruptRecord.unreadable(store.backend, key, f"artifact {artifact_id!r}",
                                           f"its chunk {int(result[2])} is missing (the record says "
                                           f"{json.loads(result[1])[1]:,} bytes)")
        first = offset // CHUNK
        size = json.loads(result[1])[1]
        return b"".join(result[2:])[offset - first * CHUNK:min(offset + length, size) - first * CHUNK]
