"""A session's TTL against its lease, and leases against clock steps, on every backend.

A run's lease keeps its session alive (each renewal moves the session's expiry with it), expiry never
deletes a session a run holds, and a refused write says what happened. The embedded stores measure
leases with a clock the tests move: a step back blocks a dead holder's session for at most one ttl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Durability, Heartbeat, LeaseLost, Message, Session, SessionBusy, tool
from contextpipe.providers import History
from contextpipe.stores import Lease, MemoryStore, SessionKey, SessionStore, SQLiteStore
from contextpipe.stores import sqlite as sqlite_module
from contextpipe.testing import ScriptedModel, tool_call
from helpers import describe

from .backends import elapse, open_store, server_address
from .test_run_durability import Beats

TINY_TTL = 1e-6
"""A session TTL shorter than any round trip: such a session lives only as long as its lease keeps it."""


def msgs(*texts: str) -> list[Message]:
    return [Message.user(t) for t in texts]


async def texts(store: SessionStore, tenant: str, session_id: str) -> list[str]:
    return [m.text for m in (await store.load(tenant, session_id)).messages]


class StepClock:
    """The embedded stores' clock, moved by the test only: time passing (`elapse`) or the clock being set (`step`)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def elapse(self, seconds: float) -> None:
        self.now += seconds

    def step(self, seconds: float) -> None:
        """The system clock is set `seconds` forward (or back, when negative): NTP, a VM resumed, a hand."""
        self.now += seconds


def stepped_store(backend: str, folder: Path, clock: StepClock) -> SessionStore:
    if backend == "memory":
        return MemoryStore(clock=clock)
    return SQLiteStore(folder / f"{uuid.uuid4().hex}.db", clock=clock)


@pytest.fixture(params=["memory", "sqlite"])
async def embedded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[SessionStore, StepClock]]:
    """The embedded stores on a `StepClock`."""
    clock = StepClock()
    store = stepped_store(request.param, tmp_path, clock)
    yield store, clock
    await store.close()


# --- a live lease keeps its session ----------------------------------------------------------------------


async def test_a_session_never_expires_while_a_run_holds_its_lease(store: SessionStore, tenant: str) -> None:
    lease = await store.acquire_lease(tenant, "held", "run", ttl=60)
    await store.save_session(Session("held", tenant, ttl=TINY_TTL), lease=lease)
    await store.append(tenant, "held", msgs("a", "b"), lease=lease)
    await store.purge_expired()
    lease = await store.renew_lease(lease)
    await store.append(tenant, "held", msgs("c"), lease=lease)
    assert await texts(store, tenant, "held") == ["a", "b", "c"]
    assert await store.get_session(tenant, "held") is not None
    assert [i.session_id for i in (await store.list_sessions(tenant)).sessions] == ["held"]
    await store.delete_session(tenant, "held")


async def test_renewals_move_the_session_expiry_and_it_expires_after_the_run(
        embedded: tuple[SessionStore, StepClock], tenant: str) -> None:
    store, clock = embedded
    lease = await store.acquire_lease(tenant, "s", "run", ttl=3)
    await store.save_session(Session("s", tenant, ttl=5), lease=lease)
    await store.append(tenant, "s", msgs("a"), lease=lease)  # the last write: t = 0
    for _ in range(3):  # a tool call of 6 s, longer than the session's TTL
        clock.elapse(2)
        lease = await store.renew_lease(lease)
        assert await store.purge_expired() == 0
    await store.append(tenant, "s", msgs("b"), lease=lease)  # t = 6
    await store.release_lease(lease)
    clock.elapse(4.9)
    assert await texts(store, tenant, "s") == ["a", "b"]
    clock.elapse(0.2)  # TTL after the last write, and past the last lease
    assert await store.get_session(tenant, "s") is None
    assert await texts(store, tenant, "s") == []


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_a_renewal_moves_the_session_expiry_on_the_server(backend: str, tmp_path: Path, tenant: str) -> None:
    server_address(backend)
    store = open_store(backend, tmp_path)
    try:
        lease = await store.acquire_lease(tenant, "s", "run", ttl=30)
        await store.save_session(Session("s", tenant, ttl=TINY_TTL), lease=lease)
        await store.append(tenant, "s", msgs("a"), lease=lease)
        assert 20 < await seconds_to_expiry(store, SessionKey(tenant, "s")) <= 30  # as long as its lease
        await store.renew_lease(dataclasses.replace(lease, ttl=300))
        assert 200 < await seconds_to_expiry(store, SessionKey(tenant, "s")) <= 300  # moved by the renewal
        await store.delete_session(tenant, "s")
    finally:
        await store.close()


async def seconds_to_expiry(store: SessionStore, key: SessionKey) -> float:
    """How long the server will keep the session (the shortest-lived of its Redis keys)."""
    from contextpipe.stores import PostgresStore, RedisStore

    if isinstance(store, RedisStore):
        keys = store._keys(key)
        left = [await store._client.pttl(keys[i]) for i in (0, 1, 2)]  # its record, log and message ids
        return min(left) / 1000
    assert isinstance(store, PostgresStore)
    pool = await store._get_pool()
    left: float = await pool.fetchval(
        "SELECT expires_at - extract(epoch from clock_timestamp()) FROM contextpipe_sessions "
        "WHERE tenant = $1 AND session_id = $2", key.tenant, key.id)
    return left


async def test_a_run_outlives_a_session_ttl_shorter_than_its_tool_call(
        embedded: tuple[SessionStore, StepClock], tenant: str) -> None:
    store, clock = embedded
    started, finish = asyncio.Event(), asyncio.Event()

    @tool
    async def build_report() -> str:
        """Takes longer than the session's TTL."""
        started.set()
        await finish.wait()
        return "report ready"

    beats = Beats()
    agent = Agent(ScriptedModel([tool_call("build_report"), "Here it is."]), tools=[build_report],
                  providers=[History(store)],
                  durability=Durability(lease_ttl=45, heartbeat=Heartbeat(sleep=beats.sleep, shared_timer=False)))
    session = await agent.session("report", tenant=tenant, ttl=30)
    run = asyncio.ensure_future(agent.run("Make the report.", session=session))
    await started.wait()
    for _ in range(4):  # 80 s inside the tool call, renewed every 20 s
        clock.elapse(20)
        await asyncio.wait_for(beats.beat(), 60)  # a heartbeat stopped by a lost lease fails here, not hangs
        assert await store.purge_expired() == 0
    finish.set()
    assert (await run).text == "Here it is."
    assert describe(await agent.history(session)) == [
        "user:Make the report.", "assistant:call:build_report", "tool:result:report ready", "assistant:Here it is."]


# --- the error says what happened ------------------------------------------------------------------------


async def test_a_session_deleted_under_a_live_lease_says_it_was_deleted(store: SessionStore, tenant: str) -> None:
    lease = await store.acquire_lease(tenant, "s", "run", ttl=60)
    await store.append(tenant, "s", msgs("a"), lease=lease)
    assert await store.delete_session(tenant, "s")
    for refused in (store.renew_lease(lease), store.append(tenant, "s", msgs("b"), lease=lease)):
        with pytest.raises(LeaseLost, match="was deleted while this run held its lease") as info:
            await refused
        assert "taken over" not in str(info.value)
    assert await texts(store, tenant, "s") == []  # nothing written to the deleted session


async def test_a_session_that_expired_after_its_lease_lapsed_says_it_expired(store: SessionStore,
                                                                           tenant: str) -> None:
    lease = await store.acquire_lease(tenant, "s", "run", ttl=60)
    await store.save_session(Session("s", tenant, ttl=TINY_TTL), lease=lease)
    await store.append(tenant, "s", msgs("a"), lease=lease)
    lease = await store.renew_lease(dataclasses.replace(lease, ttl=0.002))  # then its holder pauses past it
    for _ in range(1000):  # wait until the lease lapsed and the session expired (a fake clock jumps)
        if await store.get_session(tenant, "s") is None:
            break
        await elapse(store, 0.005)
    else:
        pytest.fail("the session outlived its 2 ms lease by 5 s")
    await store.purge_expired()
    for refused in (store.renew_lease(lease), store.append(tenant, "s", msgs("b"), lease=lease)):
        with pytest.raises(LeaseLost, match="expired: this run's lease lapsed") as info:
            await refused
        assert "taken over" not in str(info.value)
    assert await texts(store, tenant, "s") == []


async def test_a_lease_taken_over_still_says_taken_over(embedded: tuple[SessionStore, StepClock],
                                                        tenant: str) -> None:
    store, clock = embedded
    first = await store.acquire_lease(tenant, "s", "a", ttl=5)
    await store.append(tenant, "s", msgs("a"), lease=first)
    clock.elapse(6)
    second = await store.acquire_lease(tenant, "s", "b", ttl=5)
    with pytest.raises(LeaseLost, match=f"expired and was taken over \\(current token {second.token}\\)"):
        await store.renew_lease(first)


# --- clock steps --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("waiter", ["lease", "write"])
async def test_a_dead_holder_blocks_its_session_at_most_one_ttl_after_the_clock_steps_back(
        embedded: tuple[SessionStore, StepClock], tenant: str, waiter: str) -> None:
    store, clock = embedded

    async def free() -> bool:
        """Whether the next one gets in: a run taking the lease, or a write without one."""
        if waiter == "lease":
            return await store.try_acquire_lease(tenant, "s", "next", ttl=15) is not None
        try:
            await store.append(tenant, "s", msgs("no lease"))
        except SessionBusy:
            return False
        return True

    await store.acquire_lease(tenant, "s", "dead", ttl=15)  # its process dies at once
    clock.step(-3600)
    assert not await free()
    clock.elapse(14.9)
    assert not await free()
    clock.elapse(0.2)
    assert await free()


async def test_sqlite_workers_whose_clocks_disagree_by_an_hour(tmp_path: Path, tenant: str) -> None:
    ahead, behind = StepClock(), StepClock()
    behind.step(-3600)
    path = tmp_path / "shared.db"
    async with SQLiteStore(path, clock=ahead) as fast, SQLiteStore(path, clock=behind) as slow:
        await fast.acquire_lease(tenant, "s", "dies", ttl=15)  # a worker whose clock is ahead dies
        for _ in range(15):
            assert await slow.try_acquire_lease(tenant, "s", "late", ttl=15) is None
            behind.elapse(0.99)
            ahead.elapse(0.99)
        behind.elapse(0.2)
        late = await slow.try_acquire_lease(tenant, "s", "late", ttl=15)
        assert late is not None  # within one ttl, not an hour
        # The other way round, the lease of the worker whose clock is behind looks expired at once to the
        # one ahead: it is taken over early, and the worker behind learns it at its next renewal.
        taken = await fast.try_acquire_lease(tenant, "s", "early", ttl=15)
        assert taken is not None
        with pytest.raises(LeaseLost, match="taken over"):
            await slow.renew_lease(late)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(backend=st.sampled_from(["memory", "sqlite"]),
       life=st.lists(st.tuples(st.floats(0, 4), st.floats(-7200, 7200)), max_size=6),
       last_step=st.floats(-7200, 7200))
async def test_a_dead_holder_blocks_at_most_one_ttl_whatever_the_clock_steps(
        backend: str, life: list[tuple[float, float]], last_step: float) -> None:
    ttl, poll = 15.0, 0.5
    clock = StepClock()
    with tempfile.TemporaryDirectory() as folder:
        store = stepped_store(backend, Path(folder), clock)
        try:
            holder: Lease | None = await store.acquire_lease("t", "s", "holder", ttl=ttl)
            for elapsed, step in life:  # the holder lives, renewing every few seconds, while the clock is set
                clock.elapse(elapsed)
                clock.step(step)
                assert holder is not None
                if await store.try_acquire_lease("t", "s", "rival", ttl=ttl) is not None:
                    # A forward step ended the lease early: the holder learns it, and its writes are refused.
                    with pytest.raises(LeaseLost, match="taken over"):
                        await store.renew_lease(holder)
                    return
                holder = await store.renew_lease(holder)
            clock.step(last_step)  # the holder dies, the clock is set once more
            waited = 0.0
            while await store.try_acquire_lease("t", "s", "next", ttl=ttl) is None:
                clock.elapse(poll)
                waited += poll
                assert waited <= ttl + poll, f"blocked {waited} s by a dead holder"
        finally:
            await store.close()


# --- the SQLite file of the earlier schema ----------------------------------------------------------------


async def test_a_sqlite_file_of_the_earlier_schema_is_read_and_upgraded_when_written(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    clock = StepClock()
    async with SQLiteStore(path, clock=clock) as store:
        await store.append("t", "s", msgs("a"))
        old = await store.acquire_lease("t", "held", "earlier-run", ttl=600)  # a lease the earlier release took
        await store.append("t", "held", msgs("x"), lease=old)
    with sqlite3.connect(path) as conn:  # as the earlier release wrote it
        conn.execute("ALTER TABLE cp_sessions DROP COLUMN lease_ttl")
        conn.execute("UPDATE cp_meta SET value = '3' WHERE key = 'schema_version'")
    async with SQLiteStore(path, read_only=True) as reader:
        assert await texts(reader, "t", "s") == ["a"]
    async with SQLiteStore(path, clock=clock) as writer:
        lease = await writer.acquire_lease("t", "s", "run", ttl=15)
        await writer.append("t", "s", msgs("b"), lease=lease)
        assert await texts(writer, "t", "s") == ["a", "b"]
        # The earlier release's lease has no ttl: it is never bounded by one it did not have, and it still writes.
        clock.step(-3600)
        for _ in range(3):
            assert await writer.try_acquire_lease("t", "held", "next", ttl=15) is None
            clock.elapse(30)
        await writer.append("t", "held", msgs("y"), lease=old)
        assert await texts(writer, "t", "held") == ["x", "y"]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM cp_meta WHERE key = 'schema_version'").fetchone() == (
            str(sqlite_module.SQLITE_SCHEMA_VERSION),)
        assert conn.execute("SELECT session_id, lease_ttl FROM cp_sessions ORDER BY session_id").fetchall() == [
            ("held", 0.0), ("s", 15.0)]


@pytest.mark.parametrize("given_ttl", [None, 7200])
async def test_a_session_object_made_by_hand_keeps_the_stored_sessions_ttl_unless_it_gives_one(
        store: SessionStore, tenant: str, given_ttl: int | None) -> None:
    """`Session(id)` naming a stored session is that session: its run does not make it permanent (nor
    change its creation time); a ttl given on the object is the caller's to set."""
    stored = Session("s", tenant, ttl=3600)
    await store.save_session(stored)
    agent = Agent(ScriptedModel(["Hello."]), store=store)
    await agent.run("Hi.", session=Session("s", tenant, ttl=given_ttl))
    after = await store.get_session(tenant, "s")
    assert after is not None
    assert (after.ttl, after.created_at) == (given_ttl or 3600, stored.created_at)
