"""One contract, every backend: MemoryStore, SQLiteStore, PostgresStore and RedisStore."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import ConcurrentUpdate, CorruptRecord, LeaseLost, Message, Session, SessionBusy, UsageError
from contextpipe.codec import dumps
from contextpipe.messages import DataPart, FunctionCall, FunctionResult, UriPart
from contextpipe.stores import Checkpoint, SessionKey, SessionStore
from message_strategies import WIDE_INTS, wide_values_messages

from .backends import elapse


def msgs(*texts: str) -> list[Message]:
    return [Message.user(t) for t in texts]


def texts(page_messages: list[Message]) -> list[str]:
    return [m.text for m in page_messages]


async def test_append_assigns_increasing_sequences_and_loads_in_order(store: SessionStore, tenant: str) -> None:
    assert await store.append(tenant, "s", msgs("a", "b")) == 2
    assert await store.append(tenant, "s", msgs("c")) == 3
    page = await store.load(tenant, "s")
    assert texts(page.messages) == ["a", "b", "c"]
    assert (page.first_seq, page.last_seq, page.has_more) == (1, 3, False)
    original = msgs("with parts")[0]
    await store.append(tenant, "t", [original])
    assert (await store.load(tenant, "t")).messages == [original]


async def test_tool_results_keep_their_images_and_files(store: SessionStore, tenant: str) -> None:
    result = FunctionResult("c1", "A chart.", parts=(DataPart(bytes(range(256)) * 40, "image/png"),
                                                     UriPart("https://example.com/a.pdf", "application/pdf")))
    messages = [Message("assistant", (FunctionCall("c1", "chart", "{}"),)), Message("tool", (result,))]
    await store.append(tenant, "media", messages)
    assert (await store.load(tenant, "media")).messages == messages


async def test_integers_beyond_64_bits_come_back_as_stored(store: SessionStore, tenant: str) -> None:
    # orjson reads an integer outside 64 bits as a float; 2**64 would even compare equal, so compare the JSON.
    wide = {"k": -14136784903946279993, "ints": WIDE_INTS}
    log = [Message.user("hi", metadata=wide), *wide_values_messages(), Message.assistant("plain")]
    await store.append(tenant, "s", log)
    await store.save_checkpoint(tenant, "s", Checkpoint(1, Message.system("so far", metadata=wide), 1.0))
    await store.append_traces(tenant, "s", [{"step": 1, "tokens": 2**64}])
    session = await store.load_or_create(tenant, "s")
    session.state["big"] = -(2**63) - 1
    await store.save_session(session)
    checkpoint, tail = await store.load_context(tenant, "s")
    assert [dumps(m) for m in (await store.load(tenant, "s")).messages] == [dumps(m) for m in log]
    assert [dumps(m) for m in tail.messages] == [dumps(m) for m in log[1:]]
    for summary in (checkpoint, await store.latest_checkpoint(tenant, "s")):
        assert summary is not None and type(summary.summary.metadata["k"]) is int
        assert summary.summary.metadata["ints"] == WIDE_INTS
    assert repr(await store.load_traces(tenant, "s")) == repr([{"step": 1, "tokens": 2**64}])
    stored = await store.get_session(tenant, "s")
    assert stored is not None and repr(stored.state["big"]) == repr(-(2**63) - 1)


async def test_retried_append_never_duplicates(store: SessionStore, tenant: str) -> None:
    batch = msgs("a", "b")
    await store.append(tenant, "s", batch)
    assert await store.append(tenant, "s", batch) == 2
    extra = msgs("c")
    assert await store.append(tenant, "s", [batch[1], *extra]) == 3
    assert texts((await store.load(tenant, "s")).messages) == ["a", "b", "c"]
    with pytest.raises(UsageError, match="repeats a message id"):
        await store.append(tenant, "s", [extra[0], *msgs("d"), extra[0]])
    assert texts((await store.load(tenant, "s")).messages) == ["a", "b", "c"]


async def test_message_seq_finds_a_message_by_id_in_its_session_only(store: SessionStore, tenant: str) -> None:
    a, b = msgs("a", "b")
    await store.append(tenant, "s", [a, b])
    await store.append(tenant, "s", [b, *msgs("c")])  # a retried id keeps its first sequence
    assert [await store.message_seq(tenant, "s", m.id) for m in (a, b)] == [1, 2]
    assert await store.message_seq(tenant, "s", "msg_never_stored") is None
    assert await store.message_seq(tenant, "other", a.id) is None
    assert await store.message_seq(f"{tenant}-other", "s", a.id) is None
    await store.delete_session(tenant, "s")
    assert await store.message_seq(tenant, "s", a.id) is None


async def test_bounded_tail_loads_and_paging_backwards(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", msgs(*(f"m{i}" for i in range(1, 11))))
    tail = await store.load(tenant, "s", limit=3)
    assert texts(tail.messages) == ["m8", "m9", "m10"]
    assert (tail.first_seq, tail.has_more) == (8, True)
    older = await store.load(tenant, "s", limit=3, before=tail.first_seq)
    assert texts(older.messages) == ["m5", "m6", "m7"]
    oldest = await store.load(tenant, "s", limit=10, before=3)
    assert texts(oldest.messages) == ["m1", "m2"]
    assert (oldest.first_seq, oldest.has_more) == (1, False)
    after = await store.load(tenant, "s", after=7)
    assert texts(after.messages) == ["m8", "m9", "m10"] and after.first_seq == 8
    assert texts((await store.load(tenant, "s", after=7, limit=2)).messages) == ["m9", "m10"]
    empty = await store.load(tenant, "s", after=10)
    assert empty.messages == [] and empty.first_seq == 11
    for after, before in ((20, None), (20, 5), (7, 3)):  # past the end, or an empty window: one past its end
        beyond = await store.load(tenant, "s", after=after, before=before)
        end = 10 if before is None else before - 1
        assert (beyond.messages, beyond.first_seq, beyond.has_more) == ([], end + 1, True), (after, before)
    await store.save_session(await store.load_or_create(tenant, "blank"))  # a session with no messages
    for after in (None, 0, 1, 5):
        blank = await store.load(tenant, "blank", after=after)
        assert (blank.messages, blank.first_seq, blank.has_more) == ([], 1, False), after
    missing = await store.load(tenant, "nobody")
    assert (missing.messages, missing.has_more) == ([], False)
    with pytest.raises(UsageError, match="limit must be at least 1"):
        await store.load(tenant, "s", limit=0)
    for bounds in ({"before": -1}, {"after": -1}, {"after": -5, "before": 3}, {"before": True}, {"after": 2.5}):
        with pytest.raises(UsageError, match="must be a sequence number"):  # the same refusal on every backend
            await store.load(tenant, "s", **bounds)  # type: ignore[arg-type]


async def test_session_state_compare_and_swap(store: SessionStore, tenant: str) -> None:
    assert await store.get_session(tenant, "s") is None
    session = await store.load_or_create(tenant, "s")
    assert session.version == 1
    session.state["prefs"] = {"food": "noodles"}
    await store.save_session(session)
    assert session.version == 2
    stale = Session("s", tenant, {"prefs": {"food": "rice"}}, version=1)
    with pytest.raises(ConcurrentUpdate, match="stored version 2, this copy has 1"):
        await store.save_session(stale)
    stored = await store.get_session(tenant, "s")
    assert stored is not None
    assert (stored.state, stored.version) == ({"prefs": {"food": "noodles"}}, 2)
    fresh = Session("new", tenant, {"k": 1}, version=3)
    with pytest.raises(ConcurrentUpdate):
        await store.save_session(fresh)


async def test_lease_is_exclusive_and_fences_late_writes(store: SessionStore, tenant: str) -> None:
    first = await store.acquire_lease(tenant, "s", "worker-a", ttl=0.3)
    assert await store.try_acquire_lease(tenant, "s", "worker-b", ttl=5) is None
    with pytest.raises(SessionBusy, match="busy"):
        await store.acquire_lease(tenant, "s", "worker-b", ttl=5)
    with pytest.raises(SessionBusy):
        await store.append(tenant, "s", msgs("no lease"))
    await store.append(tenant, "s", msgs("a's write"), lease=first)
    await elapse(store, 0.45)  # first's lease expires
    second = await store.acquire_lease(tenant, "s", "worker-b", ttl=5)
    assert second.token > first.token
    with pytest.raises(LeaseLost, match="taken over"):
        await store.append(tenant, "s", msgs("a's late write"), lease=first)
    with pytest.raises(LeaseLost):
        await store.renew_lease(first)
    session = await store.load_or_create(tenant, "other")
    with pytest.raises(LeaseLost):
        await store.save_session(Session("s", tenant, version=0), lease=first)
    await store.release_lease(first)  # a no-op: it is not first's any more
    await store.append(tenant, "s", msgs("b's write"), lease=second)
    renewed = await store.renew_lease(second)
    assert renewed.token == second.token and renewed.expires_at >= second.expires_at
    await store.release_lease(second)
    third = await store.acquire_lease(tenant, "s", "worker-c", ttl=5)
    assert third.token > second.token
    assert texts((await store.load(tenant, "s")).messages) == ["a's write", "b's write"]
    assert session.version == 1


async def test_waiting_for_a_lease(store: SessionStore, tenant: str) -> None:
    held = await store.acquire_lease(tenant, "s", "a", ttl=10)

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await store.release_lease(held)

    releaser = asyncio.create_task(release_soon())
    started = time.monotonic()
    got = await store.acquire_lease(tenant, "s", "b", ttl=10, wait=5)
    assert got.owner == "b" and time.monotonic() - started >= 0.15
    await releaser
    with pytest.raises(SessionBusy):
        await store.acquire_lease(tenant, "s", "c", ttl=10, wait=0.1)


async def test_tenants_never_cross(store: SessionStore, tenant: str) -> None:
    other = tenant + "x"
    await store.append(tenant, "shared-id", msgs("mine"))
    await store.append(other, "shared-id", msgs("theirs"))
    s = await store.load_or_create(tenant, "shared-id")
    s.state["owner"] = "me"
    await store.save_session(s)
    assert texts((await store.load(tenant, "shared-id")).messages) == ["mine"]
    assert texts((await store.load(other, "shared-id")).messages) == ["theirs"]
    theirs = await store.get_session(other, "shared-id")
    assert theirs is not None and theirs.state == {}
    assert [i.session_id for i in (await store.list_sessions(other)).sessions] == ["shared-id"]
    assert await store.delete_session(other, "shared-id")
    assert texts((await store.load(tenant, "shared-id")).messages) == ["mine"]
    assert await store.try_acquire_lease(other, "shared-id", "x", 5) is not None
    assert await store.try_acquire_lease(tenant, "shared-id", "y", 5) is not None


async def test_delete_removes_everything_of_the_session(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", msgs("a", "b"))
    session = await store.load_or_create(tenant, "s")
    session.state["k"] = "v"
    await store.save_session(session)
    await store.save_checkpoint(tenant, "s", Checkpoint(2, Message.system("summary"), time.time()))
    await store.acquire_lease(tenant, "s", "a", ttl=60)
    assert await store.delete_session(tenant, "s")
    assert not await store.delete_session(tenant, "s")
    assert await store.get_session(tenant, "s") is None
    assert (await store.load(tenant, "s")).messages == []
    assert await store.latest_checkpoint(tenant, "s") is None
    assert (await store.list_sessions(tenant)).sessions == []
    assert await store.try_acquire_lease(tenant, "s", "b", 5) is not None  # the lease went too


async def test_ttl_expires_sessions_and_writes_extend_it(store: SessionStore, tenant: str) -> None:
    session = Session("short", tenant, ttl=0.6)
    await store.save_session(session)
    await store.append(tenant, "short", msgs("a"))
    await store.save_session(Session("long", tenant))
    await elapse(store, 0.35)
    await store.append(tenant, "short", msgs("b"))  # pushes the expiry forward
    await elapse(store, 0.35)
    assert texts((await store.load(tenant, "short")).messages) == ["a", "b"]
    await elapse(store, 0.5)
    assert await store.get_session(tenant, "short") is None
    assert (await store.load(tenant, "short")).messages == []
    assert [i.session_id for i in (await store.list_sessions(tenant)).sessions] == ["long"]
    await store.purge_expired()
    assert await store.get_session(tenant, "long") is not None


async def test_listing_is_most_recent_first_with_cursor_pages(store: SessionStore, tenant: str) -> None:
    for i in range(7):
        await store.append(tenant, f"s{i}", msgs(*["x"] * (i + 1)))
        await asyncio.sleep(0.002)
    await store.append(tenant, "s2", msgs("touch"))  # now the most recent
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        listing = await store.list_sessions(tenant, limit=3, cursor=cursor)
        seen += [i.session_id for i in listing.sessions]
        pages += 1
        cursor = listing.next_cursor
        if cursor is None:
            break
    assert seen == ["s2", "s6", "s5", "s4", "s3", "s1", "s0"]
    assert pages == 3
    first = (await store.list_sessions(tenant, limit=1)).sessions[0]
    assert (first.session_id, first.message_count) == ("s2", 4)
    with pytest.raises(UsageError, match="invalid cursor"):
        await store.list_sessions(tenant, cursor="not-a-cursor")


async def test_checkpoints(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", msgs("a", "b", "c", "d"))
    assert await store.latest_checkpoint(tenant, "s") is None
    summary = Message.system("Summary of a and b.")
    await store.save_checkpoint(tenant, "s", Checkpoint(2, summary, 100.0))
    await store.save_checkpoint(tenant, "s", Checkpoint(3, Message.system("a, b and c."), 101.0))
    latest = await store.latest_checkpoint(tenant, "s")
    assert latest is not None and latest.seq == 3 and latest.summary.text == "a, b and c."
    assert texts((await store.load(tenant, "s", after=latest.seq)).messages) == ["d"]
    with pytest.raises(UsageError, match="log ends at 4"):
        await store.save_checkpoint(tenant, "s", Checkpoint(9, summary, 1.0))


@pytest.mark.parametrize("bad", [("", "s"), ("t", ""), ("bad tenant", "s"), ("t", "x" * 201), ("t", "semi;colon")])
async def test_ids_are_validated(store: SessionStore, bad: tuple[str, str]) -> None:
    tenant, session_id = bad
    with pytest.raises(UsageError, match="invalid"):
        await store.append(tenant, session_id, msgs("a"))
    with pytest.raises(UsageError, match="invalid"):
        await store.try_acquire_lease(tenant, session_id, "o", 1)
    for call in (store.load(tenant, session_id), store.get_session(tenant, session_id),
                 store.delete_session(tenant, session_id)):
        with pytest.raises(UsageError, match="invalid"):
            await call


async def test_hostile_ids_are_data_not_code(store: SessionStore, tenant: str) -> None:
    hostile = "x'); DROP TABLE contextpipe_messages;--"
    with pytest.raises(UsageError):
        await store.append(tenant, hostile, msgs("a"))
    odd = "a:b/c@d=e+f.g-h_i"
    await store.append(tenant, odd, msgs("fine"))
    assert texts((await store.load(tenant, odd)).messages) == ["fine"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=4, unique=True), min_size=1, max_size=6))
async def test_retries_in_any_order_never_lose_or_duplicate(
    store: SessionStore, batches: list[list[int]]
) -> None:
    tenant = f"t{uuid.uuid4().hex[:12]}"
    pool = {i: Message.user(f"m{i}") for i in range(13)}
    expected: list[int] = []
    for batch in batches:
        await store.append(tenant, "s", [pool[i] for i in batch])
        expected += [i for i in batch if i not in expected]
    loaded = (await store.load(tenant, "s")).messages
    assert [m.id for m in loaded] == [pool[i].id for i in expected]


async def corrupt_message(store: SessionStore, tenant: str, session_id: str, seq: int,
                          body: str | None = None) -> None:
    """Damage one stored message behind the store's back, the way a bad disk or a bad hand would (to `body`)."""
    if store.backend == "sqlite":
        import sqlite3

        from contextpipe.stores import SQLiteStore

        assert isinstance(store, SQLiteStore)
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE cp_messages SET body = ? WHERE tenant = ? AND session_id = ? AND seq = ?",
                         (body or '{"v": 1, "role": ', tenant, session_id, seq))
    elif store.backend == "postgres":
        from contextpipe.stores import PostgresStore

        assert isinstance(store, PostgresStore)
        pool = await store._get_pool()
        await pool.execute("UPDATE contextpipe_messages SET body = $4 WHERE tenant = $1 AND session_id = $2 "
                           "AND seq = $3", tenant, session_id, seq, body or "not json")
    elif store.backend == "redis":
        from contextpipe.stores import RedisStore

        assert isinstance(store, RedisStore)
        await store._client.lset(store._keys(SessionKey(tenant, session_id))[1], seq - 1,
                                 b"\xff\xfe garbage" if body is None else body.encode())
    else:
        raise AssertionError(f"no way to corrupt {store.backend}")



async def test_corrupt_row_names_session_and_sequence(durable_store: SessionStore, tenant: str) -> None:
    # MemoryStore keeps message objects, not bytes: there is nothing in it to corrupt.
    store = durable_store
    await store.append(tenant, "s", msgs("a", "b", "c", "d"))
    await corrupt_message(store, tenant, "s", 3)
    with pytest.raises(CorruptRecord, match=r"message 3 of session 's'") as info:
        await store.load(tenant, "s")
    assert (info.value.session_id, info.value.sequence, info.value.tenant) == ("s", 3, tenant)
    # Pages that do not touch the damaged row still load; nothing is skipped silently.
    assert texts((await store.load(tenant, "s", limit=1)).messages) == ["d"]
    with pytest.raises(CorruptRecord):
        await store.load(tenant, "s", limit=2)


@pytest.mark.parametrize("how", ["arrays", "objects", "parts"])
async def test_a_row_nested_too_deeply_is_a_corrupt_record_not_a_recursion_error(
        durable_store: SessionStore, tenant: str, how: str) -> None:
    # JSON past orjson's 1,024 levels goes to the standard library's parser, which meets Python's recursion limit.
    store, depth = durable_store, 5000
    await store.append(tenant, "s", msgs("a", "b", "c"))
    nested = {"arrays": "[" * depth + "]" * depth, "objects": '{"k":' * depth + "1" + "}" * depth,
              "parts": '{"kind":"function_result","call_id":"c","result":"r","parts":[' * depth
              + '{"kind":"uri","media_type":"text/plain","uri":"u"}' + "]}" * depth}[how]
    parts = nested if how == "parts" else '{"kind":"text","text":"b"}'
    metadata = '{"k":1}' if how == "parts" else f'{{"k":{nested}}}'
    body = f'{{"v":1,"role":"user","id":"b","created_at":1.0,"parts":[{parts}],"metadata":{metadata}}}'
    await corrupt_message(store, tenant, "s", 2, body)
    for load in (lambda: store.load(tenant, "s"), lambda: store.load_context(tenant, "s")):
        with pytest.raises(CorruptRecord, match=r"message 2 of session 's' .* cannot be read: .*nested too") as info:
            await load()
        assert (info.value.session_id, info.value.sequence) == ("s", 2)
    assert texts((await store.load(tenant, "s", limit=1)).messages) == ["c"]


async def test_a_message_nested_too_deeply_to_store_is_a_usage_error_and_the_session_goes_on(
        durable_store: SessionStore, tenant: str) -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    store = durable_store
    await store.append(tenant, "s", msgs("a"))
    with pytest.raises(UsageError, match="message 'deep' cannot be stored: its metadata or parts nest too deeply"):
        await store.append(tenant, "s", [Message.user("x", id="deep", metadata={"k": deep})])
    await store.append(tenant, "s", msgs("b"))
    assert texts((await store.load(tenant, "s")).messages) == ["a", "b"]


async def test_load_context_is_latest_checkpoint_plus_tail(store: SessionStore, tenant: str) -> None:
    assert await store.load_context(tenant, "nobody") == (None, (await store.load(tenant, "nobody")))
    await store.append(tenant, "s", msgs(*(f"m{i}" for i in range(1, 9))))
    checkpoint, page = await store.load_context(tenant, "s", limit=3)
    assert checkpoint is None and texts(page.messages) == ["m6", "m7", "m8"] and page.has_more
    await store.save_checkpoint(tenant, "s", Checkpoint(5, Message.system("m1..m5 in short"), 1.0))
    checkpoint, page = await store.load_context(tenant, "s")
    assert checkpoint is not None and checkpoint.summary.text == "m1..m5 in short"
    assert texts(page.messages) == ["m6", "m7", "m8"] and page.first_seq == 6
    _, page = await store.load_context(tenant, "s", limit=2)
    assert texts(page.messages) == ["m7", "m8"]


async def test_traces_are_stored_in_order_and_deleted_with_the_session(store: SessionStore, tenant: str) -> None:
    assert await store.load_traces(tenant, "s") == []
    await store.append(tenant, "s", msgs("a"))
    await store.append_traces(tenant, "s", [{"step": 1, "tokens": {"input": 3}}, {"step": 2}])
    await store.append_traces(tenant, "s", [{"step": 3, "text": "ünïcode"}])
    assert [t["step"] for t in await store.load_traces(tenant, "s")] == [1, 2, 3]
    assert (await store.load_traces(tenant, "s"))[0]["tokens"] == {"input": 3}
    assert [t["step"] for t in await store.load_traces(tenant, "s", limit=2)] == [2, 3]
    assert await store.load_traces(tenant + "x", "s") == []
    lease = await store.acquire_lease(tenant, "s", "a", ttl=30)
    with pytest.raises(SessionBusy):
        await store.append_traces(tenant, "s", [{"step": 4}])
    await store.append_traces(tenant, "s", [{"step": 4}], lease=lease)
    await store.delete_session(tenant, "s")
    assert await store.load_traces(tenant, "s") == []
