"""`History`'s token bound: a run loads the newest messages that fit, never the whole log, and says what it left out."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Message, UsageError
from contextpipe.compaction import TokenBudget
from contextpipe.exchanges import exchange_problem
from contextpipe.messages import FunctionCall, FunctionResult
from contextpipe.providers import Compaction, History
from contextpipe.stores import Checkpoint, MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel
from contextpipe.tokens import EstimateTokenizer, TokenCounter


def log(turns: int, seed: str = "") -> list[Message]:
    """A conversation with a tool exchange (one call, two results) every third turn."""
    out: list[Message] = []
    for i in range(turns):
        out.append(Message.user(f"question {seed}{i} " + "word " * (i % 7)))
        if i % 3 == 2:
            calls = (FunctionCall(f"c{seed}{i}a", "lookup", "{}"), FunctionCall(f"c{seed}{i}b", "lookup", "{}"))
            out += [Message("assistant", calls), Message("tool", (FunctionResult(f"c{seed}{i}a", "ok " * 20),)),
                    Message("tool", (FunctionResult(f"c{seed}{i}b", "ok"),))]
        out.append(Message.assistant(f"answer {seed}{i} " + "more " * (i % 5)))
    return out


def tokens(messages: list[Message]) -> int:
    return sum(TokenCounter(EstimateTokenizer()).messages(messages))


def bound_changes(result: Any) -> list[str]:
    return [item for t in result.traces for c in t.changes if c.action == "history_bound" for item in c.items]


async def test_a_long_log_loads_only_the_newest_messages_that_fit(store: SessionStore, tenant: str) -> None:
    stored = log(200)
    await store.append(tenant, "s", stored)
    model = ScriptedModel(["one", "two"])
    agent = Agent(model, providers=[History(store, max_tokens=500)])
    session = await agent.session("s", tenant=tenant)
    for text in ("first", "second"):  # the second run goes through the kept tail
        full = await store.load(tenant, "s")  # the log the run starts from
        result = await agent.run(text, session=session)
        sent = list(model.requests[-1].messages[:-1])
        ids = [m.id for m in full.messages]
        start = ids.index(sent[0].id)
        assert [m.id for m in sent] == ids[start:]  # the newest messages, in order
        assert exchange_problem(sent) is None  # no exchange split
        cut = start
        while full.messages[cut - 1].role == "tool":  # results left out with their call
            cut -= 1
        assert tokens(sent) <= 500 < tokens(full.messages[cut - 1:])  # as many as fit
        assert bound_changes(result) == [f"{start:,} older messages (log sequences 1 to {start:,}) not loaded: "
                                         "History(max_tokens=500)"]


async def test_a_checkpoint_and_the_bound(store: SessionStore, tenant: str) -> None:
    await store.append(tenant, "s", log(120))
    summary = Message.user("[Summary] earlier", metadata={"summary": True})
    await store.save_checkpoint(tenant, "s", Checkpoint(100, summary, 0.0))
    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[History(store, max_tokens=300)])
    after = (await store.load(tenant, "s", after=100)).messages
    result = await agent.run("now", session=await agent.session("s", tenant=tenant))
    sent = list(model.requests[-1].messages[:-1])
    assert sent[0].text == summary.text
    kept = [m.id for m in sent[1:]]
    assert kept == [m.id for m in after][len(after) - len(kept):] and 0 < len(kept) < len(after)
    assert tokens(sent[1:]) <= 300
    skipped = len(after) - len(kept)
    assert bound_changes(result) == [f"{skipped} older messages (log sequences 101 to {100 + skipped}) not loaded: "
                                     "History(max_tokens=300)"]


async def test_max_tokens_none_loads_the_whole_log(store: SessionStore, tenant: str) -> None:
    stored = log(200)
    await store.append(tenant, "s", stored)
    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[History(store, max_tokens=None)])
    result = await agent.run("all", session=await agent.session("s", tenant=tenant))
    assert [m.id for m in model.requests[-1].messages[:-1]] == [m.id for m in stored]
    assert bound_changes(result) == []


async def test_the_default_bound_leaves_a_log_that_a_model_can_take_whole(tenant: str) -> None:
    store = MemoryStore()
    stored = log(300)
    await store.append(tenant, "s", stored)
    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[History(store)])
    result = await agent.run("all", session=await agent.session("s", tenant=tenant))
    assert len(model.requests[-1].messages) == len(stored) + 1 and bound_changes(result) == []


async def test_a_token_budget_after_history_bounds_the_load(tenant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    await store.append(tenant, "s", log(3000))
    read: list[int] = []
    original = store.load

    async def counting(*args: Any, **kwargs: Any) -> Any:
        page = await original(*args, **kwargs)
        read.append(len(page.messages))
        return page

    monkeypatch.setattr(store, "load", counting)
    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[History(store), Compaction(TokenBudget(400))])
    result = await agent.run("hi", session=await agent.session("s", tenant=tenant))
    assert sum(read) < 1_000  # pages of the tail, not the 10,000 messages of the log
    assert tokens(list(model.requests[-1].messages)) <= 400
    (change,) = bound_changes(result)
    assert change.endswith("not loaded: twice the 400-token budget of Compaction('compaction'), after "
                           "History(max_tokens=1000000)")


@pytest.mark.parametrize("bad", [0, -5, 1.5, "100", True])
def test_bad_bounds_say_what_to_pass(bad: Any) -> None:
    for name in ("max_tokens", "max_messages"):
        with pytest.raises(UsageError, match=f"{name} must be a whole number of at least 1, or None to load the "
                                             "whole log"):
            History(MemoryStore(), **{name: bad})


def turns() -> st.SearchStrategy[list[tuple[int, int]]]:
    """Turns as (kind, size): 0 a plain exchange of words, 1 a tool exchange with 1 to 3 results."""
    return st.lists(st.tuples(st.integers(0, 1), st.integers(0, 40)), min_size=1, max_size=30)


def build(shape: list[tuple[int, int]], tag: str) -> list[Message]:
    out: list[Message] = []
    for i, (kind, size) in enumerate(shape):
        out.append(Message.user(f"{tag}{i} " + "w " * size))
        if kind:
            calls = tuple(FunctionCall(f"{tag}c{i}_{k}", "f", "{}") for k in range(1 + size % 3))
            out.append(Message("assistant", calls))
            out += [Message("tool", (FunctionResult(c.call_id, "r " * size),)) for c in calls]
        out.append(Message.assistant("a " * (size // 2)))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=turns(), more=turns(), bound=st.integers(1, 400), checkpoint=st.booleans())
async def test_property_the_kept_tail_and_the_store_agree_and_never_split_an_exchange(
        tmp_path: Path, first: list[tuple[int, int]], more: list[tuple[int, int]], bound: int,
        checkpoint: bool) -> None:
    sqlite = SQLiteStore(tmp_path / "bound.db")
    try:
        for store in (MemoryStore(), sqlite):
            sid = uuid.uuid4().hex
            history = History(store, max_tokens=bound)
            session = await store.load_or_create("default", sid)
            await store.append("default", sid, build(first, "a"))
            await history.load_view(session, lease_token=1)  # kept for the next run
            await store.append("default", sid, build(more, "b"))
            if checkpoint:
                page = await store.load("default", sid, limit=1)
                await store.save_checkpoint("default", sid, Checkpoint(
                    max(1, page.last_seq - 5), Message.user("[Summary]", metadata={"summary": True}), 0.0))
            cached = await history.load_view(session, lease_token=2)
            fresh = await History(store, max_tokens=bound, cache_messages=0).load_view(session)
            assert [m.id for m in cached.messages] == [m.id for m in fresh.messages]
            assert (cached.first_seq, cached.left_out) == (fresh.first_seq, fresh.left_out)
            assert exchange_problem(list(fresh.messages)) is None
            assert tokens(list(fresh.messages)) <= bound
            stored = (await store.load("default", sid)).messages
            assert fresh.first_seq is not None
            floor = fresh.first_seq - 1 - fresh.left_out
            assert [m.id for m in stored[fresh.first_seq - 1:]] == [m.id for m in fresh.messages]
            assert floor == (max(1, len(stored) - 5) if checkpoint else 0)
    finally:
        await sqlite.close()
