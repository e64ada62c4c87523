"""A sibling's late result while its exchange waits for a person: held in the session, given back after the answer.

The model asks for a call that needs approval and, in the same message, for a sync tool that times
out. The run stops for the approval, but the sibling's thread still runs: its late result may not
go into the log before the waiting call is answered (nothing comes between a call and its result),
and the waiting call may not be answered "stopped" either. It is held in the session's state and
follows the answer of the run that decides; on every backend, whatever the persistence.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from contextpipe import Agent, ApprovalRequired, Durability, RunDone, tool
from contextpipe.approvals import STATE_KEY
from contextpipe.errors import StoreError
from contextpipe.exchanges import LATE_RESULT_KEY
from contextpipe.exchanges import exchange_problem as broken_exchange
from contextpipe.models import ModelRequest
from contextpipe.session import Session
from contextpipe.stores import MemoryStore
from contextpipe.stores.base import SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import PAID, pay

PERSISTENCE = ["per_step", "per_run"]
SID = f"late-{uuid.uuid4().hex[:12]}"  # the servers are shared: a test's session is its own (a fresh SID each)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global SID
    PAID.clear()
    SID = f"late-{uuid.uuid4().hex[:12]}"


class Lookup:
    """A sync tool whose thread blocks until the test releases it, so its timeout always comes first."""

    def __init__(self) -> None:
        self.release = threading.Event()

        @tool(timeout=0.001)
        def lookup(invoice: str) -> str:
            """Look an invoice up."""
            assert self.release.wait(timeout=120), "the test never released the tool"  # only stops a broken test
            return f"{invoice} is due on 3 March"

        self.tool = lookup


def agent_for(store: SessionStore, lookup: Lookup, *script: Any, persistence: Any) -> Agent:
    model = ScriptedModel([tool_call("pay", invoice="INV-7", amount=120) + tool_call("lookup", invoice="INV-7"),
                           *script])
    return Agent(model, tools=[pay, lookup.tool], store=store, durability=Durability(persistence=persistence))


async def stop_for_approval(agent: Agent, lookup: Lookup) -> list[Any]:
    """Run until the approval stop, releasing the sibling's thread once the run announced the stop."""
    events = []
    async for event in agent.stream("Pay INV-7 and tell me when it is due.", session=await agent.session(SID)):
        if isinstance(event, ApprovalRequired):
            lookup.release.set()  # the run has answered lookup with its timeout, and now waits for its thread
        events.append(event)
    return events


def roles(log: list[Any]) -> list[str]:
    return [m.role for m in log]


@pytest.mark.parametrize("persistence", PERSISTENCE)
async def test_a_late_sibling_result_waits_in_the_session_and_follows_the_approved_answer(
        store: SessionStore, persistence: Any) -> None:
    lookup = Lookup()
    seen: list[ModelRequest] = []

    def answer(request: ModelRequest) -> str:
        seen.append(request)
        return "Paid INV-7; it was due on 3 March."

    agent = agent_for(store, lookup, answer, persistence=persistence)
    events = await stop_for_approval(agent, lookup)
    done = events[-1]
    assert isinstance(done, RunDone) and done.result.stop_reason == "approval_required"
    [pending] = done.result.pending_approvals
    assert pending.tool_name == "pay"
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool"]  # the waiting call is not answered "stopped"
    assert log[2].function_results[0].is_error  # lookup's timeout
    assert [p.call_id for p in await agent.pending_approvals(await agent.session(SID))] == [pending.call_id]
    session = await agent.session(SID)  # as another worker would read it
    [held] = session.state[STATE_KEY]["late"]
    assert held["metadata"][LATE_RESULT_KEY] == log[2].function_results[0].call_id

    result = await agent.run(None, session=session, approvals={pending.call_id: pending.approve()})
    assert result.text == "Paid INV-7; it was due on 3 March." and PAID == ["INV-7"]
    log = await agent.history(session)
    assert roles(log) == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert [r.result for r in log[3].function_results] == ["paid INV-7"]
    assert log[4].id == held["id"] and "INV-7 is due on 3 March" in log[4].text
    assert broken_exchange(log) is None
    assert [m.id for m in seen[0].messages[-2:]] == [log[3].id, log[4].id]  # the late result right after the answer
    assert STATE_KEY not in (await agent.session(SID)).state  # nothing held, nothing approved any more
    assert [m.id for m in result.messages[:2]] == [log[3].id, log[4].id]


@pytest.mark.parametrize("persistence", PERSISTENCE)
async def test_a_late_sibling_result_follows_a_rejection_and_stays_held_while_nothing_is_decided(
        store: SessionStore, persistence: Any) -> None:
    lookup = Lookup()
    agent = agent_for(store, lookup, "Not paid; INV-7 is due on 3 March.", persistence=persistence)
    [pending] = (await stop_for_approval(agent, lookup))[-1].result.pending_approvals
    again = await agent.run(None, session=await agent.session(SID))  # no decision: it stops again, holds on
    assert again.stop_reason == "approval_required" and [p.call_id for p in again.pending_approvals] == [
        pending.call_id]
    assert len((await agent.session(SID)).state[STATE_KEY]["late"]) == 1
    assert roles(await agent.history(await agent.session(SID))) == ["user", "assistant", "tool"]
    result = await agent.run(None, session=await agent.session(SID),
                             approvals={pending.call_id: pending.reject("not this month")})
    assert result.text == "Not paid; INV-7 is due on 3 March." and PAID == []
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert "not this month" in log[3].function_results[0].result
    assert log[4].metadata[LATE_RESULT_KEY] == log[2].function_results[0].call_id
    assert broken_exchange(log) is None and STATE_KEY not in (await agent.session(SID)).state


@pytest.mark.parametrize("persistence", PERSISTENCE)
@pytest.mark.parametrize("given", [None, "Thanks."])
async def test_a_late_result_held_when_the_deciding_run_was_cut_follows_at_the_next_run(
        store: SessionStore, given: str | None, persistence: Any) -> None:
    """The run that decides is cut while the approved call runs. Without input (or per run) the call
    stays open (approved: the next run answers it as interrupted); with input, per step, the cut run
    answers it and keeps its input. Either way the next run gives back the late result still held."""
    lookup, started, calls = Lookup(), asyncio.Event(), []

    @tool(needs_approval=True)
    async def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        calls.append(invoice)
        started.set()
        await asyncio.Event().wait()  # cut while it runs
        return "never"

    model = ScriptedModel([tool_call("pay", invoice="INV-7", amount=120) + tool_call("lookup", invoice="INV-7"),
                           "INV-7 may not be paid; it is due on 3 March."])
    agent = Agent(model, tools=[pay, lookup.tool], store=store, durability=Durability(persistence=persistence))
    [pending] = (await stop_for_approval(agent, lookup))[-1].result.pending_approvals
    task = asyncio.ensure_future(agent.run(given, session=await agent.session(SID),
                                           approvals={pending.call_id: pending.approve()}))
    await asyncio.wait_for(started.wait(), 120)  # the bound only stops a broken test from hanging the suite
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    kept = given is not None and persistence == "per_step"  # a run saved per run that is cut keeps no input
    log = await agent.history(await agent.session(SID))
    assert roles(log) == (["user", "assistant", "tool", "tool", "user"] if kept else  # the input after the answer
                          ["user", "assistant", "tool"])
    assert len((await agent.session(SID)).state[STATE_KEY]["late"]) == 1
    result = await agent.run(None, session=await agent.session(SID))
    assert result.text == "INV-7 may not be paid; it is due on 3 March." and calls == ["INV-7"]
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "tool", *(["user"] if kept else []), "user", "assistant"]
    assert "was interrupted before it finished" in log[3].function_results[0].result  # never run twice
    assert log[-2].metadata[LATE_RESULT_KEY] == log[2].function_results[0].call_id
    assert broken_exchange(log) is None and STATE_KEY not in (await agent.session(SID)).state


class SavesBreak(MemoryStore):
    """A memory store whose save of the run's messages (`messages=True`) or of a state without held late
    results (`state=True`) fails with `StoreError`, once armed."""

    def __init__(self, *, messages: bool = False, state: bool = False) -> None:
        super().__init__()
        self.messages, self.state, self.armed = messages, state, False

    async def append(self, tenant: str, session_id: str, messages: Any, **kwargs: Any) -> Any:
        messages = list(messages)
        if self.armed and self.messages and any(m.role == "assistant" for m in messages):
            self.armed = False
            raise StoreError("the disk is full")
        return await super().append(tenant, session_id, messages, **kwargs)

    async def save_session(self, session: Session, **kwargs: Any) -> None:
        if self.armed and self.state and "late" not in session.state.get(STATE_KEY, {}):
            self.armed = False
            raise StoreError("the disk is full")
        await super().save_session(session, **kwargs)


@pytest.mark.parametrize("persistence", PERSISTENCE)
async def test_a_held_late_result_saved_with_the_answer_is_forgotten_when_the_state_save_was_lost(
        persistence: Any) -> None:
    """The deciding run saved the answer and the late result, then failed to save the session's state:
    the next run finds the result in the log, forgets it, and adds nothing twice."""
    lookup, store = Lookup(), SavesBreak(state=True)
    agent = agent_for(store, lookup, "Paid INV-7.", "Anything else?", persistence=persistence)
    [pending] = (await stop_for_approval(agent, lookup))[-1].result.pending_approvals
    store.armed = True
    with pytest.raises(StoreError):
        await agent.run(None, session=await agent.session(SID), approvals={pending.call_id: pending.approve()})
    assert "late" in (await agent.session(SID)).state[STATE_KEY]  # the state still says it is held
    result = await agent.run("Thanks.", session=await agent.session(SID))
    assert result.text == "Anything else?"
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "tool", "user", "assistant", "user", "assistant"]
    assert [m.metadata.get(LATE_RESULT_KEY) is not None for m in log].count(True) == 1
    assert "late" not in (await agent.session(SID)).state.get(STATE_KEY, {}) and broken_exchange(log) is None


async def test_per_run_nothing_is_held_for_calls_whose_run_was_not_saved() -> None:
    lookup, store = Lookup(), SavesBreak(messages=True)
    store.armed = True
    agent = agent_for(store, lookup, persistence="per_run")
    with pytest.raises(StoreError, match="disk is full"):
        await stop_for_approval(agent, lookup)
    assert await agent.history(await agent.session(SID)) == []
    assert STATE_KEY not in (await agent.session(SID)).state  # no late result of a call the log never had


@pytest.mark.parametrize("persistence", PERSISTENCE)
async def test_a_run_cancelled_while_it_waits_for_the_sibling_holds_its_result_only_where_its_calls_are_saved(
        store: SessionStore, persistence: Any) -> None:
    lookup, announced = Lookup(), asyncio.Event()
    agent = agent_for(store, lookup, "Paid INV-7.", persistence=persistence)

    async def consume() -> None:
        async for event in agent.stream("Pay INV-7 and tell me when it is due.", session=await agent.session(SID)):
            if isinstance(event, ApprovalRequired):
                announced.set()  # the run now waits for lookup's thread, before anything else can run

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(announced.wait(), 120)  # the bound only stops a broken test from hanging the suite
    task.cancel()  # deferred until the thread returns
    lookup.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    log = await agent.history(await agent.session(SID))
    state = (await agent.session(SID)).state
    if persistence == "per_run":  # a cancelled run saved per run keeps no call, so no late result of one
        assert [m.function_calls for m in log] == [[] for _ in log]
        assert "late" not in state.get(STATE_KEY, {})
        return
    assert roles(log) == ["user", "assistant", "tool"]
    [held] = state[STATE_KEY]["late"]
    [pending] = await agent.pending_approvals(await agent.session(SID))
    await agent.run(None, session=await agent.session(SID), approvals={pending.call_id: pending.approve()})
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "tool", "user", "assistant"] and log[4].id == held["id"]
    assert broken_exchange(log) is None


@pytest.mark.parametrize("persistence", PERSISTENCE)
async def test_a_decided_call_that_times_out_while_another_still_waits_has_its_late_result_held(
        store: SessionStore, persistence: Any) -> None:
    """A person approves one of two calls; it times out, the other still waits, and the client closes the
    stream at the approval stop: the late result waits for the other call's answer, whatever the persistence."""
    release = threading.Event()

    @tool(needs_approval=True, timeout=0.001)  # it blocks until released: the timeout always comes first
    def ship(order: str) -> str:
        """Ship an order."""
        assert release.wait(timeout=120), "the test never released the tool"
        return f"shipped {order}"

    model = ScriptedModel([tool_call("ship", order="O-1") + tool_call("pay", invoice="INV-7", amount=120),
                           "Shipped O-1 and paid INV-7."])
    agent = Agent(model, tools=[ship, pay], store=store, durability=Durability(persistence=persistence))
    first = await agent.run("Ship O-1 and pay INV-7.", session=await agent.session(SID))
    decide = {p.tool_name: p for p in first.pending_approvals}
    async with agent.stream(None, session=await agent.session(SID),
                            approvals={decide["ship"].call_id: decide["ship"].approve()}) as events:
        async for event in events:
            if isinstance(event, ApprovalRequired):
                release.set()
                break  # the client goes away at the stop; the run still waits for ship's thread
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool"] and log[2].function_results[0].is_error  # ship's timeout
    assert [p.call_id for p in await agent.pending_approvals(await agent.session(SID))] == [decide["pay"].call_id]
    assert len((await agent.session(SID)).state[STATE_KEY]["late"]) == 1
    result = await agent.run(None, session=await agent.session(SID),
                             approvals={decide["pay"].call_id: decide["pay"].approve()})
    assert result.text == "Shipped O-1 and paid INV-7." and PAID == ["INV-7"]
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert log[4].metadata[LATE_RESULT_KEY] == decide["ship"].call_id and "shipped O-1" in log[4].text
    assert broken_exchange(log) is None and STATE_KEY not in (await agent.session(SID)).state


async def test_per_run_the_late_result_of_a_call_the_log_held_is_kept_when_the_run_then_fails() -> None:
    """Per run: a person approves a sync call, which times out (its answer saved at once); the model then
    makes a call that waits, and the save of the run fails. The late result of the approved call, whose
    call is in the log, is held all the same, and the next run gives it back after that call's answer."""
    release = threading.Event()

    @tool(needs_approval=True, timeout=0.001)  # it blocks until released: the timeout always comes first
    def ship(order: str) -> str:
        """Ship an order."""
        assert release.wait(timeout=120), "the test never released the tool"
        return f"shipped {order}"

    def then_pay(request: ModelRequest) -> Any:
        release.set()  # the run stops for pay's approval, waits for ship's thread, and holds its result
        return tool_call("pay", invoice="INV-7", amount=120)

    store = SavesBreak(messages=True)
    model = ScriptedModel([tool_call("ship", order="O-1"), then_pay, "Shipped O-1."])
    agent = Agent(model, tools=[ship, pay], store=store, durability=Durability(persistence="per_run"))
    [pending] = (await agent.run("Ship O-1, then pay INV-7.", session=await agent.session(SID))).pending_approvals
    store.armed = True  # the save of the next run (its model's call to pay) fails
    with pytest.raises(StoreError, match="disk is full"):
        await agent.run(None, session=await agent.session(SID), approvals={pending.call_id: pending.approve()})
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool"] and log[2].function_results[0].is_error  # ship's timeout
    [held] = (await agent.session(SID)).state[STATE_KEY]["late"]
    assert held["metadata"][LATE_RESULT_KEY] == pending.call_id
    result = await agent.run(None, session=await agent.session(SID))  # nothing open: it gives the result back
    assert result.text == "Shipped O-1."
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "user", "assistant"] and log[3].id == held["id"]
    assert broken_exchange(log) is None and "late" not in (await agent.session(SID)).state.get(STATE_KEY, {})


@pytest.mark.parametrize("stored", [False, True])
async def test_a_session_made_by_hand_holds_a_late_result_too(store: SessionStore, stored: bool) -> None:
    """A `Session` made by hand (version 0), for a session not stored yet or one stored already, is the
    run's: holding is no `LeaseLost`."""
    lookup = Lookup()
    agent = agent_for(store, lookup, "Paid INV-7.", persistence="per_step")
    if stored:
        session = await agent.session(SID)
        session.state["note"] = "kept"
        await store.save_session(session)
    events = []
    async for event in agent.stream("Pay INV-7 and tell me when it is due.", session=Session(SID)):
        if isinstance(event, ApprovalRequired):
            lookup.release.set()
        events.append(event)
    [pending] = events[-1].result.pending_approvals
    assert len((await agent.session(SID)).state[STATE_KEY]["late"]) == 1
    await agent.run(None, session=await agent.session(SID), approvals={pending.call_id: pending.approve()})
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "tool", "user", "assistant"] and broken_exchange(log) is None
    assert (await agent.session(SID)).state.get("note") == ("kept" if stored else None)
