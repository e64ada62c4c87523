"""`RedisStore`: sessions in Redis, for low-latency, TTL-heavy deployments.

Each session is a handful of keys sharing one hash tag (``{tenant/session}``): a hash with the
record, a list with the log (index = sequence - 1), a hash of message ids for idempotent appends, a
sorted set of checkpoints, a lease key, the message queue (`_queue_redis`) and artifacts
(`_artifacts_redis`). Every write is one Lua script, so the checks (lease, version, known ids) and
the write are atomic. TTLs are Redis's own key
expiry, pushed forward on every write. Timestamps come from the Redis server's clock.

A per-tenant sorted set indexes sessions by last update for listing; it lives outside the session's
hash tag, so this store targets a single Redis (or a Sentinel-managed primary), not Redis Cluster.

A server that stops answering never hangs a run: connecting, each command and closing have timeouts
(commands are not retried: a write whose answer was lost is reported, and appends are idempotent to
retry), connections use TCP keepalives, and the error is a `StoreError` naming the server.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .._compat import override
from ..errors import ConcurrentUpdate, LeaseLost, SessionBusy, StoreError, UsageError, shorten
from ..messages import Message
from ..session import Session, SessionKey
from . import _common as common
from . import _rows as row_codec
from .base import Checkpoint, Erased, Lease, MessagePage, SessionInfo, SessionStore

if TYPE_CHECKING:
    import redis.asyncio

__all__ = ["RedisStore"]

# Shared Lua prologue: KEYS as `_keys` (meta, log, ids, ckpt, lease, index, traces, ..., artifacts); clears the
# artifact keys of a session made afresh, reads the clock and checks the lease. The session's keys expire `ttl`
# after the last write, and never before the lease key does (`expire_keys`): never while a run holds the session.
# ARGV[1] session id, ARGV[2] lease owner ('' for none), ARGV[3] lease token.
_PROLOGUE: Final = """
if KEYS[11] and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[10], KEYS[11])  -- a session made afresh starts without artifacts (none left by its past)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function expire_keys()
  local ttl = redis.call('HGET', KEYS[1], 'ttl')
  if ttl and ttl ~= '' then
    local ms = math.floor(tonumber(ttl) * 1000)
    local held = redis.call('PTTL', KEYS[5])
    if held > ms then ms = held end
    for _, i in ipairs({1, 2, 3, 4, 7, 8, 9, 10, 11}) do
      if KEYS[i] and redis.call('EXISTS', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], ms) end
    end
  else
    for _, i in ipairs({1, 2, 3, 4, 7, 8, 9, 10, 11}) do
      if KEYS[i] then redis.call('PERSIST', KEYS[i]) end
    end
  end
end
local function touch()
  redis.call('HSET', KEYS[1], 'updated_at', tostring(now))
  redis.call('HSETNX', KEYS[1], 'created_at', tostring(now))
  redis.call('HSETNX', KEYS[1], 'version', '0')
  redis.call('ZADD', KEYS[6], now, ARGV[1])
  expire_keys()
end
-- A lease is current when its token is the session's and meta's 'lease_holder' (set by the acquire, cleared by the
-- release, gone with an erase) names its owner and token: an erased session's token restarts, its owner differs.
local function stale_lease(owner, token)
  local mine = owner .. '|' .. token
  local holder = redis.call('GET', KEYS[5])
  return token ~= (redis.call('HGET', KEYS[1], 'lease_token') or '0') or (holder and holder ~= mine)
    or redis.call('HGET', KEYS[1], 'lease_holder') ~= mine
end
local function check_lease()
  local holder = redis.call('GET', KEYS[5])
  local token = redis.call('HGET', KEYS[1], 'lease_token') or '0'
  if ARGV[2] ~= '' then
    if stale_lease(ARGV[2], ARGV[3]) then return {'lost', token, tostring(now)} end
  elseif holder then
    return {'busy', holder}
  end
  return nil
end
"""

_APPEND: Final = _PROLOGUE + """
local bad = check_lease()
if bad then return bad end
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  local id = ARGV[5 + 2 * i]
  if redis.call('HEXISTS', KEYS[3], id) == 0 then
    local seq = redis.call('RPUSH', KEYS[2], ARGV[6 + 2 * i])
    redis.call('HSET', KEYS[3], id, seq)
  end
end
local last = redis.call('LLEN', KEYS[2])
redis.call('HSET', KEYS[1], 'last_seq', last)
touch()
return {'ok', tostring(last)}
"""

# ARGV[4] expected version, ARGV[5] state, ARGV[6] ttl ('' for none), ARGV[7] created_at
_SAVE: Final = _PROLOGUE + """
local bad = check_lease()
if bad then return bad end
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version ~= tonumber(ARGV[4]) then return {'conflict', tostring(version)} end
redis.call('HSET', KEYS[1], 'state', ARGV[5], 'version', version + 1, 'ttl', ARGV[6])
if version == 0 then redis.call('HSET', KEYS[1], 'created_at', ARGV[7]) end
touch()
return {'ok', tostring(version + 1)}
"""

# ARGV[4] checkpoint seq, ARGV[5] body
_CHECKPOINT: Final = _PROLOGUE + """
local bad = check_lease()
if bad then return bad end
local seq = tonumber(ARGV[4])
local last = redis.call('LLEN', KEYS[2])
if seq < 1 or seq > last then return {'past_end', tostring(last)} end
redis.call('ZREMRANGEBYSCORE', KEYS[4], seq, seq)
redis.call('ZADD', KEYS[4], seq, ARGV[5])
touch()
return {'ok', ''}
"""

# ARGV[2] owner, ARGV[3] ttl in ms
_ACQUIRE: Final = _PROLOGUE + """
local holder = redis.call('GET', KEYS[5])
if holder and string.sub(holder, 1, string.len(ARGV[2]) + 1) ~= ARGV[2] .. '|' then return {'busy', holder} end
local token = redis.call('HINCRBY', KEYS[1], 'lease_token', 1)
redis.call('SET', KEYS[5], ARGV[2] .. '|' .. token, 'PX', ARGV[3])
redis.call('HSET', KEYS[1], 'lease_holder', ARGV[2] .. '|' .. token)
touch()
return {'ok', tostring(token), tostring(now + tonumber(ARGV[3]) / 1000)}
"""

# ARGV[2] owner, ARGV[3] token, ARGV[4] ttl in ms
_RENEW: Final = _PROLOGUE + """
if stale_lease(ARGV[2], ARGV[3]) then
  return {'lost', redis.call('HGET', KEYS[1], 'lease_token') or '0', tostring(now)}
end
redis.call('SET', KEYS[5], ARGV[2] .. '|' .. ARGV[3], 'PX', ARGV[4])
expire_keys()
return {'ok', tostring(now + tonumber(ARGV[4]) / 1000)}
"""

# KEYS[1] lease, KEYS[2] meta; ARGV[1] 'owner|token'
_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('HGET', KEYS[2], 'lease_holder') == ARGV[1] then redis.call('HDEL', KEYS[2], 'lease_holder') end
return 1
"""

# ARGV[1] limit (-1 for all), ARGV[2] before (-1 for none), ARGV[3] after (0 for none)
_LOAD: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local last = redis.call('LLEN', KEYS[2])
local stop = last
local before = tonumber(ARGV[2])
if before >= 0 then stop = math.max(0, math.min(before - 1, last)) end
local floor = math.min(tonumber(ARGV[3]), stop)
local start = floor
local limit = tonumber(ARGV[1])
if limit >= 0 then start = math.max(floor, stop - limit) end
if stop <= start then return {stop, start} end
return {stop, start, redis.call('LRANGE', KEYS[2], start, stop - 1)}
"""

# ARGV[4..] trace bodies
_TRACES: Final = _PROLOGUE + """
local bad = check_lease()
if bad then return bad end
for i = 4, #ARGV do redis.call('RPUSH', KEYS[7], ARGV[i]) end
touch()
return {'ok', ''}
"""

_DELETE: Final = """
local gone = {redis.call('EXISTS', KEYS[1]), redis.call('LLEN', KEYS[2]), redis.call('ZCARD', KEYS[4]),
              redis.call('LLEN', KEYS[7]), redis.call('HLEN', KEYS[10])}
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11])
redis.call('ZREM', KEYS[6], ARGV[1])
return gone
"""


@functools.cache
def _blocking_pool_class() -> type[redis.asyncio.BlockingConnectionPool]:
    """redis-py's blocking pool, raising a `StoreError` that says what to do when no connection frees up."""
    import redis.asyncio
    import redis.exceptions

    class BlockingPool(redis.asyncio.BlockingConnectionPool):
        async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
            except redis.exceptions.ConnectionError as exc:
                if not isinstance(exc.__cause__, TimeoutError):  # only the wait for a free connection
                    raise
                raise StoreError.pool_exhausted("redis", _server_of(self.connection_kwargs), self.max_connections,
                                                self.timeout or 0) from exc

    return BlockingPool


def _server_of(connection_kwargs: dict[str, Any]) -> str:
    """``host:port`` (or the socket's path) of a redis-py pool's connections."""
    kw = connection_kwargs
    return str(kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}")

# A listed session: its index score (updated_at), its id and its record's version, last_seq, created_at.
_Listed = tuple[float, str, list[Any]]


def _listing(tenant: str, found: list[_Listed]) -> list[SessionInfo]:
    """Return `found` in listing order (newest first, then by id)."""
    found.sort(key=lambda r: (-r[0], r[1]))
    return [SessionInfo(tenant, sid, int(m[0]), int(m[1] or 0), float(m[2] or t), t) for t, sid, m in found]

class RedisStore(SessionStore):
    """Sessions in Redis.

    Give a URL (``redis://127.0.0.1:6379/0``) or an existing ``redis.asyncio.Redis`` client (then
    the store does not close it, and its own timeouts apply). Keys start with `prefix`.

    `connect_timeout` bounds opening a connection, `command_timeout` each command, `close_timeout`
    closing the client; past them the call raises a `StoreError` naming the server. `keepalive`
    (seconds of silence before TCP keepalive probes) lets the OS notice a dead peer.

    A store made from a URL keeps at most `max_connections` connections open (one per command in
    flight); a call made while all are busy waits for one to be returned, up to `pool_timeout`
    seconds, and then raises a `StoreError` (raise `max_connections`, or the server's ``maxclients``,
    when it does). So a burst of concurrent runs queues instead of failing, and a whole fleet of
    workers opens at most workers x `max_connections` connections.
    """

    backend = "redis"
    driver = "redis"

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.asyncio.Redis | None = None,
        prefix: str = "cp",
        connect_timeout: float = 5.0,
        command_timeout: float = 10.0,
        close_timeout: float = 5.0,
        keepalive: int = 30,
        max_connections: int = 50,
        pool_timeout: float = 30.0,
    ) -> None:
        if (url is None) == (client is None):
            raise UsageError("RedisStore needs exactly one of url=... or client=...")
        for name, value in (("connect_timeout", connect_timeout), ("command_timeout", command_timeout),
                            ("close_timeout", close_timeout), ("keepalive", keepalive),
                            ("max_connections", max_connections), ("pool_timeout", pool_timeout)):
            if value <= 0:
                raise UsageError(f"{name} must be positive, got {value}")
        if client is None:
            assert url is not None
            try:
                import redis.asyncio as redis_asyncio
                from redis.asyncio.retry import Retry
                from redis.backoff import NoBackoff
            except ImportError as exc:
                raise UsageError('RedisStore needs redis: pip install "contextpipe[redis]"') from exc
            options = {getattr(socket, name): value for name, value in (
                ("TCP_KEEPIDLE", keepalive), ("TCP_KEEPINTVL", max(1, keepalive // 3)), ("TCP_KEEPCNT", 3))
                if hasattr(socket, name)}
            # A blocking pool: past max_connections commands in flight, a call waits for a connection
            # (up to pool_timeout) instead of failing at once as redis-py's default pool does.
            pool = _blocking_pool_class().from_url(
                url, max_connections=max_connections, timeout=pool_timeout, socket_connect_timeout=connect_timeout,
                socket_timeout=command_timeout, socket_keepalive=True, socket_keepalive_options=options,
                retry=Retry(NoBackoff(), 0))
            client = redis_asyncio.Redis.from_pool(pool)
            self.answer_timeout = command_timeout
        # redis-py's return types are wide unions (bytes | str | list ...); results are decoded here.
        self._client: Any = client
        self._owns_client = url is not None
        self._close_timeout = close_timeout
        self._prefix = prefix
        self._server = _server_of(self._client.connection_pool.connection_kwargs)
        c = client
        self._lua_append = c.register_script(_APPEND)
        self._lua_save = c.register_script(_SAVE)
        self._lua_checkpoint = c.register_script(_CHECKPOINT)
        self._lua_acquire = c.register_script(_ACQUIRE)
        self._lua_renew = c.register_script(_RENEW)
        self._lua_release = c.register_script(_RELEASE)
        self._lua_load = c.register_script(_LOAD)
        self._lua_delete = c.register_script(_DELETE)
        self._lua_traces = c.register_script(_TRACES)

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "cp") -> RedisStore:
        """Return a store that connects to `url` and owns its client."""
        return cls(url, prefix=prefix)

    @property
    @override
    def server(self) -> str:
        return str(self._server)

    def _keys(self, key: SessionKey) -> list[str]:
        tag = f"{self._prefix}:{{{key.tenant}/{key.id}}}"
        return [f"{tag}:meta", f"{tag}:log", f"{tag}:ids", f"{tag}:ckpt", f"{tag}:lease",
                self._index(key.tenant), f"{tag}:traces", f"{tag}:queue", f"{tag}:queued", f"{tag}:artifacts",
                f"{tag}:artbody"]  # artifacts: `_artifacts_redis`

    def _index(self, tenant: str) -> str:
        return f"{self._prefix}:index:{tenant}"

    def _raise(self, result: list[bytes], key: SessionKey, lease: Lease | None) -> None:
        """Raise what a write script's answer `result` stands for, if it refused the write."""
        status = result[0].decode()
        if status == "busy":
            raise SessionBusy.held(self.backend, key)
        if status == "lost" and lease is not None:
            raise self._lost(result, lease)

    def _lost(self, result: list[bytes], lease: Lease) -> LeaseLost:
        """Return the error of a refused write or renewal, from ``{'lost', current token ('0': gone), now}``."""
        return common.lease_lost(self.backend, lease.key, lease, int(result[1]), float(result[2]))

    @staticmethod
    def _lease_args(lease: Lease | None) -> list[str]:
        return [lease.owner, str(lease.token)] if lease is not None else ["", "0"]

    async def _unindex(self, tenant: str, session_ids: Sequence[str]) -> list[SessionKey]:
        """Drop sessions Redis expired from the tenant's index; return their keys (for the deletion hooks)."""
        gone = []
        for sid in session_ids:
            if await self._client.zrem(self._index(tenant), sid):
                gone.append(SessionKey(tenant, sid))
        return gone

    # --- session records ---------------------------------------------------------------------------

    @override
    async def _get(self, key: SessionKey) -> Session | None:
        raw = await self._client.hmget(self._keys(key)[0], ["state", "version", "created_at", "ttl", "last_seq"])
        if raw[1] is None or (int(raw[1]) == 0 and not int(raw[4] or 0)):  # only a lease: not a session yet
            return None
        state = common.decode_state(self.backend, key, raw[0] or b"{}")
        ttl = float(raw[3]) if raw[3] else None
        return Session(key.id, key.tenant, state, int(raw[1]), float(raw[2]), ttl)

    @override
    async def _save(self, key: SessionKey, session: Session, lease: Lease | None) -> int:
        result = await self._lua_save(keys=self._keys(key), args=[
            session.id, *self._lease_args(lease), session.version, common.encode_state(session),
            "" if session.ttl is None else repr(float(session.ttl)), repr(session.created_at)])
        status, value = result[0].decode(), result[1].decode()
        if status == "conflict":
            raise ConcurrentUpdate.stale(self.backend, key, int(value), session.version)
        self._raise(result, key, lease)
        return int(value)

    @override
    async def _delete(self, key: SessionKey) -> Erased | None:
        existed, messages, summaries, traces, artifacts = await self._lua_delete(keys=self._keys(key), args=[key.id])
        return Erased(int(messages), int(summaries), int(traces), int(artifacts)) if existed else None

    @override
    async def _list(self, tenant: str, limit: int, after: tuple[float, str]) -> list[SessionInfo]:
        found: list[_Listed] = []
        offset = 0
        while len(found) <= limit:  # read the index newest first, in slices, until a page and one more
            read, candidates = await self._index_slice(tenant, after, offset, limit + 1)
            if not read:
                break
            listed, expired = await self._live_sessions(tenant, candidates)
            offset += read - expired  # expired members left the index, so later ones moved up
            found += listed
        return _listing(tenant, found)

    async def _index_slice(
        self, tenant: str, after: tuple[float, str], offset: int, count: int
    ) -> tuple[int, list[tuple[float, str]]]:
        """Read `count` members of the tenant's index from `offset`, newest first; keep those past `after`.

        Returns how many members were read and the (updated_at, session id) of those after the cursor.
        """
        after_time, after_id = after
        max_score = "+inf" if after_time == float("inf") else repr(after_time)
        chunk = await self._client.zrevrangebyscore(self._index(tenant), max_score, "-inf", start=offset, num=count,
                                                    withscores=True)
        candidates = [(float(score), member.decode()) for member, score in chunk]
        return len(chunk), [c for c in candidates if c[0] < after_time or (c[0] == after_time and c[1] > after_id)]

    async def _live_sessions(self, tenant: str, candidates: list[tuple[float, str]]) -> tuple[list[_Listed], int]:
        """Return the sessions of `candidates` that exist, with their records, and how many had expired.

        The expired ones are dropped from the index (running the deletion hooks); a record holding only
        a lease (no state saved, no message) is not a session yet and is left out.
        """
        async with self._client.pipeline(transaction=False) as pipe:
            for _, sid in candidates:
                pipe.hmget(self._keys(SessionKey(tenant, sid))[0], ["version", "last_seq", "created_at"])
            metas = await pipe.execute()
        rows = list(zip(candidates, metas, strict=True))
        stale = [sid for (_, sid), meta in rows if meta[0] is None]
        expired = await self._unindex(tenant, stale) if stale else []
        await self._notify_deleted(expired)
        listed = [(t, sid, meta) for (t, sid), meta in rows
                  if meta[0] is not None and (int(meta[0]) > 0 or int(meta[1] or 0) > 0)]
        return listed, len(expired)

    @override
    async def _purge(self) -> list[SessionKey]:
        """Redis deletes expired sessions itself; this drops them from the indexes (the hooks run after)."""
        removed: list[SessionKey] = []
        try:
            async for index in self._client.scan_iter(match=f"{self._prefix}:index:*"):
                tenant = index.decode().split(":index:", 1)[1]
                members = [m.decode() for m in await self._client.zrange(index, 0, -1)]
                stale = [sid for sid in members
                         if not await self._client.exists(self._keys(SessionKey(tenant, sid))[0])]
                removed += await self._unindex(tenant, stale)
        except Exception:
            # Sessions already dropped from their index are found by no later purge: their hooks run
            # now (a failure logged), and the error that stopped the scan is raised.
            await self._notify_restarted(removed)
            raise
        return removed

    # --- message log -------------------------------------------------------------------------------

    @override
    async def _append(self, key: SessionKey, messages: Sequence[Message], lease: Lease | None, durable: bool) -> int:
        flat: list[str] = []
        for mid, body in row_codec.encode_batch(messages):
            flat += [mid, body]
        result = await self._lua_append(keys=self._keys(key),
                                        args=[key.id, *self._lease_args(lease), len(messages), *flat])
        self._raise(result, key, lease)
        return int(result[1])

    @override
    async def _load(self, key: SessionKey, limit: int | None, before: int | None, after: int | None) -> MessagePage:
        result = await self._lua_load(keys=self._keys(key)[:2], args=[
            -1 if limit is None else limit, -1 if before is None else before, after or 0])
        if result[0] == -1:
            return MessagePage([], 1, False)
        start = int(result[1])
        bodies = result[2] if len(result) > 2 else []
        messages = [row_codec.decode_message(self.backend, key, start + i + 1, body) for i, body in enumerate(bodies)]
        first = start + 1
        return MessagePage(messages, first, first > 1)

    # No `_copy_view`: a fork copies page by page here (`rewind.copy_pages`). A copy inside Redis would need each
    # entry's id, and the only way to it without decoding is the id index turned around: reading all of it
    # (HGETALL) costs the whole session's size even to fork at 10 (blocking the server meanwhile), and an index
    # damaged, evicted or out of step with the log would drop or misnumber messages without a word. The plain
    # copy reads the ids from the entries themselves.

    @override
    async def _message_seq(self, key: SessionKey, message_id: str) -> int | None:
        seq = await self._client.hget(self._keys(key)[2], message_id)  # the ids expire with the session
        return None if seq is None else int(seq)

    # --- checkpoints -------------------------------------------------------------------------------

    @override
    async def _save_checkpoint(self, key: SessionKey, checkpoint: Checkpoint, lease: Lease | None) -> None:
        result = await self._lua_checkpoint(keys=self._keys(key), args=[
            key.id, *self._lease_args(lease), checkpoint.seq, row_codec.encode_checkpoint(checkpoint)])
        if result[0] == b"past_end":
            raise common.checkpoint_past_end(self.backend, key, checkpoint.seq, int(result[1]))
        self._raise(result, key, lease)

    @override
    async def _latest_checkpoint(self, key: SessionKey) -> Checkpoint | None:
        rows = await self._client.zrevrange(self._keys(key)[3], 0, 0)
        return row_codec.decode_checkpoint(self.backend, key, rows[0]) if rows else None

    # --- traces ------------------------------------------------------------------------------------

    @override
    async def _append_traces(self, key: SessionKey, traces: Sequence[dict[str, Any]], lease: Lease | None) -> None:
        if not traces:
            return
        result = await self._lua_traces(keys=self._keys(key), args=[
            key.id, *self._lease_args(lease), *(common.encode_trace(t) for t in traces)])
        self._raise(result, key, lease)

    @override
    async def _load_traces(self, key: SessionKey, limit: int | None) -> list[dict[str, Any]]:
        keys = self._keys(key)
        if not await self._client.exists(keys[0]):
            return []
        bodies = await self._client.lrange(keys[6], 0 if limit is None else -limit, -1)
        return [common.decode_trace(self.backend, key, b) for b in bodies]

    # --- leases ------------------------------------------------------------------------------------

    @override
    async def _try_acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        if "|" in owner:
            raise UsageError(f"lease owner {shorten(owner)} must not contain '|'")
        result = await self._lua_acquire(keys=self._keys(key), args=[key.id, owner, max(1, int(ttl * 1000))])
        if result[0].decode() != "ok":
            return None
        return Lease(key.tenant, key.id, owner, int(result[1]), float(result[2]), ttl)

    @override
    async def _renew_lease(self, lease: Lease) -> Lease:
        result = await self._lua_renew(keys=self._keys(lease.key), args=[
            lease.session_id, lease.owner, str(lease.token), max(1, int(lease.ttl * 1000))])
        if result[0].decode() != "ok":
            raise self._lost(result, lease)
        return lease.renewed(float(result[1]))

    @override
    async def _release_lease(self, lease: Lease) -> None:
        keys = self._keys(lease.key)
        await self._lua_release(keys=[keys[4], keys[0]], args=[f"{lease.owner}|{lease.token}"])

    @override
    async def close(self) -> None:
        """Close the client (if the store made it), within `close_timeout`; past it, drop the connections."""
        if not self._owns_client:
            return
        try:
            await asyncio.wait_for(self._client.aclose(), self._close_timeout)
        except TimeoutError:
            await self._client.connection_pool.disconnect(inuse_connections=True)
