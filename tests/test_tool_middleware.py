"""Tool middleware from context providers (issue 31, item 8), written from seed 004.

Seed 004 (``004_c7551522d2c48d8a.txt``, the note after the Python ``UserPreferenceProvider``):
"Penyedia konteks juga dapat menambahkan middleware percakapan atau fungsi untuk pemanggilan saat
ini dengan memanggil context.extend_middleware(self.source_id, middleware). Agen mengharmonisasi
penambahan tersebut dengan context.get_middleware() dan menerapkannya sesuai urutan penyedia
sebelum memanggil klien obrolan." A context provider may add chat *or function* middleware for the
current invocation, attributed to its ``source_id``, applied in provider order. In contextpipe:
``ctx.add_tool_middleware(...)`` from ``before_run``; every test runs through ``Agent.run`` with
``History`` on SQLite and on the in-memory store, and reads back what the session stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from contextpipe import (
    Agent,
    ContextProvider,
    Durability,
    Message,
    RunContext,
    RunResult,
    ToolCallFinished,
    ToolMiddlewareError,
    tool,
)
from contextpipe.models import CallModel, ModelMiddleware, ModelRequest, ModelResponse
from contextpipe.providers import History
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.stores.base import SessionStore
from contextpipe.telemetry import Telemetry
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.tools import CallTool, ToolInvocation, ToolMiddleware, ToolOutcome

INSTRUCTIONS = "You are a helpful assistant."  # seed 004's agent


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    made: SessionStore = SQLiteStore(tmp_path / "agent.db") if request.param == "sqlite" else MemoryStore()
    async with made:
        yield made


class MiddlewareProvider(ContextProvider):
    """A provider whose ``before_run`` adds one tool middleware (and, when given, one model middleware)."""

    def __init__(self, source_id: str, middleware: ToolMiddleware,
                 model_middleware: ModelMiddleware | None = None) -> None:
        super().__init__(source_id)
        self.middleware = middleware
        self.model_middleware = model_middleware

    async def before_run(self, ctx: RunContext) -> None:
        ctx.add_tool_middleware(self.middleware)
        if self.model_middleware is not None:
            ctx.add_middleware(self.model_middleware)


def results(messages: list[Message]) -> list[tuple[str, str, bool]]:
    return [(r.call_id, r.result, r.is_error) for m in messages for r in m.function_results]


async def stored(store: SessionStore, session_id: str) -> list[tuple[str, str, bool]]:
    """The results the session's log holds, read by a fresh agent (what a resumed run would see)."""
    reader = Agent(ScriptedModel(), providers=[History(store)])
    return results(await reader.history(await reader.session(session_id)))


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


async def test_middleware_runs_again_around_an_idempotent_call_rerun_on_resume(store: SessionStore) -> None:
    """Seed 004's function middleware with the durable tool loop: a run is cut while an idempotent tool
    runs; the next run runs the call again through the middleware (told it is a re-run), and stores what
    the middleware returned.
    """
    running = asyncio.Event()
    calls = 0

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        nonlocal calls
        calls += 1
        if calls == 1:  # the first time, hang until the run is cut
            running.set()
            await asyncio.Event().wait()
        return f"Sunny in {city}"

    seen: list[tuple[str, bool]] = []

    async def label(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        seen.append((call.call_id, call.resumed))
        outcome = await call_next(call)
        return ToolOutcome(f"{outcome.result} (checked)")

    model = ScriptedModel([tool_call("get_forecast", city="Suzhou"), "It is sunny."])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[get_forecast],
                  providers=[History(store), MiddlewareProvider("label", label)])
    session = await agent.session("mw-resume")
    run = asyncio.create_task(agent.run("Forecast for Suzhou?", session=session))
    started = asyncio.create_task(running.wait())
    await asyncio.wait({run, started}, return_when=asyncio.FIRST_COMPLETED)
    if run.done():  # the run failed before the tool started: show why instead of waiting forever
        started.cancel()
        run.result()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await stored(store, "mw-resume") == []

    result = await agent.run(None, session=session)

    assert seen == [("call_1", False), ("call_1", True)]
    assert await stored(store, "mw-resume") == [("call_1", "Sunny in Suzhou (checked)", False)]
    assert results(list(model.requests[1].messages)) == [("call_1", "Sunny in Suzhou (checked)", False)]
    (traced,) = result.traces[0].tool_calls
    assert traced.resumed and traced.step == 0
    assert traced.middleware[0].actions == ("changed_result",)


async def test_a_middleware_that_raises_fails_the_run_with_every_call_answered(store: SessionStore) -> None:
    """Seed 004's function middleware, when it fails: the run raises `ToolMiddlewareError` naming the provider,
    after every call of the step has a stored result (the failed one an error saying whether the tool ran), so
    the next run on the session goes on from a consistent log.
    """
    ran: list[str] = []

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        ran.append(city)
        return {"Suzhou": "SZ", "Beijing": "BJ"}[city]

    async def broken(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        outcome = await call_next(call)
        if "Beijing" in call.arguments:
            raise KeyError("quota")
        return outcome

    async def outer(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        return await call_next(call)  # passes the inner one's exception on: the inner one is named

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou")
                           + tool_call("lookup_location_code", city="Beijing")])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[lookup_location_code],
                  providers=[History(store), MiddlewareProvider("outer", outer), MiddlewareProvider("quota", broken)])
    session = await agent.session("mw-raise")
    with pytest.raises(ToolMiddlewareError) as info:
        await agent.run("Codes for Suzhou and Beijing?", session=session)

    error = info.value
    assert (error.source_id, error.tool_name, error.call_id) == ("quota", "lookup_location_code", "call_2")
    assert isinstance(error.__cause__, KeyError)
    assert "context provider 'quota' raised KeyError" in str(error) and "the tool had run" in str(error)
    assert sorted(ran) == ["Beijing", "Suzhou"]
    log = {cid: (text, is_error) for cid, text, is_error in await stored(store, "mw-raise")}
    assert log["call_1"] == ("SZ", False)
    assert log["call_2"][1] is True and "a tool middleware failed (the tool had run" in log["call_2"][0]

    # The next run sends a complete exchange: both calls answered, nothing to repair.
    model.enqueue("SZ; Beijing's code is unknown.")
    again = await Agent(model, instructions=INSTRUCTIONS, tools=[lookup_location_code],
                        providers=[History(store)]).run("And now?", session=session)
    assert again.text == "SZ; Beijing's code is unknown."
    assert all(c.action != "repaired_log" for c in again.traces[0].changes)


async def test_a_middleware_must_keep_the_tool_name_and_return_an_outcome(store: SessionStore) -> None:
    """Seed 004's function middleware wraps the call it is given: passing another tool's call on, or returning
    something else than an outcome, is a clear `ToolMiddlewareError` (the call still gets a result; the tool
    did not run).
    """

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        raise AssertionError("never run")

    async def reroute(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        return await call_next(ToolInvocation(name="other_tool", call_id=call.call_id, arguments=call.arguments))

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou")])
    agent = Agent(model, tools=[lookup_location_code],
                  providers=[History(store), MiddlewareProvider("router", reroute)])
    with pytest.raises(ToolMiddlewareError, match="only the arguments may change") as info:
        await agent.run("Code for Suzhou?", session=await agent.session("mw-reroute"))
    assert "the tool did not run" in str(info.value)
    ((_, text, is_error),) = await stored(store, "mw-reroute")
    assert is_error and "the tool did not run" in text

    async def returns_text(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        return "SZ"  # type: ignore[return-value]

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou")])
    agent = Agent(model, tools=[lookup_location_code],
                  providers=[History(store), MiddlewareProvider("texty", returns_text)])
    with pytest.raises(ToolMiddlewareError, match=r"returned str .* return a ToolOutcome"):
        await agent.run("Code for Suzhou?", session=await agent.session("mw-text"))


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


# --- any stack of middleware, any number of parallel calls ------------------------------------------

BEHAVIOURS = ("pass", "args", "block", "result", "raise_before", "raise_after")


def _stacked(index: int, behaviour: str) -> ToolMiddleware:
    async def mw(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        if behaviour == "block":
            return ToolOutcome(f"blocked by {index}", is_error=True)
        if behaviour == "raise_before":
            raise ValueError(f"mw {index}")
        if behaviour == "args":
            args = call.parsed_arguments() or {}
            return await call_next(call.with_arguments({"v": f"{args['v']}+{index}"}))
        outcome = await call_next(call)
        if behaviour == "raise_after":
            raise ValueError(f"mw {index}")
        return ToolOutcome(f"{outcome.result}<{index}") if behaviour == "result" else outcome

    return mw


def _expected(stack: list[str], v: str) -> tuple[str | None, dict[str, tuple[str, ...]], int | None, bool]:
    """What a call with argument `v` should come to: its result (None on error), each middleware's actions,
    the index of the middleware that raised, and whether the tool ran."""
    seen: list[int] = []
    outcome: str | None = None
    culprit: int | None = None
    for i, behaviour in enumerate(stack):
        seen.append(i)
        if behaviour == "block":
            outcome = f"blocked by {i}"
            break
        if behaviour == "raise_before":
            culprit = i
            break
        if behaviour == "args":
            v = f"{v}+{i}"
    ran = outcome is None and culprit is None
    if ran:
        outcome = f"ran:{v}"
    actions: dict[str, tuple[str, ...]] = {}
    for i in reversed(seen):
        behaviour, did = stack[i], []
        if behaviour == "args":
            did.append("changed_arguments")
        if behaviour == "block":
            did.append("blocked")
        if culprit is None and behaviour == "result":
            outcome, did = f"{outcome}<{i}", [*did, "changed_result"]
        if (culprit is None and behaviour == "raise_after") or culprit == i:
            culprit, did = i, [*did, "raised"]
        actions[f"p{i}"] = tuple(did)
    return (None if culprit is not None else outcome), actions, culprit, ran


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stack=st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=3), calls=st.integers(1, 3))
def test_any_middleware_stack_answers_every_call_once_and_the_trace_says_what_each_did(
        stack: list[str], calls: int) -> None:
    """Seed 004's function middleware "sesuai urutan penyedia", for any stack of providers' middleware
    (each passing, changing the arguments, blocking, changing the result or raising) and any number of
    parallel calls: every call gets exactly one stored result, the one the model was sent; the trace
    names each middleware that saw the call with what it did; a raise fails the run naming the provider.
    """

    @tool
    async def probe(v: str) -> str:
        """Return what the tool was given."""
        return f"ran:{v}"

    async def scenario() -> tuple[list[tuple[str, str, bool]], ScriptedModel, object, BaseException | None]:
        turn = tool_call("probe", v="c0")
        for n in range(1, calls):
            turn = turn + tool_call("probe", v=f"c{n}")
        model = ScriptedModel([turn, "done"])
        async with MemoryStore() as store:
            agent = Agent(model, tools=[probe], providers=[
                History(store), *(MiddlewareProvider(f"p{i}", _stacked(i, b)) for i, b in enumerate(stack))])
            error: BaseException | None = None
            result = None
            try:
                result = await agent.run("go", session=await agent.session("stack"))
            except ToolMiddlewareError as exc:
                error = exc
            return await stored(store, "stack"), model, result, error

    log, model, result, error = asyncio.run(scenario())
    expected = {f"call_{n + 1}": _expected(stack, f"c{n}") for n in range(calls)}
    assert sorted(cid for cid, _, _ in log) == sorted(expected)  # every call answered, once
    for cid, text, is_error in log:
        want, _, _, ran = expected[cid]
        if want is None:
            assert is_error and ("the tool had run" if ran else "the tool did not run") in text
        else:
            assert text == want
    failures = [(cid, e) for cid, e in expected.items() if e[0] is None]
    if failures:
        assert isinstance(error, ToolMiddlewareError)
        assert error.source_id in {f"p{e[2]}" for _, e in failures}
        assert len(model.requests) == 1  # the run stopped after the step, before another model call
        return
    assert error is None and isinstance(result, RunResult)
    assert set(results(list(model.requests[1].messages))) == set(log)  # the model read what was stored
    for traced in result.traces[0].tool_calls:
        assert {m.source_id: m.actions for m in traced.middleware} == expected[traced.call_id][1]
        assert [m.source_id for m in traced.middleware] == sorted(expected[traced.call_id][1])
