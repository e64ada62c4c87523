"""`ContextBudget`: one budget split across tools, memory, search and history, through `Agent.run`."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, ApprovalError, HistoryProvider, Message, PromptTrace, Session, Tool, UsageError
from contextpipe.budget import RankedItems, ranked_message
from contextpipe.models import ModelRequest
from contextpipe.models.base import Usage
from contextpipe.pipeline import RunContext
from contextpipe.providers import (
    Compaction,
    ContextBudget,
    ContextProvider,
    FactMemory,
    History,
    SearchResult,
    SemanticMemory,
    TextSearch,
    ToolSearch,
)
from contextpipe.session import set_user_id
from contextpipe.stores import Lease, MemoryStore
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.testing.scripted import Turn
from contextpipe.vectors import HashEmbedder, MemoryVectorStore
from helpers import PAID, balance, changes, lookup_location_code, pay

WORDS = "word " * 40


def searcher(scores: Sequence[float]):  # type: ignore[no-untyped-def]
    async def search(query: str) -> list[SearchResult]:
        return [SearchResult(f"passage {i} {WORDS}", f"doc{i}", score=s) for i, s in enumerate(scores)]

    return search


def search_message(request: ModelRequest) -> Message | None:
    return next((m for m in request.messages if m.source and m.source.source_id == "search"), None)


def by_source(trace: PromptTrace) -> dict[str, tuple[int, int, int]]:
    return {b.source: (b.share, b.asked, b.got) for b in trace.budget}


async def seeded(agent: Agent, turns: int, session_id: str = "s") -> None:
    """Give the session `turns` runs of history, each a tool exchange and a long answer."""
    session = await agent.session(session_id)
    for i in range(turns):
        model = agent.model
        assert isinstance(model, ScriptedModel)
        model.enqueue(tool_call("lookup_location_code", city="Suzhou"), f"answer {i} {WORDS}")
        await agent.run(f"question {i} {WORDS}", session=session)


# --- configuration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"shares": {"history": 0.7, "search": 0.5}}, "add up to 1.2, over 1"),
    ({"shares": {"history": 0.5}, "reserve": 1_000}, "must be larger than reserve"),
    ({"shares": {"files": 0.5}}, "knows no source 'files'"),
    ({"shares": {"history": 0.5}, "priorities": ["search"]}, "priority 'search' has no share: add it to shares"),
    ({"shares": {"history": 1.5}}, "fractions from 0 to 1"),
    ({"shares": {"history": "half"}}, "fractions from 0 to 1"),
    ({"shares": {}}, "needs at least one share"),
    ({"shares": {"history": 0.5}, "priorities": "history"}, "write priorities=\\['history'\\]"),
])
def test_a_mistaken_budget_says_what_to_change(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        ContextBudget(1_000, **kwargs)  # type: ignore[arg-type]


async def test_a_budget_runs_after_every_provider_the_agents_and_the_runs_own() -> None:
    model = ScriptedModel(["ok", "ok"])
    agent = Agent(model, providers=[ContextBudget(200, shares={"search": 1.0}), TextSearch(searcher([0.9, 0.8, 0.7]))])
    result = await agent.run("hello")  # the budget first among the agent's providers: it still runs last
    assert result.traces[0].budget[0].asked > result.traces[0].budget[0].got > 0
    assert result.traces[0].total_tokens <= 200
    agent = Agent(model, providers=[ContextBudget(200, shares={"search": 1.0})])
    result = await agent.run("hello", providers=[TextSearch(searcher([0.9, 0.8, 0.7]))])  # a run's own (AG-UI's)
    [line] = result.traces[0].budget
    assert line.asked > line.got > 0 and result.traces[0].total_tokens <= 200
    assert [t.source_id for t in result.traces[0].provider_timings if t.hook == "before_run"][-1] == "budget"


# --- each source's rule ---------------------------------------------------------------------------------


async def test_search_drops_its_lowest_scored_chunks_and_the_trace_shows_share_asked_got() -> None:
    model = ScriptedModel(["ok"])
    scores = [0.9, 0.2, 0.8, 0.1, 0.7]  # not in score order: the budget goes by score, not by place
    agent = Agent(model, instructions="Be brief.", providers=[
        TextSearch(searcher(scores)), ContextBudget(300, reserve=50, shares={"search": 0.9})])
    result = await agent.run("what is in the documents?")
    text = search_message(model.requests[0]).text  # type: ignore[union-attr]
    kept = [i for i in range(len(scores)) if f"passage {i} " in text]
    best = sorted(range(len(scores)), key=lambda i: -scores[i])
    assert 0 < len(kept) < len(scores) and kept == sorted(best[:len(kept)])  # the best fit, in their places
    assert "[1] passage 0" in text and "[3] passage 2" in text  # and keep their citation numbers
    [line] = result.traces[0].budget
    assert (line.source, line.asked > 250, line.got <= line.share) == ("search", True, True)
    assert line.got == result.traces[0].tokens_by_source()["context:search"]
    assert result.traces[0].total_tokens <= 250
    assert "budget search: share" in result.traces[0].table() and result.traces[0].to_dict()["budget"][0]["got"]


async def test_providers_sharing_a_share_split_it_by_their_asks() -> None:
    def tagged(tag: str, scores: Sequence[float]):  # type: ignore[no-untyped-def]
        async def search(query: str) -> list[SearchResult]:
            return [SearchResult(f"{tag} passage {i} {WORDS}", f"{tag}{i}", score=s) for i, s in enumerate(scores)]

        return search

    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[TextSearch(tagged("A", [0.99, 0.98, 0.97]), source_id="a"),
                                    TextSearch(tagged("B", [0.1, 0.05, 0.01]), source_id="b"),
                                    ContextBudget(300, shares={"search": 1.0})])
    result = await agent.run("q")
    sent = "\n".join(m.text for m in model.requests[0].messages)
    assert "A passage 0" in sent and "B passage 0" in sent  # neither starves: each keeps its best
    assert "A passage 2" not in sent and "B passage 2" not in sent
    [line] = result.traces[0].budget
    assert line.got <= line.share and line.share - line.got < 60  # what the first left went to the second


async def test_memory_drops_its_lowest_scored_memories() -> None:
    memory = SemanticMemory(MemoryVectorStore(), HashEmbedder(), k=5, search="keywords")
    model = ScriptedModel([f"Noted {i}: the pottery class {WORDS}" for i in range(5)] + ["ok"])
    agent = Agent(model, providers=[memory, ContextBudget(500, shares={"memory": 1.0})])
    earlier, now = await agent.session("m1"), await agent.session("m2")
    earlier.state["user_id"] = now.state["user_id"] = "maya"
    for i in range(5):
        await agent.run(f"Pottery class note {i}: {'clay ' * (i + 1)}{WORDS}", session=earlier)
    question = "What about the pottery class clay?"
    hits = await memory.recall(question, now)  # what the run recalls, with the scores
    result = await agent.run(question, session=now)
    text = next(m for m in model.requests[-1].messages if m.metadata.get("memory")).text
    kept = [h for h in hits if SemanticMemory.format(h) in text]
    best = sorted(hits, key=lambda h: -h.score)
    assert 1 < len(kept) < len(hits) == 5 and {h.id for h in kept} == {h.id for h in best[:len(kept)]}
    [line] = result.traces[0].budget
    assert line.asked > line.got and result.traces[0].total_tokens <= 500


async def test_memory_with_its_tool_counts_its_instructions_against_its_share() -> None:
    memory = SemanticMemory(MemoryVectorStore(), HashEmbedder(), k=5, search="keywords", mode="both")
    model = ScriptedModel([f"Noted {i}: the pottery class {WORDS}" for i in range(5)] + ["ok"])
    agent = Agent(model, providers=[memory, ContextBudget(420, shares={"memory": 1.0})])
    earlier, now = await agent.session("m1"), await agent.session("m2")
    earlier.state["user_id"] = now.state["user_id"] = "maya"
    for i in range(5):
        await agent.run(f"Pottery class note {i}: {'clay ' * (i + 1)}{WORDS}", session=earlier)
    result = await agent.run("What about the pottery class clay?", session=now)
    trace = result.traces[0]
    [line] = trace.budget
    assert trace.tokens_by_source()["instructions:memory"] > 0  # the tool's instructions: kept, and counted
    assert line.asked > line.got and trace.total_tokens <= 420
    assert not [c for c in trace.changes if c.action == "over_budget"]


async def test_facts_drop_the_least_relevant_first() -> None:
    facts = tuple(f"Maya's fact {i}: she {'likes pottery and clay ' if i % 2 else 'drives a bus '}{WORDS}"
                  for i in range(6))
    memory = FactMemory(ScriptedModel([changes(add=facts), changes()]), MemoryVectorStore(), HashEmbedder())
    model = ScriptedModel(["Noted.", "ok"])
    agent = Agent(model, instructions="Be brief.", providers=[memory, ContextBudget(250, shares={"memory": 1.0})])
    session = await agent.session("f")
    set_user_id(session, "maya")
    await agent.run("Here is everything about me.", session=session)
    question = "Does Maya like pottery?"
    ranked = [text for _, text in await memory.facts(session, question)]
    result = await agent.run(question, session=session)
    sent = model.requests[-1].instructions or ""
    kept = [text for text in ranked if f"- {text}" in sent]
    assert sent.startswith("Be brief.") and 0 < len(kept) < len(ranked) and kept == ranked[:len(kept)]
    assert result.traces[0].total_tokens <= 250


async def test_history_is_compacted_to_its_share_and_no_call_leaves_its_result() -> None:
    model = ScriptedModel([])
    agent = Agent(model, tools=[lookup_location_code], providers=[
        History(MemoryStore()), ContextBudget(400, reserve=100, shares={"history": 1.0})])
    await seeded(agent, 6)
    model.enqueue("done")
    result = await agent.run("the latest question", session=await agent.session("s"))
    request = model.requests[-1]
    calls = {c.call_id for m in request.messages for c in m.function_calls}
    answered = {r.call_id for m in request.messages for r in m.function_results}
    assert calls == answered and calls  # whole exchanges: kept together, or dropped together
    assert request.messages[-1].text == "the latest question"
    assert request.messages[-2].text.startswith("answer 5")  # the newest history stays, the oldest went
    assert not any(m.text.startswith("question 0") for m in request.messages)
    [decision], [line] = result.traces[0].compaction, result.traces[0].budget
    assert decision.strategy == "budget" and result.traces[0].total_tokens <= 300
    assert decision.tokens_after == result.traces[0].total_tokens  # the request's tokens, as documented
    assert decision.tokens_before - decision.tokens_after == line.asked - line.got


async def test_a_compaction_provider_is_the_historys_rule() -> None:
    model = ScriptedModel([])
    agent = Agent(model, tools=[lookup_location_code], providers=[
        History(MemoryStore()), Compaction(max_input_tokens=100_000),
        ContextBudget(400, shares={"history": 1.0})])
    await seeded(agent, 6)
    model.enqueue("done")
    result = await agent.run("the latest question", session=await agent.session("s"))
    assert [d.strategy for d in result.traces[0].compaction] == ["compaction (budget)"]
    assert result.traces[0].total_tokens <= 400


async def test_tool_definitions_are_deferred_behind_tool_search() -> None:
    def make(i: int) -> Tool:
        def run(query: str) -> str:
            return query

        return Tool(run, name=f"tool_{i}", description=f"Tool number {i}: does thing {i} with a query. {WORDS}")

    tools = [make(i) for i in range(10)]
    model = ScriptedModel(["ok", "ok"])
    search = ToolSearch(threshold=30)  # 10 tools: under its own threshold, the budget is what defers them
    result = await Agent(model, tools=tools, providers=[
        search, ContextBudget(1_000, shares={"tools": 0.3})]).run("go")
    assert [t.name for t in model.requests[0].tools] == ["search_tools"]
    assert "tool_3" in (model.requests[0].instructions or "")  # the catalogue names them
    [line] = result.traces[0].budget
    assert line.asked > 1_000 > line.got
    roomy = await Agent(model, tools=tools, providers=[search, ContextBudget(10_000, shares={"tools": 0.9})]).run("go")
    assert len(model.requests[1].tools) == 10 and by_source(roomy.traces[0])["tools"][1:] == (line.asked,) * 2


async def test_a_deferred_catalogue_keeps_tool_searchs_place_among_the_instructions() -> None:
    class Rules(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.add_instructions("House rules.")

    def make(i: int) -> Tool:
        def run(query: str) -> str:
            return query

        return Tool(run, name=f"tool_{i}", description=f"Tool number {i}: does thing {i}. {WORDS}")

    model = ScriptedModel(["ok"])
    result = await Agent(model, instructions="Be brief.", tools=[make(i) for i in range(10)], providers=[
        ToolSearch(), Rules("rules"), ContextBudget(1_000, shares={"tools": 0.2})]).run("go")
    assert [i.source_id for i in result.traces[0].instructions] == ["agent", "tool-search", "rules"]


async def test_deferred_tools_are_not_counted_by_compaction_in_the_tool_loop() -> None:
    def make(i: int) -> Tool:
        def run(query: str) -> str:
            return "result " * 400

        return Tool(run, name=f"tool_{i}", description=f"Tool number {i}: does thing {i}. {WORDS}")

    model = ScriptedModel([])
    agent = Agent(model, tools=[make(i) for i in range(10)], providers=[
        History(MemoryStore()), ToolSearch(threshold=30, max_results=5), Compaction(max_input_tokens=1_900),
        ContextBudget(1_200, shares={"tools": 0.05, "history": 0.95})])
    session = await agent.session("s")
    for i in range(6):
        model.enqueue(f"a{i} {WORDS}")
        await agent.run(f"q{i} {WORDS}", session=session)
    model.enqueue(tool_call("tool_1", query="x"), "done")
    result = await agent.run("latest", session=session)
    first, second = result.traces
    assert sorted(t.name for t in model.requests[-1].tools) == ["search_tools", "tool_1"]
    assert second.compaction == () and len(second.messages) == len(first.messages) + 2  # nothing dropped:
    # the in-loop compaction counts the two tools sent, not the ten the budget deferred


async def test_whether_tools_are_deferred_does_not_change_with_the_other_sources() -> None:
    def make(i: int) -> Tool:
        def run(query: str) -> str:
            return query

        return Tool(run, name=f"tool_{i}", description=f"Tool number {i}: does thing {i}. {WORDS}")

    async def search(query: str) -> list[SearchResult]:  # results for one question, none for the other
        return [SearchResult(f"refund policy {WORDS}", f"d{i}", score=1 - i / 10) for i in range(8)] if (
            "refund" in query) else []

    cached = Usage(200, 10, cache_read_tokens=150)  # about what the run counts: a calibration near 1
    model = ScriptedModel([Turn("ok", usage=cached), Turn("ok", usage=cached)])
    agent = Agent(model, tools=[make(i) for i in range(6)], providers=[
        History(MemoryStore()), TextSearch(search), ToolSearch(),
        ContextBudget(1_000, shares={"tools": 0.4, "search": 0.4, "history": 0.2})])
    session = await agent.session("s")
    await agent.run("hello", session=session)  # no search results: the tools could have had the spare share
    result = await agent.run("what about a refund?", session=session)
    assert [t.name for t in model.requests[0].tools] == [t.name for t in model.requests[1].tools]
    check = result.traces[0].cache
    assert check is not None and check.against == "previous_run" and check.broke_at is None  # the whole prefix


# --- flow and the protected parts -----------------------------------------------------------------------


async def test_unused_share_flows_to_the_others_by_priority() -> None:
    got: dict[str, dict[str, tuple[int, int, int]]] = {}
    for first, other in (("history", "search"), ("search", "history")):
        model = ScriptedModel([])
        agent = Agent(model, tools=[lookup_location_code], providers=[
            History(MemoryStore()), TextSearch(searcher([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])),
            ContextBudget(900, shares={"history": 0.3, "search": 0.3, "memory": 0.4}, priorities=[first])])
        await seeded(agent, 6)
        model.enqueue("done")
        result = await agent.run("the latest question", session=await agent.session("s"))
        assert result.traces[0].total_tokens <= 900
        got[first] = budget = by_source(result.traces[0])
        assert budget["memory"][1:] == (0, 0)  # no memory provider: its whole share is spare
        assert budget[first][2] > budget[first][0]  # the first in priority takes the spare share
        assert budget[other][2] < budget[other][1]  # the other had to trim more

    assert got["history"]["history"][2] > got["search"]["history"][2]
    assert got["search"]["search"][2] > got["history"]["search"][2]


async def test_what_a_source_leaves_after_trimming_flows_to_the_next() -> None:
    model = ScriptedModel([])
    big = [SearchResult(f"passage {i} " + "word " * 150, f"doc{i}", score=1 - i / 10) for i in range(3)]

    async def search(query: str) -> list[SearchResult]:
        return big

    agent = Agent(model, providers=[History(MemoryStore()), TextSearch(search),
                                    ContextBudget(600, shares={"search": 0.5, "history": 0.5})])
    session = await agent.session("s")
    for i in range(80):
        model.enqueue(f"a{i}")
        await agent.run(f"q{i}", session=session)
    model.enqueue("done")
    result = await agent.run("q", session=session)
    budget = by_source(result.traces[0])
    assert budget["search"][2] < budget["search"][0]  # a chunk is ~150 tokens: it cannot use all its share
    assert budget["history"][2] > budget["history"][0]  # what it left went to the history, whose turns are small
    assert 600 - result.traces[0].total_tokens < 12


@pytest.mark.parametrize("trim", ["budget", "compaction"])
async def test_a_call_awaiting_approval_is_never_trimmed_away(trim: str) -> None:
    model = ScriptedModel([])
    rule = ContextBudget(150, shares={"history": 1.0}) if trim == "budget" else Compaction(max_input_tokens=150)
    agent = Agent(model, tools=[pay, balance], providers=[History(MemoryStore()), rule])
    session = await agent.session("s")
    model.enqueue(tool_call("pay", invoice="INV-7", amount=120))
    first = await agent.run(f"Pay INV-7. {WORDS}", session=session)
    assert first.stop_reason == "approval_required"
    model.enqueue("balance is fine")
    with pytest.raises(ApprovalError):  # the pending call is still there: decide it first
        await agent.run(f"Actually, what is my balance? {WORDS}", session=session)


async def test_a_resume_keeps_the_approved_call_and_its_answer() -> None:
    PAID.clear()
    model = ScriptedModel([])
    agent = Agent(model, tools=[pay, balance], providers=[
        History(MemoryStore()), ContextBudget(150, shares={"history": 1.0})])
    session = await agent.session("s")
    for i in range(3):
        model.enqueue(f"a{i} {WORDS}")
        await agent.run(f"q{i} {WORDS}", session=session)
    model.enqueue(tool_call("pay", invoice="INV-7", amount=120))
    [pending] = (await agent.run("Pay INV-7.", session=session)).pending_approvals
    model.enqueue("Paid.")
    result = await agent.run(None, session=session, approvals={pending.call_id: pending.approve()})
    assert result.stop_reason == "completed" and PAID == ["INV-7"]
    assert [m.role for m in model.requests[-1].messages] == ["user", "assistant", "tool"]  # the oldest went
    assert result.traces[0].compaction[0].strategy == "budget"


async def test_a_calibrated_counter_is_what_the_budget_counts_with() -> None:
    model = ScriptedModel([])
    agent = Agent(model, tools=[lookup_location_code], providers=[
        History(MemoryStore()), TextSearch(searcher([0.9, 0.8, 0.7, 0.6])),
        ContextBudget(900, shares={"history": 0.5, "search": 0.5})])
    await seeded(agent, 4)
    session = await agent.session("s")
    session.state["contextpipe.calibration"] = {"ratio": 1.6, "samples": 5}  # the model counts 60% more
    model.enqueue("done")
    result = await agent.run("the latest question", session=session)
    trace = result.traces[0]
    assert trace.total_tokens <= 900 and 900 - trace.total_tokens < 120
    assert sum(b.got for b in trace.budget) == sum(v for k, v in trace.tokens_by_source().items()
                                                   if k.startswith(("history:", "context:")))


class _Loaded(HistoryProvider):
    """A history that loads fixed messages (a system message first), for the pinning test."""

    def __init__(self, messages: list[Message]) -> None:
        super().__init__("loaded")
        self.messages = messages

    async def load(self, session: Session) -> list[Message]:
        return self.messages

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        pass


async def test_history_keeps_its_system_messages() -> None:
    system = Message.system("You are talking to a support agent for the Acme shop.")
    turns = [Message.user(f"q{i} {WORDS}") if i % 2 == 0 else Message.assistant(f"a{i} {WORDS}") for i in range(10)]
    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[_Loaded([system, *turns]), ContextBudget(200, shares={"history": 1.0})])
    await agent.run("the question", session=await agent.session("s"))
    sent = [m.id for m in model.requests[0].messages]
    assert sent[0] == system.id and turns[0].id not in sent and turns[-1].id in sent


async def test_what_cannot_be_trimmed_over_the_total_is_said_on_the_trace() -> None:
    model = ScriptedModel(["ok"])
    agent = Agent(model, instructions="Answer in French.", providers=[
        TextSearch(searcher([0.9])), ContextBudget(100, shares={"search": 1.0})])
    question = "please read this: " + "word " * 200
    result = await agent.run(question)
    request = model.requests[0]
    assert [m.text for m in request.messages] == [question]  # the search result went, the input stayed whole
    assert request.instructions == "Answer in French."
    [change] = [c for c in result.traces[0].changes if c.action == "over_budget"]
    assert "may not trim" in change.items[0]


async def test_over_budget_names_the_source_that_could_not_go_lower() -> None:
    system = Message.system("You are a support agent. " + "rule " * 200)  # history may not drop it
    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[_Loaded([system, Message.user("q"), Message.assistant("a")]),
                                    ContextBudget(150, shares={"history": 1.0})])
    result = await agent.run("the question", session=await agent.session("s"))
    [change] = [c for c in result.traces[0].changes if c.action == "over_budget"]
    assert "history could not go below" in change.items[0] and "may not trim" not in change.items[0]


class _Noted(RankedItems, ContextProvider):
    """A participant with instructions of its own and scored items (like SemanticMemory's ``both`` mode)."""

    budget_share = "search"

    def __init__(self, scores: Sequence[float]) -> None:
        super().__init__("noted")
        self.scores = scores

    async def before_run(self, ctx: RunContext) -> None:
        ctx.add_instructions("Use the notes tool when the notes below are not enough.")
        if self.scores:
            notes = [(f"note {i} {WORDS}", s) for i, s in enumerate(self.scores)]
            ctx.add_messages([ranked_message("Notes:\n", notes)])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.integers(0, 5), scores=st.lists(st.floats(0, 1), max_size=6), total=st.integers(60, 1_500),
       reserve=st.integers(0, 50), history=st.floats(0, 1), question=st.integers(1, 120), system=st.booleans(),
       notes=st.lists(st.floats(0, 1), max_size=4))
@example(turns=0, scores=[0.0, 0.0], total=191, reserve=0, history=0.0, question=1, system=True, notes=[])
async def test_the_request_fits_when_it_can_and_never_loses_what_is_protected(
        turns: int, scores: list[float], total: int, reserve: int, history: float, question: int, system: bool,
        notes: list[float]) -> None:
    model, store = ScriptedModel([]), MemoryStore()
    agent = Agent(model, instructions="Be brief.", tools=[lookup_location_code], providers=[
        History(store), TextSearch(searcher(scores)), _Noted(notes),
        ContextBudget(total, reserve=reserve, shares={"history": history, "search": 1 - history})])
    if system:
        await store.append("default", "s", [Message.system("You answer for the Acme shop. " + "rule " * 20)])
    await seeded(agent, turns)
    model.enqueue("done")
    ask = "word " * question
    result = await agent.run(ask, session=await agent.session("s"))
    trace, request = result.traces[0], model.requests[-1]
    assert request.messages[-1].text == ask and (request.instructions or "").startswith("Be brief.")
    assert "Use the notes tool" in (request.instructions or "")
    assert [m.role for m in request.messages][:1] == ["system"] if system else True
    calls = {c.call_id for m in request.messages for c in m.function_calls}
    assert calls == {r.call_id for m in request.messages for r in m.function_results}
    least = sum(v for k, v in trace.tokens_by_source().items() if not k.startswith(("history:", "context:")))
    least += sum(m.tokens for m in trace.messages if m.role == "system")  # what the history may not drop
    if least <= total - reserve:
        assert trace.total_tokens <= total - reserve
        assert all(b.got <= b.asked for b in trace.budget)
    else:
        assert any(c.action == "over_budget" for c in trace.changes)
