"""Client tools (`contextpipe.ClientTool`): the caller runs the call, the run waits for its result in the log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent, ApprovalError, ApprovalRequired, ClientTool, Durability, RunDone, UsageError, tool
from contextpipe.approvals import CLIENT_KEY, DECISIONS_KEY, answer, approve
from contextpipe.exchanges import exchange_problem
from contextpipe.models import ModelRequest
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, Turn, tool_call

WHERE = ClientTool("user_location", "Where the user is, from the browser.",
                   {"type": "object", "properties": {"precise": {"type": "boolean"}}})
RAN: list[str] = []


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    RAN.append(city)
    return f"sunny in {city}"


@tool(needs_approval=True)
def book(city: str) -> str:
    """Book a trip (needs approval)."""
    RAN.append(f"book {city}")
    return f"booked {city}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    s = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "sessions.db")
    yield s
    await s.close()


def saw(model: ScriptedModel, call_id: str) -> list[str]:
    """The results of `call_id` in the model's last request."""
    return [r.result for m in model.requests[-1].messages for r in m.function_results if r.call_id == call_id]


async def test_a_client_call_waits_and_its_answer_continues_the_same_exchange(store: SessionStore) -> None:
    model = ScriptedModel([tool_call("user_location", precise=True), "You are in Suzhou."])
    agent = Agent(model, tools=[weather], store=store)
    session = await agent.session("s")
    first = await agent.run("Where am I?", session=session, tools=[WHERE])
    assert first.stop_reason == "client_tool_calls" and RAN == []
    [call] = first.pending_approvals
    assert (call.tool_name, call.arguments, call.client) == ("user_location", '{"precise": true}', True)
    assert [s.name for s in model.requests[0].tools] == ["weather", "user_location"]
    log = await agent.history(session)
    assert log[-1].metadata[CLIENT_KEY] == [call.call_id] and exchange_problem(log) is not None
    assert await agent.pending_approvals(session) == [call]

    done = await agent.run(None, session=session, tools=[WHERE], approvals={call.call_id: call.answer("Suzhou")})
    assert (done.stop_reason, done.text) == ("completed", "You are in Suzhou.")
    assert saw(model, call.call_id) == ["Suzhou"]  # the model read the client's result
    answered = done.messages[0]
    assert answered.metadata[DECISIONS_KEY] == {call.call_id: {"decision": "answered", "digest": call.digest}}
    assert [(c.call_id, c.approval) for c in done.traces[0].tool_calls] == [(call.call_id, "answered")]
    log = await agent.history(session)
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"] and exchange_problem(log) is None


async def test_a_rejected_client_call_tells_the_model_and_an_error_answer_is_an_error(store: SessionStore) -> None:
    model = ScriptedModel([tool_call("user_location") + tool_call("user_location", precise=True), "Fine."])
    agent = Agent(model, store=store)
    session = await agent.session("s")
    one, two = (await agent.run("Where?", session=session, tools=[WHERE])).pending_approvals
    done = await agent.run(None, session=session, approvals={
        one.call_id: one.reject("the user said no"), two.call_id: two.answer("no GPS", is_error=True)})
    results = {r.call_id: r for r in done.messages[0].function_results}
    assert "the user rejected it (the user said no)" in results[one.call_id].result
    assert (results[two.call_id].result, results[two.call_id].is_error) == ("no GPS", True)
    assert done.text == "Fine." and RAN == []


async def test_new_input_while_a_client_call_is_open_is_refused(store: SessionStore) -> None:
    agent = Agent(ScriptedModel([tool_call("user_location")]), store=store)
    session = await agent.session("s")
    [call] = (await agent.run("Where?", session=session, tools=[WHERE])).pending_approvals
    log = await agent.history(session)
    with pytest.raises(ApprovalError, match=r"user_location \(call_1\).*pending\.answer\(result\)"):
        await agent.run("Never mind.", session=session, tools=[WHERE])
    again = await agent.run(None, session=session)  # no decision: it stops again, calling no model
    assert (again.stop_reason, again.pending_approvals) == ("client_tool_calls", [call])
    assert await agent.history(session) == log


async def test_decisions_of_the_wrong_kind_are_refused(store: SessionStore) -> None:
    agent = Agent(ScriptedModel([tool_call("user_location") + tool_call("book", city="Rome")]), tools=[book],
                  store=store)
    session = await agent.session("s")
    first = await agent.run("Go.", session=session, tools=[WHERE])
    client, gated = sorted(first.pending_approvals, key=lambda p: not p.client)
    assert first.stop_reason == "approval_required"  # a person must decide one of them
    with pytest.raises(ApprovalError, match="is a client tool's call: the client runs it"):
        await agent.run(None, session=session, approvals={client.call_id: approve()})
    with pytest.raises(ApprovalError, match="awaits a person's approval, not a client's result"):
        await agent.run(None, session=session, approvals={gated.call_id: answer("booked, trust me")})
    with pytest.raises(ApprovalError, match="made for other arguments"):
        await agent.run(None, session=session, approvals={client.call_id: answer("x", digest="0" * 64)})
    assert RAN == [] and len(await agent.history(session)) == 2


async def test_the_open_call_survives_a_new_agent_on_the_same_sqlite_file(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        agent = Agent(ScriptedModel([tool_call("user_location")]), store=store)
        session = await agent.session("s")
        [call] = (await agent.run("Where?", session=session, tools=[WHERE])).pending_approvals
    async with SQLiteStore(tmp_path / "s.db") as store:  # another process, a new agent: no tools passed
        model = ScriptedModel(["Suzhou it is."])
        later = Agent(model, store=store)
        session = await later.session("s")
        [found] = await later.pending_approvals(session)
        assert found == call and found.client
        done = await later.run(None, session=session, approvals={found.call_id: found.answer("Suzhou")})
        assert done.text == "Suzhou it is." and saw(model, call.call_id) == ["Suzhou"]


async def test_a_stream_lists_the_client_calls_before_it_is_done() -> None:
    agent = Agent(ScriptedModel([tool_call("user_location")]))
    session = await agent.session("s")
    async with agent.stream("Where?", session=session, tools=[WHERE]) as events:
        seen = [e async for e in events]
    [required] = [e for e in seen if isinstance(e, ApprovalRequired)]
    assert [p.client for p in required.pending] == [True]
    assert isinstance(seen[-1], RunDone) and seen[-1].result.stop_reason == "client_tool_calls"


def test_a_run_tool_named_as_an_agent_tool_or_a_bad_schema_is_refused() -> None:
    agent = Agent(ScriptedModel([]), tools=[weather])
    with pytest.raises(UsageError, match="the run's tool 'weather' has the name of one of the agent's tools"):
        agent.run_sync("hi", tools=[ClientTool("weather")])
    with pytest.raises(UsageError, match="another of the run's tools"):
        agent.run_sync("hi", tools=[WHERE, WHERE])
    with pytest.raises(UsageError, match="must be a JSON schema of an object"):
        ClientTool("bad", parameters={"type": "string"})


@pytest.mark.parametrize("persistence", ["per_step", "per_run"])
@pytest.mark.parametrize("step", [
    ["weather", "user_location", "book"], ["user_location", "weather"], ["book", "user_location", "weather", "book"],
    ["user_location", "user_location", "weather", "weather"]])
async def test_server_approval_and_client_calls_in_one_step_keep_every_pair(step: list[str], persistence: Any) -> None:
    calls = tuple(tool_call(name, {"city": f"c{i}"} if name != "user_location" else {}, call_id=f"k{i}").calls[0]
                  for i, name in enumerate(step))

    def checked(reply: object) -> Any:
        def answer_(request: ModelRequest) -> object:
            assert exchange_problem(request.messages) is None  # never a call without its result, nor the reverse
            return reply
        return answer_

    agent = Agent(ScriptedModel([checked(Turn(calls=calls)), checked("done")]), tools=[weather, book],
                  durability=Durability(persistence=persistence))
    session = await agent.session("s")
    first = await agent.run("go", session=session, tools=[WHERE])
    assert [f"c{i}" for i, n in enumerate(step) if n == "weather"] == RAN  # the server's ran, the others wait
    waiting = {p.call_id: p for p in first.pending_approvals}
    assert sorted(waiting) == sorted(c.call_id for c in calls if c.name != "weather")
    assert first.stop_reason == ("approval_required" if "book" in step else "client_tool_calls")
    done = await agent.run(None, session=session, approvals={
        i: p.answer(f"at {i}") if p.client else p.approve() for i, p in waiting.items()})
    assert done.text == "done"
    log = await agent.history(session)
    assert exchange_problem(log) is None
    results = {r.call_id: r.result for m in log for r in m.function_results}
    assert sorted(results) == sorted(c.call_id for c in calls)
    assert all(results[c.call_id] == f"at {c.call_id}" for c in calls if c.name == "user_location")
    assert sorted(RAN) == sorted([f"c{i}" for i, n in enumerate(step) if n == "weather"] +
                                 [f"book c{i}" for i, n in enumerate(step) if n == "book"])
