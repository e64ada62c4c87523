"""Human approval of tool calls in one process: stop, decide, resume; refusals; policies; streams; an invariant.

Across processes (a worker SIGKILLed at the approval, decisions from new processes, two at once) on
every durable backend: tests/stores/test_approval_processes.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contextpipe import (
    Agent,
    ApprovalError,
    ApprovalRequired,
    ContextProvider,
    Durability,
    RunContext,
    RunDone,
    ToolContext,
    UsageError,
    approve,
    reject,
    tool,
)
from contextpipe.approvals import AWAITING_KEY, DECISIONS_KEY, STATE_KEY, PendingApproval, arguments_digest
from contextpipe.exchanges import exchange_problem as broken_exchange
from contextpipe.models import ModelRequest
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from contextpipe.tools import CallTool, Tool, ToolInvocation, ToolOutcome
from helpers import PAID, MiddlewareProvider, balance, pay


@pytest.fixture(autouse=True)
def _no_payments() -> None:
    PAID.clear()


def agent_for(*script: Any, tools: list[Tool] | None = None, **kwargs: Any) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(list(script))
    return Agent(model, tools=tools if tools is not None else [pay, balance], store=MemoryStore(), **kwargs), model


async def test_a_call_that_needs_approval_stops_the_run_and_waits_in_the_log() -> None:
    agent, model = agent_for(tool_call("pay", invoice="INV-7", amount=120))
    session = await agent.session("s")
    result = await agent.run("Pay INV-7.", session=session)
    assert result.stop_reason == "approval_required" and PAID == []
    [pending] = result.pending_approvals
    log = await agent.history(session)
    assert [m.role for m in log] == ["user", "assistant"]
    assert (pending.call_id, pending.tool_name, pending.arguments, pending.message_id) == (
        "call_1", "pay", '{"invoice": "INV-7", "amount": 120}', log[1].id)
    assert pending.why == "tool 'pay' needs approval for every call"
    assert pending.digest == arguments_digest("pay", pending.arguments)
    assert log[1].metadata[AWAITING_KEY] == {"call_1": pending.why}

    again = await agent.run(None, session=session)  # a resume without a decision stops again, calling no model
    assert (again.stop_reason, again.pending_approvals, again.messages) == ("approval_required", [pending], [])
    with pytest.raises(ApprovalError, match=r"pay \(call_1\) await approval.*nothing was run or stored") as refused:
        await agent.run("Actually, what is my balance?", session=session)
    assert refused.value.call_ids == ("call_1",)
    assert await agent.history(session) == log and len(model.requests) == 1 and PAID == []


async def test_an_approved_call_runs_and_the_run_goes_on() -> None:
    agent, _ = agent_for(tool_call("pay", invoice="INV-7", amount=120), "Paid INV-7.")
    session = await agent.session("s")
    [pending] = (await agent.run("Pay INV-7.", session=session)).pending_approvals
    result = await agent.run(None, session=session, approvals={pending.call_id: pending.approve()})
    assert (result.stop_reason, result.text, PAID) == ("completed", "Paid INV-7.", ["INV-7"])
    answer = result.messages[0]
    assert answer.function_results[0].result == "paid INV-7" and answer.source is not None
    assert answer.metadata[DECISIONS_KEY] == {"call_1": {"decision": "approved", "digest": pending.digest}}
    assert [(c.call_id, c.approval) for c in result.traces[0].tool_calls] == [("call_1", "approved")]
    assert broken_exchange(await agent.history(session)) is None
    assert STATE_KEY not in session.state  # the approval is forgotten once the call is answered


async def test_a_rejected_call_is_answered_with_the_reason_the_model_reads_and_the_trace_shows() -> None:
    agent, model = agent_for(tool_call("pay", invoice="INV-7", amount=120), "I did not pay it.")
    session = await agent.session("s")
    [pending] = (await agent.run("Pay INV-7.", session=session)).pending_approvals
    result = await agent.run(None, session=session, approvals={pending.call_id: pending.reject("not this month")})
    assert result.text == "I did not pay it." and PAID == []
    told = [r for m in model.requests[-1].messages for r in m.function_results]
    assert [(r.call_id, r.is_error) for r in told] == [("call_1", True)]
    assert told[0].result.startswith("Error: the call to 'pay' was not run: the user rejected it (not this month).")
    trace = result.traces[0]
    assert [(c.call_id, c.approval, c.is_error) for c in trace.tool_calls] == [("call_1", "rejected", True)]
    rejection = [m for m in trace.messages if m.role == "tool"]
    assert [(m.source_kind, m.source_id) for m in rejection] == [("tool", "approval")]
    assert "tool call pay (call_1): rejected" in trace.table()
    stored = (await agent.history(session))[2]
    assert stored.metadata[DECISIONS_KEY]["call_1"] == {"decision": "rejected", "digest": pending.digest,
                                                        "reason": "not this month"}


async def test_decisions_that_cannot_apply_are_refused_before_anything_runs() -> None:
    agent, _ = agent_for(tool_call("pay", invoice="INV-7", amount=120), "Paid.")
    session = await agent.session("s")
    [pending] = (await agent.run("Pay INV-7.", session=session)).pending_approvals
    log = await agent.history(session)
    other = arguments_digest("pay", '{"invoice": "INV-7", "amount": 12000}')
    with pytest.raises(ApprovalError, match="made for other arguments"):
        await agent.run(None, session=session, approvals={"call_1": approve(digest=other)})
    with pytest.raises(ApprovalError, match=r"'call_9' is not awaiting approval.*pay \(call_1\)"):
        await agent.run(None, session=session, approvals={"call_9": approve()})
    with pytest.raises(UsageError, match=r"give approve\(\) or reject"):
        await agent.run(None, session=session, approvals={"call_1": True})  # type: ignore[dict-item]
    with pytest.raises(UsageError, match="pass session="):
        await agent.run("hi", approvals={"call_1": approve()})
    assert await agent.history(session) == log and PAID == [] and STATE_KEY not in session.state
    await agent.run(None, session=session, approvals={"call_1": approve()})  # a decision bound to the id alone
    with pytest.raises(ApprovalError, match="has been answered already"):
        await agent.run(None, session=session, approvals={"call_1": pending.reject()})
    assert PAID == ["INV-7"]


async def test_always_allowing_a_tool_is_kept_in_the_session() -> None:
    agent, _ = agent_for(tool_call("pay", invoice="A", amount=1), "Paid A.", tool_call("pay", invoice="B", amount=2),
                         "Paid B.", tool_call("pay", invoice="C", amount=3))
    session = await agent.session("s")
    [pending] = (await agent.run("Pay A.", session=session)).pending_approvals
    await agent.run(None, session=session, approvals={pending.call_id: pending.approve(always=True)})
    assert session.state[STATE_KEY] == {"approved": {}, "always": ["pay"]}
    result = await agent.run("Pay B.", session=session)
    assert (result.stop_reason, PAID) == ("completed", ["A", "B"])
    assert [c.approval for c in result.traces[0].tool_calls] == ["allowed"]
    other = await agent.run("Pay C.", session=await agent.session("another"))
    assert other.stop_reason == "approval_required" and PAID == ["A", "B"]


async def test_a_check_decides_per_call_and_one_that_cannot_answer_asks_a_person() -> None:
    async def large(ctx: ToolContext[None], arguments: dict[str, Any]) -> bool | str:
        assert ctx.tool_name == "transfer" and ctx.call_id
        return f"{arguments['amount']} EUR is over the limit" if arguments["amount"] > 100 else False

    moved: list[int] = []

    @tool(needs_approval=large)
    def transfer(amount: int) -> str:
        """Move money."""
        moved.append(amount)
        return "moved"

    @tool(needs_approval=lambda ctx, arguments: 1 / 0)
    def broken(x: int) -> str:
        """A tool whose check raises."""
        return "ran"

    agent, _ = agent_for(tool_call("transfer", amount=50), "Moved 50.", tool_call("transfer", amount=500),
                         "Not moved.", tool_call("broken", x=1), tools=[transfer, broken])
    session = await agent.session("s")
    assert (await agent.run("Move 50.", session=session)).stop_reason == "completed" and moved == [50]
    big = await agent.run("Move 500.", session=session)
    assert [p.why for p in big.pending_approvals] == ["500 EUR is over the limit"] and moved == [50]
    await agent.run(None, session=session, approvals={big.pending_approvals[0].call_id: reject()})
    failing = await agent.run("Try the broken one.", session=await agent.session("t"))
    assert failing.pending_approvals[0].why.startswith(
        "the approval check of tool 'broken' raised ZeroDivisionError (division by zero)")


async def test_the_agents_policy_covers_tools_it_did_not_write() -> None:
    async def remote(arguments: dict[str, Any]) -> str:
        return "deleted"

    delete = Tool.from_schema("git_delete_branch", "Delete a branch.", {"type": "object", "properties": {}}, remote)
    status = Tool.from_schema("status", "Show the status.", {"type": "object", "properties": {}}, remote)
    agent, _ = agent_for(tool_call("status") + tool_call("git_delete_branch"), "Done.", tools=[delete, status],
                         needs_approval=["git_*"])
    session = await agent.session("s")
    result = await agent.run("Clean up.", session=session)
    assert [(p.tool_name, p.why) for p in result.pending_approvals] == [
        ("git_delete_branch", "the agent's approval policy covers tool 'git_delete_branch' ('git_*')")]
    log = await agent.history(session)  # the other call of the step ran and was saved; the run stopped
    assert [m.role for m in log] == ["user", "assistant", "tool"] and log[2].function_results[0].call_id == "call_1"
    done = await agent.run(None, session=session, approvals={"call_2": approve()})
    assert done.text == "Done." and broken_exchange(await agent.history(session)) is None
    with pytest.raises(UsageError, match="needs_approval must be"):
        Agent(ScriptedModel(), needs_approval=[3])  # type: ignore[list-item]


async def test_decisions_and_new_input_in_one_call_answer_the_calls_before_the_input() -> None:
    agent, model = agent_for(tool_call("pay", invoice="INV-7", amount=120), "Noted, and your balance is 1200 EUR.",
                             durability=Durability(persistence="per_run"))
    session = await agent.session("s")
    await agent.run("Pay INV-7.", session=session)
    result = await agent.run("No. What is my balance?", session=session, approvals={"call_1": reject("no")})
    assert result.stop_reason == "completed"
    assert [m.role for m in await agent.history(session)] == ["user", "assistant", "tool", "user", "assistant"]
    assert broken_exchange(model.requests[-1].messages) is None


async def test_a_stream_says_approval_required_before_it_is_done() -> None:
    agent, _ = agent_for(tool_call("pay", invoice="INV-7", amount=120))
    session = await agent.session("s")
    kinds = [e.kind async for e in agent.stream("Pay INV-7.", session=session)]
    assert kinds[-2:] == ["approval_required", "run_done"]
    events = [e async for e in agent.stream(None, session=session)]
    assert isinstance(events[0], ApprovalRequired) and isinstance(events[1], RunDone)
    assert [p.call_id for p in events[0].pending] == ["call_1"]


async def test_a_run_cut_while_an_approved_call_runs_does_not_ask_again_or_run_it_twice() -> None:
    started, calls = asyncio.Event(), []

    @tool(needs_approval=True)
    async def ship(order: str) -> str:
        """Ship an order."""
        calls.append(order)
        started.set()
        await asyncio.Event().wait()
        return "shipped"

    agent, _ = agent_for(tool_call("ship", order="O-1"), "Checked.", tools=[ship])
    session = await agent.session("s")
    await agent.run("Ship O-1.", session=session)
    task = asyncio.ensure_future(agent.run(None, session=session, approvals={"call_1": approve()}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert session.state[STATE_KEY]["approved"]["call_1"]["digest"] == arguments_digest("ship", '{"order": "O-1"}')
    with pytest.raises(ApprovalError, match="approved by an earlier run"):
        await agent.run(None, session=session, approvals={"call_1": reject()})
    result = await agent.run(None, session=session)
    assert result.messages[0].function_results[0].result.startswith("Error: the call to 'ship' was interrupted")
    assert calls == ["O-1"] and STATE_KEY not in session.state


async def test_a_run_that_fails_before_the_approved_calls_start_leaves_them_waiting() -> None:
    class Flaky(ContextProvider):
        fail = True

        async def before_run(self, ctx: RunContext) -> None:
            if self.fail:
                raise RuntimeError("the vector store is down")

    flaky = Flaky("flaky")
    flaky.fail = False
    agent, _ = agent_for(tool_call("pay", invoice="A", amount=1) + tool_call("pay", invoice="B", amount=2), "Paid A.",
                         providers=[flaky])
    session = await agent.session("s")
    await agent.run("Pay A and B.", session=session)
    flaky.fail = True
    with pytest.raises(RuntimeError, match="vector store"):
        await agent.run(None, session=session, approvals={"call_1": approve()})
    flaky.fail = False
    with pytest.raises(ApprovalError, match=r"pay \(call_2\) await approval"):  # a decision left out, with input
        await agent.run("And then?", session=session, approvals={"call_1": approve()})
    assert STATE_KEY not in session.state and PAID == []  # nothing kept: neither run got to the calls
    result = await agent.run(None, session=session, approvals={"call_1": approve(), "call_2": reject()})
    assert result.text == "Paid A." and PAID == ["A"]  # approved after the failures: it runs, not "interrupted"


async def test_a_run_with_input_cut_before_it_read_the_history_leaves_the_calls_waiting() -> None:
    reached, blocked = asyncio.Event(), asyncio.Event()

    class Slow(ContextProvider):
        armed = False

        async def before_run(self, ctx: RunContext) -> None:
            if self.armed:
                reached.set()
                await blocked.wait()

    slow = Slow("slow")
    agent, _ = agent_for(tool_call("pay", invoice="A", amount=1), "Paid A.", providers=[slow])
    session = await agent.session("s")
    await agent.run("Pay A.", session=session)
    log = await agent.history(session)
    slow.armed = True
    task = asyncio.ensure_future(agent.run("Hello?", session=session))
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as cut:
        await task
    assert any("input could not be kept" in note and "pay (call_1)" in note and "decide the calls awaiting approval"
               in note for note in cut.value.__notes__)
    assert await agent.history(session) == log  # not answered "interrupted", and no input after the open call
    slow.armed = False
    result = await agent.run(None, session=session, approvals={"call_1": approve()})
    assert result.text == "Paid A." and PAID == ["A"]


async def test_tool_middleware_sees_an_approved_call_as_a_first_run() -> None:
    seen: list[tuple[str, bool]] = []

    async def watch(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        seen.append((call.call_id, call.resumed))
        return await call_next(call)

    agent, _ = agent_for(tool_call("pay", invoice="A", amount=1), "Paid.", providers=[MiddlewareProvider("mw", watch)])
    session = await agent.session("s")
    await agent.run("Pay A.", session=session)
    await agent.run(None, session=session, approvals={"call_1": approve()})
    assert seen == [("call_1", False)] and PAID == ["A"]


def test_a_pending_approval_binds_its_decisions_to_its_arguments() -> None:
    pending = PendingApproval("call_1", "pay", '{"amount": 1}', "why")
    assert pending.approve().digest == pending.reject("no").digest == arguments_digest("pay", '{"amount": 1}')
    assert pending.parsed_arguments() == {"amount": 1}
    assert approve().digest is None and reject("no").reason == "no"


# --- an invariant over any calls and decisions ------------------------------------------------------------

CALL = st.tuples(st.sampled_from(["gated", "free", "odd"]), st.integers(0, 3))
DECISION = st.sampled_from(["approve", "reject", "always", "later"])


@example(steps=[[("gated", 0), ("gated", 0)]], decisions=["always", "later", "reject"])  # found by CI
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.lists(CALL, min_size=1, max_size=3), min_size=1, max_size=3),
       decisions=st.lists(DECISION, min_size=1, max_size=12))
def test_any_decisions_answer_every_call_once_and_run_exactly_the_allowed_ones(
        steps: list[list[tuple[str, int]]], decisions: list[str]) -> None:
    asyncio.run(_decide_everything(steps, decisions))


async def _decide_everything(steps: list[list[tuple[str, int]]], decisions: list[str]) -> None:
    ran: list[str] = []

    def effect(ctx: ToolContext[None]) -> str:
        ran.append(ctx.call_id)
        return f"ran {ctx.call_id}"

    @tool(needs_approval=True)
    def gated(x: int, ctx: ToolContext[None]) -> str:
        """Needs approval for every call."""
        return effect(ctx)

    @tool
    def free(x: int, ctx: ToolContext[None]) -> str:
        """Needs none."""
        return effect(ctx)

    @tool(needs_approval=lambda ctx, arguments: arguments["x"] % 2 == 1)
    def odd(x: int, ctx: ToolContext[None]) -> str:
        """Needs approval for odd numbers."""
        return effect(ctx)

    tools = [gated, free, odd]

    def checked(turn: object) -> Any:
        def step(request: ModelRequest) -> object:
            assert broken_exchange(request.messages) is None
            return turn
        return step

    turns = [Turn(calls=tuple(tool_call(name, x=x).calls[0] for name, x in calls)) for calls in steps]
    agent, _ = agent_for(*[checked(t) for t in [*turns, "done"]], tools=tools)
    session = await agent.session("s")
    expected: set[str] = set()
    always: set[str] = set()
    result = await agent.run("go", session=session)
    choices = iter(decisions)
    while result.stop_reason == "approval_required":
        given_: dict[str, Any] = {}
        for p in result.pending_approvals:
            choice = next(choices, "approve")
            if choice in ("approve", "always"):
                given_[p.call_id] = p.approve(always=choice == "always")
                expected.add(p.call_id)
                always.update([p.tool_name] if choice == "always" else [])
            elif choice == "reject":
                given_[p.call_id] = p.reject()
        # a call left undecided runs too once its tool is always allowed (by a decision on another call)
        expected.update(p.call_id for p in result.pending_approvals
                        if p.tool_name in always and p.call_id not in given_)
        result = await agent.run(None, session=session, approvals=given_)
    log = await agent.history(session)
    assert broken_exchange(log) is None and result.text == "done"
    calls = [c for m in log for c in m.function_calls]
    answered = [r.call_id for m in log for r in m.function_results]
    assert sorted(answered) == sorted(c.call_id for c in calls)  # every call answered exactly once
    needed = {c.call_id for m in log for c in m.function_calls if c.call_id in (m.metadata.get(AWAITING_KEY) or {})}
    unasked = {c.call_id for c in calls if c.call_id not in needed}
    assert sorted(ran) == sorted(unasked | expected)
    assert set(session.state.get(STATE_KEY, {}).get("always", [])) == always


async def test_a_call_approved_always_and_cut_while_it_runs_is_not_run_again() -> None:
    started, calls = asyncio.Event(), []

    @tool(needs_approval=True)
    async def ship(order: str) -> str:
        """Ship an order."""
        calls.append(order)
        started.set()
        if len(calls) == 1:  # the first run is cut here
            await asyncio.Event().wait()
        return "shipped"

    agent, _ = agent_for(tool_call("ship", order="O-1"), "Checked.", tools=[ship])
    session = await agent.session("s")
    [pending] = (await agent.run("Ship O-1.", session=session)).pending_approvals
    task = asyncio.ensure_future(agent.run(None, session=session, approvals={"call_1": pending.approve(always=True)}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = await agent.run(None, session=session)  # the tool is always allowed now, but this call may have run
    assert result.messages[0].function_results[0].result.startswith("Error: the call to 'ship' was interrupted")
    assert calls == ["O-1"] and session.state[STATE_KEY] == {"approved": {}, "always": ["ship"]}


@pytest.mark.parametrize("resent", [False, True], ids=["resumed without decisions", "an approval sent for it"])
async def test_a_call_run_as_another_decision_always_allowed_its_tool_and_cut_is_not_run_again(resent: bool) -> None:
    started, calls = asyncio.Event(), []

    @tool(needs_approval=True)
    async def ship(order: str) -> str:
        """Ship an order."""
        calls.append(order)
        if calls == ["O-1", "O-2"]:  # the run that starts O-2, undecided but now always allowed, is cut here
            started.set()
            await asyncio.Event().wait()
        return "shipped"

    agent, _ = agent_for(tool_call("ship", order="O-1") + tool_call("ship", order="O-2"), "Checked.", tools=[ship])
    session = await agent.session("s")
    first, second = (await agent.run("Ship both.", session=session)).pending_approvals
    decisions = {first.call_id: first.approve(always=True)}
    task = asyncio.ensure_future(agent.run(None, session=session, approvals=decisions))
    await started.wait()
    stored = await agent.store.get_session(session.tenant, session.id)  # as a worker killed now would leave it
    assert stored is not None and set(stored.state[STATE_KEY]["approved"]) == {first.call_id, second.call_id}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(session.state[STATE_KEY]["approved"]) == {first.call_id, second.call_id}  # kept before they ran
    assert [r.call_id for m in await agent.history(session) for r in m.function_results] == [first.call_id]
    with pytest.raises(ApprovalError, match="has been answered already"):  # O-1 completed: its result is kept
        await agent.run(None, session=session, approvals=decisions)
    result = await agent.run(None, session=session, approvals={second.call_id: second.approve()} if resent else None)
    assert calls == ["O-1", "O-2"] and result.text == "Checked."  # the always allowed tool, not run again
    log = await agent.history(session)
    answers = {r.call_id: r.result for m in log for r in m.function_results}
    assert answers[first.call_id] == "shipped"
    assert answers[second.call_id].startswith("Error: the call to 'ship' was interrupted")
    assert broken_exchange(log) is None and sorted(answers) == [first.call_id, second.call_id]
    assert session.state[STATE_KEY] == {"approved": {}, "always": ["ship"]}


@pytest.mark.parametrize("persistence", ["per_step", "per_run"])
async def test_a_run_cut_after_an_approved_call_completed_keeps_its_result_and_the_rejection(persistence: Any) -> None:
    started, calls = asyncio.Event(), []

    @tool(needs_approval=True)
    async def ship(order: str) -> str:
        """Ship an order."""
        calls.append(order)
        if order == "O-2":  # the run is cut here, after O-1 completed
            started.set()
            await asyncio.Event().wait()
        return f"shipped {order}"

    script = tool_call("ship", order="O-1") + tool_call("ship", order="O-2") + tool_call("ship", order="O-3")
    agent, _ = agent_for(script, "Checked.", tools=[ship], durability=Durability(persistence=persistence))
    session = await agent.session("s")
    one, two, three = (await agent.run("Ship all three.", session=session)).pending_approvals
    task = asyncio.ensure_future(agent.run(None, session=session, approvals={
        one.call_id: one.approve(), two.call_id: two.approve(), three.call_id: three.reject("not that one")}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    answers = {r.call_id: r.result for m in await agent.history(session) for r in m.function_results}
    assert answers[one.call_id] == "shipped O-1" and "rejected it (not that one)" in answers[three.call_id]
    assert two.call_id not in answers  # it may have run: the next run answers it as interrupted
    result = await agent.run(None, session=session)
    assert result.messages[0].function_results[0].result.startswith("Error: the call to 'ship' was interrupted")
    assert calls == ["O-1", "O-2"] and result.text == "Checked."


async def test_a_waiting_call_run_as_the_session_always_allows_its_tool_is_kept_before_it_runs() -> None:
    started, calls = asyncio.Event(), []

    @tool(needs_approval=True)
    async def ship(order: str) -> str:
        """Ship an order."""
        calls.append(order)
        if len(calls) == 1:
            started.set()
            await asyncio.Event().wait()
        return "shipped"

    agent, _ = agent_for(tool_call("ship", order="O-1"), "Checked.", tools=[ship])
    session = await agent.session("s")
    [pending] = (await agent.run("Ship O-1.", session=session)).pending_approvals
    session.state[STATE_KEY] = {"approved": {}, "always": ["ship"]}  # allowed since, with no decision on the call
    await agent.store.save_session(session)
    task = asyncio.ensure_future(agent.run(None, session=session))
    await started.wait()
    stored = await agent.store.get_session(session.tenant, session.id)  # as a worker killed now would leave it
    assert stored is not None and list(stored.state[STATE_KEY]["approved"]) == [pending.call_id]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert list(session.state[STATE_KEY]["approved"]) == [pending.call_id]
    result = await agent.run(None, session=session)
    assert result.messages[0].function_results[0].result.startswith("Error: the call to 'ship' was interrupted")
    assert calls == ["O-1"] and result.text == "Checked."


async def test_pending_approvals_lists_what_a_run_without_input_would_stop_on() -> None:
    both = Turn(calls=(tool_call("pay", invoice="INV-7", amount=120).calls[0],
                       tool_call("pay", invoice="INV-8", amount=80).calls[0]))
    agent, model = agent_for(both, "Paid INV-7.")
    session = await agent.session("s")
    assert await agent.pending_approvals(session) == []
    stopped = await agent.run("Pay INV-7 and INV-8.", session=session)
    assert await agent.pending_approvals(session) == stopped.pending_approvals
    assert [p.call_id for p in stopped.pending_approvals] == ["call_1", "call_2"]
    first, second = stopped.pending_approvals
    partly = await agent.run(None, session=session, approvals={first.call_id: first.approve()})
    assert (partly.stop_reason, partly.pending_approvals, PAID) == ("approval_required", [second], ["INV-7"])
    assert await agent.pending_approvals(session) == [second]  # read from the store: any session object will do
    assert await agent.pending_approvals(await agent.session("other")) == []
    await agent.run(None, session=session, approvals={second.call_id: second.reject("no")})
    assert await agent.pending_approvals(session) == [] and len(model.requests) == 2
