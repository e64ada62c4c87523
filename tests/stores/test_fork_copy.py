"""Each store's server-side copy of a view (`SessionStore.copy_view`) gives what the plain page-by-page copy gives."""

from __future__ import annotations

import dataclasses
import math
import os
import uuid
from typing import Any

import pytest
from _pytest.monkeypatch import MonkeyPatch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from contextpipe import CorruptRecord, LeaseLost, Message, UsageError
from contextpipe.messages import FunctionCall, FunctionResult
from contextpipe.outbox import OUTBOX_KEY
from contextpipe.rewind import Rewound, copy_pages, fork, rewind, rewound_ranges, view_messages
from contextpipe.session import REWINDS_KEY, Session
from contextpipe.stores import PostgresStore, SessionStore
from message_strategies import messages as any_message

from .test_conformance import corrupt_message

Step = tuple[str, Any]

plans = st.lists(st.one_of(
    st.tuples(st.just("append"), st.lists(any_message, min_size=1, max_size=4)),
    st.tuples(st.just("exchange"), st.integers(1, 3)),
    st.tuples(st.just("rewind"), st.integers(0, 40))), min_size=1, max_size=10)


async def copying(store: SessionStore, tenant: str) -> None:
    """Skip unless the store copies on its side: Redis offers no copy (`fork` copies page by page there)."""
    if store.backend == "redis":
        assert await store.copy_view(tenant, "s", "t", upto=5) is None
        pytest.skip("Redis offers no copy of its own")


async def build(store: SessionStore, tenant: str, sid: str, plan: list[Step]) -> None:
    """Write `plan` to the session: batches of any messages, tool exchanges, rewinds (to a sequence in the view).

    The first result of each exchange carries an outbox entry, on the stores that keep an outbox.
    """
    for n, (op, arg) in enumerate(plan):
        if op == "rewind":
            last = (await store.load(tenant, sid, limit=1)).last_seq
            if min(arg, last) not in await rewound_ranges(store, tenant, sid):
                lease = await store.acquire_lease(tenant, sid, "test")
                await rewind(store, tenant, sid, min(arg, last), lease)
                await store.release_lease(lease)
            continue
        entry = {OUTBOX_KEY: [{"key": f"{sid}.{n}", "call_id": f"c{n}.0", "topic": "t", "payload": n}]}
        batch = [dataclasses.replace(m, id=f"{n}.{i}") for i, m in enumerate(arg)] if op == "append" else [
            Message("assistant", tuple(FunctionCall(f"c{n}.{i}", "f", "{}") for i in range(arg)), id=f"{n}.a"),
            *(Message("tool", (FunctionResult(f"c{n}.{i}", "r"),), id=f"{n}.r{i}",
                      metadata=entry if i == 0 and store.keeps_outbox else {}) for i in range(arg))]
        await store.append(tenant, sid, batch)


async def forks_of(store: SessionStore, tenant: str, sid: str, at: int) -> tuple[str, str, int]:
    """Fork `sid` at `at` (`fork`: the store's copy), and copy the same messages page by page (`copy_pages`) into
    another session the way `fork` would, its state first; return both ids and the count."""
    fast, plain = f"f-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex[:8]}"
    lease = await store.acquire_lease(tenant, fast, "fork")
    copied = await fork(store, tenant, sid, at, fast, lease)
    await store.release_lease(lease)
    source = await store.get_session(tenant, sid)
    assert source is not None
    view = await view_messages(store, tenant, sid)
    lease = await store.acquire_lease(tenant, plain, "fork")
    await store.save_session(Session(plain, tenant, state={k: v for k, v in source.state.items() if k != REWINDS_KEY}),
                             lease=lease)
    upto = view[copied - 1][0] if copied else 0  # the last message `fork` copied (after snapping `at`)
    assert await copy_pages(store, tenant, sid, plain, upto, await rewound_ranges(store, tenant, sid), lease) == copied
    await store.release_lease(lease)
    return fast, plain, copied


async def snapshot(store: SessionStore, tenant: str, sid: str) -> dict[str, Any]:
    """What a fork holds: its messages with their sequences, each id's indexed sequence, its state, version and
    ttl, and its listing (version, message count)."""
    page = await store.load(tenant, sid)
    session = await store.get_session(tenant, sid)
    assert session is not None
    seqs = [await store.message_seq(tenant, sid, m.id) for m in page.messages]
    listed = [(i.version, i.message_count) for i in (await store.list_sessions(tenant, limit=500)).sessions
              if i.session_id == sid]
    return {"log": list(enumerate(page.messages, page.first_seq)), "ids": seqs, "state": session.state,
            "version": session.version, "ttl": session.ttl, "listed": listed, "last_seq": page.last_seq}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(plan=plans, at=st.integers(0, 60), state=st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
       ttl=st.sampled_from([None, 3600.0]))
async def test_the_stores_copy_forks_as_the_plain_copy_does(store: SessionStore, tenant: str, plan: list[Step],
                                                           at: int, state: dict[str, int], ttl: float | None) -> None:
    sid = f"s-{uuid.uuid4().hex[:8]}"
    await store.load_or_create(tenant, sid, ttl=ttl)
    await build(store, tenant, sid, plan)
    session = await store.load_or_create(tenant, sid)
    session.state.update(state)
    await store.save_session(session)
    rewound = await rewound_ranges(store, tenant, sid)
    view = await view_messages(store, tenant, sid)
    at = view[min(at, len(view)) - 1][0] if at and view else 0  # a sequence in the view (fork refuses others)
    note(f"{plan=} {at=} {rewound=}")
    outbox = await store.outbox(tenant) if store.keeps_outbox else []
    fast, plain, n = await forks_of(store, tenant, sid, at)
    got, want = await snapshot(store, tenant, fast), await snapshot(store, tenant, plain)
    assert got == want
    assert got["ids"] == [s for s, _ in got["log"]] and len(got["log"]) == n == got["last_seq"]  # 1, 2, ... indexed
    assert got["listed"] == [(got["version"], n)] and got["state"] == state and got["ttl"] is None
    assert [m.id for _, m in got["log"]] == [m.id for _, m in view[:n]]  # the view's start, up to the point
    assert not n or view[n - 1][0] <= at
    if store.keeps_outbox:  # entries are unique by tenant and key: the source holds them, a fork adds none
        assert await store.outbox(tenant) == outbox
    for forked in (fast, plain):  # each goes on where its copy ended, and a retried message is still known
        again = [m for _, m in got["log"][-1:]] + [Message.user("next")]
        assert await store.append(tenant, forked, again) == n + 1


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(upto=st.integers(0, 12), skip=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 4)), max_size=3))
async def test_any_ranges_copy_as_page_by_page(store: SessionStore, tenant: str, upto: int,
                                               skip: list[tuple[int, int]]) -> None:
    await copying(store, tenant)
    # Past the end of the log, overlapping or unsorted ranges: the copy takes what the plain one takes.
    sid, ranges = f"s-{uuid.uuid4().hex[:8]}", [(lo, lo + width) for lo, width in skip]
    await store.append(tenant, sid, [Message.user(f"m{i}") for i in range(10)])
    fast, plain = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    lease = await store.acquire_lease(tenant, fast, "copy")
    copied = await store.copy_view(tenant, sid, fast, upto=upto, skip=ranges, lease=lease)
    other = await store.acquire_lease(tenant, plain, "copy")
    assert copied == await copy_pages(store, tenant, sid, plain, upto, Rewound(tuple(ranges)), other)
    assert [(m.id, m.text) for m in (await store.load(tenant, fast)).messages] == [
        (m.id, m.text) for m in (await store.load(tenant, plain)).messages]


async def test_a_copy_under_a_lost_lease_writes_nothing(store: SessionStore, tenant: str) -> None:
    await copying(store, tenant)
    await store.append(tenant, "s", [Message.user("q"), Message.assistant("a")])
    lost = await store.acquire_lease(tenant, "f", "first")
    await store.release_lease(lost)
    held = await store.acquire_lease(tenant, "f", "second")  # the lease moved on: `lost` fences nothing any more
    with pytest.raises(LeaseLost):
        await store.copy_view(tenant, "s", "f", upto=2, lease=lost)
    with pytest.raises(LeaseLost):
        await fork(store, tenant, "s", 2, "f", lost)
    with pytest.raises(LeaseLost):  # as the plain copy's append does
        await copy_pages(store, tenant, "s", "f", 2, Rewound(), lost)
    assert (await store.load(tenant, "f")).messages == []
    assert await store.copy_view(tenant, "s", "f", upto=2, lease=held) == 2
    with pytest.raises(UsageError, match="has 2 messages already"):
        await store.copy_view(tenant, "s", "f", upto=2, lease=held)
    with pytest.raises(UsageError, match="upto must be"):
        await store.copy_view(tenant, "s", "g", upto=-1)
    await store.release_lease(held)


@pytest.mark.parametrize("bad", [1, 4, 7])
async def test_a_damaged_row_is_refused_as_the_plain_copy_refuses_it(durable_store: SessionStore, tenant: str,
                                                                     bad: int) -> None:
    await refused_when_damaged(durable_store, tenant, bad)


async def test_postgres_16_and_later_find_the_damaged_row_at_once(tenant: str) -> None:
    # The server of the other PostgreSQL tests is 15 (the range halved, cast again); this one is newer.
    dsn = os.environ.get("CONTEXTPIPE_TEST_PGVECTOR_DSN")
    if not dsn:
        pytest.skip("CONTEXTPIPE_TEST_PGVECTOR_DSN (a PostgreSQL 16 or later) is not set")
    async with PostgresStore(dsn, max_size=2) as store:
        pool = await store._get_pool()
        async with pool.acquire() as conn:
            if conn.get_server_version().major < 16:
                pytest.skip("the server is older than PostgreSQL 16")
        await refused_when_damaged(store, tenant, 4)


async def refused_when_damaged(store: SessionStore, tenant: str, bad: int) -> None:
    """The copy of a log damaged at `bad` is the plain copy's `CorruptRecord`, naming the source and sequence."""
    await store.append(tenant, "s", [Message.user(f"m{i}", id=f"m{i}") for i in range(8)])
    await store.load_or_create(tenant, "s")
    await corrupt_message(store, tenant, "s", bad)
    errors = []
    for new_id in ("fast", "plain"):
        lease = await store.acquire_lease(tenant, new_id, "fork")
        copy = fork(store, tenant, "s", 8, new_id, lease) if new_id == "fast" else copy_pages(
            store, tenant, "s", new_id, 8, Rewound(), lease)
        with pytest.raises(CorruptRecord) as info:
            await copy
        errors.append(info.value)
        assert (await store.load(tenant, new_id)).messages == []  # nothing copied
        await store.release_lease(lease)
    for error in errors:
        assert (error.session_id, error.sequence) == ("s", bad), error
        assert f"message {bad} of session 's'" in str(error)
    # Copied around the damage (it is skipped, as a rewound range is), the rest copies.
    lease = await store.acquire_lease(tenant, "around", "fork")
    copied = await store.copy_view(tenant, "s", "around", upto=8, skip=[(bad, bad)], lease=lease)
    assert copied in (None, 7)


async def test_a_row_sql_does_not_read_as_json_hands_the_fork_to_the_plain_copy(durable_store: SessionStore,
                                                                                tenant: str) -> None:
    # A message holding NaN (the codec writes and reads it; SQL's JSON does not) forks as elsewhere, and a damaged
    # row further back than the fork's snapping reads is the plain copy's CorruptRecord, not a fork copied whole.
    store = durable_store
    messages = [Message.user(f"m{i}", id=f"m{i}") for i in range(200)]
    messages[3] = Message.user("scored", id="m3", metadata={"score": float("nan"), "big": float("inf")})
    await store.append(tenant, "s", messages)
    await store.load_or_create(tenant, "s")
    lease = await store.acquire_lease(tenant, "nan", "fork")
    assert await store.copy_view(tenant, "s", "nan", upto=200, lease=lease) is None  # nothing copied that way
    assert await fork(store, tenant, "s", 200, "nan", lease) == 200
    copied = (await store.load(tenant, "nan")).messages
    assert [m.id for m in copied] == [m.id for m in messages] and math.isnan(copied[3].metadata["score"])
    await store.release_lease(lease)
    await corrupt_message(store, tenant, "s", 10)
    lease = await store.acquire_lease(tenant, "damaged", "fork")
    with pytest.raises(CorruptRecord) as info:
        await fork(store, tenant, "s", 200, "damaged", lease)
    assert (info.value.session_id, info.value.sequence) == ("s", 10)
    await store.release_lease(lease)


async def test_a_fork_that_failed_before_or_during_the_copy_is_retried(store: SessionStore, tenant: str,
                                                                       monkeypatch: MonkeyPatch) -> None:
    await store.append(tenant, "s", [Message.user("q", id="q"), Message.assistant("a", id="a")])
    source = await store.load_or_create(tenant, "s")
    source.state["k"] = "v"
    await store.save_session(source)

    async def killed(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the process died here")

    for method in ("save_session", "copy_view", "append"):  # before the state, in the copy, in the plain copy
        new_id = f"f-{method}"
        with monkeypatch.context() as patch:
            patch.setattr(store, method, killed)
            if method == "append":  # no copy of the store's own: the plain copy's append dies
                patch.setattr(store, "copy_view", offered_none)
            lease = await store.acquire_lease(tenant, new_id, "first")
            with pytest.raises(RuntimeError, match="died"):
                await fork(store, tenant, "s", 2, new_id, lease)
        assert (await store.load(tenant, new_id)).messages == []  # a crash leaves no messages without state
        await store.release_lease(lease)
        lease = await store.acquire_lease(tenant, new_id, "retry")
        assert await fork(store, tenant, "s", 2, new_id, lease) == 2
        after = await store.get_session(tenant, new_id)
        assert after is not None and after.state == {"k": "v"}
        assert [m.id for m in (await store.load(tenant, new_id)).messages] == ["q", "a"]
        await store.release_lease(lease)


async def offered_none(*args: object, **kwargs: object) -> None:
    """What a store without a copy of its own answers to `SessionStore.copy_view`."""
