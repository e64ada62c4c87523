"""Artifacts beside a session's log (`contextpipe.artifacts`), on every backend: ranges, idempotent writes,
tenancy, and deletion with the session (erase, TTL, forget_user)."""

from __future__ import annotations

import pytest

from contextpipe import UsageError
from contextpipe.artifacts import Artifact, artifact_info, put_artifact, read_artifact
from contextpipe.erasure import forget_user
from contextpipe.session import Session, set_user_id
from contextpipe.stores import SessionStore
from contextpipe.stores._artifacts_redis import CHUNK

from .backends import elapse

DATA = bytes(range(256)) * (3 * CHUNK // 256 + 7)  # over three Redis chunks, not a whole number of them


async def test_an_artifact_reads_back_by_range(store: SessionStore, tenant: str) -> None:
    kept = await put_artifact(store, tenant, "s", "big", DATA, "application/octet-stream")
    assert kept == Artifact("big", "application/octet-stream", len(DATA))
    assert await artifact_info(store, tenant, "s", "big") == kept
    for offset, length in [(0, 10), (CHUNK - 3, 6), (CHUNK, CHUNK), (5, 3 * CHUNK), (len(DATA) - 4, 100),
                           (0, len(DATA) + 1), (len(DATA), 5), (len(DATA) + 10, 1)]:
        assert await read_artifact(store, tenant, "s", "big", offset=offset, length=length) == \
            DATA[offset:offset + length], (offset, length)
    await put_artifact(store, tenant, "s", "empty", b"", "text/plain")
    assert await read_artifact(store, tenant, "s", "empty", length=10) == b""


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


async def test_artifacts_expire_with_their_session(store: SessionStore, tenant: str) -> None:
    await store.save_session(Session("short", tenant, ttl=0.6))
    await put_artifact(store, tenant, "short", "a", b"brief", "text/plain")
    await elapse(store, 0.35)
    await put_artifact(store, tenant, "short", "b", b"pushes the expiry", "text/plain")  # a write, as an append
    await elapse(store, 0.35)
    assert await read_artifact(store, tenant, "short", "a", length=10) == b"brief"
    await elapse(store, 0.5)
    assert await artifact_info(store, tenant, "short", "a") is None
    assert await read_artifact(store, tenant, "short", "b", length=10) is None
    await store.purge_expired()
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


async def test_bad_arguments_say_what_to_give(store: SessionStore, tenant: str) -> None:
    with pytest.raises(UsageError, match="holds bytes, got str"):
        await put_artifact(store, tenant, "s", "a", "text", "text/plain")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="media type"):
        await put_artifact(store, tenant, "s", "a", b"x", "plain")
    with pytest.raises(UsageError, match="non-empty string"):
        await put_artifact(store, tenant, "s", "", b"x", "text/plain")
    with pytest.raises(UsageError, match="offset is an integer >= 0"):
        await read_artifact(store, tenant, "s", "a", offset=-1, length=3)
    with pytest.raises(UsageError, match="length is an integer >= 1"):
        await read_artifact(store, tenant, "s", "a", length=0)
    assert await artifact_info(store, tenant, "s", "a") is None  # nothing was written
