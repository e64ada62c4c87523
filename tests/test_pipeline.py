"""The semantics of DESIGN.md: provider order, merging, replace_messages, after_run, filters, state."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import BaseModel

from contextpipe import (
    AfterRunError,
    Agent,
    ContextProvider,
    HistoryPolicy,
    HistoryProvider,
    Message,
    ModelServerError,
    ProviderState,
    RunContext,
    RunOutcome,
    Source,
    UsageError,
    tool,
)
from contextpipe.models import CallModel, ModelRequest, ModelResponse
from contextpipe.providers import History
from contextpipe.session import Session
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel
from helpers import RecordingHistory, describe


class Recorder(ContextProvider):
    """Adds an instruction and a message, and records what it saw."""

    def __init__(self, source_id: str, log: list[str], *, fail_after: bool = False, message: bool = True) -> None:
        super().__init__(source_id)
        self.log = log
        self.fail_after = fail_after
        self.message = message
        self.seen_before: list[str] = []
        self.outcome: RunOutcome | None = None

    async def before_run(self, ctx: RunContext) -> None:
        self.log.append(f"before:{self.source_id}")
        self.seen_before = [m.text for m in ctx.messages]
        ctx.add_instructions(f"Instruction from {self.source_id}.")
        if self.message:
            ctx.add_messages([Message.user(f"Context from {self.source_id}.")])

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        self.log.append(f"after:{self.source_id}")
        self.outcome = outcome
        if self.fail_after:
            raise RuntimeError(f"{self.source_id} cannot save")


async def test_providers_run_in_order_and_after_run_in_reverse() -> None:
    log: list[str] = []
    a, b, c = Recorder("a", log), Recorder("b", log), Recorder("c", log)
    model = ScriptedModel(["ok"])
    agent = Agent(model, instructions="Agent rules.", providers=[a, b, c])
    await agent.run("hi")
    assert log == ["before:a", "before:b", "before:c", "after:c", "after:b", "after:a"]
    # Each provider sees what earlier ones added, with the caller's input last.
    assert a.seen_before == ["hi"]
    assert b.seen_before == ["Context from a.", "hi"]
    assert c.seen_before == ["Context from a.", "Context from b.", "hi"]


async def test_instructions_messages_and_tools_merge_in_order() -> None:
    @tool
    def agent_tool() -> str:
        """Agent's."""
        return "x"

    @tool
    def provider_tool() -> str:
        """Provider's."""
        return "y"

    class AddsTool(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.add_tools([provider_tool])

    log: list[str] = []
    model = ScriptedModel(["ok"])
    agent = Agent(model, instructions="Agent rules.", tools=[agent_tool],
                  providers=[Recorder("a", log), AddsTool("tools"), Recorder("b", log)])
    await agent.run("question")
    request = model.requests[0]
    assert request.instructions == "Agent rules.\n\nInstruction from a.\n\nInstruction from b."
    assert [m.text for m in request.messages] == ["Context from a.", "Context from b.", "question"]
    assert [m.source for m in request.messages] == [Source("context", "a"), Source("context", "b"), Source("input")]
    assert [t.name for t in request.tools] == ["agent_tool", "provider_tool"]


async def test_replace_own_instructions_replaces_in_place_or_adds_and_attributes_back() -> None:
    class Replaces(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            if self.source_id == "b":
                ctx.add_instructions("old b")
            with ctx.contributing("x"):  # another's block inside this one's: this one's again after it
                ctx.replace_own_instructions(["from x"])
            ctx.replace_own_instructions([f"new {self.source_id}"])

    model = ScriptedModel(["ok"])
    await Agent(model, instructions="Agent rules.", providers=[Replaces("a"), Replaces("b")]).run("q")
    assert model.requests[0].instructions == "Agent rules.\n\nfrom x\n\nnew a\n\nnew b"


async def test_tool_name_clash_is_an_error_not_an_override() -> None:
    @tool(name="lookup")
    def first() -> str:
        """One."""
        return "1"

    @tool(name="lookup")
    def second() -> str:
        """Two."""
        return "2"

    class Clash(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.add_tools([second])

    agent = Agent(ScriptedModel(["ok"]), tools=[first], providers=[Clash("clash")])
    with pytest.raises(UsageError, match="'clash' adds tool 'lookup', but 'agent' already provides"):
        await agent.run("hi")


async def test_tagging_never_mutates_the_callers_messages() -> None:
    mine = Message.user("hello")
    provided = Message.user("from provider")

    class Adds(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.add_messages([provided])

    model = ScriptedModel(["ok"])
    await Agent(model, providers=[Adds("adds")]).run([mine])
    assert mine.source is None and provided.source is None
    sent = model.requests[0].messages
    assert sent[0].source == Source("context", "adds") and sent[1].source == Source("input")
    assert sent[1].id == mine.id


async def test_replace_messages_drops_what_came_before_and_keeps_the_input() -> None:
    store = MemoryStore()
    session_model = ScriptedModel(["first answer"])
    seed_agent = Agent(session_model, providers=[History(store)])
    session = await seed_agent.session("s")
    await seed_agent.run("first question", session=session)

    class Compress(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            kept = ctx.segments[-1].messages[-1:]  # keep only the last context message
            ctx.replace_messages([Message.system("Summary: earlier talk."), *kept])

    log: list[str] = []
    model = ScriptedModel(["ok"])
    agent = Agent(model, providers=[History(store), Recorder("memory", log), Compress("compress"),
                                    Recorder("late", log)])
    session = await agent.session("s")
    await agent.run("second question", session=session)
    sent = model.requests[0]
    assert [m.text for m in sent.messages] == [
        "Summary: earlier talk.", "Context from memory.", "Context from late.", "second question"]
    assert [m.source for m in sent.messages] == [
        Source("context", "compress"), Source("context", "memory"), Source("context", "late"), Source("input")]
    # Instructions are not affected by replace_messages.
    assert sent.instructions == "Instruction from memory.\n\nInstruction from late."


async def test_replace_messages_keeps_the_source_of_history_it_keeps() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["a1"]), providers=[History(store)])
    session = await agent.session("s")
    await agent.run("q1", session=session)

    class KeepLastTwo(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.replace_messages(ctx.messages[-3:-1])

    model = ScriptedModel(["a2"])
    await Agent(model, providers=[History(store), KeepLastTwo("window")]).run("q2", session=session)
    # The kept history messages still count as history: they are not stored a second time.
    assert describe(await agent.history(session)) == ["user:q1", "assistant:a1", "user:q2", "assistant:a2"]
    assert [m.text for m in model.requests[0].messages] == ["q1", "a1", "q2"]


async def test_after_run_gets_the_error_and_every_provider_is_called() -> None:
    log: list[str] = []
    a, b = Recorder("a", log), Recorder("b", log, fail_after=True)
    model = ScriptedModel([ModelServerError("down", status_code=503)])
    agent = Agent(model, providers=[a, b])
    with pytest.raises(ModelServerError) as info:
        await agent.run("hi")
    assert log == ["before:a", "before:b", "after:b", "after:a"]
    assert a.outcome is not None and a.outcome.response_messages is None
    assert isinstance(a.outcome.error, ModelServerError)
    assert [m.text for m in a.outcome.request_messages] == ["Context from a.", "Context from b.", "hi"]
    # The after_run failure does not hide the run's own error; it is attached to it.
    assert any("'b'" in note and "cannot save" in note for note in info.value.__notes__)


async def test_after_run_failures_are_reported_after_all_ran_and_keep_the_result() -> None:
    log: list[str] = []
    a, b, c = Recorder("a", log, fail_after=True), Recorder("b", log), Recorder("c", log, fail_after=True)
    agent = Agent(ScriptedModel(["answer"]), providers=[a, b, c])
    with pytest.raises(AfterRunError) as info:
        await agent.run("hi")
    assert log[3:] == ["after:c", "after:b", "after:a"]
    assert [sid for sid, _ in info.value.errors] == ["c", "a"]
    assert info.value.result is not None and info.value.result.text == "answer"  # type: ignore[attr-defined]
    assert b.outcome is not None and [m.text for m in b.outcome.response_messages or []] == ["answer"]


async def test_before_run_failure_still_calls_after_run_of_started_providers() -> None:
    log: list[str] = []

    class Broken(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            raise ValueError("cannot reach memory service")

        async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
            log.append(f"after:broken:{type(outcome.error).__name__}")

    model = ScriptedModel(["never"])
    agent = Agent(model, providers=[Recorder("a", log), Broken("broken"), Recorder("never", log)])
    with pytest.raises(ValueError, match="memory service"):
        await agent.run("hi")
    assert log == ["before:a", "after:broken:ValueError", "after:a"]
    assert model.requests == []


async def test_provider_middleware_wraps_each_model_call() -> None:
    from contextpipe.testing import tool_call

    calls: list[int] = []

    class Counting(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            async def count(request: ModelRequest, call_next: CallModel) -> ModelResponse:
                calls.append(len(request.messages))
                return await call_next(request)

            ctx.add_middleware(count)

    class Prefix(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            async def prefix(request: ModelRequest, call_next: CallModel) -> ModelResponse:
                response = await call_next(request)
                return ModelResponse([Message.assistant("[checked] " + response.text)] if response.text
                                     else response.messages)

            ctx.add_middleware(prefix)

    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    agent = Agent(ScriptedModel([tool_call("ping"), "done"]), tools=[ping], providers=[Counting("c"), Prefix("p")])
    result = await agent.run("go")
    assert calls == [1, 3]
    assert result.text == "[checked] done"


def test_construction_rejects_duplicate_ids_keys_and_loaders() -> None:
    class Stateful(ContextProvider):
        @property
        def state_keys(self) -> tuple[str, ...]:
            return ("shared",)

    model = ScriptedModel()
    with pytest.raises(UsageError, match="source_id 'x'"):
        Agent(model, providers=[Recorder("x", []), Recorder("x", [])])
    with pytest.raises(UsageError, match="session state key 'shared'"):
        Agent(model, providers=[Stateful("one"), Stateful("two")])
    with pytest.raises(UsageError, match="only one history provider may load"):
        Agent(model, providers=[History(MemoryStore()), History(MemoryStore(), source_id="second")])
    Agent(model, providers=[History(MemoryStore()),
                            History(MemoryStore(), source_id="audit",
                                    policy=HistoryPolicy(load_messages=False, store_context_messages=True))])


async def test_a_runs_own_providers_follow_the_agents_for_that_run_only() -> None:
    log: list[str] = []
    model = ScriptedModel(["one", "two"])
    agent = Agent(model, providers=[Recorder("a", log)])
    await agent.run("hi", providers=[Recorder("per-run", log)])
    async with agent.stream("again") as events:
        async for _ in events:
            pass
    assert log == ["before:a", "before:per-run", "after:per-run", "after:a", "before:a", "after:a"]
    assert [(m.source, m.text) for m in model.requests[0].messages] == [
        (Source("context", "a"), "Context from a."), (Source("context", "per-run"), "Context from per-run."),
        (Source("input"), "hi")]
    assert len(model.requests[1].messages) == 2  # the next run has the agent's providers only


async def test_a_runs_own_providers_are_refused_when_they_cannot_be() -> None:
    class Stateful(ContextProvider):
        state_keys = ("mine",)

    agent = Agent(ScriptedModel(), providers=[Recorder("a", [])])
    cases = [([Recorder("a", [])], "source_id 'a'"), ([Recorder("b", []), Recorder("b", [])], "source_id 'b'"),
             ([History(MemoryStore(), source_id="h")], "not history providers"),
             ([Stateful("s")], "declares session state keys")]
    for providers, problem in cases:
        with pytest.raises(UsageError, match=problem):
            await agent.run("hi", providers=providers)


class Prefs(BaseModel):
    favourite_food: str | None = None
    runs: int = 0


class PreferenceProvider(ContextProvider):
    """Keeps its per-session data in ProviderState, never on itself."""

    def __init__(self) -> None:
        super().__init__("prefs")
        self.state = ProviderState("prefs", Prefs)

    @property
    def state_keys(self) -> tuple[str, ...]:
        return (self.state.key,)

    async def before_run(self, ctx: RunContext) -> None:
        prefs = self.state.get(ctx.session)
        if prefs.favourite_food:
            ctx.add_instructions(f"The user's favourite food is {prefs.favourite_food}.")

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        if ctx.session is None:
            return
        prefs = self.state.get(ctx.session)
        prefs.runs += 1
        for m in ctx.input:
            if "favourite food is" in m.text:
                prefs.favourite_food = m.text.split("favourite food is", 1)[1].strip(" .")


async def test_typed_provider_state_survives_serialisation_and_the_store() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["noted", "noodles it is"]), providers=[History(store), PreferenceProvider()])
    session = await agent.session("alice")
    await agent.run("My favourite food is noodles.", session=session)
    assert session.to_dict()["state"]["prefs"] == {"favourite_food": "noodles", "runs": 1}

    # A fresh Session object from JSON, and a fresh agent on the same store: state is typed again.
    restored = Session.from_json(session.to_json())
    assert isinstance(restored.state["prefs"], dict)
    fresh_model = ScriptedModel(["noodles it is"])
    fresh = Agent(fresh_model, providers=[History(store), PreferenceProvider()])
    await fresh.run("What should I eat?", session=await fresh.session("alice"))
    assert fresh_model.requests[0].instructions == "The user's favourite food is noodles."
    reloaded = await store.get_session("default", "alice")
    assert reloaded is not None and reloaded.state["prefs"]["runs"] == 2


async def test_stale_session_object_is_refreshed_not_overwritten() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["a", "b"]), providers=[History(store), PreferenceProvider()])
    first = await agent.session("alice")
    second = await agent.session("alice")  # another worker's copy
    await agent.run("My favourite food is rice.", session=first)
    await agent.run("hello", session=second)
    stored = await store.get_session("default", "alice")
    assert stored is not None and stored.state["prefs"] == {"favourite_food": "rice", "runs": 2}


async def test_run_without_session_works_and_stores_nothing() -> None:
    store = MemoryStore()
    model = ScriptedModel(["hello"])
    result = await Agent(model, providers=[History(store)]).run("hi")
    assert result.text == "hello" and result.session is None
    assert (await store.list_sessions("default")).sessions == []


# --- history filters and options ------------------------------------------------------------------

async def run_twice(history: History, *, extra: Sequence[ContextProvider] = ()) -> tuple[Agent, Session]:
    agent = Agent(ScriptedModel(["a1", "a2"]), providers=[history, *extra])
    session = await agent.session("s")
    await agent.run("q1", session=session)
    await agent.run("q2", session=session)
    return agent, session


async def test_history_is_never_stored_twice() -> None:
    history = RecordingHistory(MemoryStore())
    agent, session = await run_twice(history)
    assert [describe(b) for b in history.saves] == [["user:q1", "assistant:a1"], ["user:q2", "assistant:a2"]]
    assert describe(await agent.history(session)) == ["user:q1", "assistant:a1", "user:q2", "assistant:a2"]
    model = agent.model
    assert isinstance(model, ScriptedModel)
    assert describe(model.requests[1].messages) == ["user:q1", "assistant:a1", "user:q2"]


async def test_store_inputs_and_outputs_switches() -> None:
    no_inputs = RecordingHistory(MemoryStore(), policy=HistoryPolicy(store_inputs=False))
    await run_twice(no_inputs)
    assert [describe(b) for b in no_inputs.saves] == [["assistant:a1"], ["assistant:a2"]]
    no_outputs = RecordingHistory(MemoryStore(), policy=HistoryPolicy(store_outputs=False))
    await run_twice(no_outputs)
    assert [describe(b) for b in no_outputs.saves] == [["user:q1"], ["user:q2"]]


async def test_context_messages_stored_only_when_asked_and_audit_pattern() -> None:
    log: list[str] = []
    primary = RecordingHistory(MemoryStore())
    audit = RecordingHistory(MemoryStore(), source_id="audit",
                             policy=HistoryPolicy(load_messages=False, store_context_messages=True))
    agent = Agent(ScriptedModel(["a1", "a2"]), providers=[primary, Recorder("memory", log, message=True), audit])
    session = await agent.session("s")
    await agent.run("q1", session=session)
    await agent.run("q2", session=session)
    assert [describe(b) for b in primary.saves] == [["user:q1", "assistant:a1"], ["user:q2", "assistant:a2"]]
    assert [describe(b) for b in audit.saves] == [
        ["user:Context from memory.", "user:q1", "assistant:a1"],
        ["user:Context from memory.", "user:q2", "assistant:a2"],
    ]
    # The audit copy keeps where each message came from.
    assert audit.saves[0][0].source == Source("context", "memory")


async def test_custom_filters() -> None:
    history = RecordingHistory(
        MemoryStore(),
        policy=HistoryPolicy(
            provide_filter=lambda msgs: [m for m in msgs if m.role == "user"],
            store_request_filter=lambda msgs: [m for m in msgs if m.source is not None and m.source.kind == "input"],
            store_response_filter=lambda msgs: [m.with_source(Source("model", "redacted")) for m in msgs],
        ),
    )
    agent, session = await run_twice(history)
    model = agent.model
    assert isinstance(model, ScriptedModel)
    # provide filter: only user turns of the history reach the model.
    assert describe(model.requests[1].messages) == ["user:q1", "user:q2"]
    stored = await agent.history(session)
    assert [m.source for m in stored if m.role == "assistant"] == [Source("model", "redacted")] * 2
    assert [describe(b) for b in history.saves][1] == ["user:q2", "assistant:a2"]


async def test_request_filter_sees_sources_of_every_request_message() -> None:
    seen: list[list[str | None]] = []

    def keep_inputs(msgs: Sequence[Message]) -> Sequence[Message]:
        seen.append([m.source.kind if m.source else None for m in msgs])
        return [m for m in msgs if m.source is not None and m.source.kind == "input"]

    log: list[str] = []
    history = RecordingHistory(MemoryStore(), policy=HistoryPolicy(store_request_filter=keep_inputs))
    await run_twice(history, extra=[Recorder("memory", log)])
    assert seen == [["context", "input"], ["history", "history", "context", "input"]]


async def test_a_custom_history_provider_gets_the_lease_token_the_durable_flag_and_fencing() -> None:
    """What `History` gets from a run, a `HistoryProvider` written from scratch gets too (declared, not probed)."""
    from contextpipe.providers import LoadedHistory
    from contextpipe.stores import Lease
    from contextpipe.testing import tool_call

    @tool(idempotent=True)
    def ping() -> str:
        """Answers pong."""
        return "pong"

    class Custom(HistoryProvider):
        def __init__(self, store: MemoryStore) -> None:
            super().__init__("custom")
            self.store = store
            self.tokens: list[int | None] = []
            self.saves: list[tuple[list[str], bool, bool]] = []

        async def load_view(self, session: Session, *, lease_token: int | None = None) -> LoadedHistory:
            self.tokens.append(lease_token)
            return LoadedHistory([])

        async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                       durable: bool = True) -> None:
            self.saves.append((describe(messages), lease is not None, durable))

    store = MemoryStore()
    custom = Custom(store)
    agent = Agent(ScriptedModel([tool_call("ping"), "done"]), tools=[ping], providers=[custom])
    assert agent.store is store  # the provider's declared store is the agent's
    await agent.run("go", session=await agent.session("s"))
    assert len(custom.tokens) == 1 and isinstance(custom.tokens[0], int)
    assert custom.saves == [(["user:go", "assistant:call:ping"], True, True),
                            (["tool:result:pong"], True, False),  # an idempotent tool's result: not fsynced
                            (["assistant:done"], True, True)]
