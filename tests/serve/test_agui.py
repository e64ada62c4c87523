"""AG-UI details: the history a client resends each turn, recognised by message id."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx

from contextpipe.stores import MemoryStore

from .conftest import GateModel, ThinkingModel, auth, client, make_app


def events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def answer(response: httpx.Response) -> str:
    return "".join(e["delta"] for e in events(response) if e["type"] == "TEXT_MESSAGE_CONTENT").strip()


def run(run_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"threadId": "t1", "runId": run_id, "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": messages}


def user(id: str, text: str) -> dict[str, Any]:
    return {"id": id, "role": "user", "content": text}


def assistant(id: str, text: str) -> dict[str, Any]:
    return {"id": id, "role": "assistant", "content": text}


async def stored(c: httpx.AsyncClient) -> list[tuple[str, str]]:
    messages = (await c.get("/v1/sessions/t1/messages", headers=auth())).json()["messages"]
    return [(m["role"], m["parts"][0]["text"]) for m in messages]


async def test_the_resent_history_is_stored_once_and_only_new_user_messages_are_input() -> None:
    model = GateModel()
    async with client(make_app(MemoryStore(), model)) as c:
        assert answer(await c.post("/v1/ag-ui", json=run("r1", [user("u1", "one")]), headers=auth())) == \
            "reply 1 to one"
        # The whole history again, with the client's own id for the answer and two new user messages.
        history = [user("u1", "one"), assistant("client-a1", "reply 1 to one"), user("u2", "two"),
                   assistant("client-x", "typed by the client"), user("u3", "three")]
        assert answer(await c.post("/v1/ag-ui", json=run("r2", history), headers=auth())) == "reply 2 to three"
        assert await stored(c) == [("user", "one"), ("assistant", "reply 1 to one"), ("user", "two"),
                                   ("user", "three"), ("assistant", "reply 2 to three")]
        assert model.calls == 2


async def test_a_history_ending_past_its_last_user_message_is_answered_from_the_log_not_twice() -> None:
    model = GateModel()
    async with client(make_app(MemoryStore(), model)) as c:
        await c.post("/v1/ag-ui", json=run("r1", [user("u1", "one")]), headers=auth())
        tail = [user("u1", "one"), assistant("client-a1", "reply 1 to one"),
                {"id": "tr", "role": "tool", "toolCallId": "c1", "content": "42"}]
        for history in (tail, tail[:2], tail[:1]):
            assert answer(await c.post("/v1/ag-ui", json=run("r2", history), headers=auth())) == "reply 1 to one"
        assert await stored(c) == [("user", "one"), ("assistant", "reply 1 to one")]
        assert model.calls == 1


async def test_a_new_thread_looks_up_none_of_the_history_a_client_brings_to_it() -> None:
    store, lookups = MemoryStore(), []
    real = store.message_seq

    async def counted(tenant: str, session_id: str, message_id: str) -> int | None:
        lookups.append(message_id)
        return await real(tenant, session_id, message_id)

    store.message_seq = counted  # type: ignore[method-assign]
    async with client(make_app(store, GateModel())) as c:
        history = [m for i in range(50) for m in (user(f"u{i}", f"m{i}"), assistant(f"a{i}", "x"))]
        response = await c.post("/v1/ag-ui", json=run("r1", [*history, user("last", "go")]), headers=auth())
        assert answer(response) == "reply 1 to go"
        assert [id for id in lookups if id != "last"] == []  # the run's own retry check looks up its input only
        assert await stored(c) == [("user", "go"), ("assistant", "reply 1 to go")]


async def test_reasoning_is_streamed_as_protocol_reasoning_events_before_the_answer() -> None:
    import pydantic
    from ag_ui import core

    async with client(make_app(MemoryStore(), ThinkingModel())) as c:
        response = await c.post("/v1/ag-ui", json=run("r1", [user("u1", "one")]), headers=auth())
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(core.Event)
    parsed = [adapter.validate_python(e) for e in events(response)]
    types = [e.type.value for e in parsed]
    assert types[:5] == ["RUN_STARTED", "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
                         "REASONING_MESSAGE_CONTENT"]
    assert types[5:8] == ["REASONING_MESSAGE_END", "REASONING_END", "TEXT_MESSAGE_START"]
    assert "".join(e.delta for e in parsed if e.type.value == "REASONING_MESSAGE_CONTENT") == "Let me think."
    assert len({e.message_id for e in parsed[1:7]}) == 1 and parsed[7].message_id != parsed[1].message_id
    assert answer(response) == "reply 1 to one"
