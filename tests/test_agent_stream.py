"""`AgentStream.start`: a streamed run's admission (lease held, input and decisions accepted), on every local store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, ApprovalError, InputConflict, Message, SessionBusy, UsageError, approve, tool
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call


@tool
def lookup(city: str) -> str:
    """Return a city's code."""
    return city[:2].upper()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    s = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "sessions.db")
    yield s
    await s.close()


def agent_on(store: SessionStore, *script: Any) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(list(script))
    return Agent(model, tools=[lookup], providers=[History(store)]), model


async def texts(agent: Agent, session_id: str) -> list[str]:
    return [m.text for m in await agent.history(await agent.session(session_id))]


async def test_start_returns_once_the_run_holds_the_lease_and_then_every_event_comes(store: SessionStore) -> None:
    called = asyncio.Event()

    async def answer(request: ModelRequest) -> str:
        called.set()
        return "Suzhou is SU."

    agent, _ = agent_on(store, tool_call("lookup", city="Suzhou"), answer)
    session = await agent.session("chat")
    async with agent.stream("Code?", session=session) as events:
        await events.start()
        await events.start()  # again: at once
        assert not called.is_set()  # admitted before anything ran
        with pytest.raises(SessionBusy):
            await store.acquire_lease(session.tenant, session.id, "someone-else", ttl=10)
        with pytest.raises(SessionBusy):
            await agent.stream("Other?", session=session).start()
        with pytest.raises(SessionBusy):
            await agent.run("Other?", session=session)
        kinds = [event.kind async for event in events]
    assert kinds == ["step_persisted", "tool_call_started", "tool_call_finished", "step_persisted",
                     "text_delta", "text_delta", "text_delta", "step_persisted", "run_done"]
    assert events.result is not None and events.result.text == "Suzhou is SU."
    assert (await texts(agent, "chat"))[0] == "Code?"  # the refused runs stored nothing
    lease = await store.acquire_lease(session.tenant, session.id, "someone-else", ttl=10)  # given back
    await store.release_lease(lease)


async def test_start_raises_input_conflict_and_nothing_is_stored(store: SessionStore) -> None:
    agent, model = agent_on(store, "First.", "Never.")
    session = await agent.session("chat")
    await agent.run([Message.user("Hi", id="m1")], session=session)
    stream = agent.stream([Message.user("Other text", id="m1")], session=session)
    with pytest.raises(InputConflict):
        await stream.start()
    assert [event async for event in stream] == []  # the stream is over
    assert await texts(agent, "chat") == ["Hi", "First."]
    assert len(model.requests) == 1
    assert (await agent.run("Next", session=session)).text == "Never."  # the lease was given back


async def test_start_raises_approval_error_for_a_decision_that_does_not_fit(store: SessionStore) -> None:
    agent, model = agent_on(store, "Never.")
    session = await agent.session("chat")
    stream = agent.stream(None, session=session, approvals={"call_9": approve()})
    with pytest.raises(ApprovalError, match="call_9"):
        await stream.start()
    assert model.requests == [] and await texts(agent, "chat") == []


async def test_a_retry_is_admitted_and_answered_from_the_log(store: SessionStore) -> None:
    agent, model = agent_on(store, "Once.")
    session = await agent.session("chat")
    await agent.run([Message.user("Hi", id="m1")], session=session)
    async with agent.stream([Message.user("Hi", id="m1")], session=session) as events:
        await events.start()
        done = [event async for event in events]
    assert [e.kind for e in done] == ["run_done"]
    assert events.result is not None and (events.result.replayed, events.result.text) == (True, "Once.")
    assert len(model.requests) == 1


async def test_a_stream_closed_before_it_started_cannot_start() -> None:
    agent, model = agent_on(MemoryStore(), "Never.")
    stream = agent.stream("Hi", session=await agent.session("chat"))
    await stream.aclose()
    with pytest.raises(UsageError, match="closed before its run started"):
        await stream.start()
    assert model.requests == []


STEPS = st.lists(st.sampled_from(["tool", "text"]), max_size=4).map(lambda s: [*s, "text"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS, started=st.booleans())
async def test_a_started_stream_yields_the_same_events_as_one_iterated_at_once(steps: list[str],
                                                                              started: bool) -> None:
    def script() -> list[Any]:
        return [tool_call("lookup", city="Oslo") if s == "tool" else f"Answer {i}." for i, s in enumerate(steps)]

    async def kinds(agent: Agent, start: bool) -> list[tuple[str, str]]:
        async with agent.stream("Go", session=await agent.session("chat")) as events:
            if start:
                await events.start()
            return [(e.kind, getattr(e, "text", "")) async for e in events]

    plain = await kinds(agent_on(MemoryStore(), *script())[0], False)
    assert await kinds(agent_on(MemoryStore(), *script())[0], started) == plain
    assert plain[-1][0] == "run_done" and "admitted" not in {k for k, _ in plain}
