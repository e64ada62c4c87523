"""The three semantics the seeds (000 and 004) give context providers, written from their examples.

1. What providers and the model see carries the source of *this* run's view: loaded history is
   ``history``, provider messages are ``context``, this run's input is ``input``.
2. Context providers have three message filters: what they are given (default: external input
   only), what request messages they store / learn from, and what response messages.
3. A provider can replace or remove instructions and tools added before it; the trace keeps who did what.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import BaseModel

from contextpipe import Agent, ContextProvider, Message, ProviderState, RunContext, RunOutcome, UsageError, tool
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, tool_call


class MemoryService:
    """The seeds' ``ServiceClient``: a memory container that stores messages and searches them."""

    def __init__(self) -> None:
        self.containers: dict[str, list[str]] = {}

    def create(self) -> str:
        key = f"mem-{len(self.containers) + 1}"
        self.containers[key] = []
        return key

    def load(self, key: str, query: str) -> list[str]:
        words = set(query.lower().split())
        return [m for m in self.containers[key] if words & set(m.lower().split())]

    def store(self, key: str, texts: Sequence[str]) -> None:
        self.containers[key].extend(texts)


class MemoryState(BaseModel):
    memories_id: str | None = None


class AdvancedServiceMemoryProvider(ContextProvider):
    """Seed 004's advanced provider, filtering by source the way the seed does (not via the defaults)."""

    def __init__(self, client: MemoryService) -> None:
        super().__init__("service-memory")
        self.client = client
        self.state = ProviderState("service-memory", MemoryState)
        self.seen_sources: list[list[str]] = []

    @property
    def state_keys(self) -> tuple[str, ...]:
        return (self.state.key,)

    async def before_run(self, ctx: RunContext) -> None:
        self.seen_sources.append([m.source.kind if m.source else "none" for m in ctx.messages])
        state = self.state.get(ctx.session)
        if state.memories_id is None:
            return
        # "We only want to search for memories based on user input, and exclude chat history or
        # other AI context provider messages."
        external = [m for m in ctx.messages if m.source is not None and m.source.kind == "input"]
        memories = self.client.load(state.memories_id, "\n".join(m.text for m in external))
        if memories:
            ctx.add_messages([Message.user("Here are some memories to help answer the user question: "
                                           + "\n".join(memories))])

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        if outcome.error is not None:
            return
        state = self.state.get(ctx.session)
        state.memories_id = state.memories_id or self.client.create()
        # "... exclude messages from chat history or other AI context providers to avoid feedback loops."
        request = [m for m in outcome.request_messages if m.source is not None and m.source.kind == "input"]
        self.client.store(state.memories_id, [m.text for m in [*request, *(outcome.response_messages or [])]])


async def test_loaded_history_is_tagged_history_so_a_seed_memory_provider_never_relearns_old_turns() -> None:
    client = MemoryService()
    memory = AdvancedServiceMemoryProvider(client)
    model = ScriptedModel(["Noted: you like tea.", "Tea, then.", "Green tea is tea."])
    agent = Agent(model, providers=[History(MemoryStore()), memory])
    session = await agent.session("alice")
    for text in ["I like tea", "What do I like to drink?", "Is green tea tea?"]:
        await agent.run(text, session=session)

    # Each turn was learned exactly once: three inputs and three answers, no old turn again.
    (stored,) = client.containers.values()
    assert stored == ["I like tea", "Noted: you like tea.", "What do I like to drink?", "Tea, then.",
                      "Is green tea tea?", "Green tea is tea."]
    # What the provider saw on the third run: four history messages, then this run's input.
    assert memory.seen_sources[2] == ["history"] * 4 + ["input"]
    # The model request carries the same view, plus the memory provider's own context message.
    last = model.requests[2].messages
    assert [m.source.kind for m in last if m.source] == ["history"] * 4 + ["context", "input"]
    assert last[4].source is not None and last[4].source.source_id == "service-memory"


async def test_history_is_not_copied_until_someone_reads_it() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["a", "b"]), providers=[History(store)])
    session = await agent.session("s")
    await agent.run("one", session=session)
    seen: list[int] = []

    class Counter(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            seen.append(len(ctx.messages))  # O(1): a view over the segments
            assert all(s._tagged is None for s in ctx.segments if s.source.kind == "history")

    agent = Agent(ScriptedModel(["c"]), providers=[History(store), Counter("counter")])
    await agent.run("two", session=session)
    assert seen == [3]


async def test_stored_messages_keep_their_original_source() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["first answer", "second answer"]), providers=[History(store)])
    session = await agent.session("s")
    await agent.run("hello", session=session)
    await agent.run("again", session=session)
    kinds = [m.source.kind for m in await agent.history(session) if m.source]
    assert kinds == ["input", "model", "input", "model"]  # tagging a run's view never rewrites the log


class DefaultFilters(ContextProvider):
    """A provider relying on the seeds' default filters through the base class helpers."""

    def __init__(self, source_id: str = "learner", **filters: object) -> None:
        super().__init__(source_id, **filters)  # type: ignore[arg-type]
        self.given: list[list[str]] = []
        self.learned: list[list[str]] = []

    async def before_run(self, ctx: RunContext) -> None:
        self.given.append([m.text for m in self.given_messages(ctx)])
        ctx.add_messages([Message.user(f"note from {self.source_id}")])

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        self.learned.append([m.text for m in self.messages_to_learn(outcome)])


async def test_provider_filters_default_to_external_input_and_all_responses() -> None:
    agent_store = MemoryStore()
    learner = DefaultFilters()
    agent = Agent(ScriptedModel(["first", "second"]), providers=[History(agent_store), DefaultFilters("other"),
                                                                 learner])
    session = await agent.session("s")
    await agent.run("hello", session=session)
    await agent.run("more", session=session)
    # Given only this run's input: not the history, not the other provider's note.
    assert learner.given == [["hello"], ["more"]]
    # Learns from this run's input and every response message.
    assert learner.learned == [["hello", "first"], ["more", "second"]]


async def test_provider_filters_can_be_replaced() -> None:
    learner = DefaultFilters(
        input_filter=lambda ms: [m for m in ms if m.source is not None and m.source.kind in ("history", "input")],
        store_request_filter=lambda ms: [],
        store_response_filter=lambda ms: [m for m in ms if m.role == "assistant"],
    )

    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    store = MemoryStore()
    agent = Agent(ScriptedModel(["first", tool_call("ping"), "done"]), tools=[ping],
                  providers=[History(store), learner])
    session = await agent.session("s")
    await agent.run("hello", session=session)
    await agent.run("more", session=session)
    assert learner.given == [["hello"], ["hello", "first", "more"]]
    assert learner.learned[0] == ["first"]
    assert learner.learned[1][-1] == "done" and len(learner.learned[1]) == 2  # the call and the answer, no result


async def test_a_failed_run_gives_nothing_to_learn() -> None:
    learner = DefaultFilters()
    agent = Agent(ScriptedModel([]), providers=[learner])
    with pytest.raises(Exception, match="script"):
        await agent.run("hello")
    assert learner.learned == [[]]


class Replacer(ContextProvider):
    async def before_run(self, ctx: RunContext) -> None:
        ctx.replace_instructions("Only answer in French.")
        ctx.remove_tools(["shout"])


async def test_a_provider_replaces_instructions_and_removes_tools_and_the_trace_says_so() -> None:
    @tool
    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    @tool
    def whisper(text: str) -> str:
        """Whisper."""
        return text.lower()

    class Adder(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.add_instructions("Be brief.")

    model = ScriptedModel(["Bonjour."])
    agent = Agent(model, instructions="You are helpful.", tools=[shout, whisper],
                  providers=[Adder("adder"), Replacer("french")])
    result = await agent.run("hi")
    request: ModelRequest = model.requests[0]
    assert request.instructions == "Only answer in French."
    assert [t.name for t in request.tools] == ["whisper"]
    trace = result.traces[0]
    assert [(i.source_id, i.text) for i in trace.instructions] == [("french", "Only answer in French.")]
    assert [(c.source_id, c.action, c.items) for c in trace.changes] == [
        ("french", "replaced_instructions", ("agent", "adder")),
        ("french", "removed_tools", ("shout (agent)",)),
    ]
    assert "french replaced instructions: agent, adder" in trace.table()


async def test_replacing_tools_and_removing_an_unknown_one() -> None:
    @tool
    def old() -> str:
        """Old tool."""
        return "old"

    @tool
    def new() -> str:
        """New tool."""
        return "new"

    class Swap(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.replace_tools([new])

    model = ScriptedModel(["ok"])
    result = await Agent(model, tools=[old], providers=[Swap("swap")]).run("hi")
    assert [t.name for t in model.requests[0].tools] == ["new"]
    assert [(t.name, t.source_id) for t in result.traces[0].tools] == [("new", "swap")]

    class Bad(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.remove_tools(["nope"])

    with pytest.raises(UsageError, match="removes tools \\['nope'\\]"):
        await Agent(ScriptedModel(["x"]), tools=[old], providers=[Bad("bad")]).run("hi")
