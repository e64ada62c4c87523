"""`MessageProvider`, written from seed 000's MessageAIContextProvider (§2.1).

"MessageAIContextProvider derives from AIContextProvider and is meant to provide request messages only
(ignoring system instructions and tools): its mission is to insert extra context messages (RAG results,
a user profile) into the conversation dynamically. It defines its own InvokingContext, keeping only the
request messages (without the AIContext's Instructions and Tools)" — Agent, Session, RequestMessages —
and "a virtual ProvideMessagesAsync ... that returns the messages provided", with a public InvokingAsync
so it can be called on its own. Each test runs through `Agent.run` on the in-memory store and on SQLite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from contextpipe import Agent, ContextProvider, Message, RunContext, tool
from contextpipe.messages import Source
from contextpipe.models import CallModel, ModelRequest, ModelResponse
from contextpipe.providers import History, MessageContext, MessageProvider
from contextpipe.session import Session
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    sqlite = SQLiteStore(tmp_path / "message-provider.db")
    yield sqlite
    await sqlite.close()


class UserProfile(MessageProvider):
    """The seed's example of extra context: a user profile, built from what the user said before."""

    def __init__(self, source_id: str = "profile", **filters: object) -> None:
        super().__init__(source_id, **filters)  # type: ignore[arg-type]
        self.given: list[MessageContext] = []
        self.stored: list[tuple[list[str], list[str]]] = []
        self.facts: dict[str, list[str]] = {}
        self.run_contexts: list[RunContext] = []

    async def provide_messages(self, ctx: MessageContext) -> Sequence[Message]:
        self.given.append(ctx)
        known = self.facts.get(ctx.session.id if ctx.session else "", [])
        return [Message.user("User profile: " + "; ".join(known))] if known else []

    async def store_messages(self, ctx: MessageContext, response_messages: Sequence[Message]) -> None:
        self.stored.append(([m.text for m in ctx.request_messages], [m.text for m in response_messages]))
        if ctx.session is not None:
            self.facts.setdefault(ctx.session.id, []).extend(m.text for m in ctx.request_messages)

    async def before_run(self, ctx: RunContext) -> None:
        self.run_contexts.append(ctx)
        await super().before_run(ctx)


async def test_a_message_provider_is_given_only_the_input_and_its_messages_are_tagged_context(
        store: SessionStore) -> None:
    """Seed 000 §2.1: its InvokingContext holds Agent, Session and RequestMessages only; what
    ProvideMessagesAsync returns is merged into the request, marked as coming from this provider (seed
    004: "marks all messages returned ... with source information"); stored only after a successful run
    (seed 000: InvokedCoreAsync "returns directly if an exception occurred")."""
    profile = UserProfile()
    model = ScriptedModel(["Hello.", "Suzhou it is."])
    agent = Agent(model, instructions="Be brief.", providers=[History(store), profile])
    session = await agent.session("message-provider-1")
    await agent.run("I live in Suzhou.", session=session)
    await agent.run("Where should I eat?", session=session)

    second = profile.given[1]
    assert [m.text for m in second.request_messages] == ["Where should I eat?"]  # no history, no instructions
    assert second.session is session
    assert second.agent is getattr(profile.run_contexts[1], "agent", None)
    sent = model.requests[1].messages
    assert [m.text for m in sent] == ["I live in Suzhou.", "Hello.", "User profile: I live in Suzhou.",
                                      "Where should I eat?"]
    assert sent[2].source == Source("context", "profile")
    # The store filters' defaults: the caller's input (not the loaded history, not the profile) and the response.
    assert profile.stored == [(["I live in Suzhou."], ["Hello."]), (["Where should I eat?"], ["Suzhou it is."])]
    assert [m.text for m in await agent.history(session)] == [
        "I live in Suzhou.", "Hello.", "Where should I eat?", "Suzhou it is."]  # the profile is context, not history

    model.enqueue(RuntimeError("model down"))
    with pytest.raises(RuntimeError):
        await agent.run("Any other tips?", session=session)
    assert len(profile.stored) == 2  # nothing learned from a failed run


async def test_a_message_provider_applies_the_filters_it_is_given(store: SessionStore) -> None:
    """Seed 000: AIContextProvider's constructor takes provideInputMessageFilter,
    storeInputRequestMessageFilter and storeInputResponseMessageFilter; a MessageAIContextProvider
    is one, so what it is given and what it stores follow them."""

    def input_and_history(messages: Sequence[Message]) -> list[Message]:
        return [m for m in messages if m.source is not None and m.source.kind in ("input", "history")]

    profile = UserProfile(input_filter=input_and_history, store_request_filter=lambda ms: [],
                          store_response_filter=lambda ms: [m for m in ms if "secret" not in m.text])
    agent = Agent(ScriptedModel(["The secret is out.", "Fine."]), providers=[History(store), profile])
    session = await agent.session("message-provider-2")
    await agent.run("Hi", session=session)
    await agent.run("How are you?", session=session)
    assert [m.text for m in profile.given[1].request_messages] == ["Hi", "The secret is out.", "How are you?"]
    assert profile.stored == [([], []), ([], ["Fine."])]


async def test_a_message_provider_on_its_own_from_model_middleware_per_model_call(store: SessionStore) -> None:
    """Seed 000 §2.1: MessageAIContextProvider has a public InvokingAsync, so it works outside the
    agent's provider chain: here model middleware asks it before every model call of a tool loop, and its
    input filter lets it see the tool results as they arrive."""

    @tool
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        return {"Suzhou": "SZ"}[city]

    class CityNotes(MessageProvider):
        async def provide_messages(self, ctx: MessageContext) -> Sequence[Message]:
            codes = [m.function_results[0].result for m in ctx.request_messages if m.function_results]
            return [Message.user(f"Notes for {code}: bring an umbrella.") for code in codes]

    notes = CityNotes("city-notes", input_filter=lambda ms: [m for m in ms if m.source and m.source.kind == "tool"])

    class PerCall(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            async def middleware(request: ModelRequest, call_next: CallModel) -> ModelResponse:
                extra = await notes.messages_for(request.messages, session=ctx.session)
                return await call_next(replace(request, messages=(*request.messages, *extra)))

            ctx.add_middleware(middleware)

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "Take an umbrella."])
    agent = Agent(model, tools=[lookup_location_code], providers=[History(store), PerCall("per-call")])
    session = await agent.session("message-provider-3")
    await agent.run("What should I pack for Suzhou?", session=session)
    assert "Notes for" not in "".join(m.text for m in model.requests[0].messages)
    added = model.requests[1].messages[-1]
    assert added.text == "Notes for SZ: bring an umbrella." and added.source == Source("context", "city-notes")
    assert "Notes for" not in "".join(m.text for m in await agent.history(session))


async def test_messages_for_counts_untagged_messages_as_the_callers_input() -> None:
    """Seed 000: GetAgentRequestMessageSourceType "returns External by default" for a message without a
    source, so a message built by hand and passed to `messages_for` is the caller's input."""
    profile = UserProfile()
    profile.facts["s"] = ["vegetarian"]
    added = await profile.messages_for([Message.user("What should I eat?")], session=Session("s"), agent="an agent")
    assert [m.text for m in added] == ["User profile: vegetarian"]
    assert added[0].source == Source("context", "profile")
    [given] = profile.given
    assert [m.text for m in given.request_messages] == ["What should I eat?"] and given.agent == "an agent"
