"""Human approval in a session saved per run: the answer to decided calls is saved as soon as they ran.

A run saved per run stores its messages when it ends; the answers to calls a person decided (their
results, their late results, what a cut run's threads returned) cannot wait for that, or a run that
fails afterwards would leave a completed side effect to be reported "interrupted".
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent, ApprovalError, Durability, tool
from contextpipe.errors import StoreError
from contextpipe.exchanges import LATE_RESULT_KEY
from contextpipe.exchanges import exchange_problem as broken_exchange
from contextpipe.messages import FunctionCall
from contextpipe.models import ModelRequest
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.stores.base import SessionStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from contextpipe.tools import Tool
from helpers import PAID, balance, pay

PER_RUN = Durability(persistence="per_run")


@pytest.fixture(autouse=True)
def _no_payments() -> None:
    PAID.clear()


def agent_for(*script: Any, tools: list[Tool] | None = None, durability: Durability = PER_RUN,
              store: SessionStore | None = None) -> Agent:
    return Agent(ScriptedModel(list(script)), tools=tools if tools is not None else [pay, balance],
                 store=store if store is not None else MemoryStore(), durability=durability)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    s = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "sessions.db")
    yield s
    await s.close()


async def cut_while_running(task: asyncio.Future[Any], started: threading.Event, release: threading.Event) -> None:
    """Cancel `task` once its tool's thread `started`, then `release` the thread; the run ends cancelled."""
    assert await asyncio.to_thread(started.wait, 120), "the approved call never started"
    task.cancel()  # the run waits for the thread before it ends
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_run_saved_per_run_that_fails_after_the_approved_call_ran_keeps_its_result(
        store: SessionStore) -> None:
    agent = agent_for(tool_call("pay", invoice="A", amount=1), RuntimeError("the model is down"), "Paid A.",
                      store=store)
    session = await agent.session("s")
    [pending] = (await agent.run("Pay A.", session=session)).pending_approvals
    with pytest.raises(RuntimeError, match="model is down"):  # the call ran and its result was saved at once
        await agent.run(None, session=session, approvals={pending.call_id: pending.approve()})
    assert PAID == ["A"]
    log = await agent.history(session)
    assert [r.result for r in log[-1].function_results] == ["paid A"]  # never "interrupted": it completed
    assert await agent.pending_approvals(session) == []
    with pytest.raises(ApprovalError):  # nothing awaits a decision any more
        await agent.run(None, session=session, approvals={pending.call_id: pending.reject()})
    result = await agent.run(None, session=session)
    assert result.text == "Paid A." and PAID == ["A"]
    assert [m.role for m in await agent.history(session)] == ["user", "assistant", "tool", "assistant"]


class CountingStore(MemoryStore):
    """A memory store that records the roles of each batch appended to it."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def append(self, tenant: str, session_id: str, messages: Any, **kwargs: Any) -> Any:
        self.batches.append([m.role for m in messages])
        return await super().append(tenant, session_id, messages, **kwargs)


async def test_a_run_saved_per_run_stores_the_decided_answer_once_before_its_input() -> None:
    store = CountingStore()
    agent = Agent(ScriptedModel([tool_call("pay", invoice="A", amount=1), "Paid A; B next."]), tools=[pay],
                  store=store, durability=PER_RUN)
    session = await agent.session("s")
    [pending] = (await agent.run("Pay A.", session=session)).pending_approvals
    result = await agent.run("Then B.", session=session, approvals={pending.call_id: pending.approve()})
    assert result.text == "Paid A; B next."
    log = await agent.history(session)
    assert [m.role for m in log] == ["user", "assistant", "tool", "user", "assistant"]
    assert broken_exchange(log) is None
    assert store.batches == [["user", "assistant"], ["tool"], ["user", "assistant"]]  # the answer sent once


async def test_a_run_saved_per_run_cut_while_an_approved_sync_tool_runs_keeps_what_its_thread_returned(
        store: SessionStore) -> None:
    started, release, calls = threading.Event(), threading.Event(), []

    @tool(needs_approval=True)
    def ship(order: str) -> str:
        """Ship an order."""
        calls.append(order)
        started.set()
        assert release.wait(timeout=120), "the test never released the tool"
        return f"shipped {order}"

    agent = agent_for(tool_call("ship", order="O-1"), "Checked.", tools=[ship], store=store)
    session = await agent.session("s")
    [pending] = (await agent.run("Ship O-1.", session=session)).pending_approvals
    task = asyncio.ensure_future(agent.run(None, session=session, approvals={pending.call_id: pending.approve()}))
    await cut_while_running(task, started, release)
    answers = {r.call_id: r.result for m in await agent.history(session) for r in m.function_results}
    assert answers == {pending.call_id: "shipped O-1"}  # the thread's result, not "interrupted"
    result = await agent.run(None, session=session)
    assert result.text == "Checked." and calls == ["O-1"]


async def test_a_late_result_of_an_approved_call_is_kept_when_the_run_then_fails() -> None:
    release = threading.Event()

    @tool(needs_approval=True, timeout=0.001)  # it blocks until released: the timeout always comes first
    def ship(order: str) -> str:
        """Ship an order."""
        release.wait(timeout=120)  # the bound only stops a broken test from hanging the suite
        return f"shipped {order}"

    def down(request: ModelRequest) -> str:
        release.set()  # the thread returns; the run fails, waits for it, and keeps its late result
        raise RuntimeError("the model is down")

    agent = agent_for(tool_call("ship", order="O-1"), down, tools=[ship])
    session = await agent.session("s")
    [pending] = (await agent.run("Ship O-1.", session=session)).pending_approvals
    with pytest.raises(RuntimeError, match="model is down"):
        await agent.run(None, session=session, approvals={pending.call_id: pending.approve()})
    log = await agent.history(session)
    assert [m.role for m in log] == ["user", "assistant", "tool", "user"]
    assert log[2].function_results[0].is_error  # the timeout, saved as soon as it was the answer
    assert log[3].metadata[LATE_RESULT_KEY] == pending.call_id and "shipped O-1" in log[3].text
    assert broken_exchange(log) is None


@pytest.mark.parametrize("persistence", ["per_step", "per_run"])
async def test_a_model_reusing_the_id_of_the_call_just_answered_gets_a_new_one(persistence: Any) -> None:
    reused = Turn(calls=(FunctionCall("call_1", "balance", "{}"),))  # the id of the call a person approved
    agent = agent_for(tool_call("pay", invoice="A", amount=1, call_id="call_1"), reused, "Paid A; 1200 EUR left.",
                      durability=Durability(persistence=persistence))
    session = await agent.session("s")
    [pending] = (await agent.run("Pay A.", session=session)).pending_approvals
    result = await agent.run(None, session=session, approvals={pending.call_id: pending.approve()})
    assert result.text == "Paid A; 1200 EUR left." and PAID == ["A"]
    log = await agent.history(session)
    ids = [c.call_id for m in log for c in m.function_calls]
    assert len(ids) == len(set(ids)) == 2 and ids[0] == "call_1"
    assert [r.result for m in log for r in m.function_results] == ["paid A", "1200 EUR"]
    assert broken_exchange(log) is None
    assert any("used twice" in note for t in result.traces for change in t.changes for note in change.items)


@pytest.mark.parametrize("persistence", ["per_step", "per_run"])
async def test_a_late_result_is_stored_where_the_model_saw_it_whatever_the_persistence(persistence: Any) -> None:
    release = threading.Event()

    @tool(needs_approval=True, timeout=0.001)  # it blocks until released: the timeout always comes first
    def ship(order: str) -> str:
        """Ship an order."""
        release.wait(timeout=120)
        return f"shipped {order}"

    def answer(request: ModelRequest) -> str:
        release.set()  # the run ends once the thread's late result is saved
        return "O-1 is on its way."

    agent = agent_for(tool_call("ship", order="O-1"), answer, tools=[ship],
                      durability=Durability(persistence=persistence))
    session = await agent.session("s")
    [pending] = (await agent.run("Ship O-1.", session=session)).pending_approvals
    result = await agent.run("Where is it?", session=session, approvals={pending.call_id: pending.approve()})
    log = await agent.history(session)
    assert [m.id for m in log[2:]] == [m.id for m in (result.messages[0], *result.input, *result.messages[1:])]
    assert [m.role for m in log] == ["user", "assistant", "tool", "user", "assistant", "user"]
    assert log[-1].metadata[LATE_RESULT_KEY] == pending.call_id and broken_exchange(log) is None


def two_shipments() -> Turn:
    return tool_call("ship", order="O-1") + tool_call("ship", order="O-2")


@pytest.mark.parametrize("persistence", ["per_step", "per_run"])
async def test_a_call_run_as_its_tool_is_now_always_allowed_and_cut_keeps_what_its_thread_returned(
        persistence: Any) -> None:
    started, release, calls = threading.Event(), threading.Event(), []

    @tool(needs_approval=True)
    def ship(order: str) -> str:
        """Ship an order."""
        calls.append(order)
        if order == "O-2":
            started.set()
            release.wait(timeout=120)
        return f"shipped {order}"

    agent = agent_for(two_shipments(), "Checked.", tools=[ship], durability=Durability(persistence=persistence))
    session = await agent.session("s")
    first, second = (await agent.run("Ship both.", session=session)).pending_approvals
    # Approving the first for always allows the second: it runs as allowed, with no decision of its own.
    task = asyncio.ensure_future(agent.run(None, session=session,
                                           approvals={first.call_id: first.approve(always=True)}))
    await cut_while_running(task, started, release)
    answers = {r.call_id: r.result for m in await agent.history(session) for r in m.function_results}
    assert answers == {first.call_id: "shipped O-1", second.call_id: "shipped O-2"}  # never "interrupted"
    result = await agent.run(None, session=session)
    assert result.text == "Checked." and calls == ["O-1", "O-2"]


@pytest.mark.parametrize("persistence", ["per_step", "per_run"])
async def test_the_late_result_of_a_call_run_as_allowed_is_kept_when_the_run_then_fails(persistence: Any) -> None:
    release = threading.Event()

    @tool(needs_approval=True, timeout=0.001)
    def ship(order: str) -> str:
        """Ship an order."""
        if order == "O-2":
            release.wait(timeout=120)  # its timeout always comes first
        return f"shipped {order}"

    def down(request: ModelRequest) -> str:
        release.set()
        raise RuntimeError("the model is down")

    agent = agent_for(two_shipments(), down, tools=[ship], durability=Durability(persistence=persistence))
    session = await agent.session("s")
    first, second = (await agent.run("Ship both.", session=session)).pending_approvals
    with pytest.raises(RuntimeError, match="model is down"):
        await agent.run(None, session=session, approvals={first.call_id: first.approve(always=True)})
    log = await agent.history(session)
    late = [m for m in log if m.metadata.get(LATE_RESULT_KEY) == second.call_id]
    assert len(late) == 1 and "shipped O-2" in late[0].text and broken_exchange(log) is None


class SaveOfTheRunBreaks(MemoryStore):
    """A memory store whose append of a run's messages (the one holding a model output) fails, once armed.

    `how="fail"` raises `StoreError`; `how="hang"` never returns (the run is cancelled there).
    """

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.armed, self.reached = how, False, asyncio.Event()
        self.batches: list[list[str]] = []

    async def append(self, tenant: str, session_id: str, messages: Any, **kwargs: Any) -> Any:
        messages = list(messages)
        if self.armed and any(m.role == "assistant" for m in messages):
            self.armed = False
            self.reached.set()
            if self.how == "fail":
                raise StoreError("the disk is full")
            await asyncio.Event().wait()
        self.batches.append([m.role for m in messages])
        return await super().append(tenant, session_id, messages, **kwargs)


def late_shipment(store: MemoryStore, answer: Any) -> Agent:
    """An agent whose approved `ship` times out at once and returns later, when `answer` (the model) releases it."""
    return agent_for(tool_call("ship", order="O-1"), answer, tools=[ship], store=store)


SHIPPED = threading.Event()


@tool(needs_approval=True, timeout=0.001)  # it blocks until released: the timeout always comes first
def ship(order: str) -> str:
    """Ship an order."""
    SHIPPED.wait(timeout=120)  # the bound only stops a broken test from hanging the suite
    return f"shipped {order}"


def assert_late_result_kept(log: list[Any], call_id: str) -> None:
    assert [m.role for m in log] == ["user", "assistant", "tool", "user"]
    assert log[2].function_results[0].is_error  # the timeout, saved as soon as it was the answer
    assert log[3].metadata[LATE_RESULT_KEY] == call_id and "shipped O-1" in log[3].text
    assert broken_exchange(log) is None


@pytest.mark.parametrize("how", ["fail", "hang"])
async def test_the_late_result_of_an_approved_call_is_kept_when_the_save_of_the_run_fails_or_is_cut(
        how: str) -> None:
    SHIPPED.clear()

    def answer(request: ModelRequest) -> str:
        SHIPPED.set()  # the run ends once the thread returned: its late result is among the run's messages
        return "O-1 is on its way."

    store = SaveOfTheRunBreaks(how)
    agent = late_shipment(store, answer)
    session = await agent.session("s")
    [pending] = (await agent.run("Ship O-1.", session=session)).pending_approvals
    store.armed = True
    task = asyncio.ensure_future(agent.run(None, session=session, approvals={pending.call_id: pending.approve()}))
    await store.reached.wait()
    if how == "hang":
        task.cancel()
    with pytest.raises(StoreError if how == "fail" else asyncio.CancelledError):
        await task
    assert_late_result_kept(await agent.history(session), pending.call_id)
    assert store.batches[-2:] == [["tool"], ["user"]]  # the timeout's answer once, then the late result alone


async def test_the_late_result_of_an_approved_call_is_kept_when_the_run_is_cancelled_waiting_for_its_thread() -> None:
    SHIPPED.clear()
    answered = threading.Event()

    def answer(request: ModelRequest) -> str:
        answered.set()  # the run then waits for the thread (the cancellation is deferred until it returns)
        return "O-1 is on its way."

    agent = late_shipment(MemoryStore(), answer)
    session = await agent.session("s")
    [pending] = (await agent.run("Ship O-1.", session=session)).pending_approvals
    task = asyncio.ensure_future(agent.run(None, session=session, approvals={pending.call_id: pending.approve()}))
    await cut_while_running(task, answered, SHIPPED)
    assert_late_result_kept(await agent.history(session), pending.call_id)
