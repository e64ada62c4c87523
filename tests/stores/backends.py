"""Store backends for the tests: how to open each one, and skip-or-fail when its server is absent."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

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
        message = (f"NO {backend.upper()} SERVER: {ENV[backend]} is not set, so the {backend} store tests "
                   "cannot run. Run the tests through scripts/test.sh, which starts the servers.")
        if os.environ.get("CI"):
            pytest.fail(message + " CI must not skip a backend.")
        pytest.skip(message)
    return address


def open_store(backend: str, tmp_path: Path) -> SessionStore:
    """A fresh store of `backend` (a new file for SQLite; shared servers otherwise)."""
    if backend == "memory":
        return MemoryStore()
    if backend == "sqlite":
        from contextpipe.stores import SQLiteStore

        return SQLiteStore(tmp_path / f"{uuid.uuid4().hex}.db")
    address = server_address(backend)
    assert address is not None
    if backend == "postgres":
        from contextpipe.stores import PostgresStore

        return PostgresStore(address, max_size=4)
    from contextpipe.stores import RedisStore

    return RedisStore(address)


def store_spec(backend: str, tmp_path: Path) -> str:
    """How another process opens the same store: ``backend|address``."""
    if backend == "sqlite":
        return f"sqlite|{tmp_path / 'shared.db'}"
    return f"{backend}|{server_address(backend)}"


def open_spec(spec: str) -> SessionStore:
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
