"""The seeds' three message filters, taken and applied by every built-in provider that reads or stores messages.

Seed 000 (AIContextProvider) gives every provider `provideInputMessageFilter`,
`storeInputRequestMessageFilter` and `storeInputResponseMessageFilter`; seed 004 ("Implementasi
tingkat lanjut AIContextProvider") says what the base does with them: the input filter chooses the
request messages a provider works from (default: what the caller passed), the store filters what it
stores (default: the caller's messages, and every response message). Each test runs through
`Agent.run` on the in-memory store and on SQLite.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from contextpipe import Agent, Message, UsageError, tool
from contextpipe.providers import (
    Compaction,
    FactMemory,
    History,
    McpTools,
    MessageFilter,
    SearchResult,
    SemanticMemory,
    Skills,
    TextSearch,
    external_input,
)
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from contextpipe.vectors import HashEmbedder, MemoryVectorStore, VectorStore


class QueryRecorder(HashEmbedder):
    """The test embedder, recording every search query it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    async def embed_query(self, text: str) -> list[float]:
        self.queries.append(text)
        [vector] = await self.embed([text])
        return vector


@pytest.fixture(params=["memory", "sqlite"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[SessionStore, VectorStore]]:
    """A session store and a vector store of one kind: in memory, or one SQLite file."""
    if request.param == "memory":
        yield MemoryStore(), MemoryVectorStore()
        return
    store = SQLiteStore(tmp_path / "filters.db")
    vectors = store.vectors()
    yield store, vectors
    await vectors.close()
    await store.close()


def containing(word: str) -> MessageFilter:
    """A filter keeping the caller's input that mentions `word` (built on the default, `external_input`)."""

    def keep(messages: Sequence[Message]) -> list[Message]:
        return [m for m in external_input(messages) if word in m.text.lower()]

    return keep


def not_containing(word: str) -> MessageFilter:
    """A filter leaving out the messages that mention `word`, whatever their source."""

    def keep(messages: Sequence[Message]) -> list[Message]:
        return [m for m in messages if word not in m.text.lower()]

    return keep


def input_and_history(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if m.source is not None and m.source.kind in ("input", "history")]


async def test_semantic_memory_searches_and_stores_what_its_filters_choose(
        backend: tuple[SessionStore, VectorStore]) -> None:
    """Seed 004, the advanced provider: "We only want to search for memories based on user input" (the
    input filter), and "store memories based on user input and agent output, and exclude messages ... to
    avoid feedback loops" (the store filters). Here the filters are replaced: the query is built only
    from the messages about pottery, and nothing mentioning the secret, asked or answered, is stored."""
    store, vectors = backend
    embedder = QueryRecorder()
    memory = SemanticMemory(vectors, embedder, collection="filters_memory",
                            input_filter=containing("pottery"), store_request_filter=not_containing("secret"),
                            store_response_filter=not_containing("secret"))
    model = ScriptedModel(["The secret word is heron.", "You made a blue bowl."])
    agent = Agent(model, providers=[History(store), memory])
    session = await agent.session("filters-memory-1")
    session.state["user_id"] = "filters-maya"
    await agent.run([Message.user("Keep this secret: heron."), Message.user("I made a blue bowl in pottery class.")],
                    session=session)
    stored = {h.text for h in await vectors.search("filters_memory", text="bowl heron secret pottery", k=10)}
    assert stored == {"I made a blue bowl in pottery class."}  # neither the secret nor its answer

    later = await agent.session("filters-memory-1b")  # another session of the same user
    later.state["user_id"] = "filters-maya"
    await agent.run([Message.user("What did I make in pottery?"), Message.user("And what is the weather?")],
                    session=later)
    assert embedder.queries[-1] == "What did I make in pottery?"  # the weather question is not searched with
    recalled = model.requests[-1].messages[0]
    assert recalled.source is not None and recalled.source.source_id == "memory"
    assert "I made a blue bowl in pottery class." in recalled.text and "heron" not in recalled.text


async def test_semantic_memory_keeps_what_its_store_filters_left_out_out_of_later_runs_too(
        backend: tuple[SessionStore, VectorStore]) -> None:
    """Seed 004: the store filters "exclude messages" from what is stored. A message they left out comes
    back as loaded history in the session's next run, where the turns just before the new ones are
    indexed again for the context windows: it must not be stored then either, nor shown as a neighbour."""
    store, vectors = backend
    memory = SemanticMemory(vectors, HashEmbedder(), collection="filters_later", names_lookup=False,
                            store_request_filter=not_containing("secret"),
                            store_response_filter=not_containing("secret"))
    agent = Agent(ScriptedModel(["The secret word is heron.", "Nice bowl."]), providers=[History(store), memory])
    session = await agent.session("filters-memory-later")
    await agent.run([Message.user("Keep this secret: heron."), Message.user("I made a bowl.")], session=session)
    await agent.run("Thanks", session=session)
    hits = await vectors.search("filters_later", text="secret heron bowl thanks", k=10)
    assert {h.text for h in hits} == {"I made a bowl.", "Nice bowl.", "Thanks"}
    assert not any("heron" in str(h.metadata.get(side)) for h in hits for side in ("before", "after"))


async def test_semantic_memory_input_filter_can_widen_the_query_to_loaded_history(
        backend: tuple[SessionStore, VectorStore]) -> None:
    """Seed 004: the default input filter keeps "only the messages passed to the agent by the caller",
    and "this filter can be replaced through the provideInputMessageFilter parameter"."""
    store, vectors = backend
    embedder = QueryRecorder()
    memory = SemanticMemory(vectors, embedder, collection="filters_wide", names_lookup=False,
                            input_filter=input_and_history)
    agent = Agent(ScriptedModel(["Noted.", "Yes."]), providers=[History(store), memory])
    session = await agent.session("filters-memory-2")
    await agent.run("my kiln is electric", session=session)
    await agent.run("does it matter?", session=session)
    assert embedder.queries[-1] == "my kiln is electric\nNoted.\ndoes it matter?"


async def test_fact_memory_looks_up_and_extracts_from_what_its_filters_choose(
        backend: tuple[SessionStore, VectorStore]) -> None:
    """Seed 000, Mem0Provider (a MessageAIContextProvider with the three filters) and seed 004's
    `LoadMemories(..., filteredInputMessages)` / `StoreMemoriesAsync(filteredRequestMessages.Concat(
    ResponseMessages))`: the facts are looked up with the filtered input, and extracted only from the
    request and response messages the store filters keep (here: no aside, and not the assistant's words)."""
    store, vectors = backend
    embedder = QueryRecorder()
    extractor = ScriptedModel(['{"add": ["The user is vegetarian."], "update": [], "delete": []}'])
    facts = FactMemory(extractor, vectors, embedder, collection="filters_facts", input_filter=containing("food"),
                       store_request_filter=not_containing("aside"),
                       store_response_filter=lambda ms: [m for m in ms if m.role != "assistant"])
    agent = Agent(ScriptedModel(["Noted, no meat."]), providers=[History(store), facts])
    session = await agent.session("filters-facts-1")
    session.state["user_id"] = "filters-alice"
    await agent.run([Message.user("As an aside, it is raining."), Message.user("I eat vegetarian food only.")],
                    session=session)
    assert embedder.queries[0] == "I eat vegetarian food only."  # the look-up before the run
    turns = extractor.requests[0].messages[0].text.split("New turns:\n", 1)[1]
    assert turns == "user: I eat vegetarian food only."


async def test_fact_memory_extracts_from_every_assistant_message_with_text_unless_filtered(
        backend: tuple[SessionStore, VectorStore]) -> None:
    """Seed 004's `StoreMemoriesAsync(filteredRequestMessages.Concat(context.ResponseMessages))`: by default
    every response message is learned from, so what the model wrote next to a tool call goes to extraction
    along with its final answer (tool results do not: they have no user or assistant text); a
    `store_response_filter` keeping the last assistant message extracts from the final answer only."""
    store, vectors = backend

    @tool
    def diet_of(user: str) -> str:
        """Return the diet a user chose."""
        return "vegetarian"

    def final_answer(messages: Sequence[Message]) -> list[Message]:
        return [m for m in messages if m.role == "assistant" and m.text][-1:]

    for name, response_filter in (("every", None), ("final", final_answer)):
        extractor = ScriptedModel(['{"add": [], "update": [], "delete": []}'])
        facts = FactMemory(extractor, vectors, HashEmbedder(), collection=f"filters_turns_{name}",
                           store_response_filter=response_filter)
        model = ScriptedModel([Turn("Let me check.") + tool_call("diet_of", user="me"), "You are vegetarian."])
        agent = Agent(model, tools=[diet_of], providers=[History(store), facts])
        session = await agent.session(f"filters-facts-turns-{name}")
        session.state["user_id"] = "filters-bo"
        await agent.run("What is my diet?", session=session)
        turns = extractor.requests[0].messages[0].text.split("New turns:\n", 1)[1]
        said = "assistant: Let me check.\n" if response_filter is None else ""
        assert turns == f"user: What is my diet?\n{said}assistant: You are vegetarian."


async def test_text_search_queries_with_what_its_input_filter_chooses(
        backend: tuple[SessionStore, VectorStore]) -> None:
    """Seed 000, TextSearchProvider ("wraps an async search function ... the standard retrieve-and-inject
    flow of RAG"), a MessageAIContextProvider: its query is built from the messages its input filter
    keeps, by default the caller's input only; here only the input about refunds."""
    store, _ = backend
    queries: list[str] = []

    async def search(query: str) -> list[SearchResult]:
        queries.append(query)
        return [SearchResult("Refunds within 30 days.", "policy.md")]

    agent = Agent(ScriptedModel(["Within 30 days [1].", "Yes [1]."]),
                  providers=[History(store), TextSearch(search, input_filter=containing("refund"))])
    session = await agent.session("filters-search-1")
    await agent.run([Message.user("Hello there."), Message.user("How long do refunds take?")], session=session)
    assert queries == ["How long do refunds take?"]
    wide = TextSearch(search, source_id="wide", input_filter=input_and_history)
    agent = Agent(ScriptedModel(["Yes [1]."]), providers=[History(store), wide])
    await agent.run("Really?", session=await agent.session("filters-search-1"))
    assert queries[-1] == "Hello there.\nHow long do refunds take?\nWithin 30 days [1].\nReally?"


def test_text_search_in_tool_mode_refuses_an_input_filter() -> None:
    """In tool mode the model writes the query, so an input filter would be accepted and ignored: refused."""
    async def search(query: str) -> list[SearchResult]:
        return []

    with pytest.raises(UsageError, match="model writes the query"):
        TextSearch(search, mode="tool", input_filter=external_input)


@pytest.mark.parametrize("provider", [Skills, McpTools, Compaction])
def test_providers_that_read_and_store_no_message_refuse_the_filters_and_say_why(provider: type) -> None:
    """Seed 000 lists AgentSkillsProvider and CompactionProvider as plain AIContextProviders, not
    message providers: skills and MCP tools read no request message and store none, and compaction must
    see the whole request. They take no filter (rather than one they would ignore), and say so."""
    doc = inspect.getdoc(provider) or ""
    assert "takes none of the seeds' message filters" in doc
    for name in ("input_filter", "store_request_filter", "store_response_filter"):
        assert name not in inspect.signature(provider).parameters
