"""A step boundary's fast look at the queue (`contextpipe.queue.nothing_queued`) against always reading it, on every
backend: the same deliveries at the same boundaries; a message queued by another worker is never lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Message, tool
from contextpipe.queue import deliver, enqueue, nothing_queued
from contextpipe.session import SessionKey
from contextpipe.stores import SessionStore
from contextpipe.stores.base import Lease
from contextpipe.testing import ScriptedModel, tool_call

from .backends import open_spec, store_spec


async def fast_boundary(store: SessionStore, key: SessionKey, lease: Lease) -> list[str]:
    """The run's boundary (`contextpipe._run.inbox`): read the queue only when the store does not know it is empty."""
    return [] if nothing_queued(store, key, lease) else [m.text for m in await deliver(store, key, lease)]


async def plain_boundary(store: SessionStore, key: SessionKey, lease: Lease) -> list[str]:
    return [m.text for m in await deliver(store, key, lease)]


# "step": a run's save (fenced by its lease) and the boundary right after it; "save, tools": a save, then the step's
# tools start (what the save saw is forgotten), and whatever comes next may come while they run.
OPS = st.lists(st.sampled_from(["enqueue", "step", "save, tools", "boundary"]), max_size=20)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
async def test_property_the_fast_look_delivers_what_the_plain_read_does_at_each_boundary(
        store: SessionStore, tenant: str, ops: list[str]) -> None:
    name = f"q{abs(hash(tuple(ops))) % 10**9}-{len(ops)}"
    keys = {"fast": SessionKey(tenant, f"{name}-fast"), "plain": SessionKey(tenant, f"{name}-plain")}
    boundaries = {"fast": fast_boundary, "plain": plain_boundary}
    seen: dict[str, list[list[str]]] = {"fast": [], "plain": []}
    for side, key in keys.items():
        await store.delete_session(key.tenant, key.id)
        lease = await store.acquire_lease(key.tenant, key.id, "worker", ttl=60)
        try:
            for n, op in enumerate(ops):
                if op == "enqueue":
                    await enqueue(store, key, f"queued {n}")
                    continue
                if op != "boundary":
                    await store.append(key.tenant, key.id, [Message.assistant(f"step {n}")], lease=lease)
                if op == "save, tools":
                    nothing_queued(store, key, lease)  # `Inbox.forget`
                else:
                    seen[side].append(await boundaries[side](store, key, lease))
            seen[side].append(await plain_boundary(store, key, lease))  # the next run's first boundary
        finally:
            await store.release_lease(lease)
    assert seen["fast"] == seen["plain"]


async def test_a_message_queued_between_a_save_and_the_boundary_comes_at_the_boundary_after(
        store: SessionStore, tenant: str) -> None:
    key = SessionKey(tenant, "window")
    lease = await store.acquire_lease(key.tenant, key.id, "worker", ttl=60)
    try:
        await store.append(key.tenant, key.id, [Message.user("hi")], lease=lease)
        queued = await enqueue(store, key, "late")  # after the save looked, before the boundary
        first = await fast_boundary(store, key, lease)
        second = await fast_boundary(store, key, lease)  # nothing saved in between: the queue is read
    finally:
        await store.release_lease(lease)
    assert first + second == ["late"]  # the memory store knows at once; SQLite at the next boundary
    assert [m.id for m in (await store.load(key.tenant, key.id)).messages] == [(await store.load(
        key.tenant, key.id)).messages[0].id, queued.id]


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
async def test_another_workers_message_reaches_a_run_in_its_tools_at_the_next_boundary_with_few_reads(
        backend: str, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = store_spec(backend, tmp_path)
    mine, theirs = open_spec(spec), open_spec(spec)
    table = type(__import__("contextpipe.stores._queue_sql", fromlist=["table_for"]).table_for(mine))
    reads: list[str] = []
    plain_rows = table.rows

    async def rows(self: object, key: SessionKey) -> list[tuple[str, str, str]]:
        reads.append(key.id)
        return await plain_rows(self, key)  # type: ignore[arg-type]

    monkeypatch.setattr(table, "rows", rows)
    started, go = asyncio.Event(), asyncio.Event()

    @tool
    async def lookup(city: str) -> str:
        """Return the location code of a city."""
        if city == "Suzhou":
            started.set()
            await go.wait()
        return f"code of {city}"

    try:
        model = ScriptedModel([tool_call("lookup", city="Lhasa"), tool_call("lookup", city="Suzhou"),
                               tool_call("lookup", city="Xi'an"), "done"])
        agent = Agent(model, tools=[lookup], store=mine)
        run = asyncio.create_task(agent.run("Codes?", session=await agent.session("chat", tenant=tenant)))
        await started.wait()
        queued = await Agent(ScriptedModel(), store=theirs).enqueue("chat", "Use metric units.", tenant=tenant)
        go.set()
        assert (await run).text == "done"
        log = (await mine.load(tenant, "chat")).messages
    finally:
        await mine.close()
        await theirs.close()
    # Right after the exchange the message came in (the next boundary), once.
    assert [m.id for m in log].index(queued.id) == 5
    assert [m.text for m in log].count("Use metric units.") == 1
    # SQLite reads the queue at the first boundary, and where its save saw a message; the others at each boundary.
    assert len(reads) == (2 if backend == "sqlite" else 4)
