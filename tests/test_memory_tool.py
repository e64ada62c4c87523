"""`SemanticMemory` as a tool: the model searches the memories itself, by query, time range and speaker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Message, UsageError
from contextpipe.compaction import Summarize, Trigger
from contextpipe.providers import Compaction, History, SemanticMemory, external_input
from contextpipe.session import Session, set_user_id
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.vectors import HashEmbedder, MemoryVectorStore, SearchHit, SQLiteVectorStore
from helpers import CountingEmbedder

JUNE = datetime(2025, 6, 2, 9, 14, tzinfo=UTC)


def at(days: float) -> float:
    """The time `days` after JUNE (2025-06-02 09:14 UTC), as a message's `created_at`."""
    return (JUNE + timedelta(days=days)).timestamp()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(tmp_path / "agent.db") as store:
        yield store


async def alice(agent: Agent, session_id: str) -> Session:
    session = await agent.session(session_id)
    set_user_id(session, "alice")
    session.state["user_name"] = "Alice"
    return session


def results(messages: Sequence[Message]) -> list[tuple[str, bool]]:
    """The tool results among `messages`: (text, is_error)."""
    return [(r.result, r.is_error) for m in messages for r in m.function_results]


async def test_a_turn_compaction_summarised_away_is_found_through_the_tool(store: SQLiteStore) -> None:
    """Memory stores each turn when its run ends; compaction later replaces it with a summary (and a
    checkpoint, so later runs never load it), and the model still finds it, with its id and date."""
    vectors = store.vectors()
    memory = SemanticMemory(vectors, HashEmbedder(), mode="tool", agent_name="Sage")
    summariser = ScriptedModel(["Alice chatted about the weather and her weekend."])
    model = ScriptedModel([
        "Noted.", "Sunny all week.", "Enjoy the hike.",
        tool_call("search_memory", query="locker code", speaker="alice"), "Your locker code is 4512.",
        tool_call("search_memory", query="locker code"), "Still 4512."])
    agent = Agent(model, providers=[
        History(store), memory,
        Compaction(Summarize(summariser, keep_last_turns=1, trigger=Trigger(turns=3)))])
    session = await alice(agent, "chat-1")
    locker = Message.user("My locker code is 4512.", created_at=at(0))
    await agent.run(locker, session=session)
    await agent.run(Message.user("What is the weather like?", created_at=at(1)), session=session)
    await agent.run(Message.user("I am hiking this weekend.", created_at=at(2)), session=session)

    result = await agent.run("What was my locker code?", session=session)
    first = result.traces[0]
    [decision] = first.compaction
    assert decision.action == "summarised" and locker.id in decision.message_ids
    assert locker.id not in {m.message_id for m in first.messages}  # the model is not sent the turn...
    assert not any(m.metadata.get("memory") for m in model.requests[3].messages)  # ...nor a recall of it
    assert ("search_memory", "memory") in {(t.name, t.source_id) for t in first.tools}
    assert "Use search_memory to search earlier conversations" in (model.requests[3].instructions or "")
    [call] = first.tool_calls
    assert (call.name, call.is_error) == ("search_memory", False)
    [(found, is_error)] = results(result.messages)
    assert not is_error
    assert found.splitlines()[0] == (f"- [2025-06-02 09:14 UTC, session chat-1, message {locker.id}] "
                                     "Alice: My locker code is 4512.")
    memories = [line for line in found.splitlines() if line.startswith("- [")]  # (the others: their neighbours)
    assert len(memories) == 3 and all("] Alice: " in line for line in memories)  # speaker="alice", case ignored
    assert found in model.requests[4].messages[-1].function_results[0].result  # what the model received

    later = await agent.run("And now?", session=session)  # loads the checkpoint: the turn is not in the run
    assert later.traces[0].messages[0].preview.startswith("[Summary of the earlier conversation]")
    assert locker.id not in {m.message_id for m in later.traces[0].messages}
    [(again, _)] = results(later.messages)
    assert f"message {locker.id}] Alice: My locker code is 4512." in again
    assert len(summariser.requests) == 1


async def test_the_tool_filters_by_time_range_and_speaker(store: SQLiteStore) -> None:
    vectors = store.vectors()
    memory = SemanticMemory(vectors, HashEmbedder(), mode="tool", agent_name="Sage", k=10)
    calls = [tool_call("search_memory", query="pottery class", start="2025-06-03", end="2025-06-03"),
             tool_call("search_memory", query="pottery class", speaker="SAGE"),
             tool_call("search_memory", query="pottery class", speaker="assistant", start="2025-06-03T12:00"),
             tool_call("search_memory", query="pottery class", end="2025-06-02T09:14+00:00"),
             tool_call("search_memory", query="pottery class", start="2025-06-04T11:00+02:00", speaker="user"),
             tool_call("search_memory", query="pottery class", end="9999-12-31")]
    model = ScriptedModel([sum(calls[1:], calls[0]), "Done."])
    agent = Agent(model, providers=[History(store), memory])
    session = await alice(agent, "alice-today")
    earlier = await alice(agent, "alice-june")
    turns = [Message.user("I signed up for a pottery class.", created_at=at(0)),
             Message.assistant("A pottery class, how lovely!", created_at=at(0.01)),
             Message.user("The pottery class moved to Thursdays.", created_at=at(1)),
             Message.assistant("Thursdays for the pottery class, noted.", created_at=at(1.2)),
             Message.user("I skipped the pottery class.", created_at=at(2))]
    assert await memory.remember(turns, earlier) == 5
    ids = [m.id for m in turns]

    result = await agent.run("What happened with the pottery class?", session=session)
    found = results(result.messages)
    assert not any(is_error for _, is_error in found)

    def ids_in(text: str) -> list[str]:
        return sorted(i for i in ids if f"message {i}]" in text)

    assert ids_in(found[0][0]) == sorted(ids[2:4])  # 2025-06-03, all of that day
    assert ids_in(found[1][0]) == sorted([ids[1], ids[3]])  # by name, case ignored
    assert ids_in(found[2][0]) == [ids[3]]  # by role, from noon on
    assert ids_in(found[3][0]) == []  # before 09:14 on the first day: the first turn was said at 09:14
    assert ids_in(found[4][0]) == [ids[4]]  # 11:00 in UTC+2 is 09:00 UTC on the 4th, before 09:14
    assert ids_in(found[5][0]) == sorted(ids)  # the last day there is: the range has no end
    assert "2025-06-03 09:14 UTC, session alice-june" in found[0][0]


async def test_the_tool_tells_the_model_what_it_got_wrong(store: SQLiteStore) -> None:
    memory = SemanticMemory(store.vectors(), HashEmbedder(), mode="tool")
    model = ScriptedModel([tool_call("search_memory", query="class", start="last Tuesday")
                           + tool_call("search_memory", query="class", start="2025-06-03", end="2025-06-02")
                           + tool_call("search_memory", query=" ")
                           + tool_call("search_memory", query="class", speaker=7)
                           + tool_call("search_memory", query="class"), "Sorry."])
    agent = Agent(model, providers=[History(store), memory])
    result = await agent.run("When was the class?", session=await alice(agent, "s"))
    assert results(result.messages) == [
        ("Error: 'start' must be a date or time in ISO 8601 (2025-06-02 or 2025-06-02T09:00), got 'last Tuesday'",
         True),
        ("Error: 'end' (2025-06-02) must come after 'start' (2025-06-03).", True),
        ("Error: 'query' must be a non-empty string.", True),
        ("Error: 'speaker' must be a name or a role, got 7", True),
        ("No memories match.", False)]
    assert [c.is_error for c in result.traces[0].tool_calls] == [True, True, True, True, False]


async def test_the_store_filters_still_decide_what_the_tool_can_find(store: SQLiteStore) -> None:
    """A message the store filter keeps out of memory is not found by the tool either."""
    def not_private(messages: Sequence[Message]) -> list[Message]:
        return [m for m in external_input(messages) if not m.metadata.get("private")]

    memory = SemanticMemory(store.vectors(), HashEmbedder(), mode="tool", store_request_filter=not_private)
    model = ScriptedModel(["Noted.", "Noted.", tool_call("search_memory", query="bank pin code"), "I do not know."])
    agent = Agent(model, providers=[History(store), memory])
    session = await alice(agent, "s")
    await agent.run(Message.user("My bank pin code is 1234.", metadata={"private": True}), session=session)
    await agent.run("My locker code is 4512.", session=session)
    result = await agent.run("What is my bank pin code?", session=await alice(agent, "other"))
    [(found, _)] = results(result.messages)
    assert "1234" not in found and "locker code is 4512" in found


@pytest.mark.parametrize(("scope", "finders"), [
    ("user", {"alice-1", "alice-2"}), ("session", {"alice-1"}),
    ("tenant", {"alice-1", "alice-2", "bob", "nobody"}), ("agent", {"alice-1", "alice-2", "bob", "nobody"})])
async def test_the_tool_sees_only_what_recall_before_the_run_sees(store: SQLiteStore, scope: str,
                                                                  finders: set[str]) -> None:
    """The tool searches the run's own scope, with the same store filters: never another tenant's memories,
    nor (by default) another user's; a session without a user sees its own memories only."""
    memory = SemanticMemory(store.vectors(), HashEmbedder(), mode="both", scope=scope)  # type: ignore[arg-type]
    searchers = {"alice-1": ("acme", "alice"), "alice-2": ("acme", "alice"), "bob": ("acme", "bob"),
                 "nobody": ("acme", None), "alice-elsewhere": ("globex", "alice")}
    model = ScriptedModel([step for _ in searchers for step in (tool_call("search_memory", query="locker code"),
                                                                "Done.")])
    agent = Agent(model, providers=[History(store), memory])
    sessions = {}
    for name, (tenant, user) in searchers.items():
        sessions[name] = await agent.session(name, tenant=tenant)
        if user is not None:
            set_user_id(sessions[name], user)
    await memory.remember([Message.user("My locker code is 4512.")], sessions["alice-1"])
    by_tool, before_run = set(), set()
    for n, name in enumerate(searchers):
        result = await agent.run("What is the locker code?", session=sessions[name])
        [(found, is_error)] = results(result.messages)
        assert not is_error
        if "4512" in found:
            by_tool.add(name)
        if any("4512" in m.text for m in model.requests[2 * n].messages if m.metadata.get("memory")):
            before_run.add(name)
    assert by_tool == before_run == finders


async def test_modes_before_run_tool_and_both(store: SQLiteStore) -> None:
    """The default recalls before the run and offers no tool; tool offers only the tool; both does both."""
    offered = {}
    for mode in ("before_run", "tool", "both"):
        memory = SemanticMemory(store.vectors(), HashEmbedder(), collection=f"m_{mode}", mode=mode)
        model = ScriptedModel(["Noted.", "Thursdays."])
        agent = Agent(model, providers=[History(store), memory])
        await agent.run("The pottery class meets on Thursdays.", session=await alice(agent, f"{mode}-1"))
        await agent.run("When does the pottery class meet?", session=await alice(agent, f"{mode}-2"))
        request = model.requests[1]
        offered[mode] = ([t.name for t in request.tools],
                         any(m.metadata.get("memory") for m in request.messages))
    assert offered == {"before_run": ([], True), "tool": (["search_memory"], False),
                       "both": (["search_memory"], True)}
    assert SemanticMemory(store.vectors(), HashEmbedder()).mode == "before_run"


async def test_a_run_without_a_session_is_offered_no_tool() -> None:
    """Without a session there is no scope to search: the tool would only ever answer nothing."""
    model = ScriptedModel(["Hello."])
    memory = SemanticMemory(MemoryVectorStore(), HashEmbedder(), mode="tool")
    await Agent(model, providers=[memory], default_history=False).run("Hi")
    assert list(model.requests[0].tools) == []


def test_the_mode_is_checked_and_tool_mode_takes_no_input_filter() -> None:
    with pytest.raises(UsageError, match="mode must be 'before_run' or 'tool' or 'both', got 'tools'"):
        SemanticMemory(MemoryVectorStore(), HashEmbedder(), mode="tools")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"SemanticMemory\(mode='tool'\) takes no input_filter: the model writes"):
        SemanticMemory(MemoryVectorStore(), HashEmbedder(), mode="tool", input_filter=external_input)
    assert SemanticMemory(MemoryVectorStore(), HashEmbedder(), mode="both", input_filter=external_input).mode == "both"


class CountingVectors(SQLiteVectorStore):
    """The embedded store, counting the searches asked of it (how deep each went)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.depths: list[int] = []

    async def search(self, collection: str, vector: Any = None, **options: Any) -> list[SearchHit]:
        self.depths.append(options["k"])
        return await super().search(collection, vector, **options)


async def test_a_filter_finds_what_ranks_below_the_first_candidates(tmp_path: Path) -> None:
    """The store cannot filter by time: the ranking is searched deeper until enough memories pass, the query
    embedded once for all the rounds."""
    vectors, embedder = CountingVectors(tmp_path / "v.db"), CountingEmbedder()
    memory = SemanticMemory(vectors, embedder, k=2)
    session = Session("s", state={"user_id": "alice"})
    close = [Message.user(f"The pottery class on Thursday number {i} was fun.", created_at=at(-30)) for i in range(300)]
    far = Message.user("Some class, I think.", created_at=at(0))
    await memory.remember([*close, far], session)
    assert far.id not in [h.id for h in await memory.recall("pottery class Thursday", session, k=250)]
    vectors.depths, embedder.calls = [], []
    hits = await memory.recall("pottery class Thursday", session, since=JUNE)
    assert [h.id for h in hits] == [far.id]  # the only one that passes, found past rank 250
    assert vectors.depths == [50, 200, 800]  # three rounds, one query embedding (with and without its name)
    assert embedder.calls == [["pottery class Thursday", "pottery class"]]
    assert await memory.recall("pottery class Thursday", session, since=JUNE + timedelta(seconds=1)) == []
    await vectors.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.tuples(st.integers(0, 9), st.sampled_from(["user", "assistant"]),
                                st.lists(st.sampled_from(["class", "pottery", "rain", "train", "maya", "walk"]),
                                         min_size=1, max_size=4)), min_size=1, max_size=60),
       start=st.none() | st.integers(0, 9), span=st.none() | st.integers(1, 5),
       speaker=st.none() | st.sampled_from(["user", "Sage", "alice", "nobody"]),
       search=st.sampled_from(["vector", "keywords"]), k=st.integers(1, 4))
async def test_filtered_recall_is_the_full_ranking_filtered(
        turns: list[tuple[int, str, list[str]]], start: int | None, span: int | None, speaker: str | None,
        search: str, k: int) -> None:
    """Whatever the filters, recall gives the first `k` memories of the whole ranking that pass them (vector
    or keyword ranking: a hybrid one fuses two rankings whose depth changes the order a little)."""
    vectors = MemoryVectorStore()
    vectors.candidates = 4  # so that the filtered search has to go deeper than its first ranking
    memory = SemanticMemory(vectors, HashEmbedder(), search=search, short_turn_words=0,  # type: ignore[arg-type]
                            agent_name="Sage", window=0, window_after=0)
    session = Session("s", state={"user_id": "alice", "user_name": "Alice"})
    messages = [(Message.user if role == "user" else Message.assistant)(" ".join(words), created_at=at(day))
                for day, role, words in turns]
    await memory.remember(messages, session)
    since = JUNE + timedelta(days=start) if start is not None else None
    until = since + timedelta(days=span) if since is not None and span is not None else None
    query = "pottery class maya"
    everything = await memory.recall(query, session, k=len(messages))

    def passes(meta: dict[str, object]) -> bool:
        when = datetime.fromtimestamp(float(meta["created_at"]), tz=UTC)  # type: ignore[arg-type]
        return ((since is None or since <= when) and (until is None or when < until)
                and (speaker is None or speaker.casefold() in (str(meta["author"]).casefold(), meta["role"])))

    expected = [h.id for h in everything if passes(dict(h.metadata))][:k]
    got = await memory.recall(query, session, k=k, since=since, until=until, speaker=speaker)
    assert [h.id for h in got] == expected
