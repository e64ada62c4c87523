"""Rewind, regenerate, edit and fork on every store: the view leaves rewound ranges out, the log keeps them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from contextpipe import Agent, Message, SessionBusy, UsageError
from contextpipe.messages import FunctionCall, FunctionResult
from contextpipe.providers import History, SemanticMemory
from contextpipe.rewind import read_log, rewind, rewound_ids, view_messages
from contextpipe.stores import Checkpoint, MemoryStore, SessionStore
from contextpipe.testing import ScriptedModel
from contextpipe.vectors import HashEmbedder, MemoryVectorStore


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


def sent(model: ScriptedModel) -> list[str]:
    return texts(list(model.requests[-1].messages))


async def test_rewind_regenerate_edit_through_runs(store: SessionStore, tenant: str) -> None:
    model = ScriptedModel(["a1", "a2", "a2 again", "a2 edited"])
    agent = Agent(model, providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    await agent.run("q1", session=session)
    await agent.run("q2", session=session)
    result = await agent.regenerate("s", tenant=tenant)
    assert result.text == "a2 again" and sent(model) == ["q1", "a1", "q2"]  # the old reply is not sent
    assert texts(await agent.history(session)) == ["q1", "a1", "q2", "a2 again"]
    log = await read_log(store, tenant, "s")
    assert [(e.message.text, e.rewound) for e in log if not e.message.metadata] == [
        ("q1", False), ("a1", False), ("q2", False), ("a2", True), ("a2 again", False)]  # kept, marked
    q2 = next(e.seq for e in log if e.message.text == "q2")
    result = await agent.edit("s", q2, "q2 edited", tenant=tenant)
    assert sent(model) == ["q1", "a1", "q2 edited"]  # the nested ranges compose
    assert texts(await agent.history(session)) == ["q1", "a1", "q2 edited", "a2 edited"]
    with pytest.raises(UsageError, match="no user message"):
        await agent.edit("s", 2, "no", tenant=tenant)


async def test_a_rewind_inside_a_tool_exchange_moves_before_it(store: SessionStore, tenant: str) -> None:
    call = Message("assistant", (FunctionCall("c1", "f", "{}"), FunctionCall("c2", "f", "{}")))
    log = [Message.user("q"), call, Message("tool", (FunctionResult("c1", "1"),)),
           Message("tool", (FunctionResult("c2", "2"),)), Message.assistant("done")]
    agent = Agent(ScriptedModel([]), providers=[History(store)])
    for sid, to in (("a", 2), ("b", 3), ("s", 4)):  # on the call, between its results, after them
        await store.append(tenant, sid, log)
        assert await agent.rewind(sid, to=to, tenant=tenant) == (1 if to < 4 else 4)
    assert await agent.rewind("s", to=0, tenant=tenant) == 0  # rewinding everything is fine too
    assert await agent.history(await agent.session("s", tenant=tenant)) == []
    with pytest.raises(UsageError, match="already rewound"):
        await agent.rewind("s", to=3, tenant=tenant)
    with pytest.raises(UsageError, match="log ends"):
        await agent.rewind("s", to=99, tenant=tenant)


async def test_rewinding_a_busy_session_is_refused(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", [Message.user("q")])
    lease = await store.acquire_lease(tenant, "s", "a-run")
    with pytest.raises(SessionBusy):
        await Agent(ScriptedModel([]), store=store).rewind("s", to=0, tenant=tenant)
    await store.release_lease(lease)


async def test_a_clients_message_with_a_marker_id_is_no_marker(store: SessionStore, tenant: str) -> None:
    # Message ids come from clients too (AG-UI, HTTP): one named like a marker is passed over, not read as one.
    await store.append(tenant, "s", [Message.user("q1", id="rewind-1"), Message.assistant("a1"),
                                     Message.user("q2"), Message.assistant("a2")])
    agent = Agent(ScriptedModel([]), providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    assert texts(await agent.history(session)) == ["q1", "a1", "q2", "a2"]
    assert await agent.rewind("s", to=2, tenant=tenant) == 2
    assert texts(await agent.history(session)) == ["q1", "a1"]
    assert [e.message.id for e in await read_log(store, tenant, "s")][-1] == "rewind-2"


async def test_a_session_object_from_before_a_rewind_still_sees_it(store: SessionStore, tenant: str) -> None:
    model = ScriptedModel(["a1", "a2", "a3"])
    history = History(store)
    agent = Agent(model, providers=[history])
    held = await agent.session("s", tenant=tenant)  # held across the rewind, never reloaded
    await agent.run("u1", session=held)
    await agent.run("u2", session=await agent.session("s", tenant=tenant))
    stale = await store.get_session(tenant, "s")
    assert stale is not None
    await agent.rewind("s", to=2, tenant=tenant)
    assert texts(list(await history.load(stale))) == ["u1", "a1"]  # loaded outside a run
    await agent.run("u3", session=stale)  # a run brings it up to date under its lease
    assert sent(model) == ["u1", "a1", "u3"]


async def test_fork_is_independent(store: SessionStore, tenant: str) -> None:
    model = ScriptedModel(["a1", "a2", "b2", "a3"])
    agent = Agent(model, providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    session.state["user_id"] = "u1"
    await store.save_session(session)
    await agent.run("q1", session=session)
    await agent.run("q2", session=session)
    forked = await agent.fork("s", at=2, new_id="f", tenant=tenant)
    assert forked.state["user_id"] == "u1" and texts(await agent.history(forked)) == ["q1", "a1"]
    await agent.run("q2 other", session=forked)
    assert sent(model) == ["q1", "a1", "q2 other"]
    await agent.run("q3", session=session)
    assert sent(model) == ["q1", "a1", "q2", "a2", "q3"]
    with pytest.raises(UsageError, match="has messages already"):
        await agent.fork("s", at=1, new_id="f", tenant=tenant)


async def test_a_checkpoint_past_the_rewind_point_is_not_used(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", [Message.user(f"m{i}") for i in range(1, 11)])
    summary = Message.user("[Summary] of m1..m8", metadata={"summary": True})
    await store.save_checkpoint(tenant, "s", Checkpoint(8, summary, 0.0))
    model = ScriptedModel(["ok", "ok"])
    agent = Agent(model, providers=[History(store)])
    session = await agent.session("s", tenant=tenant)
    await agent.run("go", session=session)
    assert sent(model)[0] == "[Summary] of m1..m8"
    await agent.rewind("s", to=5, tenant=tenant)
    await agent.run("go again", session=session)  # the same History: its kept tail is not used either
    assert sent(model) == ["m1", "m2", "m3", "m4", "m5", "go again"]


async def test_a_bounded_history_pages_around_rewound_ranges(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", [Message.user(f"m{i}") for i in range(1, 601)])
    agent = Agent(ScriptedModel(["ok"]), providers=[History(store, max_messages=300)])
    await agent.rewind("s", to=100, tenant=tenant)
    await store.append(tenant, "s", [Message.user(f"n{i}") for i in range(1, 201)])
    session = await agent.session("s", tenant=tenant)
    view = await History(store, max_messages=300).load_view(session)
    assert texts(list(view.messages)) == [f"m{i}" for i in range(1, 101)] + [f"n{i}" for i in range(1, 201)]
    assert view.first_seq is None  # not contiguous in the log: compaction saves no checkpoint from it


async def test_memory_recall_leaves_rewound_turns_out() -> None:
    store = MemoryStore()
    memory = SemanticMemory(MemoryVectorStore(), embedder=HashEmbedder(), scope="session", min_score=0.0)
    model = ScriptedModel(["noted", "ok"])
    agent = Agent(model, providers=[History(store), memory])
    session = await agent.session("s")
    await agent.run("my locker code is 4711", session=session)
    await agent.rewind("s", to=0)
    assert len(await rewound_ids(store, "default", "s")) == 2
    await agent.run("what is my locker code", session=session)
    assert "4711" not in " ".join(sent(model))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.tuples(st.just("append"), st.integers(1, 4)),
                          st.tuples(st.just("exchange"), st.integers(1, 3)),
                          st.tuples(st.just("rewind"), st.integers(0, 40))), max_size=12))
async def test_the_view_is_the_log_minus_the_rewound_ranges(steps: list[tuple[str, int]]) -> None:
    store, sid = MemoryStore(), "s"
    # The reference: the view with sequences, each with the sequence its tool exchange starts at and
    # whether it closes it (None, True outside exchanges).
    model: list[tuple[int, Message, int | None, bool]] = []
    last, n = 0, 0
    for op, arg in steps:
        if op == "rewind":
            index = min(arg, len(model)) - 1
            target = model[index][0] if arg and model else 0
            expected = target if not arg or not model or model[index][3] else model[index][2] - 1
            lease = await store.acquire_lease("default", sid, "test")
            assert await rewind(store, "default", sid, target, lease) == expected
            await store.release_lease(lease)
            model = [e for e in model if e[0] <= expected]
            last += 1 if last else 0  # the marker (a session not stored yet gets none)
            continue
        n += 1
        batch = [Message.user(f"u{n}.{i}") for i in range(arg)] if op == "append" else [
            Message("assistant", tuple(FunctionCall(f"c{n}.{i}", "f", "{}") for i in range(arg))),
            *(Message("tool", (FunctionResult(f"c{n}.{i}", "r"),)) for i in range(arg))]
        await store.append("default", sid, batch)
        start = last + 1
        model += [(start + i, m, None if op == "append" else start, op == "append" or i == len(batch) - 1)
                  for i, m in enumerate(batch)]
        last += len(batch)
    note(repr(steps))
    view = await view_messages(store, "default", sid)
    assert [(s, m.id) for s, m in view] == [(e[0], e[1].id) for e in model]
    assert [(s, m.id) for s, m in await view_messages(store, "default", sid, limit=3)] == [
        (e[0], e[1].id) for e in model[-3:]]
    assert len(await read_log(store, "default", sid)) == last  # nothing was deleted
