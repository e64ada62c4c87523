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
from contextpipe.exchanges import LATE_RESULT_KEY
from contextpipe.exchanges import exchange_problem as broken_exchange
from contextpipe.models import ModelRequest
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


@pytest.mark.parametrize("given", [None, "Thanks."])
async def test_a_late_result_held_when_the_deciding_run_was_cut_follows_at_the_next_run(
        store: SessionStore, given: str | None) -> None:
    """The run that decides is cut while the approved call runs. Without input the call stays open
    (approved: the next run answers it as interrupted); with input, the cut run answers it and keeps
    its input. Either way the late result still held is given back by the next run, after the answer."""
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
    agent = Agent(model, tools=[pay, lookup.tool], store=store)
    [pending] = (await stop_for_approval(agent, lookup))[-1].result.pending_approvals
    task = asyncio.ensure_future(agent.run(given, session=await agent.session(SID),
                                           approvals={pending.call_id: pending.approve()}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    log = await agent.history(await agent.session(SID))
    assert roles(log) == (["user", "assistant", "tool"] if given is None else
                          ["user", "assistant", "tool", "tool", "user"])  # the input kept after the answer
    assert len((await agent.session(SID)).state[STATE_KEY]["late"]) == 1
    result = await agent.run(None, session=await agent.session(SID))
    assert result.text == "INV-7 may not be paid; it is due on 3 March." and calls == ["INV-7"]
    log = await agent.history(await agent.session(SID))
    assert roles(log) == ["user", "assistant", "tool", "tool", *(["user"] if given else []), "user", "assistant"]
    assert "was interrupted before it finished" in log[3].function_results[0].result  # never run twice
    assert log[-2].metadata[LATE_RESULT_KEY] == log[2].function_results[0].call_id
    assert broken_exchange(log) is None and STATE_KEY not in (await agent.session(SID)).state
