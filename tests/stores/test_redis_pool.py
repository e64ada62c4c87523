"""`RedisStore`'s connection pool: a burst past the pool's size waits for connections instead of failing.

Against the real Redis server; nothing here depends on timing except a pool timeout that is only
reached while the one connection is held by a partition (see `test_partition.py`'s proxy).
"""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import urlsplit

import pytest

from contextpipe import Message, StoreError, UsageError
from contextpipe.stores import RedisStore

from .backends import server_address
from .test_partition import LIVENESS, PartitionProxy, through

SESSIONS = 40
APPENDS_PER_SESSION = 8


def redis_url() -> str:
    address = server_address("redis")
    assert address is not None
    return address


async def server_connections(watcher: object, db: int, own_id: int) -> set[str]:
    """Ids of the connections the Redis server sees on database `db`, the watcher's own left out."""
    clients = await watcher.client_list()  # type: ignore[attr-defined]
    return {c["id"] for c in clients if int(c["db"]) == db and c["id"] != str(own_id)}


async def test_a_burst_of_calls_past_the_pool_size_all_complete() -> None:
    import redis.asyncio

    url = redis_url()
    watcher = redis.asyncio.Redis.from_url(url)
    db = int(watcher.connection_pool.connection_kwargs.get("db", 0))
    own_id = await watcher.client_id()
    store = RedisStore(url, max_connections=4)
    tenant = f"t{uuid.uuid4().hex[:12]}"
    try:
        before = await server_connections(watcher, db, own_id)
        appends = [store.append(tenant, f"s{i % SESSIONS}", [Message.user(f"m{i}")])
                   for i in range(SESSIONS * APPENDS_PER_SESSION)]
        reads = [store.load(tenant, f"s{i}") for i in range(SESSIONS)] + [store.list_sessions(tenant, limit=10)] * 20
        results = await asyncio.gather(*appends, *reads)  # 380 calls in flight on 4 connections
        assert len(results) == SESSIONS * APPENDS_PER_SESSION + SESSIONS + 20
        opened = await server_connections(watcher, db, own_id) - before
        assert 1 <= len(opened) <= 4  # the pool never opened more than max_connections
        for s in range(SESSIONS):
            page = await store.load(tenant, f"s{s}")
            assert sorted(m.text for m in page.messages) == sorted(
                f"m{i}" for i in range(s, SESSIONS * APPENDS_PER_SESSION, SESSIONS))
        listing = await store.list_sessions(tenant, limit=SESSIONS)
        assert len(listing.sessions) == SESSIONS
    finally:
        for s in range(SESSIONS):
            await store.delete_session(tenant, f"s{s}")
        await store.close()
        await watcher.aclose()


async def test_waiting_longer_than_pool_timeout_is_a_store_error() -> None:
    url = redis_url()
    parts = urlsplit(url)
    proxy = PartitionProxy(parts.hostname or "127.0.0.1", parts.port or 0)
    await proxy.start()
    store = RedisStore(through(url, proxy.port), max_connections=1, pool_timeout=0.2, command_timeout=LIVENESS)
    tenant = f"t{uuid.uuid4().hex[:12]}"
    try:
        await store.append(tenant, "s", [Message.user("before")])  # the pool's one connection is open
        proxy.partition()  # the next command holds that connection until the partition heals
        calls = [asyncio.create_task(store.load(tenant, "s")) for _ in range(2)]
        done, pending = await asyncio.wait(calls, timeout=LIVENESS, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and len(pending) == 1
        error = done.pop().exception()
        assert isinstance(error, StoreError), error
        assert error.server == f"127.0.0.1:{proxy.port}"
        assert str(error) == (f"redis store (127.0.0.1:{proxy.port}): all 1 pooled connections stayed busy for "
                              "0.2 s; raise the store's max_connections (or pool_timeout), or make fewer calls at once")
        proxy.heal()
        page = await asyncio.wait_for(pending.pop(), LIVENESS)  # the call holding the connection completes
        assert [m.text for m in page.messages] == ["before"]
    finally:
        proxy.heal()
        await store.delete_session(tenant, "s")
        await asyncio.wait_for(store.close(), LIVENESS)
        await proxy.close()


@pytest.mark.parametrize("option", ["max_connections", "pool_timeout"])
def test_pool_options_must_be_positive(option: str) -> None:
    with pytest.raises(UsageError, match=option):
        RedisStore(redis_url(), **{option: 0})  # type: ignore[arg-type]
