"""A server behind a network partition: a local TCP proxy that stops forwarding, for PostgreSQL and Redis.

Every call must fail with a `StoreError` naming the server within the configured (short) timeouts,
cancellation must return, and `close()` must return once the partition heals. The only waits are
generous liveness bounds so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from contextpipe import Agent, Message, StoreError
from contextpipe.providers import History
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel

from .backends import server_address

LIVENESS = 30.0  # a bound that only a hang can reach


class PartitionProxy:
    """Forwards TCP connections on 127.0.0.1 to a server until `partition()`; `heal()` delivers what was held."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.open = asyncio.Event()
        self.open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def partition(self) -> None:
        self.open.clear()

    def heal(self) -> None:
        self.open.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        await self.open.wait()  # a new connection during a partition gets no answer
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.append(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await src.read(65536):
                await self.open.wait()  # held during a partition, delivered when it heals (as TCP would)
                dst.write(data)
                await dst.drain()
        dst.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()


def through(address: str, port: int) -> str:
    parts = urlsplit(address)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


def open_through(backend: str, port: int, *, command_timeout: float) -> SessionStore:
    address = server_address(backend)
    assert address is not None
    timeouts = {"connect_timeout": 0.5, "command_timeout": command_timeout, "close_timeout": 0.5}
    if backend == "postgres":
        from contextpipe.stores import PostgresStore

        return PostgresStore(through(address, port), max_size=3, **timeouts)
    from contextpipe.stores import RedisStore

    return RedisStore(through(address, port), **timeouts)


async def fails_naming(proxy: PartitionProxy, call: object) -> StoreError:
    with pytest.raises(StoreError) as info:
        await asyncio.wait_for(call, LIVENESS)  # type: ignore[arg-type]
    assert f"127.0.0.1:{proxy.port}" in str(info.value), info.value
    return info.value


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_a_partitioned_server_fails_fast_and_recovers(backend: str) -> None:
    address = server_address(backend)
    assert address is not None
    parts = urlsplit(address)
    proxy = PartitionProxy(parts.hostname or "127.0.0.1", parts.port or 0)
    await proxy.start()
    tenant = f"t{uuid.uuid4().hex[:12]}"
    store = open_through(backend, proxy.port, command_timeout=0.5)
    agent = Agent(ScriptedModel(["hello"] * 3), providers=[History(store)])
    try:
        session = await agent.session("s", tenant=tenant)
        await store.append(tenant, "s", [Message.user("before")])

        proxy.partition()
        error = await fails_naming(proxy, store.load(tenant, "s"))
        assert "did not answer" in str(error) and error.server == f"127.0.0.1:{proxy.port}"
        await fails_naming(proxy, store.append(tenant, "s", [Message.user("during")]))
        await fails_naming(proxy, agent.run("hi", session=session))

        proxy.heal()
        await store.append(tenant, "s", [Message.user("after")])
        assert [m.text for m in (await store.load(tenant, "s")).messages][-1] == "after"
    finally:
        proxy.heal()
        await asyncio.wait_for(store.close(), LIVENESS)
        await proxy.close()


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_cancelling_a_call_to_a_partitioned_server_returns(backend: str) -> None:
    address = server_address(backend)
    assert address is not None
    parts = urlsplit(address)
    proxy = PartitionProxy(parts.hostname or "127.0.0.1", parts.port or 0)
    await proxy.start()
    tenant = f"t{uuid.uuid4().hex[:12]}"
    store = open_through(backend, proxy.port, command_timeout=LIVENESS * 4)  # only cancellation can end the call
    try:
        await store.append(tenant, "s", [Message.user("before")])
        proxy.partition()
        call = asyncio.create_task(store.load(tenant, "s"))
        await asyncio.sleep(0.05)  # let it send its query into the partition
        call.cancel()
        done, _ = await asyncio.wait({call}, timeout=LIVENESS)
        assert call in done and call.cancelled()
        proxy.heal()
        assert [m.text for m in (await store.load(tenant, "s")).messages] == ["before"]
        proxy.partition()
        stuck = asyncio.create_task(store.append(tenant, "s", [Message.user("lost?")]))
        await asyncio.sleep(0.05)
        stuck.cancel()
        done, _ = await asyncio.wait({stuck}, timeout=LIVENESS)
        assert stuck in done
    finally:
        proxy.heal()
        await asyncio.wait_for(store.close(), LIVENESS)  # close() returns after the partition heals
        await proxy.close()


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_close_returns_during_a_partition(backend: str) -> None:
    address = server_address(backend)
    assert address is not None
    parts = urlsplit(address)
    proxy = PartitionProxy(parts.hostname or "127.0.0.1", parts.port or 0)
    await proxy.start()
    store = open_through(backend, proxy.port, command_timeout=0.5)
    try:
        await store.append(f"t{uuid.uuid4().hex[:12]}", "s", [Message.user("a")])
        proxy.partition()
        await asyncio.wait_for(store.close(), LIVENESS)
    finally:
        proxy.heal()
        await proxy.close()
