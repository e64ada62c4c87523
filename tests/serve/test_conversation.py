"""Queued input, the queue, rewind and fork over real HTTP, on every store (PostgreSQL and Redis: the real servers)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from contextpipe import Agent, Durability
from contextpipe.providers import History
from contextpipe.serve import ServeSettings, create_app
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call
from stores.backends import BACKENDS, open_store

from .conftest import auth, keys, serving
from .test_http import sse
from .test_session_tools import Gate

STORES = BACKENDS


@contextlib.asynccontextmanager
async def opened(kind: str, tmp_path: Path) -> AsyncIterator[SessionStore]:
    """A fresh store of `kind`; on a shared server (PostgreSQL, Redis) the tests use session ids of their own."""
    store = open_store(kind, tmp_path)  # skips, saying why, when the server is not there
    try:
        yield store
    finally:
        await store.close()


def new_id() -> str:
    """A session id no other test (or earlier run) on a shared server has used."""
    return f"s{uuid.uuid4().hex[:12]}"


def gated(store: SessionStore, *replies: Any) -> tuple[Any, Gate, ScriptedModel]:
    """The app of an agent whose first step calls a tool that waits for the test's `Gate.release`."""
    gate = Gate()
    model = ScriptedModel([tool_call("slow_lookup", city="Suzhou", call_id="c1"), *replies])
    agent = Agent(model, tools=[gate.tool], providers=[History(store)], durability=Durability(store_traces=True))
    return create_app(agent, keys=keys()), gate, model


async def log_ids(store: SessionStore, session: str) -> list[str]:
    return [m.id for m in (await store.load("acme", session)).messages]


@pytest.mark.parametrize("kind", STORES)
async def test_a_busy_session_queues_asap_input_and_its_run_delivers_it_once(kind: str, tmp_path: Path) -> None:
    async with opened(kind, tmp_path) as store:
        s1 = new_id()
        app, gate, model = gated(store, "Suzhou is 0512, in metric units.")
        async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": s1})
            async with c.stream("POST", f"/v1/sessions/{s1}/runs", json={"input": "Code of Suzhou?",
                                                                      "stream": True}) as streamed:
                await gate.entered.wait()  # the run holds the session, inside its tool call
                refused = await c.post(f"/v1/sessions/{s1}/runs", json={"input": "Use metric units."})
                assert (refused.status_code, refused.json()["error"]["type"]) == (409, "SessionBusy")
                queued = await c.post(f"/v1/sessions/{s1}/runs", json={"input": "Use metric units.", "queue": "asap"})
                assert queued.status_code == 202, queued.text
                body = queued.json()
                assert (body["session_id"], body["when"], body["text"]) == (s1, "asap", "Use metric units.")
                listed = (await c.get(f"/v1/sessions/{s1}/queue")).json()["queued"]
                assert [(q["id"], q["when"], q["text"]) for q in listed] == [(body["id"], "asap", "Use metric units.")]
                assert body["id"] not in await log_ids(store, s1)
                gate.release.set()
                events = sse((await streamed.aread()).decode())
            delivered = [data for name, data in events if name == "message_delivered"]
            assert [(d["message"]["id"], d["step"]) for d in delivered] == [(body["id"], 1)]
            assert events[-1][0] == "done"
            ids = await log_ids(store, s1)
            assert ids.count(body["id"]) == 1  # delivered exactly once, after the tool exchange
            roles = [m.role for m in (await store.load("acme", s1)).messages]
            assert roles == ["user", "assistant", "tool", "user", "assistant"] and ids[3] == body["id"]
            assert model.requests[-1].messages[-1].text == "Use metric units."  # the model saw it
            assert (await c.get(f"/v1/sessions/{s1}/queue")).json() == {"queued": []}


@pytest.mark.parametrize("kind", STORES)
async def test_next_input_queued_on_a_busy_session_runs_once_the_run_ends(kind: str, tmp_path: Path) -> None:
    async with opened(kind, tmp_path) as store:
        s1 = new_id()
        app, gate, model = gated(store, "Suzhou is 0512.", "Sent by e-mail.")
        async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": s1})
            running = asyncio.create_task(c.post(f"/v1/sessions/{s1}/runs", json={"input": "Code of Suzhou?"}))
            await gate.entered.wait()
            queued = await c.post(f"/v1/sessions/{s1}/runs", json={"input": [{"role": "user", "id": "m-next", "parts": [
                {"kind": "text", "text": "E-mail it to me."}]}], "queue": "next"})
            assert queued.status_code == 202, queued.text
            assert (queued.json()["id"], queued.json()["when"]) == ("m-next", "next")
            again = await c.post(f"/v1/sessions/{s1}/runs", json={"input": [{"role": "user", "id": "m-next", "parts": [
                {"kind": "text", "text": "E-mail it to me."}]}], "queue": "next"})  # a retry queues nothing more
            assert again.status_code == 202
            gate.release.set()
            assert (await running).json()["text"] == "Suzhou is 0512."
            await asyncio.gather(*app.state.api.runs.background)  # the server's run of the queued message
            stored = (await store.load("acme", s1)).messages
            assert [m.id for m in stored].count("m-next") == 1
            assert [m.text for m in stored[-2:]] == ["E-mail it to me.", "Sent by e-mail."]
            assert len(model.requests) == 3  # the tool step, its answer, and the queued message's run: no more
            assert (await c.get(f"/v1/sessions/{s1}/queue")).json() == {"queued": []}


@pytest.mark.parametrize("when", ["asap", "next"])
async def test_queue_on_an_idle_session_runs_at_once(when: str) -> None:
    store = MemoryStore()
    app = create_app(Agent(ScriptedModel(["at once"]), providers=[History(store)]), keys=keys())
    async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        await c.post("/v1/sessions", json={"id": "s1"})
        ran = await c.post("/v1/sessions/s1/runs", json={"input": "Hello", "queue": when})
        assert ran.status_code == 200, ran.text
        assert ran.json()["text"] == "at once"
        assert [m.text for m in (await store.load("acme", "s1")).messages] == ["Hello", "at once"]


async def test_bad_queue_requests_are_400_saying_what_to_send() -> None:
    app = create_app(Agent(ScriptedModel([]), providers=[History(MemoryStore())]), keys=keys())
    async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        await c.post("/v1/sessions", json={"id": "s1"})
        for body, says in [({"input": "hi", "queue": "later"}, "'asap' or 'next'"),
                           ({"input": None, "queue": "asap"}, "queue takes one user message"),
                           ({"input": [{"role": "user", "parts": [{"kind": "text", "text": "a"}]}] * 2,
                             "queue": "next"}, "a request of its own"),
                           ({"input": "hi", "queue": "asap", "approvals": {"c1": {"decision": "approve"}}},
                            "decisions cannot be queued")]:
            answer = await c.post("/v1/sessions/s1/runs", json=body)
            assert (answer.status_code, answer.json()["error"]["type"]) == (400, "BadRequest"), body
            assert says in answer.json()["error"]["message"]


@pytest.mark.parametrize("kind", STORES)
async def test_rewind_marks_messages_and_a_resume_regenerates_the_reply(kind: str, tmp_path: Path) -> None:
    async with opened(kind, tmp_path) as store:
        s1 = new_id()
        model = ScriptedModel(["Paris.", "Rome.", "Lyon, then."])
        app = create_app(Agent(model, providers=[History(store)]), keys=keys())
        async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": s1})
            await c.post(f"/v1/sessions/{s1}/runs", json={"input": "A city?"})
            await c.post(f"/v1/sessions/{s1}/runs", json={"input": "Another?"})
            plain = (await c.get(f"/v1/sessions/{s1}/messages")).json()["messages"]
            assert all("rewound" not in m for m in plain)  # a session never rewound reads as before

            rewound = await c.post(f"/v1/sessions/{s1}/rewind", json={"to": 3})  # regenerate: keep "Another?"
            assert rewound.json() == {"session_id": s1, "to": 3}
            regenerated = await c.post(f"/v1/sessions/{s1}/runs", json={"input": None})
            assert regenerated.json()["text"] == "Lyon, then."
            assert [m.text for m in model.requests[-1].messages] == ["A city?", "Paris.", "Another?"]

            page = (await c.get(f"/v1/sessions/{s1}/messages")).json()["messages"]
            assert [(m["seq"], m.get("rewound", False), m.get("rewind_to")) for m in page] == [
                (1, False, None), (2, False, None), (3, False, None), (4, True, None), (5, True, 3), (6, False, None)]
            view = (await c.get(f"/v1/sessions/{s1}/messages", params={"view": "true"})).json()["messages"]
            assert [m["seq"] for m in view] == [1, 2, 3, 6]
            bad_view = await c.get(f"/v1/sessions/{s1}/messages", params={"view": "yes"})
            assert bad_view.status_code == 400 and "view must be true" in bad_view.json()["error"]["message"]

            for to, says in [(99, "its log ends at 6"), (4, "already rewound")]:
                bad = await c.post(f"/v1/sessions/{s1}/rewind", json={"to": to})
                assert (bad.status_code, bad.json()["error"]["type"]) == (409, "BadSequence")
                assert says in bad.json()["error"]["message"] and "view=true" in bad.json()["error"]["message"]
            assert len((await store.load("acme", s1)).messages) == 6  # refused rewinds wrote nothing


@pytest.mark.parametrize("kind", STORES)
async def test_fork_starts_a_new_session_with_the_view(kind: str, tmp_path: Path) -> None:
    async with opened(kind, tmp_path) as store:
        s1, s1b, s1c = new_id(), new_id(), new_id()
        app = create_app(Agent(ScriptedModel(["Paris.", "Rome.", "Nice."]), providers=[History(store)]), keys=keys())
        async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": s1})
            await c.post(f"/v1/sessions/{s1}/runs", json={"input": "A city?"})
            await c.post(f"/v1/sessions/{s1}/runs", json={"input": "Another?"})
            forked = await c.post(f"/v1/sessions/{s1}/fork", json={"at": 2, "new_id": s1b})
            assert forked.status_code == 201, forked.text
            assert forked.json()["id"] == s1b
            assert [m.text for m in (await store.load("acme", s1b)).messages] == ["A city?", "Paris."]
            await c.post(f"/v1/sessions/{s1b}/runs", json={"input": "South?"})
            assert len((await store.load("acme", s1)).messages) == 4  # independent afterwards
            random = await c.post(f"/v1/sessions/{s1}/fork", json={"at": 4})
            assert random.status_code == 201 and random.json()["id"].startswith("s-")

            taken = await c.post(f"/v1/sessions/{s1}/fork", json={"at": 2, "new_id": s1b})
            assert (taken.status_code, taken.json()["error"]["type"]) == (409, "Conflict")
            past = await c.post(f"/v1/sessions/{s1}/fork", json={"at": 9, "new_id": s1c})
            assert (past.status_code, past.json()["error"]["type"]) == (409, "BadSequence")
            assert await store.get_session("acme", s1c) is None
            other = await c.post(f"/v1/sessions/{s1}/fork", json={"at": 2}, headers=auth("globex"))
            assert other.status_code == 404


async def test_rewind_of_a_busy_session_is_409_and_the_read_only_server_lists_the_queue(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        app, gate, _ = gated(store, "done")
        async with serving(app) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": "s1"})
            running = asyncio.create_task(c.post("/v1/sessions/s1/runs", json={"input": "Code?"}))
            await gate.entered.wait()
            busy = await c.post("/v1/sessions/s1/rewind", json={"to": 0})
            assert (busy.status_code, busy.json()["error"]["type"]) == (409, "SessionBusy")
            assert busy.headers["retry-after"] == "1"
            await app.state.api.agent.enqueue("s1", "later", when="next", tenant="acme")
            gate.release.set()
            assert (await running).status_code == 200
        inspector = create_app(None, keys=keys(), store=store, settings=ServeSettings(read_only=True))
        async with serving(inspector) as base, httpx.AsyncClient(base_url=base, headers=auth()) as c:
            assert [q["text"] for q in (await c.get("/v1/sessions/s1/queue")).json()["queued"]] == ["later"]
            assert (await c.post("/v1/sessions/s1/rewind", json={"to": 0})).status_code == 405
