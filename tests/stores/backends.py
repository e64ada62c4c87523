"""Store backends for the tests: how to open each one, and skip-or-fail when its server is absent."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
import weakref
from pathlib import Path

from contextpipe.stores import MemoryStore, SessionStore

BACKENDS = ["memory", "sqlite", "postgres", "redis"]
DURABLE = ["sqlite", "postgres", "redis"]
ENV = {"postgres": "CONTEXTPIPE_TEST_POSTGRES_DSN", "redis": "CONTEXTPIPE_TEST_REDIS_URL",
       "pgvector": "CONTEXTPIPE_TEST_PGVECTOR_DSN"}


def server_address(backend: str) -> str | None:
    """The server address for `backend`, skipping loudly (or failing under CI) when there is none."""
    if backend not in ENV:
        return None
    address = os.environ.get(ENV[backend])
    if not address:
        import pytest  # here: the worker processes that import this module start 0.2 s sooner without it

        message = (f"NO {backend.upper()} SERVER: {ENV[backend]} is not set, so the {backend} store tests "
                   "cannot run. Run the tests through scripts/test.sh, which starts the servers.")
        if os.environ.get("CI"):
            pytest.fail(message + " CI must not skip a backend.")
        pytest.skip(message)
    return address


class FakeClock:
    """The stores' clock in the tests: real time plus whatever `advance` added (TTL and lease tests jump
    ahead instead of sleeping); strictly increasing, so successive writes get distinct times."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.last = 0.0

    def __call__(self) -> float:
        self.last = max(time.time() + self.offset, self.last + 1e-6)
        return self.last

    def advance(self, seconds: float) -> None:
        self.offset += seconds


CLOCKS: weakref.WeakKeyDictionary[SessionStore, FakeClock] = weakref.WeakKeyDictionary()
"""The fake clock of each store made with one (weakly held: a dead store's id may be reused by a server store)."""


def open_store(backend: str, tmp_path: Path) -> SessionStore:
    """A fresh store of `backend` (a new file for SQLite; shared servers otherwise).

    The memory and SQLite stores run on a `FakeClock` (see `elapse`); the servers use real time.
    """
    store: SessionStore
    if backend == "memory":
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        CLOCKS[store] = clock
        return store
    if backend == "sqlite":
        from contextpipe.stores import SQLiteStore

        clock = FakeClock()
        store = SQLiteStore(tmp_path / f"{uuid.uuid4().hex}.db", clock=clock)
        CLOCKS[store] = clock
        return store
    address = server_address(backend)
    assert address is not None
    if backend == "postgres":
        from contextpipe.stores import PostgresStore

        return PostgresStore(address, max_size=4)
    from contextpipe.stores import RedisStore

    return RedisStore(address)


async def elapse(store: SessionStore, seconds: float) -> None:
    """Let `seconds` pass for `store`: at once on a fake clock, really (one real-time test per server)."""
    clock = CLOCKS.get(store)
    if clock is not None:
        clock.advance(seconds)
    else:
        await asyncio.sleep(seconds)


def store_spec(backend: str, tmp_path: Path) -> str:
    """How another process opens the same store: ``backend|address``."""
    if backend == "sqlite":
        return f"sqlite|{tmp_path / 'shared.db'}"
    return f"{backend}|{server_address(backend)}"


def open_spec(spec: str) -> SessionStore:
    """Open the store named by `spec` (the crash storm's workers have their own: fixtures/storm/storm_worker.py)."""
    backend, _, address = spec.partition("|")
    if backend == "sqlite":
        from contextpipe.stores import SQLiteStore

        return SQLiteStore(address)
    if backend == "postgres":
        from contextpipe.stores import PostgresStore

        return PostgresStore(address, max_size=4)
    if backend == "redis":
        from contextpipe.stores import RedisStore

        return RedisStore(address)
    raise ValueError(spec)
