"""Each store's server-side copy of a view (`SessionStore.copy_view`) gives what the plain page-by-page copy gives."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from contextpipe import LeaseLost, Message, UsageError
from contextpipe.messages import FunctionCall, FunctionResult
from contextpipe.rewind import Rewound, copy_pages, fork, rewind, rewound_ranges, view_messages
from contextpipe.stores import SessionStore
from message_strategies import messages as any_message

Step = tuple[str, Any]

plans = st.lists(st.one_of(
    st.tuples(st.just("append"), st.lists(any_message, min_size=1, max_size=4)),
    st.tuples(st.just("exchange"), st.integers(1, 3)),
    st.tuples(st.just("rewind"), st.integers(0, 40))), min_size=1, max_size=10)


async def build(store: SessionStore, tenant: str, sid: str, plan: list[Step]) -> None:
    """Write `plan` to the session: batches of any messages, tool exchanges, rewinds (to a sequence in the view)."""
    for n, (op, arg) in enumerate(plan):
        if op == "rewind":
            last = (await store.load(tenant, sid, limit=1)).last_seq
            if min(arg, last) not in await rewound_ranges(store, tenant, sid):
                lease = await store.acquire_lease(tenant, sid, "test")
                await rewind(store, tenant, sid, min(arg, last), lease)
                await store.release_lease(lease)
            continue
        batch = [dataclasses.replace(m, id=f"{n}.{i}") for i, m in enumerate(arg)] if op == "append" else [
            Message("assistant", tuple(FunctionCall(f"c{n}.{i}", "f", "{}") for i in range(arg)), id=f"{n}.a"),
            *(Message("tool", (FunctionResult(f"c{n}.{i}", "r"),), id=f"{n}.r{i}") for i in range(arg))]
        await store.append(tenant, sid, batch)


async def fork_of(store: SessionStore, tenant: str, sid: str, *, at: int, plain: bool) -> tuple[str, int]:
    """Fork `sid` at `at` into a new session, by the store's copy or (`plain`) page by page; return its id and count."""
    new_id = f"f-{uuid.uuid4().hex[:8]}"
    lease = await store.acquire_lease(tenant, new_id, "fork")
    if plain:  # the same store, its fast path switched off: `fork` falls back to `copy_pages`
        async def offered_none(*args: object, **kwargs: object) -> None:
            return None

        store.copy_view = offered_none  # type: ignore[method-assign]
    try:
        return new_id, await fork(store, tenant, sid, at, new_id, lease)
    finally:
        if plain:
            del store.copy_view
        await store.release_lease(lease)


async def snapshot(store: SessionStore, tenant: str, sid: str) -> dict[str, Any]:
    """What a fork holds: its messages with their sequences, each id's indexed sequence, its state and version."""
    page = await store.load(tenant, sid)
    session = await store.get_session(tenant, sid)
    assert session is not None
    seqs = [await store.message_seq(tenant, sid, m.id) for m in page.messages]
    return {"log": list(enumerate(page.messages, page.first_seq)), "ids": seqs, "state": session.state,
            "version": session.version}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(plan=plans, at=st.integers(0, 60), state=st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
async def test_the_stores_copy_forks_as_the_plain_copy_does(store: SessionStore, tenant: str, plan: list[Step],
                                                           at: int, state: dict[str, int]) -> None:
    sid = f"s-{uuid.uuid4().hex[:8]}"
    await build(store, tenant, sid, plan)
    session = await store.load_or_create(tenant, sid)
    session.state.update(state)
    await store.save_session(session)
    rewound = await rewound_ranges(store, tenant, sid)
    view = await view_messages(store, tenant, sid)
    at = view[min(at, len(view)) - 1][0] if at and view else 0  # a sequence in the view (fork refuses others)
    note(f"{plan=} {at=} {rewound=}")
    fast, n_fast = await fork_of(store, tenant, sid, at=at, plain=False)
    plain, n_plain = await fork_of(store, tenant, sid, at=at, plain=True)
    assert n_fast == n_plain
    got, want = await snapshot(store, tenant, fast), await snapshot(store, tenant, plain)
    assert got == want
    assert got["ids"] == [s for s, _ in got["log"]] and len(got["log"]) == n_fast  # numbered 1, 2, ... and indexed
    assert [m.id for _, m in got["log"]] == [m.id for _, m in view[:n_fast]]  # the view's start, up to the point
    assert not n_fast or view[n_fast - 1][0] <= at
    for forked in (fast, plain):  # each goes on where its copy ended, and a retried message is still known
        again = [m for _, m in got["log"][-1:]] + [Message.user("next")]
        assert await store.append(tenant, forked, again) == n_fast + 1


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(upto=st.integers(0, 12), skip=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 4)), max_size=3))
async def test_any_ranges_copy_as_page_by_page(store: SessionStore, tenant: str, upto: int,
                                               skip: list[tuple[int, int]]) -> None:
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
