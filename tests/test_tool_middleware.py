"""Tool middleware from context providers (issue 31, item 8), written from seed 004.

Seed 004 (``004_c7551522d2c48d8a.txt``, the note after the Python ``UserPreferenceProvider``):
"Penyedia konteks juga dapat menambahkan middleware percakapan atau fungsi untuk pemanggilan saat
ini dengan memanggil context.extend_middleware(self.source_id, middleware). Agen mengharmonisasi
penambahan tersebut dengan context.get_middleware() dan menerapkannya sesuai urutan penyedia
sebelum memanggil klien obrolan." A context provider may add chat *or function* middleware for the
current invocation, attributed to its ``source_id``, applied in provider order. In contextpipe:
``ctx.add_tool_middleware(...)`` from ``before_run``; every test runs through ``Agent.run`` with
``History`` on SQLite and on the in-memory store, and reads back what the session stored.
A middleware that fails, a call run again on resume, and any stack of middleware:
``test_tool_middleware_failures.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from contextpipe import (
    Agent,
    Durability,
    ToolCallFinished,
    tool,
)
from contextpipe.models import CallModel, ModelMiddleware, ModelRequest, ModelResponse
from contextpipe.providers import History
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.stores.base import SessionStore
from contextpipe.telemetry import Telemetry
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.tools import CallTool, ToolInvocation, ToolMiddleware, ToolOutcome
from helpers import MiddlewareProvider, results, stored

INSTRUCTIONS = "You are a helpful assistant."  # seed 004's agent


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    made: SessionStore = SQLiteStore(tmp_path / "agent.db") if request.param == "sqlite" else MemoryStore()
    async with made:
        yield made




async def test_middleware_changes_the_arguments_the_tool_gets(store: SessionStore) -> None:
    """Seed 004, function middleware added by a provider: it sees the call and changes its arguments.

    The tool runs with the changed arguments; the model and the stored log see that result; the
    trace says the provider's middleware changed the arguments.
    """
    seen: list[str] = []

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        seen.append(city)
        return {"Suzhou": "SZ"}.get(city, "unknown")

    async def title_case(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        args = call.parsed_arguments()
        if args is not None and isinstance(args.get("city"), str):
            call = call.with_arguments({**args, "city": args["city"].title()})
        return await call_next(call)

    model = ScriptedModel([tool_call("lookup_location_code", city="suzhou"), "Suzhou is SZ."])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[lookup_location_code],
                  providers=[History(store), MiddlewareProvider("normalise", title_case)])
    result = await agent.run("Code for suzhou?", session=await agent.session("mw-args"))

    assert seen == ["Suzhou"]
    assert results(result.messages) == [("call_1", "SZ", False)]
    assert results(list(model.requests[1].messages)) == [("call_1", "SZ", False)]
    assert await stored(store, "mw-args") == [("call_1", "SZ", False)]
    (traced,) = result.traces[0].tool_calls
    assert [(m.source_id, m.actions) for m in traced.middleware] == [("normalise", ("changed_arguments",))]
    # The model's own call is what the log keeps: the change is the middleware's, recorded on the trace.
    assert json.loads(result.messages[0].function_calls[0].arguments) == {"city": "suzhou"}


async def test_middleware_blocks_a_call_without_running_the_tool(store: SessionStore) -> None:
    """Seed 004, function middleware: a provider's middleware answers a call itself (blocks it).

    The tool does not run; the model reads the middleware's result; the log stores it, so a later
    run on the session sees the same answer; the trace says the call was blocked.
    """
    sent: list[str] = []

    @tool
    def send_email(to: str, text: str) -> str:
        """Send an email."""
        sent.append(to)
        return "sent"

    async def no_external_mail(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        args = call.parsed_arguments() or {}
        if call.name == "send_email" and not str(args.get("to", "")).endswith("@example.com"):
            return ToolOutcome("Refused: mail may only go to example.com addresses.", is_error=True)
        return await call_next(call)

    model = ScriptedModel([
        tool_call("send_email", to="eve@elsewhere.org", text="Hi") + tool_call("send_email", to="bob@example.com",
                                                                               text="Hi"),
        "I could only email Bob.",
    ])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[send_email],
                  providers=[History(store), MiddlewareProvider("mail-policy", no_external_mail)])
    result = await agent.run("Email Eve and Bob.", session=await agent.session("mw-block"))

    assert sent == ["bob@example.com"]
    expected = {("call_1", "Refused: mail may only go to example.com addresses.", True), ("call_2", "sent", False)}
    assert set(results(result.messages)) == expected
    assert set(results(list(model.requests[1].messages))) == expected
    assert set(await stored(store, "mw-block")) == expected
    by_id = {c.call_id: c for c in result.traces[0].tool_calls}
    assert by_id["call_1"].blocked and by_id["call_1"].is_error
    assert by_id["call_1"].middleware[0].actions == ("blocked",)
    assert not by_id["call_2"].blocked and by_id["call_2"].middleware[0].actions == ()


async def test_middleware_replaces_the_result(store: SessionStore) -> None:
    """Seed 004, function middleware: a provider's middleware runs the tool and replaces its result.

    What the middleware returned, not what the tool returned, reaches the model and the stored log.
    """

    @tool
    def get_weather_forecast(location_code: str) -> str:
        """Return the weather forecast for a location code."""
        return "Sunny, 25 C, NW wind 4."

    async def house_style(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        outcome = await call_next(call)
        return ToolOutcome("Forecast unavailable in this region.", is_error=True) if call.name.startswith(
            "get_weather") else outcome

    model = ScriptedModel([tool_call("get_weather_forecast", location_code="SZ"), "No forecast, sorry."])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[get_weather_forecast],
                  providers=[History(store), MiddlewareProvider("regional", house_style)])
    result = await agent.run("Weather in Suzhou?", session=await agent.session("mw-replace"))

    expected = [("call_1", "Forecast unavailable in this region.", True)]
    assert results(result.messages) == expected
    assert results(list(model.requests[1].messages)) == expected
    assert await stored(store, "mw-replace") == expected
    assert result.traces[0].tool_calls[0].middleware[0].actions == ("changed_result",)


async def test_middleware_post_processes_the_result(store: SessionStore) -> None:
    """Seed 004, function middleware: a provider's middleware post-processes the tool's result (redacts it)."""

    @tool
    def lookup_account(user: str) -> str:
        """Return a user's account record."""
        return f"user={user} card=4111-1111-1111-1111 plan=pro"

    async def redact_cards(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        outcome = await call_next(call)
        return ToolOutcome(outcome.result.replace("4111-1111-1111-1111", "[card]"), outcome.is_error, outcome.parts)

    model = ScriptedModel([tool_call("lookup_account", user="alice"), "Alice is on the pro plan."])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[lookup_account],
                  providers=[History(store), MiddlewareProvider("redact", redact_cards)])
    result = await agent.run("Which plan is Alice on?", session=await agent.session("mw-post"))

    expected = [("call_1", "user=alice card=[card] plan=pro", False)]
    assert results(result.messages) == expected
    assert await stored(store, "mw-post") == expected
    assert all("4111" not in r.result for m in model.requests[1].messages for r in m.function_results)
    assert result.traces[0].tool_calls[0].middleware[0].actions == ("changed_result",)


async def test_two_providers_middleware_run_in_provider_order(store: SessionStore) -> None:
    """Seed 004: the agent applies the providers' middleware "sesuai urutan penyedia" (in provider order).

    As for model middleware, the first provider's middleware is outermost: it sees the call first
    and the result last, and its change of the arguments is what the second one sees.
    """
    events: list[str] = []

    @tool
    def echo(text: str) -> str:
        """Echo the text."""
        events.append(f"tool:{text}")
        return text

    def tagging(tag: str) -> ToolMiddleware:
        async def mw(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
            args = call.parsed_arguments() or {}
            events.append(f"{tag}:in:{args['text']}")
            outcome = await call_next(call.with_arguments({"text": f"{args['text']}+{tag}"}))
            events.append(f"{tag}:out:{outcome.result}")
            return ToolOutcome(f"{outcome.result}<{tag}")

        return mw

    def model_tagging(tag: str) -> ModelMiddleware:
        async def mw(request: ModelRequest, call_next: CallModel) -> ModelResponse:
            events.append(f"model:{tag}")
            return await call_next(request)

        return mw

    model = ScriptedModel([tool_call("echo", text="x"), "done"])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[echo], providers=[
        History(store), MiddlewareProvider("first", tagging("A"), model_tagging("A")),
        MiddlewareProvider("second", tagging("B"), model_tagging("B"))])
    result = await agent.run("Echo x.", session=await agent.session("mw-order"))

    assert events == ["model:A", "model:B",  # model middleware: the first provider's is outermost
                      "A:in:x", "B:in:x+A", "tool:x+A+B", "B:out:x+A+B", "A:out:x+A+B<B",
                      "model:A", "model:B"]
    assert results(result.messages) == [("call_1", "x+A+B<B<A", False)]
    assert await stored(store, "mw-order") == [("call_1", "x+A+B<B<A", False)]
    assert [(m.source_id, m.actions) for m in result.traces[0].tool_calls[0].middleware] == [
        ("first", ("changed_arguments", "changed_result")), ("second", ("changed_arguments", "changed_result"))]


async def test_trace_records_which_middleware_touched_which_call(store: SessionStore) -> None:
    """Seed 004: middleware is added "dengan memanggil context.extend_middleware(self.source_id, middleware)",
    attributed to the provider; the trace records, per call, which provider's middleware saw it and what it did.

    The record is on the trace of the model call that asked for the calls, in its JSON form (as stored with the
    session) and in its table; an outer middleware that blocks a call keeps it from the inner ones.
    """

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        return {"Suzhou": "SZ", "Beijing": "BJ"}[city]

    async def guard(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        if (call.parsed_arguments() or {}).get("city") == "Beijing":
            return ToolOutcome("Not today.", is_error=True)
        return await call_next(call)

    async def audit(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        return await call_next(call)

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou")
                           + tool_call("lookup_location_code", city="Beijing"), "SZ, and no code for Beijing."])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[lookup_location_code],
                  providers=[History(store), MiddlewareProvider("guard", guard), MiddlewareProvider("audit", audit)],
                  durability=Durability(store_traces=True))
    result = await agent.run("Codes for Suzhou and Beijing?", session=await agent.session("mw-trace"))

    first, second = result.traces
    assert second.tool_calls == ()
    by_id = {c.call_id: c for c in first.tool_calls}
    assert [(m.source_id, m.actions) for m in by_id["call_1"].middleware] == [("guard", ()), ("audit", ())]
    assert [(m.source_id, m.actions) for m in by_id["call_2"].middleware] == [("guard", ("blocked",))]
    assert (by_id["call_1"].step, by_id["call_1"].name, by_id["call_1"].is_error) == (1, "lookup_location_code",
                                                                                      False)
    assert "tool call lookup_location_code (call_2): guard blocked" in first.table()
    assert "tool call lookup_location_code (call_1): guard passed; audit passed" in first.table()
    (saved, _) = await store.load_traces("default", "mw-trace")
    entry = {c["call_id"]: c for c in saved["tool_calls"]}["call_2"]
    assert entry["middleware"] == [{"source_id": "guard", "actions": ["blocked"]}]
    assert entry["step"] == 1 and entry["is_error"] is True


async def test_contextpipe_inspect_shows_what_tool_middleware_did(tmp_path: Path) -> None:
    """Seed 004's function middleware, attributed to its provider's ``source_id``: the stored trace that
    ``contextpipe inspect`` reads says which provider's middleware blocked which call.
    """

    @tool
    def send_email(to: str, text: str) -> str:
        """Send an email."""
        raise AssertionError("never run")

    async def no_mail(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        return ToolOutcome("Refused.", is_error=True)

    db = tmp_path / "agent.db"
    async with SQLiteStore(db) as store:
        agent = Agent(ScriptedModel([tool_call("send_email", to="bob@example.com", text="Hi"), "Refused."]),
                      tools=[send_email], providers=[History(store), MiddlewareProvider("mail-policy", no_mail)],
                      durability=Durability(store_traces=True))
        await agent.run("Email Bob.", session=await agent.session("mw-inspect"))
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "contextpipe.cli", "inspect", "mw-inspect", "--db", str(db), "--call", "1",
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    shown, _ = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0
    assert "tool call send_email (call_1): mail-policy blocked" in shown.decode()


async def test_a_streamed_run_reports_and_traces_what_the_middleware_returned(store: SessionStore) -> None:
    """Seed 004's function middleware in a streamed run: the `ToolCallFinished` event carries the result the
    middleware returned (the one stored), and the call's ``execute_tool`` span covers the middleware, so a
    blocked call has a span too, with the middleware's result.
    """

    @tool
    def delete_everything() -> str:
        """Delete every record."""
        raise AssertionError("never run")

    async def refuse_deletes(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        if call.name.startswith("delete"):
            return ToolOutcome("Refused: deletes need a person's approval.", is_error=True)
        return await call_next(call)

    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedModel([tool_call("delete_everything"), "I may not delete."])
    agent = Agent(model, tools=[delete_everything], providers=[History(store), MiddlewareProvider("guard",
                                                                                                  refuse_deletes)],
                  telemetry=Telemetry(tracer_provider=tracer, capture_content=True))
    finished: list[str] = []
    async with agent.stream("Delete everything.", session=await agent.session("mw-stream")) as events:
        async for event in events:
            if isinstance(event, ToolCallFinished):
                finished.append(event.result.result)
    tracer.shutdown()

    assert finished == ["Refused: deletes need a person's approval."]
    assert await stored(store, "mw-stream") == [("call_1", "Refused: deletes need a person's approval.", True)]
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool delete_everything"]
    assert span.attributes is not None
    assert span.attributes["gen_ai.tool.call.result"] == "Refused: deletes need a person's approval."
    assert span.status.status_code == StatusCode.ERROR
