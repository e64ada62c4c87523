"""Input that cannot hurt: strict JSON on every endpoint, 4xx for every client mistake, bad stored data still shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Durability, Message, UsageError
from contextpipe.codec import message_to_dict
from contextpipe.providers import History
from contextpipe.serve import ApiKeys, ServeSettings, create_app
from contextpipe.serve._json import MAX_DEPTH, HTTPError, read_json
from contextpipe.serve._requests import MAX_TTL, SESSION_ID
from contextpipe.session import validate_session_id
from contextpipe.stores import MemoryStore, SQLiteStore
from stores.backends import open_store

from .conftest import GateModel, auth, client, make_app

POISON = "hi \ud800 there"
"""Text with a lone surrogate: valid JSON (``"\\ud800"``, as ``json.dumps`` writes it), but not Unicode."""


def agui(thread: str, content: Any = "Hello", **more: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": "r1", "messages": [{"id": "u1", "role": "user", "content": content}],
            **more}


def user(text: str, **more: Any) -> dict[str, Any]:
    return {"role": "user", "parts": [{"kind": "text", "text": text}], **more}


async def texts(c: httpx.AsyncClient, session: str) -> list[str]:
    response = await c.get(f"/v1/sessions/{session}/messages", headers=auth())
    assert response.status_code == 200, response.text
    return [m["parts"][0]["text"] for m in response.json()["messages"]]


async def post(c: httpx.AsyncClient, path: str, raw: str) -> httpx.Response:
    return await c.post(path, content=raw.encode(), headers={**auth(), "Content-Type": "application/json"})


# --- lone surrogates -----------------------------------------------------------------------------

SURROGATE_CASES = [
    ("/v1/sessions", {"id": POISON}, "id"),
    ("/v1/sessions/s1/runs", {"input": POISON}, "input"),
    ("/v1/sessions/s1/runs", {"input": POISON, "stream": True}, "input"),
    ("/v1/sessions/s1/runs", {"input": [user(POISON)]}, "input[0].parts[0].text"),
    ("/v1/sessions/s1/runs", {"input": [user("ok", metadata={"note": {POISON: 1}})]}, "input[0].metadata.note"),
    ("/v1/sessions/s1/runs", {"input": "ok", "message_id": POISON}, "message_id"),
    ("/v1/ag-ui", agui("s1", POISON), "messages[0].content"),
    ("/v1/ag-ui", agui("s1", [{"type": "text", "text": POISON}]), "messages[0].content[0].text"),
    ("/v1/ag-ui", agui("s1", state={"draft": POISON}), "state.draft"),
    ("/v1/ag-ui", agui(POISON), "threadId"),
]


@pytest.mark.parametrize(("path", "body", "field"), SURROGATE_CASES)
async def test_a_lone_surrogate_is_refused_naming_the_field_and_the_session_stays_whole(
        tmp_path: Path, path: str, body: dict[str, Any], field: str) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        app = make_app(store, GateModel())
        async with client(app) as c:
            await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
            assert (await c.post("/v1/sessions/s1/runs", json={"input": "before"}, headers=auth())).status_code == 200
            response = await post(c, path, json.dumps(body))  # json.dumps writes the surrogate as \ud800
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["type"] == "InvalidText"
            assert error["message"].startswith(f"{field}: ")
            assert "lone surrogate (U+D800" in error["message"]
            # Nothing of it was stored, and the session reads and runs as before.
            assert await texts(c, "s1") == ["before", "reply 1 to before"]
            assert (await c.get("/v1/sessions/s1/traces", headers=auth())).status_code == 200
            after = await c.post("/v1/sessions/s1/runs", json={"input": "after"}, headers=auth())
            assert after.json()["text"] == "reply 2 to after"
            assert [s["id"] for s in (await c.get("/v1/sessions", headers=auth())).json()["sessions"]] == ["s1"]


async def test_a_surrogate_pair_is_unicode_and_goes_through_everywhere() -> None:
    app = make_app(MemoryStore(), GateModel())
    emoji = "wear this \U0001f9e5"
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        escaped = json.dumps({"input": emoji})  # "\ud83e\udde5": both halves, escaped
        assert "\\ud83e\\udde5" in escaped
        assert (await post(c, "/v1/sessions/s1/runs", escaped)).json()["text"] == f"reply 1 to {emoji}"
        response = await post(c, "/v1/ag-ui", json.dumps(agui("t1", emoji)))
        assert '"type":"RUN_FINISHED"' in response.text
        assert await texts(c, "s1") == [emoji, f"reply 1 to {emoji}"]
        assert await texts(c, "t1") == [emoji, f"reply 2 to {emoji}"]


# --- numbers JSON does not have ------------------------------------------------------------------

NOT_JSON = ["NaN", "Infinity", "-Infinity", "1e400"]
NUMBER_CASES = [
    ("/v1/sessions", '{"id": "s2", "ttl": %s}', "ttl"),
    ("/v1/sessions/s1/runs", '{"input": "hi", "wait": %s}', "wait"),
    ("/v1/sessions/s1/runs", '{"input": "hi", "stream": true, "wait": %s}', "wait"),
    ("/v1/sessions/s1/runs", '{"input": [{"role": "user", "parts": [{"kind": "text", "text": "hi"}], '
                             '"metadata": {"score": %s}}]}', "input[0].metadata.score"),
    ("/v1/ag-ui", '{"threadId": "s2", "runId": "r", "messages": [{"id": "u", "role": "user", "content": "hi"}], '
                  '"state": {"scores": [1, %s]}}', "state.scores[1]"),
    ("/v1/ag-ui", '{"threadId": "s2", "runId": "r", "messages": [], "forwardedProps": %s}', "forwardedProps"),
]


@pytest.mark.parametrize("number", NOT_JSON)
@pytest.mark.parametrize(("path", "template", "field"), NUMBER_CASES)
async def test_nan_and_infinities_are_refused_on_every_endpoint(path: str, template: str, field: str,
                                                                number: str) -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        response = await post(c, path, template % number)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "InvalidJSON"
        assert error["message"].startswith(f"{field}: ")
        assert ("not JSON" if number != "1e400" else "too large for a 64-bit float") in error["message"]
        assert await texts(c, "s1") == []
        assert (await c.get("/v1/sessions/s2", headers=auth())).status_code == 404


@pytest.mark.parametrize(("ttl", "needle"), [(1e308, "less than or equal to 315360000"), (30, "greater than or equal"),
                                             (0, "greater than or equal"), ("60", "a valid number"),
                                             (True, "a valid number")])
async def test_ttl_is_a_number_in_range(ttl: Any, needle: str) -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        response = await c.post("/v1/sessions", json={"id": "s1", "ttl": ttl}, headers=auth())
        assert (response.status_code, response.json()["error"]["type"]) == (400, "BadRequest")
        assert response.json()["error"]["message"].startswith(f"invalid request: ttl: Input should be {needle}")
        assert (await c.get("/v1/sessions/s1", headers=auth())).status_code == 404


async def test_the_longest_ttl_runs_on_redis(tmp_path: Path) -> None:
    """A TTL past what Redis can expire made every run 503; the longest one the API takes runs."""
    store = open_store("redis", tmp_path)
    try:
        app = make_app(store, GateModel())
        async with client(app) as c:
            created = await c.post("/v1/sessions", json={"ttl": MAX_TTL}, headers=auth())
            assert created.status_code == 201, created.text
            session = created.json()["id"]
            assert (await c.post(f"/v1/sessions/{session}/runs", json={"input": "hi"}, headers=auth())).status_code \
                == 200
            assert await texts(c, session) == ["hi", "reply 1 to hi"]
            await c.delete(f"/v1/sessions/{session}", headers=auth())
    finally:
        await store.close()


# --- other client mistakes -----------------------------------------------------------------------


async def test_a_user_message_in_contextpipes_message_form_is_taken_as_input() -> None:
    """What `message_to_dict` writes for a user message (its codec version and time included) is input."""
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        sent = message_to_dict(Message.user("hi", id="m1"))
        assert set(sent) == {"v", "id", "role", "parts", "created_at"}
        response = await c.post("/v1/sessions/s1/runs", json={"input": [sent]}, headers=auth())
        assert response.json()["text"] == "reply 1 to hi", response.text
        stored = (await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"][0]
        assert (stored["id"], stored["created_at"]) == ("m1", sent["created_at"])
        newer = await c.post("/v1/sessions/s1/runs", json={"input": [{**sent, "id": "m2", "v": 2}]}, headers=auth())
        assert newer.status_code == 400 and "input[0].v" in newer.json()["error"]["message"]


@pytest.mark.parametrize("part", [{"kind": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                                  {"kind": "function_result", "call_id": "c1", "result": "42"}])
async def test_a_user_message_holding_a_tool_part_is_a_400(part: dict[str, Any]) -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        body = {"input": [{"role": "user", "parts": [{"kind": "text", "text": "hi"}, part]}]}
        response = await c.post("/v1/sessions/s1/runs", json=body, headers=auth())
        assert (response.status_code, response.json()["error"]["type"]) == (400, "BadRequest")
        message = response.json()["error"]["message"]
        assert f"input[0].parts[1]: a user message cannot hold a part of kind {part['kind']!r}" in message
        assert "send parts of kind 'text', 'data' or 'uri'" in message
        assert await texts(c, "s1") == []


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/sessions/s1/runs", {"input": None}),
    ("/v1/sessions/s1/runs", {"input": None, "stream": True}),
    ("/v1/ag-ui", {"threadId": "s1", "runId": "r", "messages": []}),
    ("/v1/ag-ui", {"threadId": "new", "runId": "r", "messages": [{"id": "a", "role": "assistant", "content": "x"}]}),
])
async def test_nothing_to_run_is_a_409_and_creates_nothing(path: str, body: dict[str, Any]) -> None:
    """A resume of a session with no messages, or an AG-UI run whose messages end without a user message on
    a thread with none: the request is well formed, but the session has nothing to run on."""
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        response = await c.post(path, json=body, headers=auth())
        assert (response.status_code, response.json()["error"]["type"]) == (409, "NothingToRun"), response.text
        assert "user message" in response.json()["error"]["message"]
        assert (await c.get("/v1/sessions/new", headers=auth())).status_code == 404
        # Once the session has messages, the same resume runs.
        await c.post("/v1/sessions/s1/runs", json={"input": "first"}, headers=auth())
        if path.endswith("/runs") and not body.get("stream"):
            resumed = await c.post(path, json=body, headers=auth())
            assert resumed.json()["text"] == "reply 2 to first"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000, 200_000])
async def test_deeply_nested_json_is_a_400(depth: int) -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        nested = "[" * depth + "]" * depth
        for path, raw in [("/v1/sessions/s1/runs", '{"input": [{"role": "user", "parts": [{"kind": "text", '
                                                    f'"text": "x"}}], "metadata": {{"deep": {nested}}}}}]}}'),
                          ("/v1/ag-ui", f'{{"threadId": "s1", "runId": "r", "messages": [], "state": {nested}}}')]:
            response = await post(c, path, raw)
            assert (response.status_code, response.json()["error"]["type"]) == (400, "InvalidJSON"), response.text
            assert f"nested more than {MAX_DEPTH} levels deep" in response.json()["error"]["message"]
        assert await texts(c, "s1") == []


@pytest.mark.parametrize("cursor", [
    "abc", "eyJ4IjoxfQ", "WzEsICJ4Il0=",  # not ours; base64 of {"x":1}; the store's own form
    "1.5~", "nan~s1", "inf~s1", "1.5~bad id", "1.5~" + "x" * 201, "1e9999~s1", "1e999~s1x",
])
async def test_a_crafted_cursor_is_a_400_and_a_real_one_pages_on(cursor: str) -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        for i in range(3):
            await c.post("/v1/sessions", json={"id": f"s{i}+x"}, headers=auth())
        page = (await c.get("/v1/sessions", params={"limit": 2}, headers=auth())).json()
        rest = (await c.get("/v1/sessions", params={"limit": 2, "cursor": page["next_cursor"]}, headers=auth()))
        listed = [s["id"] for s in page["sessions"] + rest.json()["sessions"]]
        assert sorted(listed) == ["s0+x", "s1+x", "s2+x"]
        assert rest.json()["next_cursor"] is None
        response = await c.get("/v1/sessions", params={"cursor": cursor}, headers=auth())
        if cursor == "1e999~s1x":  # well formed: a time past every session's (1e999 reads as infinity)
            assert response.status_code == 200
            return
        assert (response.status_code, response.json()["error"]["type"]) == (400, "BadRequest"), response.text
        assert "pass the next_cursor of the previous page" in response.json()["error"]["message"]


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/v1/sessions", "GET, POST"), ("PATCH", "/v1/sessions/s1", "GET, DELETE"),
    ("OPTIONS", "/v1/sessions/s1/runs", "POST"), ("HEAD", "/v1/ag-ui", "POST"), ("POST", "/v1/info", "GET"),
    ("DELETE", "/v1/sessions/s1/messages", "GET"), ("TRACE", "/v1/sessions/s1/traces", "GET"),
])
async def test_a_405_says_what_is_allowed(method: str, path: str, allow: str) -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        response = await c.request(method, path, headers=auth())
        assert (response.status_code, response.headers["allow"]) == (405, allow)
        if method != "HEAD":
            assert response.json()["error"]["type"] == "MethodNotAllowed"
            assert method in response.json()["error"]["message"]


async def test_a_read_only_server_answers_writes_with_405_and_allow() -> None:
    keys = ApiKeys()
    keys.add("acme", "cp_acme_key")
    app = create_app(None, keys=keys, store=MemoryStore(), settings=ServeSettings(read_only=True))
    async with client(app) as c:
        for method, path, allow in [("POST", "/v1/sessions", "GET"), ("DELETE", "/v1/sessions/s1", "GET"),
                                    ("POST", "/v1/sessions/s1/runs", ""), ("POST", "/v1/ag-ui", "")]:
            response = await c.request(method, path, json={"input": "x"}, headers=auth())
            assert (response.status_code, response.headers["allow"]) == (405, allow), path
            assert response.json()["error"]["type"] == "ReadOnly"


async def test_paths_no_route_matches_answer_json() -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        for method, path, status in [("GET", "/v1/sessions/a%0Ab", 404), ("GET", "/nowhere", 404),
                                     ("POST", "/healthz", 405)]:
            response = await c.request(method, path, headers=auth())
            assert response.status_code == status
            assert response.json()["error"]["type"] in ("NotFound", "MethodNotAllowed")


# --- what is already stored ----------------------------------------------------------------------


async def test_stored_data_json_cannot_carry_is_shown_repaired_per_message(tmp_path: Path) -> None:
    """Data written before the edge checked (or through the Python API) still lists, reads and runs."""
    async with SQLiteStore(tmp_path / "old.db") as store:
        agent = Agent(GateModel(), providers=[History(store)], durability=Durability(store_traces=True))
        session = await agent.session("old", tenant="acme")
        await agent.run("fine", session=session)
        await agent.run([Message.user(POISON, metadata={"score": float("nan"), "ok": 1})], session=session)
        session.state["notes"] = {"weight": float("inf"), "text": POISON}
        await store.save_session(session)
        app = create_app(agent, keys=make_app(store, GateModel()).state.api.keys)
        async with client(app) as c:
            assert [s["id"] for s in (await c.get("/v1/sessions", headers=auth())).json()["sessions"]] == ["old"]
            page = (await c.get("/v1/sessions/old/messages", headers=auth())).json()["messages"]
            assert [m["parts"][0]["text"] for m in page] == ["fine", "reply 1 to fine", "hi \ufffd there",
                                                             "reply 2 to hi \ufffd there"]
            assert ["repaired" in m for m in page] == [False, False, True, True]
            assert page[2]["metadata"] == {"score": None, "ok": 1}
            assert "lone surrogates in text" in page[2]["repaired"] and "NaN" in page[2]["repaired"]
            got = (await c.get("/v1/sessions/old", headers=auth())).json()
            assert got["state"]["notes"] == {"weight": None, "text": "hi \ufffd there"}
            assert "repaired" in got
            traces = (await c.get("/v1/sessions/old/traces", headers=auth())).json()["traces"]
            assert ["repaired" in t for t in traces] == [False, True]
            result = (await c.post("/v1/sessions/old/runs", json={"input": "and now?"}, headers=auth())).json()
            assert result["text"] == "reply 3 to and now?"
            streamed = await c.post("/v1/sessions/old/runs", json={"input": "streamed", "stream": True},
                                    headers=auth())
            assert "event: done" in streamed.text
            answer = await c.post("/v1/ag-ui", json=agui("old", "via AG-UI"), headers=auth())
            assert '"type":"RUN_FINISHED"' in answer.text


async def test_a_result_holding_bad_text_renders_repaired_in_json_and_in_the_stream() -> None:
    class Lone(GateModel):  # a model whose answer holds a lone surrogate (a provider's broken escape)
        async def complete(self, request: Any) -> Any:
            response = await super().complete(request)
            return type(response)([Message.assistant("half an emoji: \udc00")], response.usage, "stop", "lone")

    app = make_app(MemoryStore(), Lone())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        result = (await c.post("/v1/sessions/s1/runs", json={"input": "hi"}, headers=auth())).json()
        assert result["text"] == "half an emoji: \ufffd"
        assert "repaired" in result["messages"][0] and "repaired" not in result["input"][0]
        streamed = await c.post("/v1/sessions/s1/runs", json={"input": "again", "stream": True}, headers=auth())
        assert streamed.text.count("half an emoji: \ufffd") >= 2 and "event: done" in streamed.text
        answer = await c.post("/v1/ag-ui", json=agui("s1", "once more"), headers=auth())
        events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
        assert "".join(e.get("delta", "") for e in events) == "half an emoji: \ufffd "
        finished = events[-1]
        assert finished["type"] == "RUN_FINISHED" and finished["result"]["text"] == "half an emoji: \ufffd"
        assert "lone surrogates in text" in finished["result"]["repaired"]  # the AG-UI client is told too


# --- the rules themselves ------------------------------------------------------------------------

# Any character, lone surrogates often (st.text leaves them out unless asked, and then draws them rarely).
_chars = st.characters(exclude_categories=()) | st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(_chars),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(_chars, max_size=5), inner, max_size=4),
    max_leaves=20)


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    return False


@settings(max_examples=300, deadline=None)
@given(value=_json_values)
def test_read_json_reads_back_every_json_value_and_refuses_only_lone_surrogates(value: Any) -> None:
    raw = json.dumps(value).encode()  # ASCII JSON: every surrogate an escape
    read = json.loads(raw)  # (two escapes that make a pair read as one character)
    if not _has_lone_surrogate(read):
        assert read_json(raw) == read
        return
    with pytest.raises(HTTPError) as refused:
        read_json(raw)
    assert (refused.value.status, refused.value.kind) == (400, "InvalidText")


@given(shape=st.lists(st.sampled_from(["[", "{"]), min_size=MAX_DEPTH - 2, max_size=MAX_DEPTH + 3),
       unicode=st.booleans())
def test_read_json_refuses_exactly_what_nests_past_the_limit(shape: list[str], unicode: bool) -> None:
    """Arrays and objects in any mix, in text with or without escapes: refused exactly past `MAX_DEPTH`."""
    value: Any = "\u00e9t\u00e9 \U0001f9e5" if unicode else 1.5
    for opener in reversed(shape):
        value = [value] if opener == "[" else {"k\u00e9": value}
    raw = json.dumps(value, ensure_ascii=unicode).encode()
    if len(shape) <= MAX_DEPTH:
        assert read_json(raw) == value
        return
    with pytest.raises(HTTPError) as refused:
        read_json(raw)
    assert (refused.value.kind, str(refused.value).split(":")[1]) == ("InvalidJSON", " nested more than 64 levels deep")


@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_is_read_exactly(value: float) -> None:
    assert read_json(json.dumps({"x": value}).encode()) == {"x": value}


@given(session_id=st.text(alphabet=st.characters(codec="ascii"), max_size=210) | st.from_regex(SESSION_ID))
def test_the_published_session_id_pattern_is_the_stores_rule(session_id: str) -> None:
    import re

    try:
        validate_session_id(session_id)
        valid = True
    except UsageError:
        valid = False
    assert bool(re.fullmatch(SESSION_ID, session_id)) == valid
