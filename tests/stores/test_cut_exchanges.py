"""A run cut at an exact point never leaves a broken tool-call pair in the log, on every backend.

Each test cuts a run where an earlier version did break the log: while it ran again a call the
previous run left open (its new input was then stored after the unanswered call), and while it
saved a model output whose calls it then answered anyway (results stored for calls the log may
not hold). The cut point is set by signals from a tool or a history provider, never by time;
every log is checked with the rule each request is checked with (`contextpipe._run.invariants`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from contextpipe import Agent, FunctionCall, Message, StoreError, tool
from contextpipe._run.invariants import check_messages
from contextpipe.events import ToolCallStarted
from contextpipe.exchanges import LATE_RESULT_KEY, exchange_problem
from contextpipe.pipeline import RunContext
from contextpipe.providers import ContextProvider, History, LoadedHistory
from contextpipe.session import Session
from contextpipe.stores import Lease, SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import describe

from .test_tool_threads import Blocked

CUT_AGAIN = "and the run that was to run it again stopped before it had a result"


async def left_open(store: SessionStore, tenant: str, *calls: FunctionCall) -> Session:
    """Return a session whose log a crashed worker left: a question and the model's calls, no results."""
    session = await store.load_or_create(tenant, "chat")
    await store.append(tenant, "chat", [Message.user("Weather in Suzhou?"), Message("assistant", calls)])
    return session


def forecast_call(call_id: str = "c1") -> FunctionCall:
    return FunctionCall(call_id, "get_forecast", '{"city": "Suzhou"}')


def assert_valid(log: Sequence[Message], latest_input: Message | None = None) -> None:
    check_messages(log, latest_input=latest_input)  # raises on an unanswered call, an orphan result, a lost input


# --- a run cut while it runs again the calls a previous run left open, with new input -------------------


async def test_a_run_cut_while_it_runs_a_leftover_call_again_answers_it_before_its_input(
        store: SessionStore, tenant: str) -> None:
    entered = asyncio.Event()

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        entered.set()
        await asyncio.Event().wait()  # never returns: the run is cancelled while it waits
        return "Sunny"

    session = await left_open(store, tenant, forecast_call())
    agent = Agent(ScriptedModel(["Sunny tomorrow too."]), tools=[get_forecast], providers=[History(store)])
    question = Message.user("And tomorrow?")
    run = asyncio.create_task(agent.run(question, session=session))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    log = await agent.history(session)
    assert_valid(log, question)
    assert [m.role for m in log] == ["user", "assistant", "tool", "user"] and log[3].id == question.id
    answer = log[2].function_results[0]
    assert answer.call_id == "c1" and answer.is_error and CUT_AGAIN in answer.result
    # The client's retry of the same message resumes that run: the input is not stored twice.
    result = await agent.run(question, session=await agent.session("chat", tenant=tenant))
    assert result.text == "Sunny tomorrow too."
    assert describe(await agent.history(session))[3:] == ["user:And tomorrow?", "assistant:Sunny tomorrow too."]


async def _run_or_stream(agent: Agent, question: Message, session: Session, streamed: bool) -> None:
    if not streamed:
        await agent.run(question, session=session)
        return
    async with agent.stream(question, session=session) as events:  # events: ToolCallStarted/Finished on the way
        async for _ in events:
            pass


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "stream"])
async def test_a_leftover_call_that_returns_as_its_run_is_cancelled_keeps_its_result(
        store: SessionStore, tenant: str, streamed: bool) -> None:
    # The cancellation reaches the run after the call's task has its result and before the run
    # reads it (the tool asks for it just before it returns): what the call did is its answer.
    run: asyncio.Task[None] | None = None

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        assert run is not None
        asyncio.get_running_loop().call_soon(run.cancel)  # runs before the run wakes up to the result
        return "Sunny"

    session = await left_open(store, tenant, forecast_call())
    agent = Agent(ScriptedModel(["Sunny tomorrow too."]), tools=[get_forecast], providers=[History(store)])
    question = Message.user("And tomorrow?")
    run = asyncio.create_task(_run_or_stream(agent, question, session, streamed))
    with pytest.raises(asyncio.CancelledError):
        await run
    log = await agent.history(session)
    assert_valid(log, question)
    assert describe(log) == ["user:Weather in Suzhou?", "assistant:call:get_forecast", "tool:result:Sunny",
                             "user:And tomorrow?"]


async def test_a_resume_without_input_cut_in_its_repair_leaves_the_call_open_for_the_next_run(
        store: SessionStore, tenant: str) -> None:
    entered = asyncio.Event()
    runs = 0

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        nonlocal runs
        runs += 1
        if runs == 1:
            entered.set()
            await asyncio.Event().wait()
        return "Sunny"

    session = await left_open(store, tenant, forecast_call())
    agent = Agent(ScriptedModel(["Sunny."]), tools=[get_forecast], providers=[History(store)])
    run = asyncio.create_task(agent.run(None, session=session))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError) as cut:
        await run
    assert not getattr(cut.value, "__notes__", None)  # no input to keep: nothing to report
    assert describe(await agent.history(session)) == ["user:Weather in Suzhou?", "assistant:call:get_forecast"]
    assert (await agent.run(None, session=await agent.session("chat", tenant=tenant))).text == "Sunny."
    assert runs == 2  # the next run ran it again
    assert describe(await agent.history(session))[2:] == ["tool:result:Sunny", "assistant:Sunny."]


async def test_a_cut_repair_keeps_the_results_it_had_and_answers_the_rest_before_the_input(
        store: SessionStore, tenant: str) -> None:
    entered = asyncio.Event()
    runs: list[str] = []

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        runs.append(city)
        return "Sunny"

    @tool(idempotent=True)
    async def get_time(city: str) -> str:
        """Return the local time in a city."""
        entered.set()
        await asyncio.Event().wait()
        return "09:00"

    @tool
    async def send_email(to: str) -> str:
        """Send an email."""
        raise AssertionError("a call left open is never run again unless its tool is idempotent")

    session = await left_open(store, tenant, forecast_call(), FunctionCall("c2", "get_time", '{"city": "Suzhou"}'),
                              FunctionCall("c3", "send_email", '{"to": "bob@example.com"}'))
    agent = Agent(ScriptedModel(["Noted."]), tools=[get_forecast, get_time, send_email], providers=[History(store)])
    question = Message.user("And tomorrow?")
    run = asyncio.create_task(agent.run(question, session=session))
    await entered.wait()  # c1 has its result; c2 runs
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    log = await agent.history(session)
    assert_valid(log, question)
    assert [m.role for m in log] == ["user", "assistant", "tool", "user"]
    c1, c2, c3 = log[2].function_results
    assert (c1.call_id, c1.result, c1.is_error) == ("c1", "Sunny", False)  # it completed: kept
    assert c2.call_id == "c2" and c2.is_error and CUT_AGAIN in c2.result
    assert c3.call_id == "c3" and c3.is_error and "not marked idempotent" in c3.result
    assert (await agent.run(None, session=await agent.session("chat", tenant=tenant))).text == "Noted."
    assert runs == ["Suzhou"]  # the next run has nothing left to repair


async def test_a_cut_repair_waits_for_the_thread_it_started_and_answers_the_other_calls(
        store: SessionStore, tenant: str) -> None:
    body = Blocked("Sunny, 25 C")

    @tool(idempotent=True)
    def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        return body()

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        raise AssertionError("a call left open is never run again unless its tool is idempotent")

    session = await left_open(store, tenant, forecast_call(), FunctionCall("c2", "send_email", '{"to": "bob@x.org"}'))
    agent = Agent(ScriptedModel(["Sunny."]), tools=[get_forecast, send_email], providers=[History(store)])
    question = Message.user("And tomorrow?")
    run = asyncio.create_task(agent.run(question, session=session))
    try:
        await body.entered.wait()  # the repair runs c1 again, in a thread
        run.cancel()
    finally:
        body.release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    log = await agent.history(session)
    assert_valid(log, question)
    assert [m.role for m in log] == ["user", "assistant", "tool", "tool", "user"]
    answers = {r.call_id: r for m in log[2:4] for r in m.function_results}
    assert answers["c1"].result == "Sunny, 25 C" and not answers["c1"].is_error  # the thread's own result
    assert answers["c2"].is_error and "not marked idempotent" in answers["c2"].result
    assert body.calls == 1


async def test_a_stream_closed_as_its_repair_starts_answers_the_call_before_its_input(
        store: SessionStore, tenant: str) -> None:
    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        raise AssertionError("the stream was closed before the call ran")

    session = await left_open(store, tenant, forecast_call())
    agent = Agent(ScriptedModel(["Sunny."]), tools=[get_forecast], providers=[History(store)])
    question = Message.user("And tomorrow?")
    async with agent.stream(question, session=session) as events:
        async for event in events:
            assert isinstance(event, ToolCallStarted)
            break  # leaving the block closes the stream as the repair is about to run c1 again
    log = await agent.history(session)
    assert_valid(log, question)
    assert [m.role for m in log] == ["user", "assistant", "tool", "user"]
    assert CUT_AGAIN in log[2].function_results[0].result


class Blocking(ContextProvider):
    """A provider whose `before_run` stops until the run is cancelled (a slow search, an MCP server connecting)."""

    def __init__(self) -> None:
        super().__init__("slow")
        self.entered = asyncio.Event()

    async def before_run(self, ctx: RunContext) -> None:
        self.entered.set()
        await asyncio.Event().wait()


class BlockingHistory(History):
    """History whose load stops, once it has read the log, until the run is cancelled."""

    def __init__(self, store: SessionStore) -> None:
        super().__init__(store)
        self.entered = asyncio.Event()

    async def load_view(self, session: Session, *, lease_token: int | None = None) -> LoadedHistory:
        view = await super().load_view(session, lease_token=lease_token)
        self.entered.set()
        await asyncio.Event().wait()
        return view


@pytest.mark.parametrize("where", ["as it loads the history", "in a later provider's before_run"])
async def test_a_run_cut_before_it_reads_its_history_answers_the_calls_left_open_before_its_input(
        store: SessionStore, tenant: str, where: str) -> None:
    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        return "Sunny"

    @tool
    async def send_email(to: str) -> str:
        """Send an email."""
        raise AssertionError("a call left open is never run again unless its tool is idempotent")

    session = await left_open(store, tenant, forecast_call(), FunctionCall("c2", "send_email", '{"to": "bob@x.org"}'))
    blocking = BlockingHistory(store) if where == "as it loads the history" else Blocking()
    providers = [blocking] if isinstance(blocking, History) else [History(store), blocking]
    agent = Agent(ScriptedModel(["Noted."]), tools=[get_forecast, send_email], providers=providers)
    question = Message.user("And tomorrow?")
    run = asyncio.create_task(agent.run(question, session=session))
    await blocking.entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    log = await store.load(tenant, "chat")
    assert_valid(log.messages, question)
    assert [m.role for m in log.messages] == ["user", "assistant", "tool", "user"], describe(log.messages)
    c1, c2 = log.messages[2].function_results
    assert c1.call_id == "c1" and c1.is_error and CUT_AGAIN in c1.result
    assert c2.call_id == "c2" and c2.is_error and "not marked idempotent" in c2.result


class FailingResults(History):
    """History whose saves of tool results fail: the store went away as the run was cut."""

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        if any(m.function_results for m in messages):
            raise StoreError("the store went away", backend="test", tenant=session.tenant, session_id=session.id)
        await super().save(session, messages, lease=lease, durable=durable)


async def test_an_input_that_would_follow_calls_it_could_not_answer_is_not_stored_and_the_error_says_so(
        store: SessionStore, tenant: str) -> None:
    entered = asyncio.Event()

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        entered.set()
        await asyncio.Event().wait()
        return "Sunny"

    session = await left_open(store, tenant, forecast_call())
    agent = Agent(ScriptedModel(["Sunny."]), tools=[get_forecast], providers=[FailingResults(store)])
    run = asyncio.create_task(agent.run(Message.user("And tomorrow?"), session=session))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError) as cut:
        await run
    notes = "\n".join(getattr(cut.value, "__notes__", []))
    assert "the run's input could not be kept in the session" in notes
    assert "get_forecast (c1)" in notes and "send the input again" in notes
    assert describe(await agent.history(session)) == ["user:Weather in Suzhou?", "assistant:call:get_forecast"]


# --- a run cut while it saves a model output, with a late result to record --------------------------------


class CutOutput(History):
    """History whose first save of the model output calling `call_id` stops for good, before or after it lands."""

    def __init__(self, store: SessionStore, call_id: str, *, lands: bool = False, fails: bool = False) -> None:
        super().__init__(store)
        self.call_id, self.lands, self.fails = call_id, lands, fails
        self.reached = asyncio.Event()

    def cuts(self, messages: Sequence[Message]) -> bool:
        return any(c.call_id == self.call_id for m in messages for c in m.function_calls)

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        cut = not self.reached.is_set() and self.cuts(messages)
        if cut and self.lands:
            await super().save(session, messages, lease=lease, durable=durable)
        if cut:
            self.reached.set()
            if self.fails:
                raise StoreError("the store went away", backend="test", tenant=session.tenant, session_id=session.id)
            await asyncio.Event().wait()  # the run is cancelled while it waits
        await super().save(session, messages, lease=lease, durable=durable)


@pytest.mark.parametrize("cut", ["before it lands", "after it lands", "with an error"])
async def test_a_run_cut_while_it_saves_a_model_output_answers_its_calls_only_once_the_output_is_stored(
        store: SessionStore, tenant: str, cut: str) -> None:
    body = Blocked("report ready")

    @tool(timeout=0.001)  # the tool blocks until released: the timeout always comes first
    def build_report() -> str:
        """Build the monthly report."""
        return body()

    @tool
    async def notify_team(text: str) -> str:
        """Tell the team."""
        raise AssertionError("the run was cut before the call ran")

    history = CutOutput(store, "call_2", lands=cut == "after it lands", fails=cut == "with an error")
    model = ScriptedModel([tool_call("build_report", call_id="call_1"),
                           tool_call("notify_team", text="soon", call_id="call_2"), "The report is ready."])
    agent = Agent(model, tools=[build_report, notify_team], providers=[history])
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Make the report and tell the team.", session=session))
    try:
        await history.reached.wait()  # call_1 timed out, its thread still runs; call_2's output is being saved
        if cut != "with an error":
            run.cancel()
    finally:
        body.release.set()
    with pytest.raises(StoreError if cut == "with an error" else asyncio.CancelledError):
        await run
    log = await agent.history(session)
    assert exchange_problem(log) is None, describe(log)
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant", "tool", "user"]
    assert [c.call_id for c in log[3].function_calls] == ["call_2"]  # saved again before its call was answered
    stopped = log[4].function_results[0]
    assert stopped.call_id == "call_2" and stopped.is_error and "was stopped before it finished" in stopped.result
    assert log[5].metadata == {LATE_RESULT_KEY: "call_1"}
    result = await agent.run(None, session=await agent.session("chat", tenant=tenant))
    assert result.text == "The report is ready."
    assert not [c for t in result.traces for c in t.changes if c.action == "repaired_log"]  # nothing to repair


async def test_a_run_whose_first_output_fails_to_save_keeps_it_and_its_input_before_a_late_result(
        store: SessionStore, tenant: str) -> None:
    body = Blocked("09:00")

    @tool(idempotent=True, timeout=0.001)  # the repair runs it again; it blocks until released: it times out
    def get_time(city: str) -> str:
        """Return the local time in a city."""
        return body()

    @tool
    async def notify_team(text: str) -> str:
        """Tell the team."""
        raise AssertionError("the run failed before the call ran")

    session = await left_open(store, tenant, FunctionCall("c1", "get_time", '{"city": "Suzhou"}'))
    history = CutOutput(store, "call_1", fails=True)
    agent = Agent(ScriptedModel([tool_call("notify_team", text="soon", call_id="call_1")]),
                  tools=[get_time, notify_team], providers=[history])
    question = Message.user("And now?")
    run = asyncio.create_task(agent.run(question, session=session))
    try:
        await history.reached.wait()  # c1 timed out in the repair; the first model output's save failed
    finally:
        body.release.set()
    with pytest.raises(StoreError):
        await run
    log = await agent.history(session)
    assert exchange_problem(log) is None, describe(log)
    assert [m.role for m in log] == ["user", "assistant", "tool", "user", "assistant", "tool", "user"], describe(log)
    assert log[3].id == question.id and [c.call_id for c in log[4].function_calls] == ["call_1"]
    assert log[6].metadata == {LATE_RESULT_KEY: "c1"} and "09:00" in log[6].text


class CutLate(CutOutput):
    """History whose first save of the late result of `call_id` stops for good, before or after it lands."""

    def cuts(self, messages: Sequence[Message]) -> bool:
        return any(m.metadata.get(LATE_RESULT_KEY) == self.call_id for m in messages)


@pytest.mark.parametrize("cut", ["before it lands", "after it lands"])
async def test_a_run_cut_as_it_saves_a_late_result_at_a_step_boundary_keeps_it(
        store: SessionStore, tenant: str, cut: str) -> None:
    # One worker thread: a job queued after the tool's own runs once the tool has returned, so its end
    # says the tool's result is in (SQLite has a thread of its own, the servers' drivers none).
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
    body = Blocked("report ready")

    @tool(timeout=0.001)  # the tool blocks until released: the timeout always comes first
    def build_report() -> str:
        """Build the monthly report."""
        return body()

    @tool
    async def wait_for_report() -> str:
        """Wait until the report is built."""
        body.release.set()
        await asyncio.to_thread(lambda: None)  # queued behind the report's thread: it has returned
        return "done waiting"

    history = CutLate(store, "call_1", lands=cut == "after it lands")
    model = ScriptedModel([tool_call("build_report", call_id="call_1"), tool_call("wait_for_report", call_id="call_2"),
                           "Here is the report."])
    agent = Agent(model, tools=[build_report, wait_for_report], providers=[history])
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Make the report.", session=session))
    try:
        await history.reached.wait()  # the thread returned; its late result is being saved, before model call 3
        run.cancel()
    finally:
        body.release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    log = await agent.history(session)
    assert exchange_problem(log) is None, describe(log)
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant", "tool", "user"], describe(log)
    assert log[5].metadata == {LATE_RESULT_KEY: "call_1"} and "report ready" in log[5].text  # what the thread did
