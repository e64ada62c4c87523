"""The HTTP API as clients use it: auth, tenants, bad input, paging, 409, disconnects and draining."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe.serve import ApiKeys, ServeSettings, create_app, new_key
from contextpipe.serve._app import STATIC
from contextpipe.serve._openapi import openapi_schema
from contextpipe.stores import MemoryStore, SQLiteStore

from .conftest import KEYS, GateModel, auth, client, make_app, serving


async def run(c: httpx.AsyncClient, session: str, text: str, tenant: str = "acme", **body: Any) -> httpx.Response:
    return await c.post(f"/v1/sessions/{session}/runs", json={"input": text, **body}, headers=auth(tenant))


def sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.split("\n\n"):
        name = data = None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if name is not None and data is not None:
            events.append((name, data))
    return events


async def test_every_api_route_needs_a_known_key() -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        for method, path in [("GET", "/v1/sessions"), ("POST", "/v1/sessions"), ("GET", "/v1/sessions/x"),
                             ("DELETE", "/v1/sessions/x"), ("GET", "/v1/sessions/x/messages"),
                             ("POST", "/v1/sessions/x/runs"), ("GET", "/v1/sessions/x/approvals"),
                             ("POST", "/v1/sessions/x/approvals"), ("POST", "/v1/ag-ui"), ("GET", "/v1/info"),
                             ("GET", "/v1/nowhere")]:
            response = await c.request(method, path)
            assert response.status_code == 401, (method, path)
            assert response.headers["www-authenticate"] == "Bearer"
            assert "API key" in response.json()["error"]["message"]
            wrong = await c.request(method, path, headers={"Authorization": "Bearer cp_not_a_key"})
            assert wrong.status_code == 401
        assert (await c.get("/v1/info", headers={"X-API-Key": KEYS["acme"]})).json()["tenant"] == "acme"
        for public in ("/healthz", "/openapi.json", "/docs", "/ui/", "/ui/app.js"):
            assert (await c.get(public)).status_code == 200, public


async def test_the_inspector_modules_are_served_as_javascript() -> None:
    # A browser runs a <script type="module"> only when it comes with a JavaScript MIME type.
    modules = sorted(p.name for p in STATIC.glob("*.js"))
    assert "app.js" in modules and len(modules) > 1
    async with client(make_app(MemoryStore(), GateModel())) as c:
        for name in modules:
            response = await c.get(f"/ui/{name}")
            assert response.status_code == 200, name
            assert response.headers["content-type"].split(";")[0] in ("text/javascript", "application/javascript"), name


async def test_a_tenant_never_sees_another_tenants_sessions() -> None:
    store = MemoryStore()
    app = make_app(store, GateModel())
    async with client(app) as c:
        assert (await c.post("/v1/sessions", json={"id": "shared-name"}, headers=auth("acme"))).status_code == 201
        assert (await run(c, "shared-name", "acme secret")).status_code == 200
        for method, path in [("GET", "/v1/sessions/shared-name"), ("GET", "/v1/sessions/shared-name/messages"),
                             ("GET", "/v1/sessions/shared-name/traces"), ("DELETE", "/v1/sessions/shared-name")]:
            response = await c.request(method, path, headers=auth("globex"))
            assert response.status_code == 404, (method, path)
            assert "secret" not in response.text
        assert (await run(c, "shared-name", "steal", tenant="globex")).status_code == 404
        assert (await c.get("/v1/sessions", headers=auth("globex"))).json()["sessions"] == []
        # globex may have its own session of the same name; acme's is untouched.
        assert (await c.post("/v1/sessions", json={"id": "shared-name"}, headers=auth("globex"))).status_code == 201
        assert (await run(c, "shared-name", "globex turn", tenant="globex")).status_code == 200
        acme = (await c.get("/v1/sessions/shared-name/messages", headers=auth("acme"))).json()["messages"]
        assert [m["parts"][0]["text"] for m in acme] == ["acme secret", "reply 1 to acme secret"]
        globex = (await c.get("/v1/sessions/shared-name/messages", headers=auth("globex"))).json()["messages"]
        assert [m["parts"][0]["text"] for m in globex] == ["globex turn", "reply 2 to globex turn"]


@pytest.mark.parametrize(("method", "path", "body", "status", "needle"), [
    ("POST", "/v1/sessions", {"id": "bad id!"}, 400, "id: must be 1-200 characters"),
    ("GET", "/v1/sessions/bad%20id", None, 400, "invalid session id"),
    ("POST", "/v1/sessions", {"id": "ok", "colour": "red"}, 400, "colour"),
    ("POST", "/v1/sessions", {"ttl": -1}, 400, "ttl"),
    ("POST", "/v1/sessions/s1/runs", {"input": "   "}, 400, "input is empty"),
    ("POST", "/v1/sessions/s1/runs", {"input": []}, 400, "empty list"),
    ("POST", "/v1/sessions/s1/runs", {}, 400, "input"),
    ("POST", "/v1/sessions/s1/runs", {"input": "hi", "wait": -2}, 400, "wait"),
    ("POST", "/v1/sessions/s1/runs", {"input": [{"role": "assistant", "parts": [{"kind": "text", "text": "x"}]}]},
     400, "user messages"),
    ("POST", "/v1/sessions/s1/runs", {"input": [{"role": "user"}]}, 400, ""),
    ("GET", "/v1/sessions?limit=0", None, 400, "limit must be between 1 and 500"),
    ("GET", "/v1/sessions?limit=many", None, 400, "limit must be an integer"),
    ("GET", "/v1/sessions/s1/messages?before=-5", None, 400, "before"),
    ("PUT", "/v1/sessions", None, 405, "PUT"),
    ("GET", "/v1/sessions/s1/nothing", None, 404, "no such route"),
    ("POST", "/v1/ag-ui", {"threadId": "t"}, 400, "runId: Field required; messages: Field required"),
    ("POST", "/v1/ag-ui", {"threadId": "t", "runId": "r", "messages": [{"id": "m", "content": "hi"}]}, 400,
     "messages[0]: Unable to extract tag using discriminator 'role'"),
    ("POST", "/v1/sessions/s1/runs", {"input": 5}, 400, "input must be text, a list of user messages, or null"),
    ("POST", "/v1/sessions/s1/runs", {"input": [{"role": "user", "parts": [{"kind": "data", "media_type": "image/png",
                                                                          "data": "not base64"}]}]},
     400, "input[0].parts[0].data: must be standard base64"),
    ("POST", "/v1/sessions/s1/runs", {"input": [{"role": "user", "parts": []}]}, 400, "input[0].parts: List should"),
    ("POST", "/v1/sessions/s1/runs", {"input": "hi", "stream": "yes"}, 400, "stream: Input should be a valid boolean"),
    ("POST", "/v1/sessions/s1/runs", {"input": [{"role": "user", "parts": [{"kind": "text", "text": "x"}]}],
                                      "message_id": "m1"}, 400, "message_id names text input"),
    ("GET", "/v1/sessions?limit=5_0", None, 400, "limit must be an integer"),
])
async def test_bad_input_gets_a_clear_4xx(method: str, path: str, body: Any, status: int, needle: str) -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        response = await c.request(method, path, json=body, headers=auth())
        assert response.status_code == status, response.text
        assert needle in response.json()["error"]["message"]


async def test_bodies_that_are_not_json_or_too_large_are_refused() -> None:
    app = make_app(MemoryStore(), GateModel(), max_body_bytes=2048)
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        response = await c.post("/v1/sessions/s1/runs", content=b"{not json", headers=auth())
        assert (response.status_code, response.json()["error"]["type"]) == (400, "InvalidJSON")
        response = await c.post("/v1/sessions/s1/runs", content='{"input": "caf\xe9"}'.encode("latin-1"),
                                headers=auth())
        assert (response.status_code, response.json()["error"]["type"]) == (400, "InvalidJSON")
        assert "not UTF-8" in response.json()["error"]["message"]
        big = {"input": "x" * 5000}
        response = await c.post("/v1/sessions/s1/runs", json=big, headers=auth())
        assert response.status_code == 413

        async def chunks() -> Any:  # no Content-Length: the limit is counted while reading
            for _ in range(10):
                yield b" " * 1000

        response = await c.post("/v1/sessions/s1/runs", content=chunks(), headers=auth())
        assert response.status_code == 413
        assert (await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"] == []


async def test_paging_forward_from_any_sequence_returns_exactly_the_messages_above_it() -> None:
    """Every `after`, `before` and `limit` over a 14-message log, against the plain rule; then following to the end."""
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        path = "/v1/sessions/behind"
        assert (await c.post("/v1/sessions", json={"id": "behind"}, headers=auth())).status_code == 201
        for i in range(7):
            assert (await run(c, "behind", f"turn {i}")).status_code == 200
        last = 14
        for after in range(-1, last + 2):
            for before in [None, *range(0, last + 3)]:
                for limit in (1, 2, 3, 5, 20):
                    query = f"after={after}&limit={limit}" + (f"&before={before}" if before is not None else "")
                    page = (await c.get(f"{path}/messages?{query}", headers=auth())).json()
                    window = [seq for seq in range(1, last + 1) if seq > after and (before is None or seq < before)]
                    assert [m["seq"] for m in page["messages"]] == window[:limit], query
                    assert page["next_after"] == (window[limit - 1] if len(window) > limit else None), query
                    if window:  # older messages, before the page, are still there to page back to
                        assert page["has_more"] is (window[0] > 1), query
                        assert page["next_before"] == (window[0] if window[0] > 1 else None), query
        seen: list[int] = []
        after = 2  # a client that fell behind: it gets what followed, not the newest page
        while after is not None:
            page = (await c.get(f"{path}/messages?after={after}&limit=4", headers=auth())).json()
            seen += [m["seq"] for m in page["messages"]]
            after = page["next_after"]
        assert seen == list(range(3, last + 1))
        newest = (await c.get(f"{path}/messages?limit=4", headers=auth())).json()
        assert [m["seq"] for m in newest["messages"]] == [11, 12, 13, 14] and newest["next_after"] is None


async def test_ids_with_slashes_and_paging_through_messages_and_sessions() -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        sid = "alice/chat:1"
        path = "/v1/sessions/alice%2Fchat%3A1"
        assert (await c.post("/v1/sessions", json={"id": sid}, headers=auth())).json()["id"] == sid
        for i in range(7):
            assert (await c.post(f"{path}/runs", json={"input": f"turn {i}"}, headers=auth())).status_code == 200
        seen: list[int] = []
        before = None
        while True:
            query = "limit=4" + (f"&before={before}" if before is not None else "")
            page = (await c.get(f"{path}/messages?{query}", headers=auth())).json()
            seen = [m["seq"] for m in page["messages"]] + seen
            before = page["next_before"]
            if before is None:
                break
        assert seen == list(range(1, 15))
        after = (await c.get(f"{path}/messages?after=12", headers=auth())).json()["messages"]
        assert [m["seq"] for m in after] == [13, 14]
        for i in range(5):
            await c.post("/v1/sessions", json={"id": f"other-{i}"}, headers=auth())
        ids, cursor = [], None
        while True:
            query = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            listing = (await c.get("/v1/sessions", params=query, headers=auth())).json()
            ids += [s["id"] for s in listing["sessions"]]
            cursor = listing["next_cursor"]
            if cursor is None:
                break
        assert sorted(ids) == sorted([sid] + [f"other-{i}" for i in range(5)])
        found = (await c.get("/v1/sessions?q=ALICE&limit=1", headers=auth())).json()["sessions"]
        assert [s["id"] for s in found] == [sid]
        assert (await c.delete(path, headers=auth())).status_code == 204
        assert (await c.get(path, headers=auth())).status_code == 404
        assert (await c.delete(path, headers=auth())).status_code == 404


async def test_result_and_stream_carry_the_run() -> None:
    app = make_app(MemoryStore(), GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        result = (await run(c, "s1", "hello", traces=True)).json()
        assert result["text"] == "reply 1 to hello"
        assert (result["usage"]["input_tokens"], result["usage"]["output_tokens"]) == (10, 4)
        assert result["traces"][0]["tokens_by_source"]["input"] > 0
        streamed = await c.post("/v1/sessions/s1/runs", json={"input": "again"}, headers={
            **auth(), "Accept": "text/event-stream"})
        events = sse(streamed.text)
        names = [n for n, _ in events]
        assert names[-1] == "done"
        assert "".join(d["text"] for n, d in events if n == "text_delta") == "reply 2 to again "
        assert "step_persisted" in names
        traces = (await c.get("/v1/sessions/s1/traces", headers=auth())).json()["traces"]
        assert len(traces) == 2


async def test_a_second_run_on_a_busy_session_gets_409_or_waits() -> None:
    model = GateModel(gated=True)
    app = make_app(MemoryStore(), model)
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        first = asyncio.create_task(run(c, "s1", "first"))
        await model.entered.wait()
        busy = await run(c, "s1", "second")
        assert busy.status_code == 409
        assert busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["type"] == "SessionBusy"
        streamed = await c.post("/v1/sessions/s1/runs", json={"input": "second", "stream": True}, headers=auth())
        assert streamed.status_code == 409
        waiting = asyncio.create_task(run(c, "s1", "patient", wait=30))
        model.release.set()
        assert (await first).status_code == 200
        assert (await waiting).json()["text"] == "reply 2 to patient"
        texts = [m["parts"][0]["text"] for m in
                 (await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"]]
        assert texts == ["first", "reply 1 to first", "patient", "reply 2 to patient"]


async def test_a_retried_run_request_is_answered_once(tmp_path: Path) -> None:
    """Seed 001, the run lifecycle (``agent.run(messages)`` → ``session.touch_request_hash(messages)``
    first), over HTTP: a client retrying a POST .../runs with the same ``message_id`` (or the same
    ``Idempotency-Key``) gets the first result back, marked replayed, and the model is called once; the
    same id with other text is a 409. MAF (agent-framework#3657) answers each retry again."""
    model = GateModel()
    async with SQLiteStore(tmp_path / "serve.db") as store:
        app = make_app(store, model)
        async with client(app) as c:
            await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
            first = await run(c, "s1", "Weather in Suzhou?", message_id="client-msg-1")
            again = await run(c, "s1", "Weather in Suzhou?", message_id="client-msg-1")
            assert first.status_code == again.status_code == 200
            assert (first.json()["replayed"], again.json()["replayed"]) == (False, True)
            for field in ("text", "messages", "input", "stop_reason"):
                assert again.json()[field] == first.json()[field], field
            assert first.json()["input"][0]["id"] == "client-msg-1"

            conflict = await run(c, "s1", "Weather in Beijing?", message_id="client-msg-1")
            assert conflict.status_code == 409
            assert conflict.json()["error"]["type"] == "InputConflict"

            keyed = {**auth(), "Idempotency-Key": "order-42"}
            one = await c.post("/v1/sessions/s1/runs", json={"input": "And tomorrow?"}, headers=keyed)
            two = await c.post("/v1/sessions/s1/runs", json={"input": "And tomorrow?"}, headers=keyed)
            assert (one.json()["replayed"], two.json()["replayed"]) == (False, True)
            assert two.json()["text"] == one.json()["text"] == "reply 2 to And tomorrow?"
            # An id in the body names the input even when the header is sent too (some SDKs send one on
            # every request): here the first input's, so it is answered from the log.
            both = await c.post("/v1/sessions/s1/runs", json={"input": "Weather in Suzhou?",
                                                              "message_id": "client-msg-1"}, headers=keyed)
            listed = [{"role": "user", "parts": [{"kind": "text", "text": "Weather in Suzhou?"}], "id": "client-msg-1"}]
            by_id = await c.post("/v1/sessions/s1/runs", json={"input": listed}, headers=keyed)
            for replay in (both, by_id):
                assert replay.json()["replayed"] is True and replay.json()["text"] == first.json()["text"]
            assert model.calls == 2
            # A resume has no input message for the key to name, so the key could not stop a retried
            # resume from running again: it is refused, each time, and nothing runs.
            for _ in range(2):
                resume = await c.post("/v1/sessions/s1/runs", json={"input": None}, headers=keyed)
                assert (resume.status_code, resume.json()["error"]["type"]) == (409, "NotIdempotent")
                assert "send its input again with the same message id" in resume.json()["error"]["message"]

            assert model.calls == 2
            texts = [m["parts"][0]["text"] for m in
                     (await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"]]
            assert texts == ["Weather in Suzhou?", "reply 1 to Weather in Suzhou?", "And tomorrow?",
                             "reply 2 to And tomorrow?"]


async def test_a_run_whose_session_is_deleted_meanwhile_gets_410() -> None:
    model = GateModel(gated=True)
    app = make_app(MemoryStore(), model)
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        running = asyncio.create_task(run(c, "s1", "first"))
        await model.entered.wait()
        assert (await c.delete("/v1/sessions/s1", headers=auth())).status_code == 204
        model.release.set()
        gone = await running
        assert gone.status_code == 410  # not 409 with Retry-After: retrying cannot help
        assert "retry-after" not in gone.headers
        assert gone.json()["error"]["type"] == "LeaseLost"
        assert "was deleted while this run held its lease" in gone.json()["error"]["message"]
        assert (await c.get("/v1/sessions/s1", headers=auth())).status_code == 404


async def stream_until_started(base: str, model: GateModel) -> None:
    """Open a streamed run, wait until the model is called, then drop the connection."""
    async with httpx.AsyncClient(base_url=base) as c, c.stream(
            "POST", "/v1/sessions/s1/runs", json={"input": "going away", "stream": True}, headers=auth()) as response:
        assert response.status_code == 200
        await model.entered.wait()


async def wait_for_runs(app: Any) -> None:
    runs = app.state.api.runs
    while runs.runs:  # progress signal: the run's task leaves the set when it has finished
        await asyncio.wait([r.task for r in list(runs.runs)])


async def test_a_client_that_disconnects_does_not_lose_the_run(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    model = GateModel(gated=True)
    app = make_app(store, model)
    async with serving(app) as base:
        async with httpx.AsyncClient(base_url=base) as c:
            await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        await stream_until_started(base, model)
        await next(iter(app.state.api.runs.runs)).detached.wait()  # the server noticed the disconnect
        model.release.set()
        await wait_for_runs(app)
        page = await store.load("acme", "s1")
        assert [m.text for m in page.messages] == ["going away", "reply 1 to going away"]
        assert await store.try_acquire_lease("acme", "s1", "probe", 5) is not None
    await store.close()


async def test_disconnect_can_cancel_the_run_cleanly(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    model = GateModel(gated=True)
    app = make_app(store, model, on_disconnect="cancel")
    async with serving(app) as base:
        async with httpx.AsyncClient(base_url=base) as c:
            await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        await stream_until_started(base, model)
        await wait_for_runs(app)  # cancelled, not waiting for the model any more
        assert await store.try_acquire_lease("acme", "s1", "probe", 5) is not None
        assert not any(m.role == "assistant" for m in (await store.load("acme", "s1")).messages)
    await store.close()


async def test_draining_finishes_runs_in_flight_and_refuses_new_ones() -> None:
    store = MemoryStore()
    model = GateModel(gated=True)
    app = make_app(store, model)
    runs = app.state.api.runs
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        await c.post("/v1/sessions", json={"id": "s2"}, headers=auth())
        first = asyncio.create_task(run(c, "s1", "in flight"))
        await model.entered.wait()
        runs.begin_drain(60)
        refused = await run(c, "s2", "too late")
        assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
        assert (await c.get("/healthz")).status_code == 503
        drained = asyncio.create_task(runs.drain())
        model.release.set()
        assert await drained == 0
        assert (await first).json()["text"] == "reply 1 to in flight"


async def test_draining_past_the_deadline_cancels_and_releases_the_lease() -> None:
    store = MemoryStore()
    model = GateModel(gated=True)
    app = make_app(store, model)
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        first = asyncio.create_task(run(c, "s1", "stuck"))
        await model.entered.wait()
        assert await app.state.api.runs.drain(0) == 1
        response = await first
        assert response.status_code == 503
        assert await store.try_acquire_lease("acme", "s1", "probe", 5) is not None


async def test_agui_protocol_run() -> None:
    app = make_app(MemoryStore(), GateModel())
    body = {"threadId": "thread-1", "runId": "run-1", "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": [{"id": "u0", "role": "user", "content": "old"}, {"id": "a0", "role": "assistant",
                                                                            "content": "old reply"},
                         {"id": "u1", "role": "user", "content": "Hi there"}]}
    async with client(app) as c:
        response = await c.post("/v1/ag-ui", json=body, headers=auth())
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        types = [e["type"] for e in events]
        assert types[0] == "RUN_STARTED"
        assert types[-1] == "RUN_FINISHED"
        assert "TEXT_MESSAGE_START" in types
        assert types.index("TEXT_MESSAGE_END") > types.index("TEXT_MESSAGE_START")
        text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "reply 1 to Hi there "
        stored = (await c.get("/v1/sessions/thread-1/messages", headers=auth())).json()["messages"]
        assert [m["parts"][0]["text"] for m in stored] == ["Hi there", "reply 1 to Hi there"]
        # The same state sent again (a client's retry: message u1 again) is answered from the log, as text.
        retried = await c.post("/v1/ag-ui", json=body, headers=auth())
        events = [json.loads(line[6:]) for line in retried.text.splitlines() if line.startswith("data: ")]
        text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "reply 1 to Hi there" and events[-1]["type"] == "RUN_FINISHED"
        assert len((await c.get("/v1/sessions/thread-1/messages", headers=auth())).json()["messages"]) == 2


async def test_read_only_inspector_app(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    writer = SQLiteStore(path)
    app = make_app(writer, GateModel())
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        await run(c, "s1", "hello")
    await writer.close()
    os.chmod(path, 0o444)
    os.chmod(tmp_path, 0o555)  # not even a journal can be created next to it (for users other than root)
    try:
        store = SQLiteStore(path, read_only=True)
        ro = create_app(None, keys=app.state.api.keys, store=store, settings=ServeSettings(read_only=True))
        async with client(ro) as c:
            assert (await c.get("/v1/info", headers=auth())).json()["read_only"] is True
            assert [s["id"] for s in (await c.get("/v1/sessions", headers=auth())).json()["sessions"]] == ["s1"]
            assert len((await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"]) == 2
            assert len((await c.get("/v1/sessions/s1/traces", headers=auth())).json()["traces"]) == 1
            assert (await run(c, "s1", "write?")).status_code == 405
            assert (await c.delete("/v1/sessions/s1", headers=auth())).status_code == 405
            assert "post" not in (await c.get("/openapi.json")).json()["paths"]["/v1/sessions"]
        await store.close()
    finally:
        os.chmod(tmp_path, 0o755)


def test_openapi_describes_every_route() -> None:
    from contextpipe.serve._app import _ROUTES

    paths = openapi_schema()["paths"]
    for pattern, methods in _ROUTES:
        name = "{model}" if pattern[0] == "models" else "{session_id}"
        path = "/v1/" + "/".join(p if p is not None else name for p in pattern)
        assert path in paths, path
        assert {m.lower() for m in methods} <= set(paths[path]), path


def test_keys_are_stored_hashed_and_bad_entries_say_what_to_do(tmp_path: Path) -> None:
    key, line = new_key("acme")
    assert key not in line
    file = tmp_path / "keys.txt"
    file.write_text(f"# team keys\n{line}\n\n", encoding="utf-8")
    other_key, other_line = new_key("globex")
    keys = ApiKeys.load(file, environ={"CONTEXTPIPE_API_KEYS": other_line})
    assert (keys.tenant_for(key), keys.tenant_for(other_key), keys.tenant_for("cp_x")) == ("acme", "globex", None)
    from contextpipe import UsageError

    with pytest.raises(UsageError, match="new-key"):
        ApiKeys.parse("acme plaintext-key")
    with pytest.raises(UsageError, match="invalid tenant"):
        ApiKeys.parse("bad/tenant sha256:" + "0" * 64)
    with pytest.raises(UsageError, match="cannot read"):
        ApiKeys.load(tmp_path / "missing.txt", environ={})


def test_serving_stays_out_of_import_contextpipe_and_its_api_is_pinned() -> None:
    import subprocess
    import sys

    import contextpipe.serve

    code = ("import sys, contextpipe, contextpipe.cli\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'ag_ui') "
            "or m.startswith('contextpipe.serve')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert sorted(contextpipe.serve.__all__) == ["ApiKeys", "Grant", "OnDisconnect", "ServeSettings", "create_app",
                                                 "hash_key", "new_key"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(session_id=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:@/=+-]{0,40}\Z"))
async def test_every_valid_session_id_has_a_url(session_id: str) -> None:
    from urllib.parse import quote

    app = make_app(MemoryStore(), GateModel())
    path = "/v1/sessions/" + quote(session_id, safe="")
    async with client(app) as c:
        assert (await c.post("/v1/sessions", json={"id": session_id}, headers=auth())).status_code == 201
        assert (await c.post(f"{path}/runs", json={"input": "hi"}, headers=auth())).status_code == 200
        assert (await c.get(path, headers=auth())).json()["id"] == session_id
        assert len((await c.get(f"{path}/messages", headers=auth())).json()["messages"]) == 2
        assert (await c.delete(path, headers=auth())).status_code == 204


async def test_cors_lets_only_the_configured_origins_call_the_api() -> None:
    app = make_app(MemoryStore(), GateModel(), cors_origins=("https://app.example.com",))
    async with client(app) as c:
        preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization,content-type"}
        allowed = await c.options("/v1/ag-ui", headers=preflight)
        assert allowed.headers["access-control-allow-origin"] == "https://app.example.com"
        other = await c.options("/v1/ag-ui", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        listed = await c.get("/v1/sessions", headers={**auth(), "Origin": "https://app.example.com"})
        assert listed.headers["access-control-allow-origin"] == "https://app.example.com"
    plain = make_app(MemoryStore(), GateModel())
    async with client(plain) as c:
        response = await c.get("/v1/sessions", headers={**auth(), "Origin": "https://app.example.com"})
        assert "access-control-allow-origin" not in response.headers


async def test_agui_events_are_valid_protocol_events_with_tool_calls() -> None:
    import pydantic
    from ag_ui import core

    from contextpipe import Agent
    from contextpipe.providers import History
    from contextpipe.testing import ScriptedModel, tool_call
    from helpers import lookup_location_code

    store = MemoryStore()
    agent = Agent(ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "Suzhou is SZ."]),
                  providers=[History(store)], tools=[lookup_location_code])
    app = create_app(agent, keys=make_app(store, GateModel()).state.api.keys)
    body = {"threadId": "t-tools", "runId": "r-1", "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": [{"id": "u1", "role": "user", "content": "Code for Suzhou?"}]}
    async with client(app) as c:
        response = await c.post("/v1/ag-ui", json=body, headers=auth())
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(core.Event)
    events = [adapter.validate_json(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    types = [e.type.value for e in events]
    start = types.index("TOOL_CALL_START")
    assert types[start:start + 4] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    call_ids = {e.tool_call_id for e in events[start:start + 4]}
    assert len(call_ids) == 1
    assert events[start + 3].content == "SZ"
    assert types[-1] == "RUN_FINISHED"
    assert events[-1].thread_id == "t-tools"
    assert events[-1].run_id == "r-1"
