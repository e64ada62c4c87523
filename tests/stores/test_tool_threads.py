"""A sync tool's thread that outlives the wait for it keeps its run's session, and what it returns is recorded.

Every tool here blocks its worker thread on a `threading.Event` the test sets. The run's lease
heartbeat is driven by hand (`Beats`): each `Beats.renew` lets one real renewal through and returns
once the heartbeat waits again, or returns False if the run stopped renewing and ended instead. So
"the run still holds its session while the thread runs" is checked with renewals, not with time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from contextpipe import Agent, Durability, FunctionCall, Heartbeat, Message, SessionBusy, tool
from contextpipe.events import ToolCallFinished
from contextpipe.exchanges import LATE_RESULT_KEY, group_messages, is_late_result
from contextpipe.models import ModelRequest
from contextpipe.providers import FactMemory, History, SemanticMemory
from contextpipe.session import Session
from contextpipe.stores import Lease, MemoryStore, SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.vectors import HashEmbedder, MemoryVectorStore
from helpers import describe

RENEWALS = 8
"""Renewals a run must make while its tool's thread runs (a run that gave up the lease stops at the first)."""


class Beats:
    """A heartbeat sleep the test drives: each renewal waits until `renew` lets it through.

    `watch` counts the store's renewals, so `renew` tells a lease really renewed from a beat that
    renewed nothing.
    """

    def __init__(self, store: SessionStore) -> None:
        self._gates: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()
        self.renewals = 0
        renew_lease = store.renew_lease

        async def counted(lease: Lease) -> Lease:
            renewed = await renew_lease(lease)
            self.renewals += 1
            return renewed

        store.renew_lease = counted  # type: ignore[method-assign]

    async def sleep(self, seconds: float) -> None:
        gate = asyncio.get_running_loop().create_future()
        self._gates.put_nowait(gate)
        await gate

    async def renew(self, run: asyncio.Task[object]) -> bool:
        """Let one renewal through and wait until the heartbeat sleeps again; False if `run` ended instead.

        False too if the heartbeat went round without renewing the lease.
        """
        before = self.renewals
        for _ in range(2):  # the gate of the sleep in progress, then the one after the renewal
            waiting = asyncio.ensure_future(self._gates.get())
            await asyncio.wait([waiting, run], return_when=asyncio.FIRST_COMPLETED)
            if run.done() or not waiting.done():
                waiting.cancel()
                return False
            gate = waiting.result()
            if gate.done():  # the heartbeat was stopped while it slept
                return False
            if _ == 0:
                gate.set_result(None)
            else:
                self._gates.put_nowait(gate)  # left for the next renewal
        return self.renewals > before


class Blocked:
    """A sync tool's body: it blocks its worker thread until the test releases it, and counts who runs."""

    def __init__(self, result: str) -> None:
        self.result = result
        self.loop = asyncio.get_running_loop()
        self.entered = asyncio.Event()
        self.release = threading.Event()
        self.calls = 0
        self.most_at_once = 0
        self._running = 0
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            self.calls += 1
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        self.loop.call_soon_threadsafe(self.entered.set)
        try:
            self.release.wait(timeout=120)  # the bound only stops a broken test from hanging the suite
            return self.result
        finally:
            with self._lock:
                self._running -= 1


@pytest.fixture
def blocked() -> Iterator[list[Blocked]]:
    """The blocked tools of a test, all released when it ends (so no thread outlives the test)."""
    made: list[Blocked] = []
    yield made
    for b in made:
        b.release.set()


def durability(beats: Beats) -> Durability:
    return Durability(heartbeat=Heartbeat(sleep=beats.sleep, shared_timer=False))


async def assert_busy(agent: Agent, tenant: str) -> None:
    with pytest.raises(SessionBusy):
        await agent.run("Anyone there?", session=await agent.session("chat", tenant=tenant))


async def test_a_cancelled_run_keeps_its_session_until_its_sync_tool_returns(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("sent")
    blocked.append(body)

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        return body()

    beats = Beats(store)
    model = ScriptedModel([tool_call("send_email", to="bob@example.com"), "The email went out."])
    agent = Agent(model, tools=[send_email], providers=[History(store)], durability=durability(beats))
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Email Bob.", session=session))
    await body.entered.wait()
    run.cancel()
    for _ in range(RENEWALS):  # the run goes on renewing its lease: the thread still runs
        assert await beats.renew(run), "the cancelled run gave its session back while its tool's thread ran"
    await assert_busy(agent, tenant)
    run.cancel()  # a second cancellation does not end the wait either
    for _ in range(RENEWALS):
        assert await beats.renew(run)
    await assert_busy(agent, tenant)

    body.release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    history = await agent.history(session)
    assert describe(history) == ["user:Email Bob.", "assistant:call:send_email", "tool:result:sent"]
    result = await agent.run(None, session=await agent.session("chat", tenant=tenant))  # the session is free
    assert result.text == "The email went out."
    assert not any("interrupted" in r.result for m in await agent.history(session) for r in m.function_results)
    assert body.calls == 1


async def test_an_idempotent_call_is_never_run_twice_at_once(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("Sunny, 25 C")
    blocked.append(body)

    @tool(idempotent=True)
    def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        return body()

    beats = Beats(store)
    model = ScriptedModel([tool_call("get_forecast", city="Suzhou"), "It is sunny."])
    agent = Agent(model, tools=[get_forecast], providers=[History(store)], durability=durability(beats))
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Forecast for Suzhou?", session=session))
    await body.entered.wait()
    run.cancel()
    for _ in range(RENEWALS):
        assert await beats.renew(run), "the cancelled run gave its session back while its tool's thread ran"
    # A resumed run waits for the session instead of running the call again beside the first thread.
    resumed = asyncio.create_task(agent.run(None, session=await agent.session("chat", tenant=tenant), lease_wait=60))
    for _ in range(RENEWALS):
        assert await beats.renew(run)
    assert not resumed.done() and body.calls == 1
    body.release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert (await resumed).text == "It is sunny."
    assert body.calls == 1 and body.most_at_once == 1  # the first run's result was recorded: not run again
    assert describe(await agent.history(session)) == [
        "user:Forecast for Suzhou?", "assistant:call:get_forecast", "tool:result:Sunny, 25 C", "assistant:It is sunny."]


async def test_a_timed_out_sync_tool_gets_a_late_result_and_keeps_the_session(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("report ready")
    blocked.append(body)

    @tool(timeout=0.001)  # the tool blocks until released: the timeout always comes first
    def build_report() -> str:
        """Build the monthly report."""
        return body()

    answered = asyncio.Event()

    def answer(request: ModelRequest) -> str:
        answered.set()
        return "The report is still being built."

    beats = Beats(store)
    model = ScriptedModel([tool_call("build_report", call_id="call_1"), answer, "Here is the report."])
    agent = Agent(model, tools=[build_report], providers=[History(store)], durability=durability(beats))
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Make the report.", session=session))
    await answered.wait()  # the model read the timeout error and answered: the run's own work is over
    for _ in range(RENEWALS):
        assert await beats.renew(run), "the run gave its session back while its tool's thread ran"
    await assert_busy(agent, tenant)
    timeout_error = model.requests[1].messages[-1].function_results[0]
    assert timeout_error.is_error and "did not finish within 0.001 s; it is still running" in timeout_error.result

    body.release.set()
    result = await run
    late = result.messages[-1]
    assert late.role == "user" and late.metadata == {LATE_RESULT_KEY: "call_1"}
    assert late.text.endswith("It has finished since and returned:\nreport ready")
    history = await agent.history(session)
    assert describe(history)[:4] == ["user:Make the report.", "assistant:call:build_report",
                                     f"tool:result:{timeout_error.result}",
                                     "assistant:The report is still being built."]
    assert history[4].id == late.id and history[4].metadata == {LATE_RESULT_KEY: "call_1"}
    # The session is free, and the next run's model reads the late result before the new input.
    assert (await agent.run("Is it ready?", session=session)).text == "Here is the report."
    assert [m.text for m in model.requests[2].messages][-2:] == [late.text, "Is it ready?"]


async def test_a_late_result_that_arrives_during_the_run_is_sent_with_the_next_model_call(
        tenant: str, blocked: list[Blocked]) -> None:
    # One worker thread: a job queued after the tool's own runs once the tool has returned, so its end
    # says the tool's result is in (the in-memory store uses no thread of its own).
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
    body = Blocked("report ready")
    blocked.append(body)

    @tool(timeout=0.001)
    def build_report() -> str:
        """Build the monthly report."""
        return body()

    @tool
    async def wait_for_report() -> str:
        """Wait until the report is built."""
        body.release.set()
        await asyncio.to_thread(lambda: None)  # queued behind the report's thread: it has returned
        return "done waiting"

    model = ScriptedModel([tool_call("build_report", call_id="call_1"), tool_call("wait_for_report"),
                           "Here is the report."])
    agent = Agent(model, tools=[build_report, wait_for_report], providers=[History(MemoryStore())])
    session = await agent.session("chat", tenant=tenant)
    result = await agent.run("Make the report.", session=session)
    assert result.text == "Here is the report."
    last_request = model.requests[2].messages
    assert last_request[-1].metadata == {LATE_RESULT_KEY: "call_1"}  # at the step boundary, before the model call
    assert describe(await agent.history(session))[-3:] == [
        "tool:result:done waiting", f"user:{last_request[-1].text}", "assistant:Here is the report."]


async def test_a_stream_closed_early_waits_for_its_sync_tool_before_it_gives_the_session_back(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("sent")
    blocked.append(body)

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        return body()

    @tool
    async def lookup_address(name: str) -> str:
        """Return a person's email address."""
        return "bob@example.com"

    beats = Beats(store)
    model = ScriptedModel([tool_call("send_email", to="bob@example.com") + tool_call("lookup_address", name="Bob"),
                           "Done."])
    agent = Agent(model, tools=[send_email, lookup_address], providers=[History(store)], durability=durability(beats))
    session = await agent.session("chat", tenant=tenant)

    async def read_until_the_first_result() -> None:
        async with agent.stream("Email Bob.", session=session) as events:
            async for event in events:
                if isinstance(event, ToolCallFinished):
                    break  # leaving the block closes the stream while send_email's thread runs

    reader = asyncio.create_task(read_until_the_first_result())
    await body.entered.wait()
    for _ in range(RENEWALS):
        assert await beats.renew(reader), "the closed stream gave its session back while its tool's thread ran"
    await assert_busy(agent, tenant)
    body.release.set()
    await reader
    assert sorted(describe(await agent.history(session))[2:]) == ["tool:result:bob@example.com", "tool:result:sent"]


async def test_a_lost_lease_ends_the_wait_for_a_thread_at_once(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("sent")
    blocked.append(body)

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        return body()

    beats = Beats(store)
    model = ScriptedModel([tool_call("send_email", to="bob@example.com")])
    agent = Agent(model, tools=[send_email], providers=[History(store)], durability=durability(beats))
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Email Bob.", session=session))
    await body.entered.wait()
    run.cancel()
    assert await beats.renew(run)
    assert await store.delete_session(tenant, "chat")  # an operator deletes the session while the thread runs
    assert not await beats.renew(run)  # the renewal finds the lease gone: the run stops waiting and ends
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not body.release.is_set() and await store.get_session(tenant, "chat") is None


async def test_a_repair_cancelled_while_it_runs_a_call_again_records_the_threads_result(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("Sunny, 25 C")
    blocked.append(body)

    @tool(idempotent=True)
    def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        return body()

    @tool(idempotent=True)
    def get_time(city: str) -> str:
        """Return the local time in a city."""
        return "09:00"

    # A log a crashed worker left: two calls to idempotent tools, no results.
    calls = Message("assistant", (FunctionCall("c1", "get_forecast", '{"city": "Suzhou"}'),
                                  FunctionCall("c2", "get_time", '{"city": "Suzhou"}')))
    session_store = await store.load_or_create(tenant, "chat")
    await store.append(tenant, "chat", [Message.user("Weather and time in Suzhou?"), calls])
    beats = Beats(store)
    model = ScriptedModel(["Sunny, 25 C at 09:00."])
    agent = Agent(model, tools=[get_forecast, get_time], providers=[History(store)], durability=durability(beats))
    run = asyncio.create_task(agent.run(None, session=session_store))
    await body.entered.wait()  # the repair runs c1 again
    run.cancel()
    for _ in range(RENEWALS):
        assert await beats.renew(run), "the cancelled repair gave its session back while its tool's thread ran"
    body.release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert describe(await agent.history(session_store)) == [
        "user:Weather and time in Suzhou?", "assistant:call:get_forecast,get_time", "tool:result:Sunny, 25 C"]
    result = await agent.run(None, session=await agent.session("chat", tenant=tenant))  # c2 is run again, not c1
    assert result.text == "Sunny, 25 C at 09:00." and body.calls == 1
    assert describe(await agent.history(session_store))[2:] == [
        "tool:result:Sunny, 25 C", "tool:result:09:00", "assistant:Sunny, 25 C at 09:00."]


class SignallingHistory(History):
    """History that tells the test each time it saved a tool message."""

    def __init__(self, store: SessionStore) -> None:
        super().__init__(store)
        self.saved_results: asyncio.Queue[str] = asyncio.Queue()

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        await super().save(session, messages, lease=lease, durable=durable)
        for m in messages:
            for r in m.function_results:
                self.saved_results.put_nowait(r.call_id)


async def test_a_cancelled_step_answers_the_calls_it_stopped_when_a_late_result_must_follow_them(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("report ready")
    blocked.append(body)

    @tool(timeout=0.001)
    def build_report() -> str:
        """Build the monthly report."""
        return body()

    @tool
    async def notify_team(text: str) -> str:
        """Tell the team."""
        await asyncio.Event().wait()  # never finishes: the run is cancelled while it waits
        return "told"

    beats = Beats(store)
    history = SignallingHistory(store)
    model = ScriptedModel([tool_call("build_report", call_id="call_1") + tool_call("notify_team", text="soon",
                                                                                   call_id="call_2"),
                           "The report is ready."])
    agent = Agent(model, tools=[build_report, notify_team], providers=[history], durability=durability(beats))
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Make the report and tell the team.", session=session))
    assert await history.saved_results.get() == "call_1"  # the timeout error; notify_team still runs
    run.cancel()
    for _ in range(RENEWALS):
        assert await beats.renew(run), "the cancelled run gave its session back while its tool's thread ran"
    body.release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    stored = await agent.history(session)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "tool", "user"]
    stopped = stored[3].function_results[0]
    assert stopped.call_id == "call_2" and stopped.is_error and "was stopped before it finished" in stopped.result
    assert stored[4].metadata == {LATE_RESULT_KEY: "call_1"}
    result = await agent.run(None, session=await agent.session("chat", tenant=tenant))
    assert result.text == "The report is ready."
    assert not [c for t in result.traces for c in t.changes if c.action == "repaired_log"]  # nothing to repair


async def test_a_parallel_result_that_finished_as_the_run_was_cancelled_is_kept(
        store: SessionStore, tenant: str, blocked: list[Blocked]) -> None:
    body = Blocked("sent")
    blocked.append(body)

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        return body()

    quick_done = asyncio.Event()

    @tool
    async def log_request(text: str) -> str:
        """Write the request to the audit log."""
        quick_done.set()
        return "logged"

    beats = Beats(store)
    model = ScriptedModel([tool_call("send_email", to="bob@example.com") + tool_call("log_request", text="email"),
                           "Done."])
    agent = Agent(model, tools=[send_email, log_request], providers=[History(store)], durability=durability(beats))
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run("Email Bob.", session=session))
    await body.entered.wait()
    await quick_done.wait()
    run.cancel()  # log_request's task may be done while its result is not taken yet: it is kept all the same
    body.release.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert sorted(describe(await agent.history(session))[2:]) == ["tool:result:logged", "tool:result:sent"]


async def test_a_late_result_is_a_tools_output_not_the_users_words(tenant: str, blocked: list[Blocked]) -> None:
    """A late result has the ``user`` role (any model API takes it there), but memory must not learn it as
    what the user said, and compaction must not count it as a user turn (nor pin it as the latest one)."""
    body = Blocked("report ready: 42 pages")
    blocked.append(body)

    @tool(timeout=0.001)
    def build_report() -> str:
        """Build the monthly report."""
        return body()

    def answer(request: ModelRequest) -> str:
        body.release.set()  # the thread returns after the model's answer: its late result ends the run
        return "The report is still being built."

    vectors = MemoryVectorStore()
    memory = SemanticMemory(vectors, HashEmbedder(), collection="late_memory", names_lookup=False)
    extractor = ScriptedModel(['{"add": [], "update": [], "delete": []}'] * 2)
    facts = FactMemory(extractor, MemoryVectorStore(), HashEmbedder(), collection="late_facts")
    model = ScriptedModel([tool_call("build_report", call_id="call_1"), answer, "It has 42 pages."])
    agent = Agent(model, tools=[build_report], providers=[History(MemoryStore()), memory, facts])
    session = await agent.session("chat", tenant=tenant)
    session.state["user_id"] = "late-maya"
    result = await agent.run("Make the report.", session=session)
    assert result.messages[-1].metadata == {LATE_RESULT_KEY: "call_1"}
    await agent.run("How long is it?", session=session)  # the late result is loaded history now

    remembered = await vectors.search("late_memory", text="report pages ready late result", k=10)
    assert {h.text for h in remembered} == {"Make the report.", "The report is still being built.",
                                            "How long is it?", "It has 42 pages."}
    assert not any("Late result" in str(h.metadata.get(side)) for h in remembered for side in ("before", "after"))
    learned = [r.messages[0].text.split("New turns:\n", 1)[1] for r in extractor.requests]
    assert learned and not any("Late result" in turns for turns in learned)

    history = await agent.history(session)
    groups = group_messages(history)
    assert [g.kind for g in groups if g.kind == "user"] == ["user", "user"]  # the two questions only
    assert groups[[g.start for g in groups].index(4)].kind != "user" and is_late_result(history[4])


async def test_a_cancelled_repair_stops_the_async_call_it_runs_again(store: SessionStore, tenant: str) -> None:
    """Only a sync tool's thread outlives its run: an idempotent async call that a repair runs again is
    cancelled with the run, so nothing of the run goes on once it has ended."""
    entered, stopped = asyncio.Event(), asyncio.Event()

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        return "Sunny"

    calls = Message("assistant", (FunctionCall("c1", "get_forecast", '{"city": "Suzhou"}'),))
    session = await store.load_or_create(tenant, "chat")
    await store.append(tenant, "chat", [Message.user("Weather in Suzhou?"), calls])
    agent = Agent(ScriptedModel(["Sunny."]), tools=[get_forecast], providers=[History(store)])
    run = asyncio.create_task(agent.run(None, session=session))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert stopped.is_set()  # the call was cancelled with the run, not left running in the background
    assert describe(await agent.history(session)) == ["user:Weather in Suzhou?", "assistant:call:get_forecast"]
