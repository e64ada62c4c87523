"""Erasing a session while a write under its lease is in flight, on PostgreSQL: the erase removes what the
write commits (no orphan message or artifact), so a new session of that id starts clean.

Two connections, no timing: a blocker holds an uncommitted row of the same key, so the write waits on its
insert while it holds the session's row; the erase is started once the write is seen waiting in
``pg_stat_activity``, and the blocker rolls back once the erase is seen waiting too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from contextpipe.artifacts import put_artifact, read_artifact
from contextpipe.messages import Message
from contextpipe.session import Session
from contextpipe.stores import SessionStore

from .backends import open_store, server_address


@pytest.fixture
async def pg(tmp_path: Path) -> AsyncIterator[SessionStore]:
    store = open_store("postgres", tmp_path)
    yield store
    await store.close()


async def waiting_on(mon: Any, holder: int, what: str, task: asyncio.Future[Any]) -> int:
    """Return the pid of a backend waiting on a lock `holder` holds, once there is one (a state polled, no time).

    Bounded: fails naming `what` when `task`, the one that should wait, ends first, or after 60 s.
    """
    try:
        async with asyncio.timeout(60):
            while not task.done():
                pid = await mon.fetchval("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                         "AND $1 = ANY(pg_blocking_pids(pid))", holder)
                if pid is not None:
                    return int(pid)
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"{what} did not wait on the lock within 60 s")
    pytest.fail(f"{what} ended without waiting on the lock: {task.exception() or task.result()!r}")


async def race(store: SessionStore, tenant: str, blocking_insert: str, args: tuple[Any, ...],
               write: Awaitable[Any]) -> tuple[Any, Any]:
    """Run `write` (holding the session's row) and `erase_session` at once, the write committing first."""
    import asyncpg

    p = store._p  # type: ignore[attr-defined]
    dsn = server_address("postgres")
    mon, blocker = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        await blocker.execute("BEGIN")
        await blocker.execute(blocking_insert.format(p=p), *args)
        written = asyncio.ensure_future(write)
        # the write waits on its insert, holding the row
        writer = await waiting_on(mon, blocker.get_server_pid(), "the write", written)
        erase = asyncio.ensure_future(store.erase_session(tenant, "s"))
        await waiting_on(mon, writer, "the erase", erase)  # the erase waits on the session's row
        await blocker.execute("ROLLBACK")
        return await written, await erase
    finally:
        await mon.close()
        await blocker.close()


async def test_an_erase_racing_an_artifact_write_removes_the_artifact(pg: SessionStore, tenant: str) -> None:
    await pg.save_session(Session("s", tenant))
    lease = await pg.try_acquire_lease(tenant, "s", "run-1", 30)
    _, erased = await race(pg, tenant, "INSERT INTO {p}artifacts VALUES ($1, 's', 'x', 'text/plain', 1, '\\x00')",
                           (tenant,), put_artifact(pg, tenant, "s", "x", b"alice's export", "text/plain",
                                                   lease=lease))
    assert erased is not None and erased.artifacts == 1  # the erase saw the write's committed artifact
    async with pg._connection() as conn:  # type: ignore[attr-defined]
        left = await conn.fetchval(f"SELECT count(*) FROM {pg._p}artifacts WHERE tenant = $1",  # type: ignore[attr-defined]
                                   tenant)
    assert left == 0
    await put_artifact(pg, tenant, "s", "x", b"the new user's", "text/plain")
    assert await read_artifact(pg, tenant, "s", "x", length=100) == b"the new user's"


async def test_an_erase_racing_an_append_removes_the_message(pg: SessionStore, tenant: str) -> None:
    await pg.save_session(Session("s", tenant))
    lease = await pg.try_acquire_lease(tenant, "s", "run-1", 30)
    secret = Message.user("alice's secret")
    _, erased = await race(pg, tenant, "INSERT INTO {p}messages VALUES ($1, 's', 99, $2, 'x')", (tenant, secret.id),
                           pg.append(tenant, "s", [secret], lease=lease))
    assert erased is not None and erased.messages == 1
    await pg.save_session(Session("s", tenant))  # a new session of the id: its first append works
    await pg.append(tenant, "s", [Message.user("the new user's first message")])
    assert [m.text for m in (await pg.load(tenant, "s")).messages] == ["the new user's first message"]
    await pg.erase_session(tenant, "s")


async def test_a_wait_for_a_lock_fails_at_once_when_the_waiter_ended(pg: SessionStore) -> None:
    import asyncpg

    mon = await asyncpg.connect(server_address("postgres"))
    try:
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ended.set_result(None)
        with pytest.raises(pytest.fail.Exception, match="the write ended without waiting on the lock"):
            await waiting_on(mon, mon.get_server_pid(), "the write", ended)
    finally:
        await mon.close()
