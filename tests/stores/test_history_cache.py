"""`History` keeps the decoded tail of a session between runs of one process, and never serves it stale."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Message
from contextpipe.providers import History
from contextpipe.stores import Checkpoint, MemoryStore, SessionStore
from contextpipe.testing import ScriptedModel

from .backends import DURABLE, open_spec, store_spec

WORKER = str(Path(__file__).with_name("proc_worker.py"))


def counting(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[dict[str, Any]]]:
    """Record the store reads `History` makes (name -> keyword arguments of each call)."""
    calls: dict[str, list[dict[str, Any]]] = {"load_context": [], "load": [], "latest_checkpoint": []}
    for name in calls:
        original: Callable[..., Awaitable[Any]] = getattr(store, name)

        def wrap(original: Callable[..., Awaitable[Any]] = original, name: str = name) -> Callable[..., Any]:
            async def spy(*args: Any, **kwargs: Any) -> Any:
                calls[name].append(kwargs)
                return await original(*args, **kwargs)
            return spy

        monkeypatch.setattr(store, name, wrap())
    return calls


async def fresh_view(store: SessionStore, tenant: str, session_id: str, **kwargs: Any) -> list[str]:
    """What a History without any kept state loads for the session (ids)."""
    view = await History(store, cache_messages=0, **kwargs).load(await store.load_or_create(tenant, session_id))
    return [m.id for m in view]


def sent_history(model: ScriptedModel) -> list[str]:
    """Ids of the messages of the last request, without the run's input (the last message)."""
    return [m.id for m in model.requests[-1].messages[:-1]]


async def test_a_warm_run_reads_only_what_was_appended(store: SessionStore, tenant: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    await store.append(tenant, "s", [Message.user(f"old {i}") for i in range(50)])
    model = ScriptedModel()
    agent = Agent(model, providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    calls = counting(store, monkeypatch)
    model.enqueue("first")
    await agent.run("one", session=session)
    assert len(calls["load_context"]) == 1
    afters = []
    for n in range(3):
        expected = await fresh_view(store, tenant, "s")
        full, loads = len(calls["load_context"]), len(calls["load"])
        model.enqueue(f"reply {n}")
        await agent.run(f"again {n}", session=session)
        assert sent_history(model) == expected
        assert len(calls["load_context"]) == full  # never the whole log again
        afters += [c["after"] for c in calls["load"][loads:]]
    # Each warm run read from the last kept message on: that one and the previous run's two messages.
    assert afters == [49 + 2 * k for k in range(3)]


async def test_never_stale_after_another_worker_writes(tmp_path: Path) -> None:
    for backend in ["memory", *DURABLE]:
        if backend == "memory":
            first: SessionStore = MemoryStore()
            second = first
        else:
            spec = store_spec(backend, tmp_path)
            try:
                first, second = open_spec(spec), open_spec(spec)
            except Exception:  # pragma: no cover - reported by the conformance tests
                continue
        tenant = f"t{uuid.uuid4().hex[:12]}"
        try:
            model_a, model_b = ScriptedModel(), ScriptedModel()
            a = Agent(model_a, providers=[History(first)])
            b = Agent(model_b, providers=[History(second)])
            for r in range(2):
                model_a.enqueue(f"a{r}")
                await a.run(f"to a {r}", session=await a.session("s", tenant=tenant))
            model_b.enqueue("b0")
            await b.run("to b", session=await b.session("s", tenant=tenant))
            # A write without a lease (a plain append) from the other instance, too.
            await second.append(tenant, "s", [Message.user("appended elsewhere")])
            expected = await fresh_view(first, tenant, "s")
            model_a.enqueue("a2")
            await a.run("to a 2", session=await a.session("s", tenant=tenant))
            texts = [m.text for m in model_a.requests[-1].messages]
            assert texts == ["to a 0", "a0", "to a 1", "a1", "to b", "b0", "appended elsewhere", "to a 2"], backend
            assert sent_history(model_a) == expected
        finally:
            await first.close()
            if second is not first:
                await second.close()


async def test_never_stale_after_another_process_runs(tmp_path: Path) -> None:
    spec = store_spec("sqlite", tmp_path)
    store = open_spec(spec)
    try:
        model = ScriptedModel()
        agent = Agent(model, providers=[History(store)])
        for r in range(2):
            model.enqueue(f"here {r}")
            await agent.run(f"run {r}", session=await agent.session("s"))
        proc = await asyncio.create_subprocess_exec(sys.executable, WORKER, "run", spec, "default", "9", "s", "2",
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 240)
        assert proc.returncode == 0, err.decode()
        expected = await fresh_view(store, "default", "s")
        model.enqueue("back here")
        await agent.run("run 2", session=await agent.session("s"))
        texts = [m.text for m in model.requests[-1].messages]
        assert texts[:4] == ["run 0", "here 0", "run 1", "here 1"]
        assert texts[4:12:4] == ["w9:r0", "w9:r1"]  # the other process's runs: input, call, result, answer
        assert sent_history(model) == expected
    finally:
        await store.close()


async def test_a_session_deleted_and_created_again_is_read_again() -> None:
    store = MemoryStore()
    model = ScriptedModel()
    agent = Agent(model, providers=[History(store)])
    model.enqueue("old answer")
    await agent.run("old question", session=await agent.session("s"))
    assert await store.delete_session("default", "s")
    # Another worker starts the session again; its lease token starts over, so this process's next
    # token directly follows the one it kept the tail with: only the log itself can tell.
    other = Agent(ScriptedModel(["new answer"]), providers=[History(store)])
    await other.run("new question", session=await other.session("s"))
    model.enqueue("fine")
    await agent.run("next", session=await agent.session("s"))
    assert [m.text for m in model.requests[-1].messages] == ["new question", "new answer", "next"]


async def test_checkpoint_and_bound_apply_to_the_kept_tail() -> None:
    store = MemoryStore()
    model = ScriptedModel()
    history = History(store, max_messages=6)
    agent = Agent(model, providers=[history])
    await store.append("default", "s", [Message.user(f"m{i}") for i in range(10)])
    for r in range(3):
        expected = await fresh_view(store, "default", "s", max_messages=6)
        model.enqueue(f"r{r}")
        await agent.run(f"q{r}", session=await agent.session("s"))
        assert sent_history(model) == expected
    summary = Message.user("[Summary] everything so far", metadata={"summary": True})
    await store.save_checkpoint("default", "s", Checkpoint(14, summary, 0.0))
    model.enqueue("after")
    await agent.run("q3", session=await agent.session("s"))
    assert [m.text for m in model.requests[-1].messages] == ["[Summary] everything so far", "q2", "r2", "q3"]


async def test_the_cache_is_bounded_over_sessions() -> None:
    store = MemoryStore()
    history = History(store, cache_messages=25)
    agent = Agent(ScriptedModel(["x"] * 10), providers=[history])
    for s in range(5):
        await store.append("default", f"s{s}", [Message.user(f"m{i}") for i in range(8)])
        await agent.run("hi", session=await agent.session(f"s{s}"))
    assert sum(len(t.messages) for t in history._tails.values()) <= 25
    assert list(history._tails) == [("default", "s2"), ("default", "s3"), ("default", "s4")]  # the latest
    with pytest.raises(Exception, match="cache_messages"):
        History(store, cache_messages=-1)


OPS = st.lists(st.sampled_from(["run_a", "run_b", "append", "delete", "checkpoint"]), min_size=1, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, bound=st.sampled_from([None, 3, 7]))
async def test_property_a_kept_tail_always_equals_a_fresh_load(ops: list[str], bound: int | None) -> None:
    store = MemoryStore()
    model_a, model_b = ScriptedModel(), ScriptedModel()
    a = Agent(model_a, providers=[History(store, max_messages=bound)])
    b = Agent(model_b, providers=[History(store, max_messages=bound)])
    for n, op in enumerate(ops, 1):
        if op == "run_a":
            expected = await fresh_view(store, "default", "s", max_messages=bound)
            model_a.enqueue(f"a{n}")
            await a.run(f"qa{n}", session=await a.session("s"))
            assert sent_history(model_a) == expected
        elif op == "run_b":
            model_b.enqueue(f"b{n}")
            await b.run(f"qb{n}", session=await b.session("s"))
        elif op == "append":
            await store.append("default", "s", [Message.user(f"x{n}"), Message.assistant(f"y{n}")])
        elif op == "delete":
            await store.delete_session("default", "s")
        else:
            page = await store.load("default", "s", limit=1)
            if page.messages:
                await store.save_checkpoint("default", "s", Checkpoint(
                    page.last_seq, Message.user(f"[Summary {n}]", metadata={"summary": True}), 0.0))
