"""AG-UI details: the history a client resends each turn (recognised by message id), shared state, context, images."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx2 as httpx
import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, ContextProvider, DataPart, Source, TextPart, UriPart, UsageError
from contextpipe.serve import create_app
from contextpipe.serve._agui import MAX_STATE_BYTES, STATE_KEY, json_patch
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, tool_call

from .conftest import GateModel, ThinkingModel, agent_app, auth, client, keys, make_app, serving


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
        for history in (tail[:2], tail[:1]):
            assert answer(await c.post("/v1/ag-ui", json=run("r2", history), headers=auth())) == "reply 1 to one"
        refused = await c.post("/v1/ag-ui", json=run("r2", tail), headers=auth())  # a result of no call of the thread
        assert refused.status_code == 409 and "answers call 'c1', which the thread never made" in refused.text
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
    assert types[:6] == ["RUN_STARTED", "STATE_SNAPSHOT", "REASONING_START", "REASONING_MESSAGE_START",
                         "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"]
    assert types[6:9] == ["REASONING_MESSAGE_END", "REASONING_END", "TEXT_MESSAGE_START"]
    assert "".join(e.delta for e in parsed if e.type.value == "REASONING_MESSAGE_CONTENT") == "Let me think."
    assert len({e.message_id for e in parsed[2:8]}) == 1 and parsed[8].message_id != parsed[2].message_id
    assert answer(response) == "reply 1 to one"


async def test_a_tool_changes_the_shared_state_the_run_stores_and_streams_as_snapshot_then_delta() -> None:
    model = ScriptedModel([tool_call("add_todo", item="eggs"), "Added eggs.", "You have two items."])
    async with serving(agent_app(model)) as url, httpx.AsyncClient(base_url=url) as c:
        body = {**run("r1", [user("u1", "add eggs")]), "state": {"items": ["milk"], "theme": "dark"}}
        seen = events(await c.post("/v1/ag-ui", json=body, headers=auth()))
        assert [e["type"] for e in seen[:2]] == ["RUN_STARTED", "STATE_SNAPSHOT"]
        assert seen[1]["snapshot"] == {"items": ["milk"], "theme": "dark"}
        assert [e["type"] for e in seen[-2:]] == ["STATE_DELTA", "RUN_FINISHED"]
        assert seen[-2]["delta"] == [{"op": "replace", "path": "/items", "value": ["milk", "eggs"]}]
        assert next(e for e in seen if e["type"] == "TOOL_CALL_RESULT")["content"] == "added eggs to 1 items"
        kept = (await c.get("/v1/sessions/t1", headers=auth())).json()["state"][STATE_KEY]
        assert kept == jsonpatch.apply_patch(seen[1]["snapshot"], seen[-2]["delta"]) == \
            {"items": ["milk", "eggs"], "theme": "dark"}
        # Without a state, the run starts from the session's; no tool changes it: no delta.
        later = {k: v for k, v in run("r2", [user("u1", "add eggs"), user("u2", "how many?")]).items() if k != "state"}
        seen = events(await c.post("/v1/ag-ui", json=later, headers=auth()))
        assert seen[1] == {"type": "STATE_SNAPSHOT", "snapshot": kept}
        assert "STATE_DELTA" not in [e["type"] for e in seen]


async def test_a_state_that_is_not_an_object_or_too_large_is_a_400_naming_it() -> None:
    async with serving(agent_app(ScriptedModel())) as url, httpx.AsyncClient(base_url=url) as c:
        for state, problem in (([1], "not an array"), ("x", "not a string"),
                               ({"big": "x" * MAX_STATE_BYTES}, f"over the {MAX_STATE_BYTES}")):
            response = await c.post("/v1/ag-ui", json={**run("r1", [user("u1", "hi")]), "state": state},
                                    headers=auth())
            assert response.status_code == 400, response.text
            assert response.json()["error"]["message"].startswith("invalid request: state: ")
            assert problem in response.json()["error"]["message"]
        assert (await c.get("/v1/sessions/t1", headers=auth())).status_code == 404  # nothing was made


async def test_context_entries_reach_the_model_as_their_own_source_and_are_not_stored() -> None:
    model = ScriptedModel(["Noted."])
    async with serving(agent_app(model)) as url, httpx.AsyncClient(base_url=url) as c:
        body = {**run("r1", [user("u1", "what is open?")]),
                "context": [{"description": "the page", "value": "/orders/17"}, {"description": "time", "value": "9"}]}
        assert answer(await c.post("/v1/ag-ui", json=body, headers=auth())) == "Noted."
        sent = model.requests[0].messages
        assert [(m.source, m.text) for m in sent] == [
            (Source("context", "ag-ui"), "Context from the application (the page):\n/orders/17"),
            (Source("context", "ag-ui"), "Context from the application (time):\n9"),
            (Source("input"), "what is open?")]
        assert await stored(c) == [("user", "what is open?"), ("assistant", "Noted.")]
        [trace] = (await c.get("/v1/sessions/t1/traces", headers=auth())).json()["traces"]
        assert [(m["source_kind"], m["source_id"]) for m in trace["messages"]] == [
            ("context", "ag-ui"), ("context", "ag-ui"), ("input", None)]


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


def image(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


async def test_image_parts_reach_the_model_and_are_stored_with_the_message() -> None:
    model = ScriptedModel(["A chart."])
    content = [{"type": "text", "text": "What is "}, {"type": "text", "text": "this?"},
               image({"type": "data", "value": base64.b64encode(PNG).decode(), "mimeType": "image/png"}),
               image({"type": "url", "value": "https://example.com/b.jpg"}),
               image({"type": "url", "value": "https://example.com/c", "mimeType": "image/webp"})]
    async with serving(agent_app(model)) as url, httpx.AsyncClient(base_url=url) as c:
        response = await c.post("/v1/ag-ui", json=run("r1", [{"id": "u1", "role": "user", "content": content}]),
                                headers=auth())
        assert answer(response) == "A chart."
        [given] = model.requests[0].messages
        assert given.parts == (TextPart("What is this?"), DataPart(PNG, "image/png"),
                               UriPart("https://example.com/b.jpg", "image/jpeg"),
                               UriPart("https://example.com/c", "image/webp"))
        assert given.id == "u1" and given.source == Source("input")
        messages = (await c.get("/v1/sessions/t1/messages", headers=auth())).json()["messages"]
        assert messages[0]["parts"][1:3] == [
            {"kind": "data", "media_type": "image/png", "data": base64.b64encode(PNG).decode()},
            {"kind": "uri", "media_type": "image/jpeg", "uri": "https://example.com/b.jpg"}]
        # The same message again is a retry, answered from the log: its parts read the same.
        assert answer(await c.post("/v1/ag-ui", json=run("r2", [{"id": "u1", "role": "user", "content": content}]),
                                   headers=auth())) == "A chart."
        assert len(model.requests) == 1


async def test_an_unread_part_or_bad_base64_is_a_400_naming_the_part() -> None:
    data = {"type": "data", "value": base64.b64encode(PNG).decode(), "mimeType": "image/png"}
    cases = [
        ({"type": "binary", "mimeType": "image/png", "data": "AAAA"}, "messages[0].content[1]: Input tag 'binary'"),
        ({"type": "audio", "source": data}, "messages[0].content[1]: audio parts are not read here"),
        (image({**data, "value": "not base64!"}), "messages[0].content[1].source.value: must be the image's bytes"),
        (image({**data, "value": "AAA"}), "messages[0].content[1].source.value: must be the image's bytes"),
        (image({**data, "mimeType": "text/plain"}), "messages[0].content[1].source.mimeType: must be an image's"),
        (image({"type": "url", "value": "no uri"}), "messages[0].content[1].source.value: must be an absolute URI"),
        (image({"type": "file", "value": "file-1"}), "messages[0].content[1].source: a file source"),
    ]
    async with serving(agent_app(ScriptedModel())) as url, httpx.AsyncClient(base_url=url) as c:
        for part, problem in cases:
            content = [{"type": "text", "text": "look"}, part]
            response = await c.post("/v1/ag-ui", json=run("r1", [{"id": "u1", "role": "user", "content": content}]),
                                    headers=auth())
            assert response.status_code == 400, response.text
            assert problem in response.json()["error"]["message"]
        # An earlier message of the history is checked as well: the document says what passes, wherever.
        history = [{"id": "u0", "role": "user", "content": [{"type": "video", "source": data}]},
                   assistant("a0", "ok"), user("u1", "hi")]
        response = await c.post("/v1/ag-ui", json=run("r1", history), headers=auth())
        assert response.status_code == 400 and "messages[0].content[0]: video parts" in response.text
        assert (await c.get("/v1/sessions/t1", headers=auth())).status_code == 404


keys_ = st.text("a/~01", max_size=3)  # few letters: the same keys often, and the two a JSON Pointer escapes
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys_, inner, max_size=3),
                           max_leaves=12)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # (load, not bugs)
@given(st.dictionaries(keys_, json_values, max_size=4), st.dictionaries(keys_, json_values, max_size=4))
def test_the_state_delta_turns_the_old_state_into_the_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    patch = json_patch(old, new)
    assert json.dumps(jsonpatch.apply_patch(old, patch), sort_keys=True) == json.dumps(new, sort_keys=True)
    assert (patch == []) == (json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True))


def test_an_agent_whose_provider_keeps_its_state_under_the_clients_key_is_refused() -> None:
    class Claims(ContextProvider):
        state_keys = (STATE_KEY,)

    with pytest.raises(UsageError, match=f"session state key '{STATE_KEY}', which the AG-UI route keeps"):
        create_app(Agent(ScriptedModel(), providers=[Claims("claims")]), keys=keys())


WHERE = {"name": "user_location", "description": "Where the user is.", "parameters": {"type": "object"}}


async def test_a_front_end_result_answers_its_call_once_and_the_resent_history_stores_nothing_twice() -> None:
    model = ScriptedModel([tool_call("user_location"), "You are in Suzhou."])
    store = MemoryStore()
    async with client(agent_app(model, store)) as c:
        first = events(await c.post("/v1/ag-ui", json=run("r1", [user("u1", "Where?")]) | {"tools": [WHERE]},
                                    headers=auth()))
        start = next(e for e in first if e["type"] == "TOOL_CALL_START")
        assert (start["toolCallId"], start["toolCallName"]) == ("call_1", "user_location")
        assert first[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["call_1"]}
        call = {"id": start["parentMessageId"], "role": "assistant", "toolCalls": [
            {"id": "call_1", "type": "function", "function": {"name": "user_location", "arguments": "{}"}}]}
        result = {"id": "t1", "role": "tool", "toolCallId": "call_1", "content": "Suzhou"}
        history = [user("u1", "Where?"), call, result]
        early = events(await c.post("/v1/ag-ui", json=run("r2", [*history[:2], user("u2", "Hello?")]), headers=auth()))
        assert early[-1]["type"] == "RUN_ERROR" and "pending.answer(result)" in early[-1]["message"]  # call open
        assert answer(await c.post("/v1/ag-ui", json=run("r2", history) | {"tools": [WHERE]}, headers=auth())) == \
            "You are in Suzhou."
        again = [*history, assistant("client-a", "You are in Suzhou.")]
        assert answer(await c.post("/v1/ag-ui", json=run("r3", again), headers=auth())) == "You are in Suzhou."
    log = (await store.load("acme", "t1")).messages
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"]
    assert log[2].function_results[0].result == "Suzhou"
    model.assert_done()


async def test_front_end_tools_named_as_the_agents_or_of_no_schema_are_refused() -> None:
    async with client(agent_app(ScriptedModel([]))) as c:
        for tools, problem in (([WHERE | {"name": "add_todo"}], "'add_todo' is the name of one of the agent's own"),
                               ([WHERE, WHERE], "another tool of the request"),
                               ([WHERE | {"parameters": {"type": "array"}}], "must be a JSON schema of an object")):
            response = await c.post("/v1/ag-ui", json=run("r1", [user("u1", "hi")]) | {"tools": tools},
                                    headers=auth())
            assert response.status_code == (400 if "schema" in problem else 409), response.text
            assert problem in response.text
