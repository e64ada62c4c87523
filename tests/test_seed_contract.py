"""Four parts of the seeds' provider contract, written from the seeds' own examples (issue 31, items 1, 4, 5, 6).

1. Providers see the agent that is running (``ctx.agent`` in `before_run` and `after_run`).
4. The session state keys a provider uses through `ProviderState` are checked when the agent is
   built, with nothing to declare; ``user_id`` and ``user_name`` are the session's own.
5. A message with no source counts as external input, so a filter never drops it unseen.
6. A session run by an agent given no history provider still remembers the conversation.

Each runs through `Agent.run` on the in-memory store and on a SQLite file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import BaseModel

from contextpipe import (
    Agent,
    ContextProvider,
    HistoryPolicy,
    Message,
    ProviderState,
    RunContext,
    RunOutcome,
    UsageError,
    tool,
)
from contextpipe.providers import History, MessageFilter, external_input
from contextpipe.stores import MemoryStore, SessionStore
from contextpipe.testing import ScriptedModel
from stores.backends import open_store


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    opened = open_store(request.param, tmp_path)
    yield opened
    await opened.close()


def texts(messages: Sequence[Message]) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]


# --- 1. providers see the agent ------------------------------------------------------------------------


@tool
def get_weather_forecast(location_code: str) -> str:
    """Return the weather forecast for a location code."""
    return "Sunny"


@tool
def book_hotel(city: str) -> str:
    """Book a hotel in a city."""
    return "booked"


class AgentAwareProvider(ContextProvider):
    """One provider instance serving two agents, telling them apart by what `ctx.agent` says."""

    def __init__(self) -> None:
        super().__init__("agent-aware")
        self.before: list[tuple[str | None, str | None, list[str], str]] = []
        self.after: list[tuple[str | None, bool]] = []

    async def before_run(self, ctx: RunContext) -> None:
        agent = ctx.agent
        self.before.append((agent.name, agent.instructions, sorted(agent.tools), agent.model.name))
        ctx.add_instructions(f"You answer as the {agent.name} agent.")

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        self.after.append((outcome.agent.name, outcome.agent is ctx.agent))


async def test_providers_are_handed_the_running_agent_and_can_tell_two_agents_apart(store: SessionStore) -> None:
    """Seed 000: ``InvokingContext.Agent`` / ``InvokedContext.Agent`` ("当前调用的AIAgent实例", the agent
    being invoked);
    seed 001: ``on_invoking(agent, session, messages, options)`` and ``on_invoked(agent, session, ...)``;
    seed 004: "Semua metode virtual diteruskan sebagai referensi ke AIContextProvider dan AIAgent saat ini"."""
    shared = AgentAwareProvider()
    weather_model, travel_model = ScriptedModel(["Sunny."], name="weather-model"), ScriptedModel(
        ["Booked."], name="travel-model")
    weather = Agent(weather_model, name="weather", instructions="Forecasts only.", tools=[get_weather_forecast],
                    store=store, providers=[History(store), shared])
    travel = Agent(travel_model, name="travel", instructions="Bookings only.", tools=[book_hotel],
                   store=store, providers=[History(store), shared])

    await weather.run("Weather in Suzhou?", session=await weather.session("seed1-weather"))
    await travel.run("A hotel in Suzhou?", session=await travel.session("seed1-travel"))

    assert shared.before == [("weather", "Forecasts only.", ["get_weather_forecast"], "weather-model"),
                             ("travel", "Bookings only.", ["book_hotel"], "travel-model")]
    assert shared.after == [("weather", True), ("travel", True)]
    assert weather_model.requests[0].instructions == "Forecasts only.\n\nYou answer as the weather agent."
    assert travel_model.requests[0].instructions == "Bookings only.\n\nYou answer as the travel agent."


async def test_the_agent_a_provider_sees_is_the_agent_object_itself(store: SessionStore) -> None:
    """Seed 000, ``AIContextProvider.InvokingContext``: ``public AIAgent Agent { get; }`` is the agent being invoked."""
    seen: list[object] = []

    class Looker(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            seen.append(ctx.agent)

    agent = Agent(ScriptedModel(["ok", "ok"]), store=store, providers=[History(store), Looker("looker")])
    await agent.run("hi", session=await agent.session("seed1-same"))
    await agent.run("hi")  # a run without a session sees it too
    assert seen == [agent, agent]


# --- 4. state keys held through ProviderState are checked ----------------------------------------------


class MemoryState(BaseModel):
    memories_id: str | None = None


class SimpleServiceMemoryProvider(ContextProvider):
    """Seed 004's simple provider: its `ProviderSessionState` keyed by the class name, no key declared."""

    def __init__(self, source_id: str = "simple-memory", key: str = "SimpleServiceMemoryProvider") -> None:
        super().__init__(source_id)
        self.session_state = ProviderState(key, MemoryState)

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        if ctx.session is None or outcome.error is not None:
            return
        state = self.session_state.get(ctx.session)
        state.memories_id = state.memories_id or f"mem-{ctx.session.id}"


class CopiedMemoryProvider(SimpleServiceMemoryProvider):
    """A second provider whose author copied the first one's state key."""


async def test_a_provider_state_key_is_registered_without_declaring_it(store: SessionStore) -> None:
    """Seed 004, ``ProviderSessionState<T>``: "The key under which to store state in the session for this
    provider. Make sure it does not clash with the keys of other providers." The key of a `ProviderState`
    the provider holds is checked when the agent is built, with no ``state_keys`` to write."""
    with pytest.raises(UsageError, match="both use session state key 'SimpleServiceMemoryProvider'"):
        Agent(ScriptedModel(), store=store,
              providers=[SimpleServiceMemoryProvider(), CopiedMemoryProvider("copied-memory")])

    # One provider per key works, and its state is saved under that key with the session.
    agent = Agent(ScriptedModel(["ok", "ok"]), store=store,
                  providers=[History(store), SimpleServiceMemoryProvider(),
                             CopiedMemoryProvider("copied-memory", key="CopiedMemoryProvider")])
    session = await agent.session("seed4-keys")
    await agent.run("Remember my name is Alice.", session=session)
    stored = await store.get_session(session.tenant, session.id)
    assert stored is not None
    assert stored.state["SimpleServiceMemoryProvider"] == {"memories_id": "mem-seed4-keys"}
    assert stored.state["CopiedMemoryProvider"] == {"memories_id": "mem-seed4-keys"}


class ClassLevelState(ContextProvider):
    prefs = ProviderState("prefs", MemoryState)  # on the class: every instance shares it


def test_a_state_held_on_the_class_is_found_too() -> None:
    """Seed 004: "AIContextProvider tidak boleh menyimpan status spesifik sesi apa pun dalam instans
    penyedia": two instances of a class holding one `ProviderState` would share a session's state."""
    with pytest.raises(UsageError, match="session state key 'prefs'"):
        Agent(ScriptedModel(), providers=[ClassLevelState("one"), ClassLevelState("two")])


def test_a_built_in_providers_state_key_is_found_without_a_declaration() -> None:
    """Seed 004: keys must not clash. `FactMemory` keeps the turns waiting for extraction under
    ``facts.pending`` through a `ProviderState` it holds, and declares nothing: the agent still finds it."""
    from contextpipe.providers import FactMemory
    from contextpipe.vectors import HashEmbedder, MemoryVectorStore

    with pytest.raises(UsageError, match=r"both use session state key 'facts\.pending'"):
        Agent(ScriptedModel(), providers=[FactMemory(ScriptedModel(), MemoryVectorStore(), HashEmbedder()),
                                          SimpleServiceMemoryProvider(key="facts.pending")])


@pytest.mark.parametrize("key", ["user_id", "user_name"])
def test_the_session_keys_user_id_and_user_name_are_reserved(key: str) -> None:
    """Seed 004, ``ProviderSessionState``: a key must not clash; ``user_id`` and ``user_name`` belong to
    the session (`set_user_id`; `SemanticMemory` and `FactMemory` read them), so no provider may use them."""
    with pytest.raises(UsageError, match=f"session state key '{key}', which is reserved"):
        Agent(ScriptedModel(), providers=[SimpleServiceMemoryProvider(key=key)])


def test_two_states_of_one_provider_with_one_key_and_different_models_are_refused() -> None:
    """Seed 004: one key, one state type; the same key with two models would overwrite each other."""

    class Other(BaseModel):
        count: int = 0

    class Confused(ContextProvider):
        def __init__(self) -> None:
            super().__init__("confused")
            self.a = ProviderState("confused", MemoryState)
            self.b = ProviderState("confused", Other)

    with pytest.raises(UsageError, match="two ProviderState objects with key 'confused'"):
        Agent(ScriptedModel(), providers=[Confused()])


# --- 5. an untagged message counts as external input ---------------------------------------------------


def test_external_input_keeps_a_message_with_no_source() -> None:
    """Seed 000: ``GetAgentRequestMessageSourceType``, when no valid source is found on a message,
    "则默认返回External" (returns External by default)."""
    by_hand = Message.user("built by hand")
    assert external_input([by_hand]) == [by_hand]


class UserPreferenceProvider(ContextProvider):
    """Seed 004's Python ``UserPreferenceProvider``: learns the favourite food from the input messages."""

    def __init__(self, store_request_filter: MessageFilter | None = None) -> None:
        super().__init__("user-preferences", store_request_filter=store_request_filter)
        self.prefs = ProviderState("user-preferences", _Food)

    async def before_run(self, ctx: RunContext) -> None:
        if favorite := self.prefs.get(ctx.session).favorite_food:
            ctx.add_instructions(f"User's favorite food is {favorite}.")

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        if ctx.session is None:
            return
        for message in self.messages_to_learn(outcome):
            if message.role == "user" and "favorite food is" in message.text.lower():
                food = message.text.lower().split("favorite food is", 1)[1].strip().rstrip(".")
                self.prefs.set(ctx.session, _Food(favorite_food=food))


class _Food(BaseModel):
    favorite_food: str | None = None


def british_to_american(messages: Sequence[Message]) -> list[Message]:
    """A store-request filter that rewrites the caller's spelling, building the new messages by hand."""
    rewritten = [Message.user(m.text.replace("favourite", "favorite"))
                 if m.source is not None and m.source.kind == "input" else m for m in messages]
    return external_input(rewritten)


async def test_a_message_a_filter_built_by_hand_is_learned_not_dropped(store: SessionStore) -> None:
    """Seed 000: an untagged message's source type "默认返回External"; seed 004's ``UserPreferenceProvider``
    learns from ``context.input_messages``. Its filter rewrote the input (a new, untagged message): the
    provider still learns from it."""
    prefs = UserPreferenceProvider(store_request_filter=british_to_american)
    model = ScriptedModel(["Noted.", "Noodles, then."])
    agent = Agent(model, store=store, providers=[History(store), prefs])
    session = await agent.session("seed5-untagged")
    await agent.run("My favourite food is noodles.", session=session)
    await agent.run("What should I eat?", session=session)
    assert model.requests[1].instructions == "User's favorite food is noodles."


async def test_the_trace_shows_a_message_middleware_built_by_hand_as_input(store: SessionStore) -> None:
    """Seed 000: an untagged message's source type "默认返回External"; the trace names it as the filters
    treat it (the caller's input), not as some provider's context."""
    from contextpipe.models import CallModel, ModelRequest, ModelResponse

    class Reminder(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            async def remind(request: ModelRequest, call_next: CallModel) -> ModelResponse:
                return await call_next(replace(request, messages=(*request.messages, Message.user("Be brief."))))

            ctx.add_middleware(remind)

    agent = Agent(ScriptedModel(["ok"]), store=store, providers=[Reminder("reminder")])
    result = await agent.run("hi", session=await agent.session("seed5-trace"))
    assert [(m.source_kind, m.source_id, m.preview) for m in result.traces[0].messages] == [
        ("input", None, "hi"), ("input", None, "Be brief.")]
    assert not any(key.startswith("context") for key in result.traces[0].tokens_by_source())


# --- 6. a session with no history provider still remembers ---------------------------------------------


async def test_an_agent_with_no_history_provider_remembers_the_session(store: SessionStore) -> None:
    """Seed 004: "RawAgent dapat menambahkan InMemoryHistoryProvider("memory") secara otomatis"; seed 000:
    InMemoryChatHistoryProvider "将对话数据存储在当前的进程内存中". An agent given no history provider keeps
    each session's conversation in its store, across runs and across `Session` objects of one session."""
    model = ScriptedModel(["Hello Alice.", "You are Alice."])
    agent = Agent(model, store=store)
    first = await agent.run("Remember my name is Alice.", session=await agent.session("seed6-remembers"))
    second = await agent.run("What is my name?", session=await agent.session("seed6-remembers"))

    assert texts(model.requests[1].messages) == [
        "user:Remember my name is Alice.", "assistant:Hello Alice.", "user:What is my name?"]
    assert [(m.source_kind, m.source_id) for m in second.traces[0].messages] == [
        ("history", "default-history"), ("history", "default-history"), ("input", None)]
    assert first.traces[0].history == second.traces[0].history == "default-history"
    assert "history: default-history" in second.traces[0].table()
    assert second.traces[0].to_dict()["history"] == "default-history"
    assert [p.source_id for p in agent.providers] == ["default-history"]
    assert len(await agent.history(await agent.session("seed6-remembers"))) == 4


async def test_an_agent_with_no_store_remembers_in_memory() -> None:
    """Seed 000: InMemoryChatHistoryProvider "将对话数据存储在当前的进程内存中" (keeps the conversation in
    the process's memory, no database needed)."""
    model = ScriptedModel(["Hi.", "Tea."])
    agent = Agent(model, providers=[])
    await agent.run("I like tea.", session=await agent.session("seed6-memory"))
    await agent.run("What do I like?", session=await agent.session("seed6-memory"))
    assert texts(model.requests[1].messages) == ["user:I like tea.", "assistant:Hi.", "user:What do I like?"]
    assert isinstance(agent.store, MemoryStore)


async def test_a_run_without_a_session_is_not_remembered_by_the_default_history(store: SessionStore) -> None:
    """Seed 000: the in-memory history belongs to a session ("for that session"); a run given no session
    has none, so the default history neither loads nor stores anything for it."""
    model = ScriptedModel(["Hello.", "I do not know."])
    agent = Agent(model, store=store)
    await agent.run("Remember my name is Alice.")
    result = await agent.run("What is my name?")
    assert texts(model.requests[1].messages) == ["user:What is my name?"]
    assert result.traces[0].history is None and "history: none" in result.traces[0].table()
    assert (await store.list_sessions("default")).sessions == []


async def test_default_history_false_keeps_nothing(store: SessionStore) -> None:
    """Seed 004: the automatic InMemoryHistoryProvider is added "dalam kasus tertentu"; an agent that must
    not remember says so with ``default_history=False``."""
    model = ScriptedModel(["Hello.", "I do not know."])
    agent = Agent(model, store=store, default_history=False)
    await agent.run("Remember my name is Alice.", session=await agent.session("seed6-off"))
    result = await agent.run("What is my name?", session=await agent.session("seed6-off"))
    assert texts(model.requests[1].messages) == ["user:What is my name?"]
    assert result.traces[0].history is None
    assert agent.providers == ()


async def test_a_configured_history_provider_replaces_the_default(store: SessionStore) -> None:
    """Seed 004: "hanya satu harus menggunakan load_messages=True": the agent adds its own history only when
    given none, so a configured one (even an audit log that loads nothing) is the only history."""
    audit_store = MemoryStore()
    audit = History(audit_store, source_id="audit",
                    policy=HistoryPolicy(load_messages=False, store_context_messages=True))
    agent = Agent(ScriptedModel(["a", "b"]), store=store, providers=[audit])
    await agent.run("one", session=await agent.session("seed6-audit"))
    result = await agent.run("two", session=await agent.session("seed6-audit"))
    assert [p.source_id for p in agent.providers] == ["audit"]
    assert result.traces[0].history is None
    assert len((await audit_store.load("default", "seed6-audit")).messages) == 4


async def test_the_default_history_runs_first_so_later_providers_see_it(store: SessionStore) -> None:
    """Seed 001: "提供器按注册顺序执行": the default history loads before the configured providers run."""
    seen: list[list[str]] = []

    class Counter(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            seen.append([m.source.kind for m in ctx.messages if m.source is not None])

    agent = Agent(ScriptedModel(["a", "b"]), store=store, providers=[Counter("counter")])
    session = await agent.session("seed6-order")
    await agent.run("one", session=session)
    await agent.run("two", session=session)
    assert seen == [["input"], ["history", "history", "input"]]


def test_the_default_history_is_named_in_a_source_id_clash() -> None:
    """A provider of the agent's that happens to use the default history's source_id gets a clear error."""
    with pytest.raises(UsageError, match="source_id 'default-history', the history the agent adds when given no "
                                         "history provider; give it another source_id, or pass default_history=False"):
        Agent(ScriptedModel(), providers=[ContextProvider("default-history")])
    Agent(ScriptedModel(), providers=[ContextProvider("default-history")], default_history=False)
