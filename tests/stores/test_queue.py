"""Messages queued for a session (`contextpipe.queue`), on every backend: order, exactly once, never inside a
tool exchange, asap while a run is in a tool, next after the run, drain_queue, bad input, cascade."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Durability, FunctionCall, Message, UsageError, tool
from contextpipe.exchanges import exchange_problem
from contextpipe.models import ModelRequest
from contextpipe.queue import deliver, enqueue, pending
from contextpipe.session import SessionKey
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel, tool_call

from .backends import open_spec, store_spec


def texts(messages: Sequence[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in messages]


class Gate:
    """An async tool that says when it started and returns only when the test lets it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.go = asyncio.Event()

    def tool(self, name: str = "lookup") -> object:
        async def lookup(city: str) -> str:
            """Return the location code of a city."""
            self.started.set()
            await self.go.wait()
            return f"code of {city}"

        lookup.__name__ = name
        return tool(lookup)


async def collect(agent: Agent, text: str | None, session_id: str, tenant: str) -> list[object]:
    session = await agent.session(session_id, tenant=tenant)
    async with agent.stream(text, session=session) as events:
        return [event async for event in events]


async def test_asap_from_another_task_while_a_run_is_in_a_tool_comes_after_the_exchange(
        store: SessionStore, tenant: str) -> None:
    gate = Gate()
    model = ScriptedModel([tool_call("lookup", city="Suzhou"), "Suzhou is SZ; metric it is."])
    agent = Agent(model, tools=[gate.tool()], store=store)
    run = asyncio.create_task(collect(agent, "Code of Suzhou?", "chat", tenant))
    await gate.started.wait()  # the run is inside its tool exchange
    first = await agent.enqueue("chat", "Use metric units.", tenant=tenant)
    second = await agent.enqueue("chat", "And be brief.", tenant=tenant)
    stored = await pending(store, SessionKey(tenant, "chat"))
    assert [q.id for q in stored] == [first.id, second.id]  # stored at once, whoever holds the lease
    gate.go.set()
    events = await run
    delivered = [e for e in events if getattr(e, "kind", None) == "message_delivered"]
    assert [(e.message.id, e.step) for e in delivered] == [(first.id, 1), (second.id, 1)]  # type: ignore[attr-defined]
    log = (await store.load(tenant, "chat")).messages
    assert texts(log) == [("user", "Code of Suzhou?"), ("assistant", ""), ("tool", ""), ("user", "Use metric units."),
                          ("user", "And be brief."), ("assistant", "Suzhou is SZ; metric it is.")]
    assert [m.id for m in log[3:5]] == [first.id, second.id]
    assert texts(model.requests[1].messages)[-2:] == [("user", "Use metric units."), ("user", "And be brief.")]
    assert await pending(store, SessionKey(tenant, "chat")) == []
    assert exchange_problem(log) is None


async def test_parallel_calls_stay_together_when_a_message_comes_between_their_results(
        store: SessionStore, tenant: str) -> None:
    fast, slow = Gate(), Gate()
    fast.go.set()
    model = ScriptedModel([_two_calls(), "done"])
    agent = Agent(model, tools=[fast.tool("fast"), slow.tool("slow")], store=store)
    run = asyncio.create_task(collect(agent, "go", "chat", tenant))
    await slow.started.wait()
    await fast.started.wait()
    await agent.enqueue("chat", "between?", tenant=tenant)
    slow.go.set()
    await run
    log = (await store.load(tenant, "chat")).messages
    assert [m.role for m in log] == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert log[4].text == "between?"
    assert exchange_problem(log) is None
    sent = model.requests[1].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool", "tool", "user"]


def _two_calls() -> Message:
    calls = (FunctionCall("c1", "fast", '{"city": "A"}'), FunctionCall("c2", "slow", '{"city": "B"}'))
    return Message("assistant", calls)


async def test_asap_queued_while_idle_comes_first_in_the_next_run_exactly_once(
        store: SessionStore, tenant: str) -> None:
    model = ScriptedModel(["one", "two"])
    agent = Agent(model, store=store)
    queued = await agent.enqueue("chat", "Before anything: I am Ann.", tenant=tenant)
    again = await agent.enqueue("chat", queued.message, tenant=tenant)  # the same message: nothing more queued
    assert again.id == queued.id
    session = await agent.session("chat", tenant=tenant)
    await agent.run("Hello", session=session)
    await agent.run("Still there?", session=session)
    log = (await store.load(tenant, "chat")).messages
    assert texts(log) == [("user", "Before anything: I am Ann."), ("user", "Hello"), ("assistant", "one"),
                          ("user", "Still there?"), ("assistant", "two")]
    assert texts(model.requests[0].messages) == [("user", "Before anything: I am Ann."), ("user", "Hello")]


async def test_a_delivery_cut_after_its_append_is_not_given_to_the_model_again(
        store: SessionStore, tenant: str) -> None:
    model = ScriptedModel(["ok"])
    agent = Agent(model, store=store)
    queued = await agent.enqueue("chat", "delivered, not settled", tenant=tenant)
    await store.append(tenant, "chat", [queued.message])  # what a run killed between append and settle leaves
    await agent.run("next", session=await agent.session("chat", tenant=tenant))
    assert texts(model.requests[0].messages) == [("user", "delivered, not settled"), ("user", "next")]
    assert await pending(store, SessionKey(tenant, "chat")) == []


async def test_asap_left_when_the_run_ends_is_delivered_by_the_next_run(store: SessionStore, tenant: str) -> None:
    agent: Agent

    async def answer_while_a_message_arrives(request: ModelRequest) -> str:
        await agent.enqueue("chat", "too late for this run", tenant=tenant)  # during the last model call
        return "first answer"

    model = ScriptedModel([answer_while_a_message_arrives, "second answer"])
    agent = Agent(model, store=store)
    session = await agent.session("chat", tenant=tenant)
    await agent.run("Hi", session=session)
    assert len(await pending(store, SessionKey(tenant, "chat"))) == 1  # no step boundary left: not lost, waiting
    result = await agent.run(None, session=session)
    assert result.text == "second answer"
    assert texts((await store.load(tenant, "chat")).messages) == [
        ("user", "Hi"), ("assistant", "first answer"), ("user", "too late for this run"),
        ("assistant", "second answer")]


async def test_next_waits_for_the_run_and_drain_queue_runs_each_once_in_order(store: SessionStore, tenant: str) -> None:
    gate = Gate()
    model = ScriptedModel([tool_call("lookup", city="Suzhou"), "SZ", "answer to next 1", "answer to next 2"])
    agent = Agent(model, tools=[gate.tool()], store=store)
    run = asyncio.create_task(collect(agent, "Code of Suzhou?", "chat", tenant))
    await gate.started.wait()
    n1 = await agent.enqueue("chat", "next 1", when="next", tenant=tenant)
    n2 = await agent.enqueue("chat", "next 2", when="next", tenant=tenant)
    gate.go.set()
    events = await run
    assert not [e for e in events if getattr(e, "kind", None) == "message_delivered"]  # not this run's
    results = await agent.drain_queue("chat", tenant=tenant)
    assert [r.text for r in results] == ["answer to next 1", "answer to next 2"]
    assert [r.input[0].id for r in results] == [n1.id, n2.id]
    assert await agent.drain_queue("chat", tenant=tenant) == []  # each exactly once
    log = (await store.load(tenant, "chat")).messages
    assert texts(log)[-4:] == [("user", "next 1"), ("assistant", "answer to next 1"), ("user", "next 2"),
                               ("assistant", "answer to next 2")]
    assert len(model.requests) == 4


async def test_drain_queue_on_an_idle_session_delivers_asap_first(store: SessionStore, tenant: str) -> None:
    model = ScriptedModel(["ok"])
    agent = Agent(model, store=store)
    await agent.enqueue("new-chat", "run this", when="next", tenant=tenant)
    await agent.enqueue("new-chat", "context first", when="asap", tenant=tenant)
    [result] = await agent.drain_queue("new-chat", tenant=tenant)
    assert result.text == "ok"
    assert texts(model.requests[0].messages) == [("user", "context first"), ("user", "run this")]


async def test_drain_after_a_run_whose_settle_was_lost_replays_instead_of_running_again(
        store: SessionStore, tenant: str) -> None:
    model = ScriptedModel(["answered once"])
    agent = Agent(model, store=store)
    queued = await agent.enqueue("chat", "once please", when="next", tenant=tenant)
    # What a drain killed after its run, before it settled the entry, leaves:
    await agent.run(queued.message, session=await agent.session("chat", tenant=tenant))
    [result] = await agent.drain_queue("chat", tenant=tenant)
    assert result.replayed and result.text == "answered once" and len(model.requests) == 1


async def test_per_run_persistence_delivers_only_before_the_input(store: SessionStore, tenant: str) -> None:
    gate = Gate()
    model = ScriptedModel([tool_call("lookup", city="Suzhou"), "SZ", "later"])
    agent = Agent(model, tools=[gate.tool()], store=store, durability=Durability(persistence="per_run"))
    run = asyncio.create_task(collect(agent, "Code?", "chat", tenant))
    await gate.started.wait()
    await agent.enqueue("chat", "mid-run", tenant=tenant)
    gate.go.set()
    await run
    assert len(await pending(store, SessionKey(tenant, "chat"))) == 1
    await agent.run("again", session=await agent.session("chat", tenant=tenant))
    log = (await store.load(tenant, "chat")).messages
    assert texts(log)[-4:] == [("assistant", "SZ"), ("user", "mid-run"), ("user", "again"), ("assistant", "later")]
    assert exchange_problem(log) is None


async def test_bad_input_is_refused_with_what_to_do(store: SessionStore, tenant: str) -> None:
    agent = Agent(ScriptedModel(), store=store)
    with pytest.raises(UsageError, match="unknown when='soon': use 'asap'"):
        await agent.enqueue("chat", "hi", when="soon", tenant=tenant)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="must not be empty"):
        await agent.enqueue("chat", "  ", tenant=tenant)
    with pytest.raises(UsageError, match="only user messages"):
        await agent.enqueue("chat", Message.assistant("hi"), tenant=tenant)
    with pytest.raises(UsageError, match="text or a Message"):
        await agent.enqueue("chat", 42, tenant=tenant)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="invalid session id"):
        await agent.enqueue("bad id\n", "hi", tenant=tenant)
    assert await pending(store, SessionKey(tenant, "chat")) == []


async def test_deleting_the_session_deletes_its_queue(store: SessionStore, tenant: str) -> None:
    agent = Agent(ScriptedModel(["hi"]), store=store)
    await agent.run("hello", session=await agent.session("chat", tenant=tenant))
    await agent.enqueue("chat", "queued", tenant=tenant)
    await agent.enqueue("chat", "queued next", when="next", tenant=tenant)
    assert await store.delete_session(tenant, "chat")
    assert await pending(store, SessionKey(tenant, "chat")) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
async def test_a_second_worker_queues_for_a_run_the_first_holds(backend: str, tmp_path: Path, tenant: str) -> None:
    spec = store_spec(backend, tmp_path)
    mine, theirs = open_spec(spec), open_spec(spec)
    try:
        gate = Gate()
        agent = Agent(ScriptedModel([tool_call("lookup", city="Suzhou"), "SZ", "next done"]), tools=[gate.tool()],
                      store=mine)
        other = Agent(ScriptedModel(), store=theirs)
        run = asyncio.create_task(collect(agent, "Code?", "chat", tenant))
        await gate.started.wait()
        await other.enqueue("chat", "from the other worker", tenant=tenant)
        await other.enqueue("chat", "then this", when="next", tenant=tenant)
        gate.go.set()
        await run
        [result] = await agent.drain_queue("chat", tenant=tenant)
        assert result.text == "next done"
        assert texts((await theirs.load(tenant, "chat")).messages) == [
            ("user", "Code?"), ("assistant", ""), ("tool", ""), ("user", "from the other worker"), ("assistant", "SZ"),
            ("user", "then this"), ("assistant", "next done")]
    finally:
        await mine.close()
        await theirs.close()


OPS = st.lists(st.sampled_from(["asap", "next", "boundary", "crash"]), max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
async def test_property_any_interleaving_delivers_in_enqueue_order_each_once(
        store: SessionStore, tenant: str, ops: list[str]) -> None:
    """Enqueues and step boundaries in any order, with deliveries cut between the append and the settle."""
    key = SessionKey(tenant, f"p{abs(hash(tuple(ops))) % 10**9}-{len(ops)}")
    await store.delete_session(key.tenant, key.id)
    lease = await store.acquire_lease(key.tenant, key.id, "worker", ttl=60)
    asap: list[str] = []
    nexts: list[str] = []
    joined: list[str] = []  # what each delivery gave the run (and what a cut one appended): each message once
    try:
        for n, op in enumerate(ops):
            if op in ("asap", "next"):
                queued = await enqueue(store, key, f"{op} {n}", op)
                (asap if op == "asap" else nexts).append(queued.id)
            elif op == "boundary":
                joined += [m.id for m in await deliver(store, key, lease)]
            else:  # a worker killed after its append, before it settled: the entries stay listed
                known = {m.id for m in (await store.load(key.tenant, key.id)).messages}
                fresh = [q.message for q in await pending(store, key) if q.when == "asap" and q.id not in known]
                await store.append(key.tenant, key.id, fresh, lease=lease)
                joined += [m.id for m in fresh]
        joined += [m.id for m in await deliver(store, key, lease)]
    finally:
        await store.release_lease(lease)
    delivered = [m.id for m in (await store.load(key.tenant, key.id)).messages]
    assert delivered == asap
    assert joined == asap
    assert [q.id for q in await pending(store, key)] == nexts
