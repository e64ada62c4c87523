"""Cancel and export over real HTTP: stop a session's run at a safe point; take a whole session away."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx2 as httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from contextpipe import Agent, Durability, Message, Session, tool
from contextpipe.codec import message_from_dict
from contextpipe.exchanges import exchange_problem
from contextpipe.messages import FunctionCall, FunctionResult, TextPart
from contextpipe.providers import History
from contextpipe.serve import ServeSettings, create_app
from contextpipe.serve._session_tools import transcript
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call

from .conftest import auth, keys, serving
from .test_http import sse
from .test_input import POISON


class Gate:
    """A tool that waits for `release`; `entered` is set once it runs (the test's progress signal)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

        @tool
        async def slow_lookup(city: str) -> str:
            """Look a city up (slowly)."""
            self.entered.set()
            await self.release.wait()
            return f"code of {city}"

        self.tool = slow_lookup


def gated_app(store: SQLiteStore, *replies: Any, **settings: Any) -> tuple[Any, Gate, ScriptedModel]:
    gate = Gate()
    model = ScriptedModel([tool_call("slow_lookup", city="Suzhou", call_id="c1"), *replies])
    agent = Agent(model, tools=[gate.tool], providers=[History(store)], durability=Durability(store_traces=True))
    return create_app(agent, keys=keys(), settings=ServeSettings(**settings)), gate, model


async def cancel(c: httpx.AsyncClient, session: str = "s1") -> httpx.Response:
    return await c.post(f"/v1/sessions/{session}/cancel", headers=auth())


async def test_cancel_stops_a_streamed_run_in_a_tool_and_keeps_its_history_valid(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        app, gate, model = gated_app(store, "Suzhou is 0512.", "You asked about Suzhou.")
        async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
            await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
            async with c.stream("POST", "/v1/sessions/s1/runs", json={"input": "Code of Suzhou?", "stream": True},
                                headers=auth()) as streamed:
                await gate.entered.wait()
                answer = await cancel(c)
                assert answer.status_code == 202, answer.text
                assert answer.json() == {"cancelled": True, "run_id": streamed.headers["x-run-id"]}
                events = sse((await streamed.aread()).decode())
            name, data = events[-1]
            assert (name, data["error"]["type"], data["error"]["reason"]) == ("error", "Cancelled", "request")
            assert data["error"]["run_id"] == answer.json()["run_id"]
            assert "cancel request" in data["error"]["message"]
            assert "done" not in [n for n, _ in events]

            # What it stored stays: the input and the model's call; the call it stopped is answered by the
            # next run (the log's repair), so no model ever sees it unanswered.
            stored = (await store.load("acme", "s1")).messages
            assert [m.role for m in stored] == ["user", "assistant"]
            assert [c.call_id for c in stored[1].function_calls] == ["c1"]
            lease = await store.try_acquire_lease("acme", "s1", "probe", 5)
            assert lease is not None  # the run gave its lease back
            await store.release_lease(lease)

            nothing = await cancel(c)
            assert (nothing.status_code, nothing.json()["error"]["type"]) == (404, "NoRunInFlight")
            assert "nothing runs on session 's1' in this server process" in nothing.json()["error"]["message"]
            assert "--workers" in nothing.json()["error"]["message"]

            again = await c.post("/v1/sessions/s1/runs", json={"input": "And now?"}, headers=auth())
            assert again.status_code == 200, again.text
            sent = model.requests[-1].messages
            assert exchange_problem(sent) is None and [m.role for m in sent] == ["user", "assistant", "tool", "user"]
            answered = sent[2].function_results[0]
            assert (answered.call_id, answered.is_error) == ("c1", True)
            assert "interrupted" in answered.result
            assert exchange_problem((await store.load("acme", "s1")).messages) is None


async def test_cancel_answers_an_awaited_run_409_cancelled(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        app, gate, _ = gated_app(store, "never said")
        async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
            await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
            running = asyncio.create_task(c.post("/v1/sessions/s1/runs", json={"input": "Code?"}, headers=auth()))
            await gate.entered.wait()
            answer = await cancel(c)
            assert answer.status_code == 202
            ended = await running
            assert ended.status_code == 409
            assert ended.json()["error"] | {"message": ""} == {"type": "Cancelled", "reason": "request", "message": "",
                                                              "run_id": answer.json()["run_id"]}
            assert [m.role for m in (await store.load("acme", "s1")).messages] == ["user", "assistant"]


async def test_cancel_tells_a_run_elsewhere_from_none_and_is_refused_where_it_cannot_write(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        app, _, _ = gated_app(store)
        async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
            await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
            other_worker = await store.acquire_lease("acme", "s1", "a run on another worker", ttl=30)
            elsewhere = await cancel(c)
            assert (elsewhere.status_code, elsewhere.json()["error"]["type"]) == (409, "RunElsewhere")
            assert "not in this server process" in elsewhere.json()["error"]["message"]
            assert elsewhere.headers["retry-after"] == "1"
            await store.renew_lease(other_worker)  # the cancel's look did not take the lease from its holder
            await store.release_lease(other_worker)
            assert (await cancel(c)).json()["error"]["type"] == "NoRunInFlight"
            unknown = await cancel(c, "nope")
            assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "NotFound")
            other_tenant = await c.post("/v1/sessions/s1/cancel", headers=auth("globex"))
            assert (other_tenant.status_code, other_tenant.json()["error"]["type"]) == (404, "NotFound")
        inspector = create_app(None, keys=keys(), store=store, settings=ServeSettings(read_only=True))
        async with serving(inspector) as base, httpx.AsyncClient(base_url=base) as c:
            assert (await cancel(c)).status_code == 405


async def filled(tmp_path: Path) -> tuple[SQLiteStore, Any]:
    """A store holding session s1 (a tool exchange, plain turns, a poisoned message) and the app serving it."""
    store = SQLiteStore(tmp_path / "s.db")
    app, gate, _ = gated_app(store, "Suzhou is 0512.", "fine", "a reply")
    gate.release.set()
    agent = app.state.api.agent
    session = await agent.session("s1", tenant="acme")
    await agent.run("Code of Suzhou?", session=session)
    await agent.run("```python\nprint('an unclosed fence')", session=session)
    await agent.run([Message.user(POISON, metadata={"score": float("nan")})], session=session)
    return store, app


async def test_export_json_is_the_session_its_messages_and_traces(tmp_path: Path) -> None:
    store, app = await filled(tmp_path)
    async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
        exported = await c.get("/v1/sessions/s1/export", headers=auth())
        assert exported.status_code == 200, exported.text
        assert exported.headers["content-disposition"] == 'attachment; filename="s1.json"'
        assert exported.headers["content-type"] == "application/json"
        body = exported.json()
        assert set(body) == {"session", "messages", "traces"}
        assert body["session"] == (await c.get("/v1/sessions/s1", headers=auth())).json()
        page = (await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"]
        assert body["messages"] == page
        assert body["traces"] == (await c.get("/v1/sessions/s1/traces", headers=auth())).json()["traces"]
        stored = (await store.load("acme", "s1")).messages
        assert [m["seq"] for m in body["messages"]] == list(range(1, len(stored) + 1)) and len(stored) == 8
        clean = [message_from_dict(m) for m in body["messages"] if "repaired" not in m]
        assert clean == [m for m in stored if POISON not in m.text]  # the round trip loses nothing else
        assert [m["parts"][0].get("text") for m in body["messages"][-2:]] == ["hi \ufffd there", "a reply"]
        assert "lone surrogates" in body["messages"][-2]["repaired"]
        same = await c.get("/v1/sessions/s1/export?format=json", headers=auth())
        assert same.content == exported.content
    await store.close()


async def test_export_json_reads_a_long_log_whole(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        await store.append("acme", "long", [Message.user(f"m{i}") for i in range(2345)])
        app, _, _ = gated_app(store)
        async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
            body = (await c.get("/v1/sessions/long/export", headers=auth())).json()
    assert [m["parts"][0]["text"] for m in body["messages"]] == [f"m{i}" for i in range(2345)]
    assert [m["seq"] for m in body["messages"]] == list(range(1, 2346))


async def test_export_markdown_is_a_transcript_of_every_message(tmp_path: Path) -> None:
    store, app = await filled(tmp_path)
    async with serving(app) as base, httpx.AsyncClient(base_url=base) as c:
        exported = await c.get("/v1/sessions/s1/export?format=markdown", headers=auth())
        assert exported.status_code == 200, exported.text
        assert exported.headers["content-type"] == "text/markdown; charset=utf-8"
        assert exported.headers["content-disposition"] == 'attachment; filename="s1.md"'
        text = exported.text
        bad = await c.get("/v1/sessions/s1/export?format=pdf", headers=auth())
        assert (bad.status_code, bad.json()["error"]["type"]) == (400, "BadRequest")
        assert "json, markdown" in bad.json()["error"]["message"]
        assert (await c.get("/v1/sessions/nope/export", headers=auth())).status_code == 404
    stored = (await store.load("acme", "s1")).messages
    assert text.startswith("# Session `s1`\n") and "- created: 20" in text and "- messages: 8" in text
    tokens = MarkdownIt("commonmark").parse(text)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h3"
                and t.level == 0]
    assert headings == [f"{m.role} · seq {seq}" for seq, m in enumerate(stored, 1)]
    fences = [t.content for t in tokens if t.type == "fence"]
    assert fences[:2] == [json.dumps({"city": "Suzhou"}, indent=2) + "\n", "code of Suzhou\n"]
    assert "Tool call `slow_lookup` (call `c1`):" in text and "Tool result for call `c1`:" in text
    for m in stored:  # each message's text is in the transcript (the unclosed fence quoted, closed with it)
        assert m.text.replace(POISON, "hi \ufffd there").replace("\n", "\n> ") in text
    assert "lone surrogates" in text
    await store.close()


MARKDOWN = st.lists(st.sampled_from([*"`~<>#*_-=+|!&[]()\\:. \t\n\raZ0", "```", "~~~", "<pre>", "<!--", "    ",
                                     "### user · seq 1", "\n\n", "- ", "1. ", "> "]), max_size=20).map("".join)
"""Text made of what Markdown gives a meaning: fences, HTML, headings, lists, quotes, blank lines."""


def message(draw: st.DrawFn, role: str) -> Message:
    if role == "assistant" and draw(st.booleans()):
        return Message(role, (TextPart(draw(MARKDOWN)), FunctionCall(draw(MARKDOWN), draw(MARKDOWN), draw(MARKDOWN))))
    if role == "tool":
        return Message(role, (FunctionResult(draw(MARKDOWN), draw(MARKDOWN), draw(st.booleans())),))
    return Message(role, (TextPart(draw(MARKDOWN)),), author_name=draw(st.none() | MARKDOWN))  # type: ignore[arg-type]


@st.composite
def logs(draw: st.DrawFn) -> list[Message]:
    roles = draw(st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), max_size=6))
    return [message(draw, role) for role in roles]


@given(logs())
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_stored_text_breaks_the_transcripts_structure(messages: list[Message]) -> None:
    """Whatever the messages hold, a CommonMark reader sees each message's heading, and each call's
    arguments and each result in a fence of its own, whole."""
    text = transcript(Session("s1", "acme"), list(enumerate(messages, 1)), None)
    tokens = MarkdownIt("commonmark").parse(text)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h3"
                and t.level == 0]
    assert headings == [f"{m.role} · seq {seq}" for seq, m in enumerate(messages, 1)]
    fenced = []
    for m in messages:
        for call in m.function_calls:
            try:
                fenced.append(json.dumps(json.loads(call.arguments), indent=2, ensure_ascii=False))
            except ValueError:
                fenced.append(call.arguments)
        fenced += [r.result for r in m.function_results]
    normal = [re.sub("\r\n?", "\n", f) + "\n" for f in fenced]
    assert [t.content for t in tokens if t.type == "fence" and t.level == 0] == normal
