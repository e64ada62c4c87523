"""Artifacts beside a session's log (`contextpipe.artifacts`), on every backend: ranges, idempotent writes,
tenancy, and deletion with the session (erase, TTL, forget_user)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import select
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import LeaseLost, UsageError
from contextpipe.artifacts import Artifact, artifact_info, put_artifact, read_artifact
from contextpipe.erasure import forget_user
from contextpipe.messages import Message
from contextpipe.models import ModelRequest
from contextpipe.session import Session, SessionKey, set_user_id
from contextpipe.stores import SessionStore
from contextpipe.stores._artifacts_redis import CHUNK
from contextpipe.stores._artifacts_sql import copy_artifacts

from .backends import CLOCKS, DURABLE, open_spec, store_spec

DATA = bytes(range(256)) * (3 * CHUNK // 256 + 7)  # over three Redis chunks, not a whole number of them


async def test_an_artifact_reads_back_by_range(store: SessionStore, tenant: str) -> None:
    kept = await put_artifact(store, tenant, "s", "big", DATA, "application/octet-stream")
    assert kept == Artifact("big", "application/octet-stream", len(DATA))
    assert await artifact_info(store, tenant, "s", "big") == kept
    for offset, length in [(0, 10), (CHUNK - 3, 6), (CHUNK, CHUNK), (5, 3 * CHUNK), (len(DATA) - 4, 100),
                           (0, len(DATA) + 1), (len(DATA), 5), (len(DATA) + 10, 1),
                           (3, 2**40), (2**31, 5), (2**31 + 7, 2**40), (2**40, 2**62), (2**70, 2**70)]:  # clamped
        assert await read_artifact(store, tenant, "s", "big", offset=offset, length=length) == \
            DATA[offset:offset + length], (offset, length)
    await put_artifact(store, tenant, "s", "empty", b"", "text/plain")
    assert await read_artifact(store, tenant, "s", "empty", length=10) == b""


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.one_of(st.integers(0, 3 * CHUNK + 9), st.sampled_from([0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK])),
       offset=st.one_of(st.integers(0, 4 * CHUNK), st.sampled_from([CHUNK - 1, CHUNK + 1, 2 * CHUNK, 2**31, 2**40])),
       length=st.one_of(st.integers(0, 2 * CHUNK + 3), st.sampled_from([0, 1, CHUNK - 1, CHUNK, 2**31, 2**62])))
async def test_any_range_reads_exactly_those_bytes(store: SessionStore, size: int, offset: int, length: int) -> None:
    """Any range, inside, across chunks, past the end or of no length: exactly `data[offset:offset + length]`."""
    tenant, data = f"t{uuid.uuid4().hex[:12]}", random.Random(size).randbytes(size)  # no period: a shifted read shows
    await put_artifact(store, tenant, "s", "a", data, "application/octet-stream")
    if length == 0:
        with pytest.raises(UsageError, match="length is an integer >= 1"):
            await read_artifact(store, tenant, "s", "a", offset=offset, length=length)
    else:
        assert await read_artifact(store, tenant, "s", "a", offset=offset, length=length) == \
            data[offset:offset + length]
    await store.erase_session(tenant, "s")


async def test_a_second_write_of_an_id_keeps_the_first(store: SessionStore, tenant: str) -> None:
    first = await put_artifact(store, tenant, "s", "call-1", b"first result", "text/plain")
    again = await put_artifact(store, tenant, "s", "call-1", b"other bytes, longer", "application/json")
    assert again == first
    assert await read_artifact(store, tenant, "s", "call-1", length=100) == b"first result"


async def test_artifacts_belong_to_their_session_and_tenant(store: SessionStore, tenant: str) -> None:
    await put_artifact(store, tenant, "s", "a", b"mine", "text/plain")
    assert await artifact_info(store, tenant, "other", "a") is None
    assert await artifact_info(store, tenant + "x", "s", "a") is None
    assert await read_artifact(store, tenant, "s", "missing", length=4) is None
    assert await read_artifact(store, tenant + "x", "s", "a", length=4) is None


async def test_erasing_the_session_removes_its_artifacts_and_counts_them(store: SessionStore, tenant: str) -> None:
    await store.save_session(Session("s", tenant))
    await put_artifact(store, tenant, "s", "a", b"one", "text/plain")
    await put_artifact(store, tenant, "s", "b", DATA, "text/plain")
    await put_artifact(store, tenant, "kept", "a", b"stays", "text/plain")
    erased = await store.erase_session(tenant, "s")
    assert erased is not None and erased.artifacts == 2
    assert await artifact_info(store, tenant, "s", "a") is None
    assert await read_artifact(store, tenant, "s", "b", length=10) is None
    assert await read_artifact(store, tenant, "kept", "a", length=10) == b"stays"
    await put_artifact(store, tenant, "s", "a", b"new", "text/plain")  # a session made afresh starts empty
    assert await read_artifact(store, tenant, "s", "a", length=10) == b"new"


TTL = 600.0
"""The session TTL of the expiry test: far longer than the test runs, so only `age` moves it."""


async def age(store: SessionStore, key: SessionKey, seconds: float) -> None:
    """Let `seconds` of the session's TTL pass at once, without waiting: the fake clock of an embedded store jumps;
    on PostgreSQL the session's expiry comes `seconds` closer; on Redis every key of the session that has an
    expiry (the artifacts' keys only if they were given one) gets `seconds` less of it, as waiting would."""
    clock = CLOCKS.get(store)
    if clock is not None:
        clock.advance(seconds)
    elif store.backend == "postgres":
        async with store._transaction() as conn:  # type: ignore[attr-defined]
            await conn.execute(f"UPDATE {store._p}sessions SET expires_at = expires_at - $3 "  # type: ignore[attr-defined]
                               "WHERE tenant = $1 AND session_id = $2", key.tenant, key.id, seconds)
    else:
        client = store._client  # type: ignore[attr-defined]
        for name in store._keys(key):  # type: ignore[attr-defined]
            left = await client.pttl(name)
            if left > 0:  # -1: no expiry (kept), -2: no such key; an expiry of 0 or less deletes the key
                await client.pexpire(name, int(left - seconds * 1000))


async def test_artifacts_expire_with_their_session(store: SessionStore, tenant: str) -> None:
    key = SessionKey(tenant, "short")
    await store.save_session(Session("short", tenant, ttl=TTL))
    await put_artifact(store, tenant, "short", "a", b"brief", "text/plain")
    await age(store, key, 0.6 * TTL)
    await put_artifact(store, tenant, "short", "b", b"pushes the expiry", "text/plain")  # a write, as an append
    await age(store, key, 0.6 * TTL)  # 1.2 TTL after the first write, 0.6 after the last
    assert await read_artifact(store, tenant, "short", "a", length=10) == b"brief"
    await age(store, key, 0.5 * TTL)  # 1.1 TTL after the last write
    assert await artifact_info(store, tenant, "short", "a") is None
    assert await read_artifact(store, tenant, "short", "b", length=10) is None
    await store.purge_expired()
    await store.save_session(Session("short", tenant))  # made afresh: the expired one's artifacts are gone
    assert await artifact_info(store, tenant, "short", "a") is None
    assert await artifact_info(store, tenant, "short", "b") is None


async def test_forget_user_removes_and_counts_the_artifacts(store: SessionStore, tenant: str) -> None:
    session = Session("chat", tenant)
    set_user_id(session, "alice")
    await store.save_session(session)
    await put_artifact(store, tenant, "chat", "a", b"alice's", "text/plain")
    await put_artifact(store, tenant, "chat", "b", b"also alice's", "text/plain")
    report = await forget_user(tenant, "alice", run_store=store, stores=[store], providers=[])
    assert (report.session_ids, report.artifacts) == (("chat",), 2)
    assert await artifact_info(store, tenant, "chat", "a") is None


async def test_a_write_with_a_lost_lease_writes_nothing(store: SessionStore, tenant: str) -> None:
    """The spill of a run whose session was erased meanwhile must not bring the session back holding it."""
    await store.save_session(Session("s", tenant))
    lease = await store.try_acquire_lease(tenant, "s", "run-1", 30)
    assert lease is not None
    await put_artifact(store, tenant, "s", "before", b"kept", "text/plain", lease=lease)
    assert await store.erase_session(tenant, "s") is not None  # forget_user, meanwhile
    with pytest.raises(LeaseLost):
        await put_artifact(store, tenant, "s", "after", b"alice's export", "text/plain", lease=lease)
    assert await store.get_session(tenant, "s") is None
    assert [i.session_id for i in (await store.list_sessions(tenant)).sessions] == []
    assert await artifact_info(store, tenant, "s", "after") is None
    assert await store.erase_session(tenant, "s") is None  # no row was made: nothing left to erase


async def test_a_fork_reads_the_artifacts_its_copied_results_name(store: SessionStore, tenant: str) -> None:
    from contextpipe import Agent, tool
    from contextpipe.providers import Artifacts
    from contextpipe.testing import ScriptedModel, Turn, tool_call

    text = "row of the export\n" * 2_000

    @tool
    def dump() -> str:
        """Return the export."""
        return text

    def read_in_fork(request: ModelRequest) -> Turn:
        spilled = next(r.result for m in request.messages for r in m.function_results)
        handle = spilled.split("stored as artifact '")[1].split("'")[0]
        return tool_call("read_artifact", handle=handle, offset=18, length=17)

    model = ScriptedModel([tool_call("dump"), "ok", read_in_fork, "done"])
    agent = Agent(model, store=store, tools=[dump], providers=[Artifacts(store, limit=1_000, head=10, tail=10)])
    await agent.run("go", session=await agent.session("orig", tenant=tenant))
    await agent.fork("orig", at=len((await store.load(tenant, "orig")).messages), new_id="branch", tenant=tenant)
    await agent.run("read it", session=await agent.session("branch", tenant=tenant))
    read = [r for m in (await store.load(tenant, "branch")).messages for r in m.function_results][-1]
    assert not read.is_error and read.result.endswith("\nrow of the export"), read.result
    erased = await store.erase_session(tenant, "branch")
    assert erased is not None and erased.artifacts == 1  # its own copy: the original keeps its artifact
    original = await store.erase_session(tenant, "orig")
    assert original is not None and original.artifacts == 1


async def test_artifacts_an_earlier_release_left_do_not_reach_a_new_session_of_the_id(store: SessionStore,
                                                                                     tenant: str) -> None:
    backend = store.backend
    if backend == "memory":
        pytest.skip("the memory store keeps a session's artifacts in its entry: they go with it")
    await store.save_session(Session("chat", tenant))
    await put_artifact(store, tenant, "chat", "call_1-x", b"alice's export", "text/plain")
    if backend == "redis":  # the session's keys gone, its artifact keys left (an erase knowing keys 1-9)
        keys = store._keys(SessionKey(tenant, "chat"))  # type: ignore[attr-defined]
        await store._client.delete(*keys[:5], *keys[6:9])  # type: ignore[attr-defined]
    elif backend == "sqlite":  # an earlier release's erase: the session's row, not its artifacts (it knew none)
        await store._run(lambda conn: conn.execute(  # type: ignore[attr-defined]
            "DELETE FROM cp_sessions WHERE tenant = ? AND session_id = ?", (tenant, "chat")))
    else:
        async with store._transaction() as conn:  # type: ignore[attr-defined]
            table = f"{store._p}sessions"  # type: ignore[attr-defined]
            await conn.execute(f"DELETE FROM {table} WHERE tenant = $1 AND session_id = $2", tenant, "chat")
    await store.save_session(Session("chat", tenant))  # another user's new chat, of the same id
    assert await artifact_info(store, tenant, "chat", "call_1-x") is None
    assert await read_artifact(store, tenant, "chat", "call_1-x", length=100) is None


async def test_a_missing_redis_chunk_is_a_corrupt_record_not_shifted_bytes(store: SessionStore, tenant: str) -> None:
    if store.backend != "redis":
        pytest.skip("Redis keeps an artifact in chunks")
    from contextpipe.errors import CorruptRecord
    from contextpipe.session import SessionKey

    await put_artifact(store, tenant, "s", "big", DATA, "application/octet-stream")
    await store._client.hdel(store._keys(SessionKey(tenant, "s"))[10], "big#1")  # type: ignore[attr-defined]
    assert await read_artifact(store, tenant, "s", "big", length=10) == DATA[:10]  # chunk 0 is whole
    named = f"artifact 'big' of session 's' \\(tenant '{tenant}'\\).*chunk 1 is missing"
    with pytest.raises(CorruptRecord, match=named):
        await read_artifact(store, tenant, "s", "big", offset=CHUNK - 5, length=2 * CHUNK)
    with pytest.raises(CorruptRecord, match=named):  # a fork's copy says so too, it does not skip the artifact
        await copy_artifacts(store, tenant, "s", "fork", None)


async def test_redis_artifact_keys_live_as_long_as_the_session(store: SessionStore, tenant: str) -> None:
    if store.backend != "redis":
        pytest.skip("Redis expires each of a session's keys")
    client, keys = store._client, store._keys(SessionKey(tenant, "s"))  # type: ignore[attr-defined]

    async def meta_ttl() -> int:  # the artifacts' first: read later, the meta key's can only have gone down
        artifacts = [await client.pttl(keys[9]), await client.pttl(keys[10])]
        meta = int(await client.pttl(keys[0]))
        assert min(artifacts) >= meta > 0, (artifacts, meta)
        return meta

    await store.save_session(Session("s", tenant, ttl=100))
    await put_artifact(store, tenant, "s", "a", DATA, "text/plain")
    assert await meta_ttl() <= 100_000
    session = await store.get_session(tenant, "s")
    assert session is not None
    session.ttl = 5000
    await store.save_session(session)  # a save
    assert await meta_ttl() > 100_000
    await store.append(tenant, "s", [Message.user("hi")])  # an append
    await meta_ttl()
    lease = await store.try_acquire_lease(tenant, "s", "run-1", 9000)
    assert lease is not None
    await store.renew_lease(lease)  # a renewal: the session outlives the lease
    assert await meta_ttl() > 5_000_000
    assert await store.erase_session(tenant, "s") is not None  # no 9000 s lease nor keys left in the test Redis
    assert not [k for k in keys if await client.exists(k)]


async def test_an_sqlite_artifact_row_id_is_never_reused(store: SessionStore, tenant: str) -> None:
    if store.backend != "sqlite":
        pytest.skip("SQLite reads an artifact's blob by its row id")
    ids = "SELECT id FROM cp_artifacts WHERE session_id = 's' AND tenant = ?"
    await put_artifact(store, tenant, "s", "a", b"this tenant's", "text/plain")
    first = await store._run(lambda conn: conn.execute(ids, (tenant,)).fetchone()[0])  # type: ignore[attr-defined]
    await store.erase_session(tenant, "s")
    await put_artifact(store, tenant + "x", "s", "a", b"another tenant's", "text/plain")
    again = await store._run(lambda conn: conn.execute(ids, (tenant + "x",)).fetchone()[0])  # type: ignore[attr-defined]
    assert again != first  # a read of the first tenant's row id, raced by the erase, finds nothing of the other's


async def test_bad_arguments_say_what_to_give(store: SessionStore, tenant: str) -> None:
    with pytest.raises(UsageError, match="holds bytes, got str"):
        await put_artifact(store, tenant, "s", "a", "text", "text/plain")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="media type"):
        await put_artifact(store, tenant, "s", "a", b"x", "plain")
    for bad_id in ("", "x" * 201, "a\x00b", "\ud800"):  # each said, never a StoreError from the store's encoding
        with pytest.raises(UsageError, match=r"an artifact id is (1 to 200 characters, no NUL|UTF-8 text)"):
            await put_artifact(store, tenant, "s", bad_id, b"x", "text/plain")
        assert await artifact_info(store, tenant, "s", bad_id) is None  # a made-up handle reads as missing
        assert await read_artifact(store, tenant, "s", bad_id, length=3) is None
    with pytest.raises(UsageError, match="an artifact id is a string, got int"):
        await read_artifact(store, tenant, "s", 7, length=3)  # type: ignore[arg-type]
    for bad_media in ("text/\x00plain", "text/" + "x" * 200, "text/plaín", "text/\udc80"):
        with pytest.raises(UsageError, match="printable ASCII"):
            await put_artifact(store, tenant, "s", "a", b"x", bad_media)
    with pytest.raises(UsageError, match="offset is an integer >= 0"):
        await read_artifact(store, tenant, "s", "a", offset=-1, length=3)
    with pytest.raises(UsageError, match="length is an integer >= 1"):
        await read_artifact(store, tenant, "s", "a", length=0)
    assert await artifact_info(store, tenant, "s", "a") is None  # nothing was written


async def test_an_artifact_past_the_maximum_size_is_refused(store: SessionStore, tenant: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from contextpipe.stores import _artifacts

    assert _artifacts.MAX_ARTIFACT_BYTES == 512 * 1024 * 1024  # the documented maximum
    monkeypatch.setattr(_artifacts, "MAX_ARTIFACT_BYTES", 10)  # the same check, without 512 MiB in a test
    await put_artifact(store, tenant, "s", "fits", b"x" * 10, "text/plain")
    with pytest.raises(UsageError, match=r"an artifact holds at most 10 bytes .*got 11"):
        await put_artifact(store, tenant, "s", "too-big", b"x" * 11, "text/plain")
    assert await artifact_info(store, tenant, "s", "too-big") is None


@pytest.mark.parametrize("backend", DURABLE)
def test_a_process_killed_after_spilling_resumes_onto_the_same_artifact(backend: str, tmp_path: Path) -> None:
    """SIGKILL between the artifact's write and the step's save: the resumed run re-runs the idempotent tool,
    finds the artifact already there (same call, same bytes: stored once), and its saved result names it."""
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("artifact_worker.py")), spec, tenant, "s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 300)  # a bounded wait: a stuck worker fails the test
        assert ready, "the worker did not say 'p spilled' within 300 s"
        assert proc.stdout.readline().strip() == "p spilled", proc.stderr.read() if proc.stderr else ""
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    asyncio.run(_resume(spec, tenant))


async def _resume(spec: str, tenant: str) -> None:
    from contextpipe import Agent
    from contextpipe.providers import Artifacts
    from contextpipe.testing import ScriptedModel

    from .artifact_worker import BIG, export

    store = open_spec(spec)
    try:
        digest = hashlib.sha256(b"call_1\0" + BIG.encode()).hexdigest()  # of the call id and the data
        handle = f"call_1-{digest[:16]}"
        assert await artifact_info(store, tenant, "s", handle) == Artifact(handle, "text/plain; charset=utf-8",
                                                                           len(BIG))
        assert [r for m in (await store.load(tenant, "s")).messages for r in m.function_results] == []  # not saved
        agent = Agent(ScriptedModel(["done"]), store=store, tools=[export], providers=[Artifacts(store)])
        await agent.run(None, session=await agent.session("s", tenant=tenant), lease_wait=60)
        saved = [r.result for m in (await store.load(tenant, "s")).messages for r in m.function_results]
        assert len(saved) == 1 and f"stored as artifact {handle!r}" in saved[0]
        assert await read_artifact(store, tenant, "s", handle, length=len(BIG)) == BIG.encode()
        erased = await store.erase_session(tenant, "s")
        assert erased is not None and erased.artifacts == 1  # stored once, by the killed run
    finally:
        await store.close()
