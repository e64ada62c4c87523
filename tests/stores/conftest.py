from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contextpipe.stores import SessionStore

from .backends import BACKENDS, DURABLE, open_store


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    """Each backend in turn: memory, SQLite (a fresh file), PostgreSQL and Redis (shared servers)."""
    s = open_store(request.param, tmp_path)
    yield s
    await s.close()


@pytest.fixture(params=DURABLE)
async def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    """Each backend that keeps bytes: SQLite, PostgreSQL and Redis."""
    s = open_store(request.param, tmp_path)
    yield s
    await s.close()


@pytest.fixture
def tenant() -> str:
    """A tenant of its own per test, so tests sharing a server never see each other's sessions."""
    return f"t{uuid.uuid4().hex[:12]}"
