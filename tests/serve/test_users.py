"""Users over HTTP: keys bound to a user or allowed to name one, memory kept per user across sessions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from contextpipe import Agent
from contextpipe.errors import UsageError
from contextpipe.providers import History, SemanticMemory
from contextpipe.serve import ApiKeys, Grant, create_app, new_key
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.testing import ScriptedModel
from contextpipe.vectors import HashEmbedder

from .conftest import GateModel, client

BACKEND, ALICE, PLAIN = "cp_backend", "cp_alice", "cp_plain"


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_keys_file_binds_a_key_to_a_user_or_lets_it_name_users() -> None:
    key, line = new_key("acme")
    assert ApiKeys.parse(f"{line} user=alice").grant_for(key) == Grant("acme", "alice")
    assert ApiKeys.parse(f"{line} users=any").grant_for(key) == Grant("acme", names_users=True)
    assert ApiKeys.parse(line).grant_for(key) == Grant("acme")
    with pytest.raises(UsageError, match="entry 1: expected 'user=ID' or 'users=any'"):
        ApiKeys.parse(f"{line} admin")
    for bad in ("al ice", "alice\n", ""):
        with pytest.raises(UsageError, match="user id"):
            Grant("acme", bad)
    with pytest.raises(UsageError, match="give it user=ID or users=any, not both"):
        Grant("acme", "alice", names_users=True)


@pytest.fixture
def served(tmp_path: Path) -> tuple[Any, ScriptedModel]:
    store = SQLiteStore(tmp_path / "agent.db")
    memory = SemanticMemory(store.vectors(), HashEmbedder(), k=2, min_score=0.1)
    model = ScriptedModel(["Noted.", "It is 4512.", "Hello Bob."])
    keys = ApiKeys()
    keys.add("acme", BACKEND, names_users=True)
    keys.add("acme", ALICE, user="alice")
    keys.add("acme", PLAIN)
    return create_app(Agent(model, providers=[History(store), memory]), keys=keys), model


def agui(thread: str) -> dict[str, Any]:
    return {"threadId": thread, "runId": "r1", "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": [{"id": "u1", "role": "user", "content": "Hi."}]}


async def messages(c: httpx.AsyncClient, session: str, key: str = BACKEND) -> list[str]:
    page = (await c.get(f"/v1/sessions/{session}/messages", headers=as_(key))).json()
    return [m["parts"][0]["text"] for m in page["messages"]]


async def test_a_user_named_by_the_back_end_keeps_memories_across_sessions_and_only_theirs(
        served: tuple[Any, ScriptedModel]) -> None:
    app, model = served
    async with client(app) as c:
        for session, user in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
            created = await c.post("/v1/sessions", json={"id": session, "user_id": user}, headers=as_(BACKEND))
            assert created.status_code == 201 and created.json()["state"]["user_id"] == user
        assert (await c.post("/v1/sessions/a1/runs", json={"input": "My locker code is 4512."},
                             headers=as_(BACKEND))).status_code == 200
        answer = await c.post("/v1/sessions/a2/runs", json={"input": "What is my locker code?", "user_id": "alice"},
                              headers=as_(BACKEND))
        assert answer.json()["text"] == "It is 4512."
        assert "My locker code is 4512." in "".join(m.text for m in model.requests[-1].messages)  # recalled
        await c.post("/v1/sessions/b1/runs", json={"input": "What is my locker code?"}, headers=as_(BACKEND))
        assert "4512" not in "".join(m.text for m in model.requests[-1].messages)  # never across users
        refused = await c.post("/v1/sessions/a1/runs", json={"input": "I am Bob now.", "user_id": "bob"},
                               headers=as_(BACKEND))
        assert (refused.status_code, refused.json()["error"]["type"]) == (409, "UserMismatch")
        assert "belongs to user 'alice', not 'bob'" in refused.json()["error"]["message"]
        assert await messages(c, "a1") == ["My locker code is 4512.", "Noted."]  # nothing stored
        await c.post("/v1/sessions", json={"id": "a3"}, headers=as_(BACKEND))  # of no user, until a run names one
        model.enqueue("Noted, Alice.")
        await c.post("/v1/sessions/a3/runs", json={"input": "Hello.", "user_id": "alice"}, headers=as_(BACKEND))
        assert (await c.get("/v1/sessions/a3", headers=as_(ALICE))).json()["state"]["user_id"] == "alice"


async def test_a_key_bound_to_a_user_reaches_that_users_sessions_only(served: tuple[Any, ScriptedModel]) -> None:
    app, model = served
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "b1", "user_id": "bob"}, headers=as_(BACKEND))
        await c.post("/v1/sessions", json={"id": "shared"}, headers=as_(BACKEND))  # of no user
        mine = await c.post("/v1/sessions", json={"id": "a1"}, headers=as_(ALICE))
        assert mine.status_code == 201 and mine.json()["state"]["user_id"] == "alice"
        assert (await c.post("/v1/sessions/a1/runs", json={"input": "Hi."}, headers=as_(ALICE))).status_code == 200
        listed = (await c.get("/v1/sessions", headers=as_(ALICE))).json()["sessions"]
        assert [s["id"] for s in listed] == ["a1"]
        assert len((await c.get("/v1/sessions", headers=as_(PLAIN))).json()["sessions"]) == 3
        for other in ("b1", "shared"):
            for method, path in (("GET", ""), ("GET", "/messages"), ("GET", "/traces"), ("GET", "/facts"),
                                 ("DELETE", "")):
                response = await c.request(method, f"/v1/sessions/{other}{path}", headers=as_(ALICE))
                assert response.status_code == 404, (method, other, path)
            for path, body in (("runs", {"input": "Hi."}), ("approvals", None),
                               ("approvals", {"decisions": {"c1": {"decision": "approve"}}})):
                ran = await c.request("GET" if body is None else "POST", f"/v1/sessions/{other}/{path}", json=body,
                                      headers=as_(ALICE))
                assert ran.status_code == 404, (other, path, body)
            taken = await c.post("/v1/sessions", json={"id": other}, headers=as_(ALICE))
            assert (taken.status_code, taken.json()["error"]["type"]) == (409, "Conflict")
            thread = await c.post("/v1/ag-ui", json=agui(other), headers=as_(ALICE))
            assert thread.status_code == 404, other
        assert (await c.get("/v1/sessions/shared", headers=as_(PLAIN))).json()["state"].get("user_id") is None
        assert (await c.get("/v1/sessions/b1", headers=as_(PLAIN))).status_code == 200  # not deleted
        named = await c.post("/v1/sessions/a1/runs", json={"input": "Hi.", "user_id": "bob"}, headers=as_(ALICE))
        assert (named.status_code, named.json()["error"]["type"]) == (403, "Forbidden")
        assert "is for user 'alice'" in named.json()["error"]["message"]
        same = await c.post("/v1/sessions/a1/runs", json={"input": "Again.", "user_id": "alice"}, headers=as_(ALICE))
        assert same.status_code == 200
        assert len(model.requests) == 2
        model.enqueue("Hello from the thread.")
        assert (await c.post("/v1/ag-ui", json=agui("a-thread"), headers=as_(ALICE))).status_code == 200
        assert (await c.get("/v1/sessions/a-thread", headers=as_(ALICE))).json()["state"]["user_id"] == "alice"
        assert len(model.requests) == 3


async def test_a_key_without_users_may_not_name_one(served: tuple[Any, ScriptedModel]) -> None:
    app, _ = served
    async with client(app) as c:
        refused = await c.post("/v1/sessions", json={"id": "p1", "user_id": "alice"}, headers=as_(PLAIN))
        assert (refused.status_code, refused.json()["error"]["type"]) == (403, "Forbidden")
        assert "users=any" in refused.json()["error"]["message"]
        assert (await c.get("/v1/sessions/p1", headers=as_(PLAIN))).status_code == 404  # nothing made
        bad = await c.post("/v1/sessions", json={"id": "p2", "user_id": "al ice"}, headers=as_(BACKEND))
        assert bad.status_code == 400 and "user_id" in bad.json()["error"]["message"]


def gated_backend() -> tuple[Any, GateModel]:
    """Return a server with one key that names users, and its model, which waits for the test's release."""
    model = GateModel(gated=True)
    keys = ApiKeys()
    keys.add("acme", BACKEND, names_users=True)
    return create_app(Agent(model, providers=[History(MemoryStore())]), keys=keys), model


async def test_a_session_is_given_to_its_user_before_the_run_starts_so_no_other_user_slips_in() -> None:
    app, model = gated_backend()
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "new"}, headers=as_(BACKEND))  # of no user yet
        first = asyncio.create_task(c.post("/v1/sessions/new/runs", json={"input": "Hi.", "user_id": "alice"},
                                           headers=as_(BACKEND)))
        await model.entered.wait()  # alice's run holds the session and has stored nothing yet
        other = await c.post("/v1/sessions/new/runs", json={"input": "Hi.", "user_id": "bob", "wait": 30},
                             headers=as_(BACKEND))
        assert (other.status_code, other.json()["error"]["type"]) == (409, "UserMismatch")
        model.release.set()
        assert (await first).status_code == 200
        assert (await c.get("/v1/sessions/new", headers=as_(BACKEND))).json()["state"]["user_id"] == "alice"
        assert model.calls == 1


async def test_a_user_named_for_a_busy_session_of_no_user_waits_for_its_run_as_asked() -> None:
    app, model = gated_backend()
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s"}, headers=as_(BACKEND))  # of no user yet
        first = asyncio.create_task(c.post("/v1/sessions/s/runs", json={"input": "Hi."}, headers=as_(BACKEND)))
        await model.entered.wait()  # a run for no user holds the session
        named = asyncio.create_task(c.post("/v1/sessions/s/runs", json={"input": "Again.", "user_id": "alice",
                                                                         "wait": 30}, headers=as_(BACKEND)))
        model.release.set()  # with no wait, `named` would have been a 409 SessionBusy already
        assert (await first).status_code == 200
        assert (await named).status_code == 200
        assert (await c.get("/v1/sessions/s", headers=as_(BACKEND))).json()["state"]["user_id"] == "alice"
        assert model.calls == 2


async def test_a_user_is_never_given_a_session_made_again_under_the_id_it_was_read_by() -> None:
    from contextpipe.serve._json import HTTPError
    from contextpipe.serve._users import claim
    from contextpipe.session import Session, set_user_id, user_id

    store = MemoryStore()
    read = await store.load_or_create("acme", "s")  # of no user, version 1
    assert await store.delete_session("acme", "s")
    bobs = Session("s", "acme", created_at=read.created_at + 1)
    set_user_id(bobs, "bob")
    await store.save_session(bobs)  # made again, for bob, at the same version
    assert bobs.version == read.version
    with pytest.raises(HTTPError) as refused:
        await claim(store, read, "alice")
    assert refused.value.status == 404
    stored = await store.get_session("acme", "s")
    assert stored is not None and user_id(stored) == "bob"


async def test_info_says_which_user_a_key_is_for(served: tuple[Any, ScriptedModel]) -> None:
    app, _ = served
    async with client(app) as c:
        seen = {key: (await c.get("/v1/info", headers=as_(key))).json() for key in (ALICE, BACKEND, PLAIN)}
    assert [(i["user"], i["names_users"]) for i in seen.values()] == [("alice", False), (None, True), (None, False)]
