"""`PostgresStore`'s errors say what went wrong in the driver's (or the server's) own words, against the real server.

A wrong database or role in the DSN, a table dropped behind the store's back, every pooled
connection busy, a session row locked by another transaction past the command timeout: each is a
`StoreError` naming the server, with the cause the driver reported, not a generic "did not answer".
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from contextpipe import Message, StoreError
from contextpipe.stores import PostgresStore

from .backends import server_address


def dsn() -> str:
    address = server_address("postgres")
    assert address is not None
    return address


def with_path(path: str, user: str | None = None) -> str:
    """The test server's DSN with another database (path) or role."""
    parts = urlsplit(dsn())
    netloc = parts.netloc if user is None else f"{user}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(path=path, netloc=netloc))


@pytest.fixture
async def tables() -> AsyncIterator[str]:
    """A table prefix of this test's own, whose tables are dropped afterwards."""
    prefix = f"errs_{uuid.uuid4().hex[:10]}_"
    yield prefix
    import asyncpg

    conn = await asyncpg.connect(dsn())
    try:
        for table in ("messages", "checkpoints", "traces", "outbox", "sessions", "schema"):
            await conn.execute(f"DROP TABLE IF EXISTS {prefix}{table} CASCADE")
    finally:
        await conn.close()


@pytest.mark.parametrize("wrong", ["database", "role", "setting"])
async def test_a_wrong_dsn_says_what_the_server_refused(wrong: str) -> None:
    target, said = {
        "database": (with_path("/no_such_database_cp"), 'database "no_such_database_cp" does not exist'),
        "role": (with_path("/postgres", user="no_such_role_cp"), 'role "no_such_role_cp" does not exist'),
        "setting": (dsn() + "?no_such_setting_cp=1", 'unrecognized configuration parameter "no_such_setting_cp"'),
    }[wrong]
    store = PostgresStore(target, connect_timeout=10)
    try:
        with pytest.raises(StoreError) as info:
            await store.load("t", "s")
    finally:
        await store.close()
    assert said in str(info.value) and info.value.server == urlsplit(dsn()).netloc.rpartition("@")[2]


async def test_a_dropped_table_is_named_with_the_drivers_error(tables: str) -> None:
    import asyncpg

    store = PostgresStore(dsn(), prefix=tables)
    try:
        await store.append("t", "s", [Message.user("hi")])
        conn = await asyncpg.connect(dsn())
        try:
            await conn.execute(f"DROP TABLE {tables}messages")
        finally:
            await conn.close()
        for call in (lambda: store.append("t", "s", [Message.user("again")]), lambda: store.load("t", "s")):
            with pytest.raises(StoreError, match=rf'UndefinedTableError: relation "{tables}messages" does not exist'):
                await call()
    finally:
        await store.close()


async def test_every_pooled_connection_busy_says_so_not_that_the_server_did_not_answer(tables: str) -> None:
    store = PostgresStore(dsn(), prefix=tables, min_size=1, max_size=1, connect_timeout=0.5)
    try:
        await store.append("t", "s", [Message.user("hi")])
        pool = await store._get_pool()
        held = await pool.acquire()  # the pool's one connection, busy elsewhere
        try:
            with pytest.raises(StoreError, match=r"all 1 pooled connections stayed busy for 0\.5 s; pass a larger "
                                                 r"max_size") as info:
                await store.load("t", "s")
            assert "did not answer" not in str(info.value)
        finally:
            await pool.release(held)
        assert [m.text for m in (await store.load("t", "s")).messages] == ["hi"]
    finally:
        await store.close()


async def test_a_session_row_locked_past_the_command_timeout_says_so_in_the_servers_words(tables: str) -> None:
    import asyncpg

    store = PostgresStore(dsn(), prefix=tables, command_timeout=1.0)
    try:
        await store.append("t", "s", [Message.user("hi")])
        blocker = await asyncpg.connect(dsn())  # another worker's transaction, holding the session's row
        try:
            async with blocker.transaction():
                await blocker.execute(f"SELECT 1 FROM {tables}sessions WHERE tenant = 't' AND session_id = 's' "
                                      "FOR UPDATE")
                with pytest.raises(StoreError, match="LockNotAvailableError: canceling statement due to lock "
                                                     "timeout") as info:
                    await store.append("t", "s", [Message.user("blocked")])
                assert "did not answer" not in str(info.value)
        finally:
            await blocker.close()
        await store.append("t", "s", [Message.user("after")])  # the lock is gone: the store works on
        assert [m.text for m in (await store.load("t", "s")).messages] == ["hi", "after"]
    finally:
        await store.close()


@pytest.mark.parametrize("min_size", [1, 0])
async def test_a_server_or_pooler_refusing_the_timeout_settings_still_connects(tables: str, min_size: int) -> None:
    """PgBouncer refuses startup parameters it does not know by default; the store then connects without
    its server-side timeouts instead of failing (here the real server refuses a made-up one), also with
    a pool that opens no connection up front."""

    class Refused(PostgresStore):
        def _server_timeouts(self) -> dict[str, str]:
            return {"no_such_timeout_cp": "1"}

    store = Refused(dsn(), prefix=tables, connect_timeout=10, min_size=min_size)
    try:
        await store.append("t", "s", [Message.user("still stored")])
        assert [m.text for m in (await store.load("t", "s")).messages] == ["still stored"]
    finally:
        await store.close()
