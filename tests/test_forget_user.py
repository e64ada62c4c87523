"""`Agent.forget_user`: a user's sessions, memories, facts, summaries and traces leave every store.

Two users' data are made by real runs; one user is forgotten; then every table (SQLite, PostgreSQL),
every key (Redis) and every object (the in-memory stores) is scanned for that user's id, session ids
and a marker word put in that user's messages. The other user's data must all still be there.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent, Durability, ForgetReport, SessionBusy, UsageError
from contextpipe.compaction import Summarize
from contextpipe.providers import Compaction, FactMemory, History, SemanticMemory
from contextpipe.session import set_user_id
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel
from contextpipe.tokens import EstimateTokenizer
from contextpipe.vectors import HashEmbedder, VectorStore
from helpers import changes, vector_store
from stores.backends import open_store, server_address

# (session store, vector store): every session backend, and every vector backend, once.
PAIRS = [("memory", "memory"), ("sqlite", "sqlite-shared"), ("postgres", "pgvector"), ("redis", "sqlite")]


@dataclass
class World:
    store: SessionStore
    vectors: VectorStore
    agent: Agent
    compacting: Agent
    summariser: ScriptedModel
    tenant: str


@pytest.fixture(params=PAIRS, ids=["-".join(p) for p in PAIRS])
async def world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    backend, vector_kind = request.param
    store = open_store(backend, tmp_path)
    vectors = store.vectors() if vector_kind == "sqlite-shared" else vector_store(vector_kind, tmp_path)  # type: ignore[attr-defined]
    memory = SemanticMemory(vectors, HashEmbedder())
    extractor = ScriptedModel(name="extractor")
    facts = FactMemory(extractor, vectors, HashEmbedder())
    chat = ScriptedModel(name="chat")
    keep = Durability(store_traces=True)
    agent = Agent(chat, providers=[History(store), memory, facts], durability=keep)
    summariser = ScriptedModel(name="summariser")
    compaction = Compaction(Summarize(summariser, keep_last_turns=1), tokenizer=EstimateTokenizer())
    compacting = Agent(chat, providers=[History(store), memory, facts, compaction], durability=keep)
    # Every model answers whatever it is asked, marking its answer with the user's marker.
    chat.enqueue(*[_echo] * 40)
    extractor.enqueue(*[lambda r: changes(add=(f"The user said {_marker_in(r.messages[0].text)}.",))] * 40)
    summariser.enqueue(*[lambda r: f"Summary: {_marker_in(r.messages[-1].text)} talked."] * 40)
    yield World(store, vectors, agent, compacting, summariser, f"t{uuid.uuid4().hex[:10]}")
    await vectors.close()
    await store.close()


def _marker_in(text: str) -> str:
    return next((w.strip(".,:") for w in text.split() if w.startswith("zqx")), "someone")


def _echo(request: Any) -> str:
    return f"Noted, {_marker_in(request.messages[-1].text)}."


@dataclass
class User:
    id: str
    marker: str
    sessions: list[str]

    @property
    def needles(self) -> list[str]:
        return [self.id, self.marker, *self.sessions]


async def _make_user(w: World, name: str) -> User:
    user = User(f"u{name}{uuid.uuid4().hex[:8]}", f"zqx{name}{uuid.uuid4().hex[:6]}", [])
    for n, runs in ((1, 3), (2, 1)):
        session = await w.agent.session(f"{user.id}-s{n}", tenant=w.tenant)
        set_user_id(session, user.id)
        user.sessions.append(session.id)
        for i in range(runs):
            await w.agent.run(f"Turn {i}: {user.marker} speaking.", session=session)
        if n == 1:  # a summary checkpoint, through a compacting run
            await w.compacting.run(f"Last turn: {user.marker} again.", session=session)
    return user


async def _expected(w: World, user: User) -> dict[str, int]:
    where = {"tenant": w.tenant, "user_id": user.id}
    counts = {"messages": 0, "traces": 0, "summaries": 0, "sessions": len(user.sessions),
              "memories": await w.vectors.count("memory", where=where),
              "facts": await w.vectors.count("facts", where=where)}
    for sid in user.sessions:
        counts["messages"] += len((await w.store.load(w.tenant, sid)).messages)
        counts["traces"] += len(await w.store.load_traces(w.tenant, sid))
        counts["summaries"] += await w.store.latest_checkpoint(w.tenant, sid) is not None
    assert all(counts.values()), counts  # every kind was made, so removing each is tested
    return counts


def _counts(report: ForgetReport) -> dict[str, int]:
    return {k: getattr(report, k) for k in ("messages", "traces", "summaries", "sessions", "memories", "facts")}


async def test_forgetting_a_user_leaves_no_trace_of_them_and_keeps_the_other_user(world: World) -> None:
    w = world
    alice, bob = await _make_user(w, "alice"), await _make_user(w, "bob")
    assert w.summariser.requests  # the compacting runs summarised
    expected, bob_before = await _expected(w, alice), await _expected(w, bob)
    assert await _found(w, alice.needles) == set(alice.needles)  # the scan sees the data before

    report = await w.agent.forget_user(w.tenant, alice.id)

    assert _counts(report) == expected
    assert report.session_ids == tuple(sorted(alice.sessions)) and report.user_id == alice.id
    assert await _found(w, alice.needles) == set()
    assert await _found(w, bob.needles) == set(bob.needles)
    assert await _expected(w, bob) == bob_before
    again = await w.agent.forget_user(w.tenant, alice.id)  # idempotent: nothing left to remove
    assert _counts(again) == dict.fromkeys(expected, 0)


async def test_a_session_held_by_a_run_is_refused_and_nothing_is_removed(world: World) -> None:
    w = world
    alice = await _make_user(w, "alice")
    lease = await w.store.acquire_lease(w.tenant, alice.sessions[1], "a-running-run")
    with pytest.raises(SessionBusy, match=alice.sessions[1]) as caught:
        await w.agent.forget_user(w.tenant, alice.id)
    assert "nothing was removed" in str(caught.value)
    assert await _found(w, alice.needles) == set(alice.needles)
    await w.store.release_lease(lease)
    assert (await w.agent.forget_user(w.tenant, alice.id)).sessions == 2
    assert await _found(w, alice.needles) == set()


@pytest.mark.parametrize("bad", ["", None, 7])
async def test_a_missing_user_id_is_a_usage_error(bad: Any) -> None:
    with pytest.raises(UsageError, match="user's id"):
        await Agent(ScriptedModel()).forget_user("default", bad)


# --- scanning every table, key and object --------------------------------------------------------------


async def _found(w: World, needles: list[str]) -> set[str]:
    """The needles found anywhere in the session store or the vector store."""
    texts = await _dump(w.store) + await _dump(w.vectors)
    return {n for n in needles if any(n.encode() in t for t in texts)}


async def _dump(thing: object) -> list[bytes]:
    """Everything `thing` holds, as bytes: every row of every table, every Redis value, or the objects."""
    kind = type(thing).__name__
    if kind in ("SQLiteStore", "SQLiteVectorStore"):
        return _sqlite_rows(Path(thing.path))  # type: ignore[attr-defined]
    if kind == "PostgresStore":
        return await _postgres_rows(server_address("postgres"))
    if kind == "PgVectorStore":
        return await _postgres_rows(server_address("pgvector"))
    if kind == "RedisStore":
        return await _redis_values(server_address("redis"))
    return [repr(vars(thing)).encode()]  # MemoryStore, MemoryVectorStore


def _sqlite_rows(path: Path) -> list[bytes]:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert "cp_sessions" in tables or "cp_vectors" in tables
        return [v if isinstance(v, bytes) else str(v).encode()
                for t in tables for row in conn.execute(f'SELECT * FROM "{t}"') for v in row]
    finally:
        conn.close()


async def _postgres_rows(dsn: str | None) -> list[bytes]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch("SELECT table_schema, table_name FROM information_schema.tables "
                                  "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')")
        assert tables
        return [str(r[0]).encode() for t in tables
                for r in await conn.fetch(f'SELECT t::text FROM "{t[0]}"."{t[1]}" t')]
    finally:
        await conn.close()


async def _redis_values(url: str | None) -> list[bytes]:
    import redis.asyncio

    client = redis.asyncio.from_url(url)  # type: ignore[no-untyped-call]
    try:
        found: list[bytes] = []
        async for key in client.scan_iter(count=1000):
            kind = (await client.type(key)).decode()
            value: Any = {"string": client.get, "hash": client.hgetall, "list": lambda k: client.lrange(k, 0, -1),
                          "set": client.smembers, "zset": lambda k: client.zrange(k, 0, -1)}[kind](key)
            found += [key, repr(await value).encode()]
        return found
    finally:
        await client.aclose()
