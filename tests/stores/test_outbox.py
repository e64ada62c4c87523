"""The outbox of every store that keeps one (memory, SQLite, PostgreSQL), and Redis refusing it clearly.

An entry rides in the metadata of the message that carries it (`contextpipe.outbox.OUTBOX_KEY`); the
append that stores the message writes the entry in the same transaction, and only then.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, FunctionResult, Message, ToolContext, UsageError, tool
from contextpipe.artifacts import put_artifact, read_artifact
from contextpipe.outbox import OUTBOX_KEY
from contextpipe.providers import History
from contextpipe.stores import SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call

from .backends import open_store

KEEPERS = ["memory", "sqlite", "postgres"]
"""The stores that keep an outbox; Redis refuses it (`test_redis_refuses_the_outbox_clearly`)."""


@pytest.fixture(params=KEEPERS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    """Each store that keeps an outbox, in turn."""
    s = open_store(request.param, tmp_path)
    assert s.keeps_outbox
    yield s
    await s.close()


def carrying(call_id: str, *entries: tuple[str, Any], key: str | None = None) -> Message:
    """A tool message answering `call_id` that carries outbox entries ``(topic, payload)``."""
    base = key or uuid.uuid4().hex
    made = [{"key": f"{base}.{n}", "call_id": call_id, "topic": topic, "payload": payload}
            for n, (topic, payload) in enumerate(entries)]
    return Message("tool", (FunctionResult(call_id, "done"),), metadata={OUTBOX_KEY: made})


async def test_entries_are_written_with_their_message_once(store: SessionStore, tenant: str) -> None:
    odd = "é \ud800 \x00"  # kept as it was given, by every store
    shipped = carrying("c\x00 1", ("emails", {"to": "ann@example.com"}), ("ledger", [1, 2.5, None, True, odd]))
    batch = [Message.user("ship it"), shipped]
    await store.append(tenant, "s", batch)
    await store.append(tenant, "s", batch)  # a retried append: the message, and its entries, once
    await store.append(tenant, "s", [Message.assistant("done"), shipped])
    entries = await store.outbox(tenant)
    assert [(e.topic, e.payload, e.seq, e.call_id, e.session_id, e.tenant) for e in entries] == [
        ("emails", {"to": "ann@example.com"}, 2, "c\x00 1", "s", tenant),
        ("ledger", [1, 2.5, None, True, odd], 2, "c\x00 1", "s", tenant)]
    assert [e.key for e in entries] == [e["key"] for e in shipped.metadata[OUTBOX_KEY]]
    assert (await store.load(tenant, "s")).messages[1] == shipped  # the log keeps the record too


async def test_the_outbox_lists_pending_entries_in_order_by_tenant_and_topic(store: SessionStore, tenant: str) -> None:
    other = f"t{uuid.uuid4().hex[:12]}"
    await store.append(tenant, "a", [carrying("c1", ("emails", 1), ("sms", 2))])
    await store.append(other, "a", [carrying("c1", ("emails", "other tenant"))])
    await store.append(tenant, "b", [carrying("c2", ("emails", 3))])
    await store.append(tenant, "a", [carrying("c3", ("emails", 4))])
    assert [e.payload for e in await store.outbox(tenant)] == [1, 2, 3, 4]
    assert [e.payload for e in await store.outbox(tenant, topic="emails")] == [1, 3, 4]
    assert [e.payload for e in await store.outbox(tenant, topic="emails", limit=2)] == [1, 3]
    assert [e.payload for e in await store.outbox(other)] == ["other tenant"]
    assert await store.outbox(tenant, topic="faxes") == []
    with pytest.raises(UsageError, match="limit must be at least 1"):
        await store.outbox(tenant, limit=0)


async def test_marking_delivered_counts_each_entry_once(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", [carrying("c1", ("emails", 1), ("emails", 2), ("emails", 3))])
    first, second, third = await store.outbox(tenant)
    assert await store.mark_delivered(tenant, [first.key, third.key, "no-such-key"]) == 2
    assert await store.outbox(tenant) == [second]
    assert await store.mark_delivered(tenant, [first.key]) == 0  # marking again is safe
    assert await store.mark_delivered(f"t{uuid.uuid4().hex[:12]}", [second.key]) == 0  # tenants stay apart
    assert await store.mark_delivered(tenant, []) == 0
    assert await store.outbox(tenant) == [second]
    await store.append(tenant, "s", [carrying("c1", ("emails", 1), ("emails", 2), ("emails", 3),
                                              key=first.key.rsplit(".", 1)[0])])
    assert await store.outbox(tenant) == [second]  # an entry delivered once is not pending again


async def test_deleting_a_session_deletes_its_entries(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "gone", [carrying("c1", ("emails", "gone"))])
    await store.append(tenant, "kept", [carrying("c1", ("emails", "kept"))])
    assert await store.delete_session(tenant, "gone")
    assert [e.payload for e in await store.outbox(tenant)] == ["kept"]


async def test_malformed_entries_are_refused_and_nothing_is_stored(store: SessionStore, tenant: str) -> None:
    for entries in ([{"topic": "emails"}], [{"key": "k\x00", "call_id": "c1", "topic": "emails", "payload": 1}],
                    [{"key": "k", "call_id": "c1", "topic": "emails", "payload": float("nan")}], "not a list"):
        bad = Message("tool", (FunctionResult("c1", "done"),), metadata={OUTBOX_KEY: entries})
        with pytest.raises(UsageError, match="malformed outbox entries"):
            await store.append(tenant, "s", [Message.user("first"), bad])
    assert (await store.load(tenant, "s")).messages == [] and await store.outbox(tenant) == []


async def test_redis_refuses_the_outbox_clearly(tmp_path: Path, tenant: str) -> None:
    store = open_store("redis", tmp_path)
    assert not store.keeps_outbox
    try:
        await refused(store, tenant)
    finally:
        await store.close()


async def refused(store: SessionStore, tenant: str) -> None:
    with pytest.raises(UsageError, match="the redis store keeps no outbox; keep sessions whose tools write"):
        await store.outbox(tenant)
    with pytest.raises(UsageError, match="keeps no outbox"):
        await store.mark_delivered(tenant, ["k"])
    shipped = carrying("c1", ("emails", 1))
    await store.append(tenant, "s", [shipped])  # the entries stay in the log's record, not in an outbox
    assert (await store.load(tenant, "s")).messages == [shipped]

    @tool(outbox=True)
    def notify(ctx: ToolContext) -> str:
        """Queue a notification."""
        return ctx.outbox.add("notifications", "hi")

    agent = Agent(ScriptedModel([tool_call("notify"), "ok"]), tools=[notify], providers=[History(store)])
    result = await agent.run("Notify me", session=await agent.session("run", tenant=tenant))
    [answer] = result.messages[1].function_results
    assert answer.is_error and "the session's store (redis) keeps no outbox; use SQLiteStore" in answer.result


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True), min_size=1, max_size=6))
async def test_the_outbox_holds_the_entries_of_the_log_each_once(store: SessionStore, batches: list[list[int]]) -> None:
    """Whatever is appended and retried in whatever order: an entry per entry of a stored message, at its sequence."""
    tenant = f"t{uuid.uuid4().hex[:12]}"
    pool = {i: carrying(f"c{i}", *[("t", f"{i}/{n}") for n in range(i % 3)]) if i % 2 else Message.user(f"m{i}")
            for i in range(10)}
    for batch in batches:
        await store.append(tenant, "s", [pool[i] for i in batch])
    log = (await store.load(tenant, "s")).messages
    expected = [(seq, entry["payload"]) for seq, m in enumerate(log, 1) for entry in m.metadata.get(OUTBOX_KEY, [])]
    assert [(e.seq, e.payload) for e in await store.outbox(tenant, limit=100)] == expected


async def test_a_sqlite_file_without_the_outbox_table_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with SQLiteStore(path) as store:
        await store.append("t", "s", [Message.user("hi")])
    with sqlite3.connect(path) as conn:  # as a file of this layout written before the outbox was added
        conn.execute("DROP TABLE cp_outbox")
    async with SQLiteStore(path, read_only=True) as reader:
        assert await reader.outbox("t") == []
    async with SQLiteStore(path) as writer:  # a writer adds the table
        await writer.append("t", "s", [carrying("c1", ("emails", 1))])
        assert [e.payload for e in await writer.outbox("t")] == [1]


async def test_a_postgres_database_of_schema_2_is_migrated_keeping_its_sessions(tenant: str) -> None:
    import asyncpg

    from contextpipe.stores import PostgresStore

    from .backends import server_address

    dsn, prefix = server_address("postgres"), f"mig_{uuid.uuid4().hex[:10]}_"
    assert dsn is not None
    conn = await asyncpg.connect(dsn)
    try:
        async with PostgresStore(dsn, prefix=prefix) as store:
            await store.append(tenant, "s", [Message.user("written at schema 2")])
        # What a database of an earlier release holds: today's tables but the outbox, the queue and the artifacts
        # (their table, the trigger on the sessions and its function), at version 2.
        await conn.execute(f"DROP TRIGGER {prefix}artifacts_fresh ON {prefix}sessions")
        await conn.execute(f"DROP FUNCTION {prefix}artifacts_fresh()")
        for table in ("outbox", "queue", "artifacts"):
            await conn.execute(f"DROP TABLE {prefix}{table}")
        await conn.execute(f"UPDATE {prefix}schema SET version = 2")
        first, second = PostgresStore(dsn, prefix=prefix), PostgresStore(dsn, prefix=prefix)
        try:  # two processes opening it at once: one migrates, the other waits for it
            loaded = await asyncio.gather(first.load(tenant, "s"), second.load(tenant, "s"))
            assert [[m.text for m in log.messages] for log in loaded] == [["written at schema 2"]] * 2
            await first.append(tenant, "s", [carrying("c1", ("emails", 1))])
            assert [e.payload for e in await second.outbox(tenant)] == [1]
            await put_artifact(first, tenant, "s", "x", b"abc" * 1000, "text/plain")
            assert await read_artifact(second, tenant, "s", "x", offset=2997, length=10) == b"abc"
        finally:
            await first.close()
            await second.close()
        assert await conn.fetchval(f"SELECT version FROM {prefix}schema") == 5
        assert await conn.fetchval("SELECT count(*) FROM pg_trigger WHERE tgname = $1", prefix + "artifacts_fresh") == 1
        # stored uncompressed: a range reads its pages
        assert await conn.fetchval("SELECT attstorage FROM pg_attribute WHERE attrelid = $1::regclass "
                                   "AND attname = 'body'", prefix + "artifacts") == b"e"
    finally:
        for table in ("messages", "checkpoints", "traces", "outbox", "queue", "artifacts", "sessions", "schema"):
            await conn.execute(f"DROP TABLE IF EXISTS {prefix}{table} CASCADE")
        await conn.execute(f"DROP FUNCTION IF EXISTS {prefix}artifacts_fresh()")
        await conn.close()
