"""History(store) with every backend: per-step persistence, failures, leases, state and repair."""

from __future__ import annotations

import asyncio

import pytest

from contextpipe import (
    Agent,
    Durability,
    FunctionCall,
    FunctionResult,
    LeaseLost,
    Message,
    ModelServerError,
    SessionBusy,
    tool,
)
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import describe, get_weather_forecast, lookup_location_code


def weather_agent(store: SessionStore, *, fail_third: bool = False) -> Agent:
    third: object = ModelServerError("HTTP 500", status_code=500) if fail_third else "Wear a T-shirt."
    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"),
                           tool_call("get_weather_forecast", location_code="SZ"), third])
    return Agent(model, tools=[lookup_location_code, get_weather_forecast], providers=[History(store)])


async def test_per_step_persistence_on_every_backend(store: SessionStore, tenant: str) -> None:
    agent = weather_agent(store, fail_third=True)
    session = await agent.session("weather", tenant=tenant)
    with pytest.raises(ModelServerError):
        await agent.run("What should I wear in Suzhou today?", session=session)
    assert describe(await agent.history(session)) == [
        "user:What should I wear in Suzhou today?", "assistant:call:lookup_location_code", "tool:result:SZ",
        "assistant:call:get_weather_forecast", "tool:result:Sunny, 25 C, NW wind 4."]
    model = agent.model
    assert isinstance(model, ScriptedModel)
    model.enqueue("Wear a T-shirt.")
    # A fresh Session object, as a new worker would have.
    result = await agent.run(None, session=await agent.session("weather", tenant=tenant))
    assert result.text == "Wear a T-shirt."
    assert len(await agent.history(session)) == 6


async def test_state_and_version_survive_the_store(store: SessionStore, tenant: str) -> None:
    agent = Agent(ScriptedModel(["one", "two"]), providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    session.state["notes"] = {"k": [1, 2]}
    await agent.run("hi", session=session)
    again = await agent.session("s", tenant=tenant)
    assert again.state == {"notes": {"k": [1, 2]}} and again.version == session.version
    await agent.run("hello", session=again)
    assert describe(await agent.history(again)) == ["user:hi", "assistant:one", "user:hello", "assistant:two"]


async def test_second_concurrent_run_is_refused(store: SessionStore, tenant: str) -> None:
    gate = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        await gate.wait()
        return "first"

    agent = Agent(ScriptedModel([slow, "second"]), providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    running = asyncio.create_task(agent.run("one", session=session))
    await asyncio.sleep(0.05)
    with pytest.raises(SessionBusy):
        await agent.run("two", session=await agent.session("s", tenant=tenant))
    gate.set()
    await running
    assert (await agent.run("two", session=session, lease_wait=5)).text == "second"


async def test_run_on_a_deleted_session_is_refused(store: SessionStore, tenant: str) -> None:
    agent = Agent(ScriptedModel(["a", "b"]), providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    await agent.run("hi", session=session)
    assert await store.delete_session(tenant, "s")
    with pytest.raises(LeaseLost, match="no longer exists") as gone:
        await agent.run("again", session=session)
    assert gone.value.gone  # retrying cannot help (over HTTP: 410)


async def test_run_on_a_session_made_again_under_its_id_is_refused(store: SessionStore, tenant: str) -> None:
    agent = Agent(ScriptedModel(["a", "b", "c"]), providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    await agent.run("hi", session=session)
    assert await store.delete_session(tenant, "s")
    other = await agent.session("s", tenant=tenant)
    other.state["owner"] = "someone else"
    await agent.run("theirs", session=other)
    with pytest.raises(LeaseLost, match="a new session has been made since under the same id") as gone:
        await agent.run("again", session=session)
    assert gone.value.gone
    assert session.state.get("owner") is None
    page = await store.load(tenant, "s")
    assert [m.text for m in page.messages] == ["theirs", "b"]


async def test_repair_after_a_kill_on_every_backend(store: SessionStore, tenant: str) -> None:
    runs: list[str] = []

    @tool(idempotent=True)
    def read(key: str) -> str:
        """Read-only."""
        runs.append(f"read {key}")
        return f"value {key}"

    @tool
    def write(key: str) -> str:
        """Has an effect."""
        runs.append(f"write {key}")
        return "written"

    await store.append(tenant, "s", [
        Message.user("go"),
        Message("assistant", (FunctionCall("c1", "write", '{"key": "a"}'), FunctionCall("c2", "read", '{"key": "b"}'),
                              FunctionCall("c3", "write", '{"key": "c"}'))),
        Message("tool", (FunctionResult("c1", "written"),)),
    ])
    model = ScriptedModel(["resumed"])
    agent = Agent(model, tools=[read, write], providers=[History(store)])
    result = await agent.run(None, session=await agent.session("s", tenant=tenant))
    assert result.text == "resumed"
    assert runs == ["read b"]
    log = await agent.history(await agent.session("s", tenant=tenant))
    repair = log[3].function_results
    assert [(r.call_id, r.is_error) for r in repair] == [("c2", False), ("c3", True)]
    sent = model.requests[0].messages
    assert {c.call_id for m in sent for c in m.function_calls} == {r.call_id for m in sent for r in m.function_results}


async def test_history_loads_checkpoint_then_tail(store: SessionStore, tenant: str) -> None:
    from contextpipe.stores import Checkpoint

    await store.append(tenant, "s", [Message.user("old question"), Message.assistant("old answer"),
                                     Message.user("recent question"), Message.assistant("recent answer")])
    await store.save_checkpoint(tenant, "s", Checkpoint(2, Message.system("Earlier: a question was answered."), 1.0))
    model = ScriptedModel(["fine"])
    agent = Agent(model, providers=[History(store)])
    await agent.run("new question", session=await agent.session("s", tenant=tenant))
    assert [m.text for m in model.requests[0].messages] == [
        "Earlier: a question was answered.", "recent question", "recent answer", "new question"]
    # The log itself is untouched: nothing stored is mutated or deleted by a checkpoint.
    assert len(await agent.history(await agent.session("s", tenant=tenant))) == 6


async def test_agent_stores_traces_with_the_session(store: SessionStore, tenant: str) -> None:
    agent = Agent(ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "SZ it is."]),
                  tools=[lookup_location_code], providers=[History(store)],
                  durability=Durability(store_traces=True))
    session = await agent.session("traced", tenant=tenant)
    await agent.run("Code for Suzhou?", session=session)
    traces = await store.load_traces(tenant, "traced")
    assert [t["step"] for t in traces] == [1, 2]
    assert traces[1]["messages"][-1]["source_kind"] == "tool"
    assert sum(traces[0]["tokens_by_source"].values()) == traces[0]["total_tokens"]
