"""Runs of one process waiting on a busy session get its lease first come, first served (issue #34).

Through the real stores: waiters queued on a held lease take it in the order they asked; one that is
cancelled or runs out of time leaves the line without holding up the next or keeping the lease; a
waiter of another store object on the same database (another process's, as far as the line knows)
still gets the lease; and for any arrive/cancel/release sequence the line and the plain polling it
replaces (``store._lease_polling = True``) end the same way. Order is driven by the line's own count
of its waiters and by events, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import SessionBusy
from contextpipe.stores import Lease, SessionKey, SessionStore

from .backends import DURABLE, open_spec, open_store, store_spec

LONG = 600.0
"""A wait or lease TTL no test reaches: a waiter with it leaves the line only when served or cancelled."""


async def queued(store: SessionStore, key: SessionKey, count: int) -> None:
    """Return once `count` runs of this event loop stand in `key`'s line of `store` (its own count)."""
    for _ in range(100_000):
        line = vars(store).get("_lease_line")
        if line is not None and line.waiting(key) == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{count} waiters never stood in line for {key}")


def waiting(store: SessionStore, key: SessionKey) -> int:
    line = vars(store).get("_lease_line")
    return 0 if line is None else int(line.waiting(key))


class Runs:
    """Runs that wait for a session's lease, then hold it a moment; records who got it, in order."""

    def __init__(self, key: SessionKey) -> None:
        self.key = key
        self.order: list[str] = []
        self.holders = 0
        self.most_holders = 0

    async def run(self, store: SessionStore, name: str, wait: float = LONG) -> None:
        lease = await store.acquire_lease(self.key.tenant, self.key.id, name, ttl=LONG, wait=wait)
        self.order.append(name)
        self.holders += 1
        self.most_holders = max(self.most_holders, self.holders)
        await asyncio.sleep(0)  # hold it across a turn of the loop: a run behind must not get in
        self.holders -= 1
        await store.release_lease(lease)

    def start(self, store: SessionStore, name: str, wait: float = LONG) -> asyncio.Task[None]:
        return asyncio.create_task(self.run(store, name, wait))


async def test_waiting_runs_take_the_lease_in_arrival_order(store: SessionStore, tenant: str) -> None:
    key = SessionKey(tenant, "s")
    held = await store.acquire_lease(tenant, "s", "holder", ttl=LONG)
    runs = Runs(key)
    tasks = []
    for i in range(8):
        tasks.append(runs.start(store, f"run-{i}"))
        await queued(store, key, i + 1)
    await store.release_lease(held)  # wakes the head of the line; it has not run yet
    with pytest.raises(SessionBusy):  # a try without waiting does not go ahead of the line
        await store.acquire_lease(tenant, "s", "impatient", ttl=LONG)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert runs.order == [f"run-{i}" for i in range(8)]
    assert runs.most_holders == 1 and waiting(store, key) == 0
    assert await store.try_acquire_lease(tenant, "s", "after", LONG) is not None


@pytest.mark.parametrize("leaves", ["cancelled", "out of time"])
@pytest.mark.parametrize("where", [0, 1, 3])
async def test_a_waiter_that_leaves_the_line_holds_up_nobody(
    store: SessionStore, tenant: str, leaves: str, where: int
) -> None:
    key = SessionKey(tenant, "s")
    held = await store.acquire_lease(tenant, "s", "holder", ttl=LONG)
    runs = Runs(key)
    tasks = []
    for i in range(4):  # the one at `where` leaves: cancelled, or with a wait that runs out
        wait = 0.2 if leaves == "out of time" and i == where else LONG
        tasks.append(runs.start(store, f"run-{i}", wait))
        await queued(store, key, i + 1)
    if leaves == "cancelled":
        tasks[where].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[where]
    else:
        with pytest.raises(SessionBusy, match="busy"):
            await asyncio.wait_for(tasks[where], 60)
    await queued(store, key, 3)
    await store.release_lease(held)
    await asyncio.wait_for(asyncio.gather(*(t for i, t in enumerate(tasks) if i != where)), 60)
    assert runs.order == [f"run-{i}" for i in range(4) if i != where]
    assert runs.most_holders == 1 and waiting(store, key) == 0
    assert await store.try_acquire_lease(tenant, "s", "after", LONG) is not None  # nobody kept it


async def test_a_waiter_that_leaves_while_the_lease_is_free_passes_it_on(store: SessionStore, tenant: str) -> None:
    key = SessionKey(tenant, "s")
    held = await store.acquire_lease(tenant, "s", "holder", ttl=LONG)
    runs = Runs(key)
    head = runs.start(store, "head")
    await queued(store, key, 1)
    second = runs.start(store, "second")
    await queued(store, key, 2)
    await store.release_lease(held)  # the head is woken to take it ...
    head.cancel()  # ... and cancelled before it asks: the second asks at once instead
    with pytest.raises(asyncio.CancelledError):
        await head
    await asyncio.wait_for(second, 60)
    assert runs.order == ["second"] and waiting(store, key) == 0


@pytest.mark.parametrize("backend", DURABLE)
async def test_a_waiter_of_another_store_object_still_gets_the_lease(
    backend: str, tmp_path: Path, tenant: str
) -> None:
    spec = store_spec(backend, tmp_path)
    here, there = open_spec(spec), open_spec(spec)  # two processes' stores, as far as either line knows
    try:
        key = SessionKey(tenant, "s")
        held = await there.acquire_lease(tenant, "s", "holder", ttl=LONG)
        runs = Runs(key)
        tasks = []
        for i in range(4):
            tasks.append(runs.start(here, f"here-{i}"))
            await queued(here, key, i + 1)
        tasks.append(runs.start(there, "there"))
        await queued(there, key, 1)
        await there.release_lease(held)  # wakes "there" at once; the line here finds out by asking
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert sorted(runs.order) == ["here-0", "here-1", "here-2", "here-3", "there"]
        assert [n for n in runs.order if n.startswith("here")] == [f"here-{i}" for i in range(4)]
        assert runs.most_holders == 1 and waiting(here, key) == waiting(there, key) == 0
        assert await here.try_acquire_lease(tenant, "s", "after", LONG) is not None
    finally:
        await here.close()
        await there.close()


# --- the line against the plain polling, for any sequence -------------------------------------

OPS = st.lists(st.sampled_from(["arrive long", "arrive short", "arrive none", "release", "release",
                                 *(f"cancel {k}" for k in range(4))]), max_size=12)
"""Steps: a run arrives (waiting long, briefly or not at all), the holder releases, the k-th waiter is cancelled."""
WAITS = {"long": LONG, "short": 0.05, "none": 0.0}


@dataclass
class Waiter:
    name: int
    wait: float
    outcome: str = "waiting"  # then "holding" and "released", "busy" (out of time) or "cancelled"
    done: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Play:
    """One arrive/cancel/release sequence on one store, each step let settle before the next."""

    def __init__(self, store: SessionStore, key: SessionKey) -> None:
        self.store, self.key = store, key
        self.waiters: list[Waiter] = []
        self.acquired: list[int] = []
        self.holders = self.most_holders = 0
        self.took = asyncio.Event()

    async def _run(self, w: Waiter) -> None:
        try:
            lease: Lease = await self.store.acquire_lease(self.key.tenant, self.key.id, f"w{w.name}", ttl=LONG,
                                                          wait=w.wait)
        except SessionBusy:
            w.outcome = "busy"
            return
        except asyncio.CancelledError:
            w.outcome = "cancelled"
            raise
        finally:
            w.done.set()
        w.outcome = "holding"
        self.acquired.append(w.name)
        self.holders += 1
        self.most_holders = max(self.most_holders, self.holders)
        self.took.set()
        await w.release.wait()
        self.holders -= 1
        await self.store.release_lease(lease)
        w.outcome = "released"

    def _in(self, outcome: str) -> list[Waiter]:
        return [w for w in self.waiters if w.outcome == outcome]

    async def arrive(self, kind: str) -> None:
        held, line = bool(self._in("holding")), len(self._in("waiting"))
        w = Waiter(len(self.waiters), WAITS[kind])
        self.waiters.append(w)
        self.took.clear()
        w.task = asyncio.create_task(self._run(w))
        if not held:  # a free lease and nobody waiting: it takes it
            await asyncio.wait_for(self.took.wait(), 60)
        elif kind == "long":
            if self.store._lease_polling:
                await asyncio.sleep(0)
            else:
                await queued(self.store, self.key, line + 1)
        else:  # held: it gives up at once or when its short wait runs out
            await asyncio.wait_for(w.done.wait(), 60)

    async def cancel(self, pick: int) -> None:
        still = self._in("waiting")
        if still:
            task = still[pick % len(still)].task
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def release(self) -> None:
        holding = self._in("holding")
        if not holding:
            return
        w = holding[0]
        self.took.clear()
        w.release.set()
        assert w.task is not None
        await asyncio.wait_for(w.task, 60)
        if self._in("waiting"):  # the next takes it: in line at once, polling within 100 ms
            await asyncio.wait_for(self.took.wait(), 60)

    def state(self) -> tuple[bool, int, dict[str, int]]:
        counts = {o: len(self._in(o)) for o in ("released", "busy", "cancelled")}
        return bool(self._in("holding")), len(self._in("waiting")), counts

    async def play(self, ops: list[str]) -> list[tuple[bool, int, dict[str, int]]]:
        states = []
        for op in ops:
            verb, _, arg = op.partition(" ")
            if verb == "arrive":
                await self.arrive(arg)
            elif verb == "cancel":
                await self.cancel(int(arg))
            else:
                await self.release()
            assert self.most_holders <= 1, "two runs held the lease at once"
            states.append(self.state())
        while self._in("holding"):  # the end: everyone still in line is served in turn
            await self.release()
        return states


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
async def test_line_and_plain_polling_end_the_same_way(backend: str, tmp_path: Path, ops: list[str]) -> None:
    # tmp_path is shared by the examples: each opens its stores on new files (open_store)
    outcomes = {}
    for polling in (False, True):
        store = open_store(backend, tmp_path)
        store._lease_polling = polling
        key = SessionKey("t", "s")
        try:
            play = Play(store, key)
            states = await play.play(ops)
            assert all(w.outcome in ("released", "busy", "cancelled") for w in play.waiters)
            assert len(set(play.acquired)) == len(play.acquired), "a waiter got the lease twice"
            assert sorted(play.acquired) == [w.name for w in play.waiters if w.outcome == "released"]
            if not polling:
                assert play.acquired == sorted(play.acquired), "the line served a later arrival first"
            assert waiting(store, key) == 0
            assert await store.try_acquire_lease("t", "s", "after", LONG) is not None  # no lease kept
            outcomes[polling] = states
        finally:
            await store.close()
    assert outcomes[False] == outcomes[True]
