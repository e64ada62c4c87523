"""The step loop: tools, limits, streaming events, leases and repair of interrupted sessions."""

from __future__ import annotations

import asyncio
import math

import pytest

from contextpipe import (
    Agent,
    FunctionCall,
    FunctionResult,
    Message,
    RunDone,
    RunLimits,
    SessionBusy,
    StepPersisted,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    tool,
)
from contextpipe.exchanges import group_messages
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from helpers import describe


async def test_parallel_tool_calls_run_concurrently() -> None:
    arrived = 0
    both_here = asyncio.Event()

    @tool
    async def meet(name: str) -> str:
        """Waits until both calls are running at the same time."""
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            both_here.set()
        await asyncio.wait_for(both_here.wait(), timeout=2)
        return f"met {name}"

    model = ScriptedModel([tool_call("meet", name="a") + tool_call("meet", name="b"), "both met"])
    result = await Agent(model, tools=[meet]).run("meet")
    # Each result is its own tool message, saved as soon as it is produced; together they answer
    # every call exactly once and form one tool exchange.
    tool_messages = result.messages[1:3]
    assert [m.role for m in tool_messages] == ["tool", "tool"]
    results = [r for m in tool_messages for r in m.function_results]
    assert sorted(r.result for r in results) == ["met a", "met b"]
    assert not any(r.is_error for r in results)
    calls = result.messages[0].function_calls
    assert sorted(r.call_id for r in results) == sorted(c.call_id for c in calls)
    assert [g.kind for g in group_messages(result.messages)] == ["tool_exchange", "assistant"]


async def test_max_steps_then_one_final_call_without_tools() -> None:
    @tool
    def again() -> str:
        """Always wants more."""
        return "more"

    model = ScriptedModel([tool_call("again"), tool_call("again"), "giving up with an answer"])
    result = await Agent(model, tools=[again], limits=RunLimits(max_steps=2)).run("loop")
    assert result.stop_reason == "max_steps"
    assert result.text == "giving up with an answer"
    assert [len(r.tools) for r in model.requests] == [1, 1, 0]


async def test_calls_in_the_final_call_are_answered_not_left_dangling() -> None:
    @tool
    def again() -> str:
        """Always wants more."""
        return "more"

    store = MemoryStore()
    model = ScriptedModel([tool_call("again"), tool_call("again")])
    agent = Agent(model, tools=[again], providers=[History(store)], limits=RunLimits(max_steps=1))
    session = await agent.session("s")
    result = await agent.run("loop", session=session)
    assert result.stop_reason == "max_steps"
    log = await agent.history(session)
    assert describe(log)[-2:] == [
        "assistant:call:again", "tool:result:Error: not run; the run's step limit (max_steps=1) was reached."]


async def test_consecutive_tool_errors_stop_the_loop() -> None:
    @tool
    def flaky() -> str:
        """Always fails."""
        raise ConnectionError("service down")

    model = ScriptedModel([tool_call("flaky"), tool_call("flaky"), "I could not reach the service."])
    agent = Agent(model, tools=[flaky], limits=RunLimits(max_consecutive_tool_errors=2))
    result = await agent.run("try")
    assert result.stop_reason == "tool_errors"
    assert [len(r.tools) for r in model.requests] == [1, 1, 0]
    errors = [r for m in result.messages for r in m.function_results]
    assert all(r.is_error and "ConnectionError: service down" in r.result for r in errors)


async def test_a_call_after_the_tool_error_limit_is_answered_with_that_limit() -> None:
    @tool
    def flaky() -> str:
        """Always fails."""
        raise ConnectionError("service down")

    model = ScriptedModel([tool_call("flaky"), tool_call("flaky"), tool_call("flaky")])
    agent = Agent(model, tools=[flaky], limits=RunLimits(max_consecutive_tool_errors=2))
    result = await agent.run("try")
    assert result.stop_reason == "tool_errors"
    last = [r for m in result.messages for r in m.function_results][-1]
    assert last.is_error
    assert last.result == ("Error: not run; the run stopped after 2 steps in a row whose tool calls failed "
                           "(max_consecutive_tool_errors).")


async def test_unknown_tool_and_bad_arguments_go_back_to_the_model() -> None:
    @tool
    def square(x: int) -> int:
        """Square a number."""
        return x * x

    model = ScriptedModel([
        tool_call("cube", x=2) + tool_call("square", '{"x": two}'), tool_call("square", x=3), "9"])
    result = await Agent(model, tools=[square]).run("go")
    calls = result.messages[0].function_calls
    by_call = {r.call_id: r for m in result.messages[1:3] for r in m.function_results}
    first = [by_call[c.call_id] for c in calls]
    assert first[0].is_error and "no tool named 'cube'. Available tools: square." in first[0].result
    assert first[1].is_error and "not valid JSON" in first[1].result
    assert result.messages[4].function_results[0].result == "9"
    assert result.text == "9"


async def test_stream_events_and_same_persistence_as_run() -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value-{key}"

    store = MemoryStore()
    model = ScriptedModel([tool_call("lookup", key="k"), Turn(chunks=("The ", "value ", "is ", "value-k."))])
    agent = Agent(model, tools=[lookup], providers=[History(store)])
    session = await agent.session("s")
    kinds: list[str] = []
    text: list[str] = []
    async for event in agent.stream("what is k?", session=session):
        kinds.append(event.kind)
        if isinstance(event, TextDelta):
            text.append(event.text)
    assert kinds == ["step_persisted", "tool_call_started", "tool_call_finished", "step_persisted",
                     "text_delta", "text_delta", "text_delta", "text_delta", "step_persisted", "run_done"]
    assert "".join(text) == "The value is value-k."
    assert describe(await agent.history(session)) == [
        "user:what is k?", "assistant:call:lookup", "tool:result:value-k", "assistant:The value is value-k."]


async def test_closing_a_stream_early_ends_the_run_cleanly() -> None:
    seen_errors: list[str] = []
    from contextpipe import ContextProvider, RunContext, RunOutcome

    class Watch(ContextProvider):
        async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
            seen_errors.append(type(outcome.error).__name__)

    store = MemoryStore()
    model = ScriptedModel([Turn(chunks=("a", "b", "c")), "second run"])
    agent = Agent(model, providers=[History(store), Watch("watch")])
    session = await agent.session("s")
    async with agent.stream("hi", session=session) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                break
    assert seen_errors == ["GeneratorExit"]
    # The lease was released: the next run on the session goes ahead.
    assert (await agent.run("again", session=session)).text == "second run"


async def test_concurrent_run_on_the_same_session_is_refused_or_waits() -> None:
    gate = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        await gate.wait()
        return "slow done"

    store = MemoryStore()
    model = ScriptedModel([slow, "second"])
    agent = Agent(model, providers=[History(store)])
    session = await agent.session("s")
    first = asyncio.create_task(agent.run("one", session=session))
    await asyncio.sleep(0.01)
    with pytest.raises(SessionBusy, match="busy"):
        await agent.run("two", session=session)
    waiting = asyncio.create_task(agent.run("two", session=session, lease_wait=5))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.set()
    assert (await first).text == "slow done"
    assert (await waiting).text == "second"
    # Runs never interleave: each run's messages are contiguous in the log.
    assert describe(await agent.history(session)) == [
        "user:one", "assistant:slow done", "user:two", "assistant:second"]


async def test_interrupted_session_is_repaired_before_the_next_call() -> None:
    runs: list[str] = []

    @tool(idempotent=True)
    def read_balance(account: str) -> str:
        """Read-only: safe to run again."""
        runs.append(account)
        return "100 EUR"

    @tool
    def send_payment(amount: int) -> str:
        """Not idempotent: must not run twice."""
        runs.append(f"pay {amount}")
        return "sent"

    store = MemoryStore()
    # The log a killed run leaves: a parallel call with one result recorded, two missing.
    await store.append("default", "s", [
        Message.user("Pay 5 if I have money."),
        Message("assistant", (FunctionCall("c1", "read_balance", '{"account": "main"}'),
                              FunctionCall("c2", "send_payment", '{"amount": 5}'),
                              FunctionCall("c3", "read_balance", '{"account": "savings"}'))),
        Message("tool", (FunctionResult("c1", "100 EUR"),)),
    ])
    model = ScriptedModel(["Done: the payment may not have gone through; please check."])
    agent = Agent(model, tools=[read_balance, send_payment], providers=[History(store)])
    session = await agent.session("s")
    async with agent.stream(None, session=session) as events:
        kinds = [e.kind async for e in events]
    assert kinds[:3] == ["tool_call_started", "tool_call_finished", "step_persisted"]
    assert runs == ["savings"]  # c1 reused, c2 not re-run, c3 re-run (idempotent)
    sent = model.requests[0].messages
    repair = sent[-1].function_results
    assert [r.call_id for r in repair] == ["c2", "c3"]
    assert repair[0].is_error and "interrupted" in repair[0].result
    assert repair[1].result == "100 EUR" and not repair[1].is_error
    # Every call the model sees has a result.
    answered = {r.call_id for m in sent for r in m.function_results}
    assert {c.call_id for m in sent for c in m.function_calls} <= answered
    # The repair is stored, so the log is whole again.
    assert describe(await agent.history(session))[3:] == [
        "tool:result:" + repair[0].result + ",100 EUR",
        "assistant:Done: the payment may not have gone through; please check.",
    ]


async def test_run_needs_input_or_session() -> None:
    from contextpipe import UsageError

    with pytest.raises(UsageError, match="nothing to run"):
        await Agent(ScriptedModel(["x"])).run(None)


async def test_run_done_is_the_last_stream_event() -> None:
    events = [e async for e in Agent(ScriptedModel(["hi there"])).stream("hello")]
    assert isinstance(events[-1], RunDone) and events[-1].result.text == "hi there"
    assert not any(isinstance(e, StepPersisted | ToolCallStarted | ToolCallFinished) for e in events)


@pytest.mark.parametrize("change", ["drop the result", "drop the call", "swap call and result"])
async def test_middleware_breaking_a_checked_history_exchange_is_caught(change: str) -> None:
    """The loaded history is checked once per run; a request that no longer holds it as checked is checked again."""
    from dataclasses import replace

    from contextpipe import ContextProvider, RequestInvariantError
    from contextpipe.models import CallModel, ModelResponse
    from contextpipe.pipeline import RunContext

    async def breaking(request: ModelRequest, call_next: CallModel) -> ModelResponse:
        sent = list(request.messages)
        i = next(i for i, m in enumerate(sent) if m.role == "tool")
        if change == "drop the result":
            del sent[i]
        elif change == "drop the call":
            del sent[i - 1]
        else:
            sent[i - 1], sent[i] = sent[i], sent[i - 1]
        return await call_next(replace(request, messages=sent))

    class Breaker(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.add_middleware(breaking)

    store = MemoryStore()
    await store.append("default", "s", [
        Message.user("Weather?"), Message("assistant", (FunctionCall("c1", "weather", "{}"),)),
        Message("tool", (FunctionResult("c1", "sunny"),)), Message.assistant("Sunny.")])
    model = ScriptedModel(["never"])
    agent = Agent(model, providers=[History(store), Breaker("breaker")])
    with pytest.raises(RequestInvariantError, match="broken tool exchange"):
        await agent.run("And tomorrow?", session=await agent.session("s"))
    assert model.requests == []


def _middleware_provider(middleware):  # type: ignore[no-untyped-def]
    from contextpipe import ContextProvider
    from contextpipe.pipeline import RunContext

    class AddsMiddleware(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.add_middleware(middleware)

    return AddsMiddleware("middleware")


@pytest.mark.parametrize("at_call", [1, 3])
async def test_middleware_dropping_the_input_is_caught_at_any_step(at_call: int) -> None:
    """The caller's input is looked for in every request, in the loop's own view and in one middleware rebuilt."""
    from dataclasses import replace

    from contextpipe import RequestInvariantError
    from contextpipe.models import CallModel, ModelResponse

    calls = 0

    async def drops_input(request: ModelRequest, call_next: CallModel) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == at_call:
            # A rewritten copy is not the caller's message: the input itself is gone.
            request = replace(request, messages=[Message.user(m.text) if m.role == "user" else m
                                                 for m in request.messages])
        return await call_next(request)

    @tool
    def ping() -> str:
        """Answers pong."""
        return "pong"

    model = ScriptedModel([tool_call("ping"), tool_call("ping"), tool_call("ping"), "done"])
    agent = Agent(model, tools=[ping], providers=[_middleware_provider(drops_input)])
    with pytest.raises(RequestInvariantError, match="latest input"):
        await agent.run("go")
    assert len(model.requests) == at_call - 1


async def test_middleware_breaking_the_runs_own_tool_exchange_is_caught_later() -> None:
    """Messages the loop found complete in one request are checked again when a middleware rebuilds a later one."""
    from dataclasses import replace

    from contextpipe import RequestInvariantError
    from contextpipe.models import CallModel, ModelResponse

    calls = 0

    async def drops_first_result(request: ModelRequest, call_next: CallModel) -> ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 3:  # the first step's exchange passed two checks already
            sent = list(request.messages)
            del sent[next(i for i, m in enumerate(sent) if m.role == "tool")]
            request = replace(request, messages=sent)
        return await call_next(request)

    @tool
    def ping() -> str:
        """Answers pong."""
        return "pong"

    model = ScriptedModel([tool_call("ping"), tool_call("ping"), tool_call("ping"), "done"])
    agent = Agent(model, tools=[ping], providers=[_middleware_provider(drops_first_result)])
    with pytest.raises(RequestInvariantError, match="broken tool exchange"):
        await agent.run("go")
    assert len(model.requests) == 2


@pytest.mark.parametrize("middleware", [False, True])
async def test_the_request_check_reads_each_message_of_a_long_loop_a_bounded_number_of_times(
        middleware: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request is checked in full, but what an earlier request's check found complete is not scanned again.

    A 20-step loop whose checks rescanned the growing tail would scan ~20 times more messages.
    A middleware that passes the loop's request on (another request object, the same messages) keeps that.
    """
    from dataclasses import replace

    from contextpipe import exchanges
    from contextpipe.models import CallModel, ModelResponse

    scanned = 0
    scan = exchanges._scan

    def counting_scan(messages, start, open_calls):  # type: ignore[no-untyped-def]
        nonlocal scanned
        scanned += len(messages)
        return scan(messages, start, open_calls)

    monkeypatch.setattr(exchanges, "_scan", counting_scan)

    async def passes_on(request: ModelRequest, call_next: CallModel) -> ModelResponse:
        return await call_next(replace(request, settings=request.settings))

    @tool
    def ping() -> str:
        """Answers pong."""
        return "pong"

    steps = 20
    model = ScriptedModel([*[tool_call("ping") for _ in range(steps)], "done"])
    store = MemoryStore()
    providers = [History(store), *([_middleware_provider(passes_on)] if middleware else [])]
    agent = Agent(model, tools=[ping], providers=providers, limits=RunLimits(max_steps=steps))
    result = await agent.run("go", session=await agent.session("s"))
    assert result.text == "done" and len(model.requests) == steps + 1
    produced = len(result.messages)  # 2 per tool step, then the answer
    assert produced == 2 * steps + 1
    # The input once per request, and each message the loop added about once.
    assert scanned <= (steps + 1) + 2 * produced, scanned


async def test_runs_waiting_for_their_first_renewal_share_one_timer_and_a_sooner_one_is_not_delayed() -> None:
    """A run whose first renewal is due before the shared timer's re-arms it; finished runs leave nothing waiting."""
    from contextpipe import Durability, Heartbeat
    from contextpipe._run import heartbeat

    store = MemoryStore()
    renewed: dict[str, int] = {"slow": 0, "fast": 0}
    fast_renewed_twice = asyncio.Event()
    real = store.renew_lease

    async def renew(lease):  # type: ignore[no-untyped-def]
        renewed[lease.session_id] += 1
        if renewed["fast"] >= 2:
            fast_renewed_twice.set()
        return await real(lease)

    store.renew_lease = renew  # type: ignore[method-assign]
    release, running = asyncio.Event(), asyncio.Event()

    @tool
    async def wait() -> str:
        """Waits until the test lets it finish."""
        running.set()
        await release.wait()
        return "done waiting"

    def agent(interval: float) -> Agent:
        return Agent(ScriptedModel([tool_call("wait"), "ok"]), tools=[wait], providers=[History(store)],
                     durability=Durability(heartbeat=Heartbeat(interval=interval)))

    slow_agent, fast_agent = agent(3600.0), agent(0.01)
    slow = asyncio.ensure_future(slow_agent.run("slow", session=await slow_agent.session("slow")))
    await running.wait()  # the slow run is registered: the timer is armed an hour ahead
    fast = asyncio.ensure_future(fast_agent.run("fast", session=await fast_agent.session("fast")))
    await asyncio.wait_for(fast_renewed_twice.wait(), timeout=60)  # a guard against hanging, not a timing
    assert renewed["slow"] == 0
    release.set()
    assert (await slow).text == (await fast).text == "ok"
    waiting = heartbeat._BY_LOOP[asyncio.get_running_loop()]
    assert waiting._due == {}
    # A short run registers and leaves again without a renewal.
    assert (await Agent(ScriptedModel(["hi"]), providers=[History(store)]).run(
        "hi", session=await slow_agent.session("short"))).text == "hi"
    assert waiting._due == {} and "short" not in renewed


def test_a_firing_of_the_shared_renewal_timer_starts_only_the_runs_that_are_due() -> None:
    """Runs due later stay waiting, runs already over are dropped, and the timer is armed for the next one."""
    from contextpipe._run.heartbeat import _FirstRenewals

    class ClockLoop(asyncio.SelectorEventLoop):
        now = 1000.0

        def time(self) -> float:
            return self.now

    class Run:
        def __init__(self, interval: float) -> None:
            self.interval, self.started = interval, 0

        def first_renewal_due(self) -> None:
            self.started += 1

    loop = ClockLoop()
    try:
        renewals = _FirstRenewals(loop)
        writers = [Run(float(i)) for i in range(1, 201)]  # due 1 s, 2 s, ... 200 s from now
        for w in writers:
            renewals.add(w, w.interval)
        for w in writers[100:150]:  # these runs are over before their renewal is due
            renewals.discard(w)
        loop.now += 120.0
        renewals._fire()
        assert [w.started for w in writers[:100]] == [1] * 100
        assert all(w.started == 0 for w in writers[100:])
        assert renewals._at == 1000.0 + 151  # the next run still waiting, past the ones that are over
        assert len(renewals._queue) == 50 and len(renewals._due) == 50
        loop.now += 1000.0
        renewals._fire()
        assert [w.started for w in writers] == [1] * 100 + [0] * 50 + [1] * 50
        assert renewals._queue == [] and renewals._due == {} and renewals._at == math.inf
    finally:
        loop.close()


def test_run_sync_runs_without_an_event_loop_and_refuses_inside_one() -> None:
    from contextpipe import UsageError

    store = MemoryStore()
    agent = Agent(ScriptedModel(["hello from a script"]), providers=[History(store)])
    session = asyncio.run(agent.session("sync"))
    result = agent.run_sync("hi", session=session)  # keyword arguments go through to run()
    assert result.text == "hello from a script"
    assert describe(asyncio.run(agent.history(session))) == ["user:hi", "assistant:hello from a script"]

    async def inside_a_loop() -> None:
        with pytest.raises(UsageError, match=r"run_sync\(\) cannot be called from a running event loop; "
                                             r"use 'await agent.run\(...\)'"):
            agent.run_sync("hi again", session=session)

    asyncio.run(inside_a_loop())
    assert len(asyncio.run(agent.history(session))) == 2  # the refused call ran nothing
