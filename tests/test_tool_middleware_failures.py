"""Tool middleware from context providers (issue 31, item 8) when it fails, on resume, and stacked.

Written from seed 004 (``004_c7551522d2c48d8a.txt``, the note after the Python ``UserPreferenceProvider``:
a context provider may add chat or function middleware for the current invocation, "sesuai urutan
penyedia", in provider order) together with the durable tool loop: a middleware that raises never
leaves a call without a stored result, an idempotent call run again on resume goes through the
middleware again, and any stack of middleware answers every call once. Every test runs through
``Agent.run`` with ``History`` on SQLite and on the in-memory store. The everyday uses (change the
arguments, block, replace or post-process the result, order, trace): ``test_tool_middleware.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, RunResult, ToolMiddlewareError, tool
from contextpipe.providers import History
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.stores.base import SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.tools import CallTool, ToolInvocation, ToolMiddleware, ToolOutcome
from helpers import MiddlewareProvider, results, stored

INSTRUCTIONS = "You are a helpful assistant."  # seed 004's agent


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    made: SessionStore = SQLiteStore(tmp_path / "agent.db") if request.param == "sqlite" else MemoryStore()
    async with made:
        yield made



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


async def test_a_middleware_that_raises_on_a_resumed_call_fails_the_run_once_the_repair_is_stored(
        store: SessionStore) -> None:
    """Seed 004's function middleware around the durable tool loop's re-run: an idempotent call left open
    is run again through the middleware; when the middleware raises there, the run stops with
    `ToolMiddlewareError` before any model call, and the call's error result is stored first.
    """
    running = asyncio.Event()

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        running.set()
        await asyncio.Event().wait()  # hangs until the run is cut
        return "never"

    async def strict_on_resume(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        if call.resumed:
            raise RuntimeError("re-runs need a person's approval")
        return await call_next(call)

    model = ScriptedModel([tool_call("get_forecast", city="Suzhou")])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[get_forecast],
                  providers=[History(store), MiddlewareProvider("strict", strict_on_resume)])
    session = await agent.session("mw-resume-raise")
    run = asyncio.create_task(agent.run("Forecast for Suzhou?", session=session))
    started = asyncio.create_task(running.wait())
    await asyncio.wait({run, started}, return_when=asyncio.FIRST_COMPLETED)
    if run.done():
        started.cancel()
        run.result()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run

    with pytest.raises(ToolMiddlewareError, match="re-runs need a person's approval") as info:
        await agent.run(None, session=session)

    assert (info.value.source_id, info.value.call_id) == ("strict", "call_1")
    assert len(model.requests) == 1  # only the interrupted run's call: the failed resume sent nothing
    ((call_id, text, is_error),) = await stored(store, "mw-resume-raise")
    assert call_id == "call_1" and is_error and "the tool did not run" in text


async def test_every_failing_middleware_of_a_step_is_named_on_the_error(store: SessionStore) -> None:
    """Seed 004's function middleware over parallel calls: when it fails on two calls of one step, the
    run's `ToolMiddlewareError` names the first and carries a note for the other, so neither is lost.
    """

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        return "SZ"

    async def broken(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        raise LookupError(f"no quota left for {call.call_id}")

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou")
                           + tool_call("lookup_location_code", city="Beijing")])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[lookup_location_code],
                  providers=[History(store), MiddlewareProvider("quota", broken)])
    with pytest.raises(ToolMiddlewareError) as info:
        await agent.run("Codes for Suzhou and Beijing?", session=await agent.session("mw-raise-two"))

    error = info.value
    other = ({"call_1", "call_2"} - {error.call_id}).pop()
    assert f"no quota left for {error.call_id}" in str(error)
    assert error.__notes__ == [f"Tool middleware of context provider 'quota' also raised LookupError on call "
                               f"'{other}': no quota left for {other}"]
    assert sorted(cid for cid, _, is_error in await stored(store, "mw-raise-two") if is_error) == ["call_1", "call_2"]


async def test_a_middleware_that_catches_an_inner_failure_answers_the_call_and_the_run_goes_on(
        store: SessionStore) -> None:
    """Seed 004's function middleware, stacked in provider order: an outer middleware that catches the inner
    one's exception and returns its own outcome has answered the call; the run goes on, and the trace says
    the inner one raised and the outer one changed the result.
    """

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        return "SZ"

    async def fallback(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        try:
            return await call_next(call)
        except LookupError:
            return ToolOutcome("The code service is down; try again later.", is_error=True)

    async def flaky(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        raise LookupError("service down")

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "The service is down."])
    agent = Agent(model, instructions=INSTRUCTIONS, tools=[lookup_location_code], providers=[
        History(store), MiddlewareProvider("fallback", fallback), MiddlewareProvider("flaky", flaky)])
    result = await agent.run("Code for Suzhou?", session=await agent.session("mw-catch"))

    assert result.text == "The service is down."
    assert await stored(store, "mw-catch") == [("call_1", "The code service is down; try again later.", True)]
    (traced,) = result.traces[0].tool_calls
    assert [(m.source_id, m.actions) for m in traced.middleware] == [("fallback", ("changed_result",)),
                                                                       ("flaky", ("raised",))]


async def test_a_middleware_must_pass_on_the_invocation_it_was_given(store: SessionStore) -> None:
    """Seed 004's function middleware wraps the call it is given: passing call_next a dict, or arguments that
    are not JSON text, is a clear error saying what to pass (the call still gets a result; the tool did not run).
    """

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        raise AssertionError("never run")

    async def passes_dict(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        return await call_next({"city": "Suzhou"})  # type: ignore[arg-type]

    async def passes_dict_arguments(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        bad = ToolInvocation(name=call.name, call_id=call.call_id, arguments={"city": "Suzhou"})  # type: ignore[arg-type]
        return await call_next(bad)

    for n, (middleware, what) in enumerate([(passes_dict, "dict"), (passes_dict_arguments, "arguments of type dict")]):
        model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou")])
        agent = Agent(model, tools=[lookup_location_code],
                      providers=[History(store), MiddlewareProvider("shaper", middleware)])
        with pytest.raises(ToolMiddlewareError, match=f"passed {what} to call_next .* pass the ToolInvocation"):
            await agent.run("Code for Suzhou?", session=await agent.session(f"mw-shape-{n}"))
        ((_, text, is_error),) = await stored(store, f"mw-shape-{n}")
        assert is_error and "the tool did not run" in text
