"""Prompt-cache checks and the cache-bust warning, through Agent.run on ScriptedModel reporting cache use."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import Agent, tool
from contextpipe._prompt_cache import Prefix, Segment, compare
from contextpipe.compaction import SlidingWindow
from contextpipe.models.base import Usage
from contextpipe.providers import Compaction, History
from contextpipe.providers.base import ContextProvider
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel
from contextpipe.testing.scripted import Turn, tool_call

CACHED = Usage(3000, 10, cache_read_tokens=2000)


@tool
def lookup(city: str) -> str:
    """Look up a city."""
    return "code-" + city


class PerRun(ContextProvider):
    """Puts text that changes every run into the instructions."""

    def __init__(self, source_id: str = "facts") -> None:
        super().__init__(source_id)
        self.runs = 0

    async def before_run(self, ctx):  # type: ignore[no-untyped-def]
        self.runs += 1
        ctx.add_instructions(f"Run {self.runs}. " + "Known fact. " * 400)


async def test_a_stable_tool_loop_matches_fully_and_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel([tool_call("lookup", city="a") + Turn(usage=CACHED),
                           tool_call("lookup", city="b") + Turn(usage=CACHED), Turn("done", usage=CACHED)])
    agent = Agent(model, instructions="Be kind. " * 300, tools=[lookup])
    with caplog.at_level(logging.WARNING, logger="contextpipe.cache"):
        result = await agent.run("hello " * 100)
    first, *rest = result.traces
    assert first.cache is None
    for trace in rest:
        assert trace.cache is not None and trace.cache.broke_at is None
        assert trace.cache.matched_tokens == trace.cache.previous_tokens > 0
        assert not any(c.action == "cache_collapsed" for c in trace.changes)
        assert trace.to_dict()["cache"]["collapsed"] is False
    assert "prompt cache: " in rest[-1].table()
    assert not caplog.records


async def test_per_run_instructions_of_a_provider_collapse_the_cache_of_the_next_run(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    model = ScriptedModel([Turn("one", usage=CACHED), Turn("two", usage=CACHED)])
    agent = Agent(model, instructions="Be kind.", providers=[History(store), PerRun()])
    session = await agent.session("s")
    await agent.run("hello " * 600, session=session)
    with caplog.at_level(logging.WARNING, logger="contextpipe.cache"):
        result = await agent.run("again", session=session)
    check = result.traces[0].cache
    assert check is not None and check.against == "previous_run"
    assert (check.broke_at, check.cause, check.culprit) == ("instructions", "instructions_changed", "facts")
    assert check.collapsed and check.previous_cached_tokens == 2000
    [change] = [c for c in result.traces[0].changes if c.action == "cache_collapsed"]
    assert "instructions_changed" in change.items[0] and "'facts'" in change.items[0]
    assert [r.levelname for r in caplog.records] == ["WARNING"]


async def test_a_model_reporting_no_cache_use_keeps_no_fingerprint() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["one"]), providers=[History(store)])
    session = await agent.session("s")
    result = await agent.run("hello", session=session)
    assert "contextpipe.prompt_cache" not in session.state
    assert not any(c.action == "cache_collapsed" for c in result.traces[0].changes)


_blocks = st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("xy"), st.integers(0, 500)), max_size=4)
_segments = st.lists(st.builds(lambda i, n, t: Segment(n, f"m{i}", f"m{i + n - 1}", t),
                               st.integers(0, 5), st.integers(1, 3), st.integers(0, 900)), max_size=6)
_prefixes = st.builds(Prefix, _blocks, _blocks, _segments)


@given(_prefixes, _prefixes)
def test_matched_tokens_are_within_the_previous_prefix_and_a_break_names_its_cause(prev: Prefix, cur: Prefix) -> None:
    check = compare(prev, cur, "previous_call")
    assert 0 <= check.matched_tokens <= prev.tokens and check.lost_tokens == prev.tokens - check.matched_tokens
    if check.broke_at is None:
        assert check.matched_tokens == prev.tokens and check.cause is None
    else:
        assert check.cause is not None and check.detail


@given(_prefixes)
def test_an_identical_request_matches_fully(prefix: Prefix) -> None:
    check = compare(prefix, prefix, "previous_call")
    assert check.broke_at is None and check.matched_tokens == prefix.tokens and not check.collapsed


class Fixed(ContextProvider):
    """Stable instructions, and a tool only from its second run on."""

    def __init__(self, source_id: str) -> None:
        super().__init__(source_id)
        self.runs = 0

    async def before_run(self, ctx):  # type: ignore[no-untyped-def]
        self.runs += 1
        ctx.add_instructions(f"Rules of {self.source_id}. " + "Stable rule. " * 400)
        if self.runs > 1 and self.source_id == "tooly":
            ctx.add_tools([lookup])


async def _second_run(providers: list[ContextProvider], reorder: bool = False):  # type: ignore[no-untyped-def]
    store = MemoryStore()
    model = ScriptedModel([Turn("one", usage=CACHED), Turn("two", usage=CACHED)])
    agent = Agent(model, providers=[History(store), *providers])
    session = await agent.session("s")
    await agent.run("hello " * 600, session=session)
    if reorder:
        agent = Agent(model, providers=[History(store), *reversed(providers)])
    result = await agent.run("again", session=session)
    return result.traces[0].cache


async def test_a_tool_added_between_runs_is_named() -> None:
    check = await _second_run([Fixed("tooly")])
    assert check is not None and (check.cause, check.culprit) == ("tools_changed", "lookup")
    assert check.matched_tokens == 0 and check.collapsed


async def test_reordered_providers_break_at_the_instructions() -> None:
    check = await _second_run([Fixed("a"), Fixed("b")], reorder=True)
    assert check is not None and (check.broke_at, check.cause) == ("instructions", "instructions_changed")
    assert "reordered" in check.detail and check.culprit == "b"


async def test_compaction_on_the_next_run_is_named_as_the_cause(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    model = ScriptedModel([Turn("one", usage=CACHED), Turn("two", usage=CACHED)])
    # One turn fits: the first run's turn is dropped from the second run's request.
    agent = Agent(model, providers=[History(store), Compaction(SlidingWindow(max_turns=1))])
    session = await agent.session("s")
    first = await agent.run("hello " * 2000, session=session)
    assert not first.traces[0].compaction
    with caplog.at_level(logging.WARNING, logger="contextpipe.cache"):
        result = await agent.run("again", session=session)
    trace = result.traces[0]
    assert [d.action for d in trace.compaction] == ["dropped"]
    check = trace.cache
    assert check is not None and check.against == "previous_run"
    assert (check.broke_at, check.cause, check.culprit) == ("messages", "compaction", "sliding_window")
    assert check.collapsed and check.matched_tokens == 0
    [record] = caplog.records
    assert record.levelname == "WARNING" and "(compaction: compaction 'sliding_window' dropped" in record.getMessage()
    assert any(c.action == "cache_collapsed" for c in trace.changes)
