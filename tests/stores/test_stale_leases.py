"""A lease that is no longer current writes nothing, on every backend: not after the session was erased and
made afresh by another run (whose token restarts where the erased one's began), not after a takeover, and not
for a fork's copy of artifacts."""

from __future__ import annotations

import pytest

from contextpipe import LeaseLost
from contextpipe.artifacts import artifact_info, put_artifact
from contextpipe.messages import Message
from contextpipe.session import Session
from contextpipe.stores import SessionStore
from contextpipe.stores._artifacts_sql import copy_artifacts


async def test_a_lease_of_an_erased_session_is_lost_in_a_new_session_of_the_id(store: SessionStore,
                                                                              tenant: str) -> None:
    await store.save_session(Session("u", tenant))
    old = await store.try_acquire_lease(tenant, "u", "run-A", 30)
    assert old is not None
    await store.erase_session(tenant, "u")  # forget_user, while run A still runs
    new = await store.try_acquire_lease(tenant, "u", "run-B", 30)  # another user's new chat of the same id
    assert new is not None and new.token == old.token  # the token restarted: only the owner tells them apart
    await store.save_session(Session("u", tenant), lease=new)
    for held in (True, False):
        with pytest.raises(LeaseLost):
            await put_artifact(store, tenant, "u", "stale", b"the erased user's export", "text/plain", lease=old)
        with pytest.raises(LeaseLost):
            await store.append(tenant, "u", [Message.user("the erased user's message")], lease=old)
        session = await store.get_session(tenant, "u")
        assert session is not None
        with pytest.raises(LeaseLost):
            await store.save_session(session, lease=old)
        with pytest.raises(LeaseLost):
            await store.renew_lease(old)
        if held:
            await store.release_lease(new)
    assert await artifact_info(store, tenant, "u", "stale") is None
    assert (await store.load(tenant, "u")).messages == []
    await store.erase_session(tenant, "u")


async def test_a_lease_taken_over_writes_no_artifact(store: SessionStore, tenant: str) -> None:
    await store.save_session(Session("s", tenant))
    first = await store.try_acquire_lease(tenant, "s", "run-A", 30)
    assert first is not None
    await store.release_lease(first)
    second = await store.try_acquire_lease(tenant, "s", "run-B", 30)
    assert second is not None and second.token > first.token
    with pytest.raises(LeaseLost, match="was taken over"):
        await put_artifact(store, tenant, "s", "late", b"run A's result", "text/plain", lease=first)
    assert await artifact_info(store, tenant, "s", "late") is None
    await put_artifact(store, tenant, "s", "mine", b"run B's", "text/plain", lease=second)
    assert await artifact_info(store, tenant, "s", "mine") is not None


async def test_a_copy_under_a_lost_lease_copies_nothing(store: SessionStore, tenant: str) -> None:
    await put_artifact(store, tenant, "src", "a", b"to copy", "text/plain")
    lease = await store.try_acquire_lease(tenant, "dst", "fork", 30)
    assert lease is not None
    await store.erase_session(tenant, "dst")
    with pytest.raises(LeaseLost):
        await copy_artifacts(store, tenant, "src", "dst", lease)
    assert await artifact_info(store, tenant, "dst", "a") is None
    assert await store.get_session(tenant, "dst") is None
    assert await copy_artifacts(store, tenant, "src", "dst", None) == 1  # the same copy, fenced by no lease
    await store.erase_session(tenant, "src")
    await store.erase_session(tenant, "dst")
