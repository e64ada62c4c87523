"""FactMemory's temporal facts: versions with validity windows and source messages, recall as of a time,
facts stored before histories existed, and extractions that wait in the session until one succeeds."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, StoreError, UsageError
from contextpipe.models import ModelRequest, ModelResponse
from contextpipe.providers import Fact, FactMemory, History, external_input
from contextpipe.session import Session, set_user_id
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.testing import ScriptedModel
from contextpipe.vectors import HashEmbedder, MemoryVectorStore, VectorRecord, VectorStore
from helpers import Clock, changes, known_ids, vector_store


@pytest.fixture(params=["memory", "sqlite", "pgvector"])
async def vectors(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    store = vector_store(request.param, tmp_path)
    yield store
    await store.close()


async def test_a_fact_that_changes_twice_is_recalled_now_as_of_each_period_and_with_its_sources(
        vectors: VectorStore) -> None:
    clock = Clock(1_000.0)
    extractor = ScriptedModel()
    facts = FactMemory(extractor, vectors, HashEmbedder(), clock=clock)
    store = MemoryStore()
    chat = ScriptedModel()
    agent = Agent(chat, providers=[History(store), facts])
    session = await agent.session("alice-1")
    set_user_id(session, "alice")

    async def turn(at: float, text: str, answer: Callable[[ModelRequest], str]) -> list[str]:
        clock.now = at
        chat.enqueue("Noted.")
        extractor.enqueue(answer)
        result = await agent.run(text, session=session)
        return [m.id for m in [*result.input, *result.messages]]

    lisbon = await turn(1_000, "I live in Lisbon.", lambda r: changes(add=("Alice lives in Lisbon.",)))

    def moved(to: str) -> Callable[[ModelRequest], str]:
        def answer(request: ModelRequest) -> str:
            [(current, _)] = known_ids(request).items()  # only the version true now is shown
            return changes(update={current: f"Alice lives in {to}."})
        return answer

    porto = await turn(2_000, "I moved to Porto.", moved("Porto"))
    berlin = await turn(3_000, "Now I live in Berlin.", moved("Berlin"))

    assert [t for _, t in await facts.facts(session)] == ["Alice lives in Berlin."]
    for when, where in [(1_000, "Lisbon"), (1_999.5, "Lisbon"), (2_000, "Porto"), (2_500, "Porto"),
                        (3_000, "Berlin"), (9_999, "Berlin")]:
        assert [t for _, t in await facts.facts(session, as_of=when)] == [f"Alice lives in {where}."], when
    assert await facts.facts(session, as_of=999) == []  # nothing was known yet
    at_porto = datetime.fromtimestamp(2_500, tz=UTC)
    assert [f.text for f in await facts.recall(session, "where does Alice live", as_of=at_porto)] == [
        "Alice lives in Porto."]

    [versions] = await facts.history(session)
    assert [(f.text, f.valid_from, f.valid_to) for f in versions] == [
        ("Alice lives in Lisbon.", 1_000, 2_000), ("Alice lives in Porto.", 2_000, 3_000),
        ("Alice lives in Berlin.", 3_000, None)]
    stored = [m.id for m in (await store.load("default", "alice-1")).messages]
    assert stored == [*lisbon, *porto, *berlin]  # each version's sources are its turn's messages, as stored
    assert [f.sources for f in versions] == [tuple(lisbon), tuple(porto), tuple(berlin)]
    assert [f.ended_by for f in versions] == [tuple(porto), tuple(berlin), ()]
    first, second, third = versions
    assert {f.lineage for f in versions} == {first.id} and len({f.id for f in versions}) == 3
    assert (first.replaces, first.replaced_by, second.replaces, second.replaced_by, third.replaces,
            third.replaced_by) == (None, second.id, first.id, third.id, second.id, None)
    assert {f.session_id for f in versions} == {"alice-1"}
    assert await facts.history(session, second.id) == [versions]  # any version's id finds its fact
    assert await facts.history(session, "fact_unknown") == []

    # Ended without a successor: not true now, still true as of before, and nothing is deleted.
    left = await turn(4_000, "I left Berlin; no fixed home for now.",
                      lambda r: changes(delete=tuple(known_ids(r))))
    assert await facts.facts(session) == [] and await facts.facts(session, as_of=4_000) == []
    assert [t for _, t in await facts.facts(session, as_of=3_999)] == ["Alice lives in Berlin."]
    [versions] = await facts.history(session)
    assert (versions[-1].valid_to, versions[-1].ended_by, versions[-1].replaced_by) == (4_000, tuple(left), None)
    assert await vectors.count("facts") == 3
    await turn(5_000, "Any plans?", lambda r: changes())
    told = [(r.instructions or "").partition("(may be outdated):\n")[2] for r in chat.requests]
    assert told == ["", "- Alice lives in Lisbon.", "- Alice lives in Porto.", "- Alice lives in Berlin.", ""]


OLD_FORMAT = Path(__file__).parent / "fixtures" / "facts_before_history.json"
"""What FactMemory stored before histories, written by that version's code (fixtures/facts_before_history.py)."""


async def test_facts_stored_by_the_version_before_histories_still_load(vectors: VectorStore) -> None:
    """Records and a waiting turn as the earlier FactMemory wrote them: read, recalled, then updated as versions."""
    written = json.loads(OLD_FORMAT.read_text())
    embedder = HashEmbedder()
    texts = [r["text"] for r in written["records"]]
    await vectors.upsert("facts", [VectorRecord(r["id"], v, r["text"], r["metadata"])
                                   for r, v in zip(written["records"], await embedder.embed(texts), strict=True)])
    store = MemoryStore()
    old = await store.load_or_create("default", "old")
    old.state.update(written["state"])  # its waiting turn kept as plain text, as turns were then
    await store.save_session(old)

    clock = Clock(2_000_000_000.0)
    extractor = ScriptedModel()
    facts = FactMemory(extractor, vectors, embedder, clock=clock)
    session = Session("new", state={"user_id": "alice"})
    by_text = {f.text: f for f in await facts.recall(session)}
    tea = by_text["Alice likes green tea."]
    assert sorted(by_text) == ["Alice likes green tea.", "Alice plays chess."]
    assert tea == Fact(tea.id, "Alice likes green tea.", tea.id, None, None, (), session_id="old")
    assert tea.true_at(0) and {f.id for f in await facts.recall(session, as_of=1.0)} == {f.id for f in by_text.values()}
    assert sorted(await facts.history(session), key=lambda h: h[0].text) == [[tea], [by_text["Alice plays chess."]]]

    def coffee(request: ModelRequest) -> str:
        text = request.messages[0].text
        assert f"[{tea.id}] Alice likes green tea." in text
        assert "user: I moved to Suzhou." in text and "user: I drink coffee now." in text  # the old turn waited
        return changes(add=("Alice lives in Suzhou.",), update={tea.id: "Alice drinks coffee."})

    extractor.enqueue(coffee)
    agent = Agent(ScriptedModel(["Noted."]), providers=[History(store), facts])
    result = await agent.run("I drink coffee now.", session=await agent.session("old"))
    assert (await store.get_session("default", "old")).state["facts.pending"] == {"turns": []}  # type: ignore[union-attr]
    histories = {h[0].text: h for h in await facts.history(session)}
    [before, coffee_now] = histories["Alice likes green tea."]
    assert (before.id, before.valid_from, before.valid_to, before.replaced_by) == (tea.id, None, clock.now,
                                                                                   coffee_now.id)
    assert (coffee_now.text, coffee_now.lineage, coffee_now.replaces, coffee_now.valid_from) == (
        "Alice drinks coffee.", tea.id, tea.id, clock.now)
    [[suzhou]] = [histories["Alice lives in Suzhou."]]
    assert coffee_now.sources == suzhou.sources == tuple(m.id for m in [*result.input, *result.messages])
    assert sorted(t for _, t in await facts.facts(session)) == [
        "Alice drinks coffee.", "Alice lives in Suzhou.", "Alice plays chess."]


class GatedModel(ScriptedModel):
    """A scripted extractor whose answers wait for the test to open `gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.started = asyncio.Event()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.started.set()
        await self.gate.wait()
        return await super().complete(request)


async def test_a_failed_background_extraction_waits_in_the_session_for_the_next_run_in_any_process(
        tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    clock = Clock(100.0)

    async def process(extractor: ScriptedModel, chat: ScriptedModel) -> tuple[SQLiteStore, Agent, FactMemory]:
        store = SQLiteStore(db)
        facts = FactMemory(extractor, store.vectors(), HashEmbedder(), background=True, clock=clock)
        return store, Agent(chat, providers=[History(store), facts]), facts

    one_extractor = ScriptedModel([RuntimeError("extractor down")])
    store_one, agent_one, facts_one = await process(one_extractor, ScriptedModel(["Noted."]))
    session = await agent_one.session("s")
    set_user_id(session, "bob")
    await agent_one.run("I play the cello.", session=session)
    await facts_one.drain()
    [waiting] = (await store_one.get_session("default", "s")).state["facts.pending"]["turns"]  # type: ignore[union-attr]
    assert waiting["text"] == "user: I play the cello.\nassistant: Noted." and waiting["at"] == 100.0

    # Another process takes the session next: it extracts the waiting turn with its own.
    def both(request: ModelRequest) -> str:
        assert "I play the cello." in request.messages[0].text and "I also sing." in request.messages[0].text
        return changes(add=("Bob plays the cello.", "Bob sings."))

    clock.now = 200.0
    store_two, agent_two, facts_two = await process(ScriptedModel([both]), ScriptedModel(["Nice."]))
    await agent_two.run("I also sing.", session=await agent_two.session("s"))
    await facts_two.drain()
    cello = next(f for [f] in await facts_two.history(Session("s", state={"user_id": "bob"}))
                 if f.text == "Bob plays the cello.")
    assert cello.valid_from == 200.0 and len(cello.sources) == 4  # both turns' messages

    # Back in the first process: that extraction wrote its facts, so its turns are not sent again.
    def alone(request: ModelRequest) -> str:
        assert "cello" not in request.messages[0].text.split("New turns:")[1]
        return changes()

    one_extractor.enqueue(alone)
    clock.now = 300.0
    agent_one.model.enqueue("Good.")  # type: ignore[attr-defined]
    session = await agent_one.session("s")
    await agent_one.run("That is all.", session=session)
    await facts_one.drain()
    assert len(one_extractor.requests) == 2
    # An extraction that succeeded with no change: this process knows, and its turn is not sent again either.
    one_extractor.enqueue(alone)
    agent_one.model.enqueue("Bye.")  # type: ignore[attr-defined]
    session = await agent_one.session("s")
    await agent_one.run("Bye.", session=session)
    await facts_one.drain()
    assert "That is all." not in one_extractor.requests[-1].messages[0].text
    for store in (store_one, store_two):
        await store.close()


async def test_a_background_extraction_that_only_ends_a_fact_is_seen_done_by_another_process(tmp_path: Path) -> None:
    """Its only record is the version it ended: that record names it, so no other process sends its turn again."""
    db = tmp_path / "agent.db"

    async def process(extractor: ScriptedModel, chat: ScriptedModel) -> tuple[SQLiteStore, Agent]:
        store = SQLiteStore(db)
        facts = FactMemory(extractor, store.vectors(), HashEmbedder(), background=True)
        return store, Agent(chat, providers=[History(store), facts])

    one = ScriptedModel([changes(add=("Eve has a dog.",)), lambda r: changes(delete=tuple(known_ids(r)))])
    store_one, agent_one = await process(one, ScriptedModel(["Nice.", "Sorry."]))
    session = await agent_one.session("s")
    set_user_id(session, "eve")
    for said in ["I have a dog.", "My dog died."]:
        await agent_one.run(said, session=session)
        await agent_one.providers[-1].drain()  # type: ignore[attr-defined]
    assert len(one.requests) == 2

    two = ScriptedModel([changes()])
    store_two, agent_two = await process(two, ScriptedModel(["Ok."]))
    await agent_two.run("Hello.", session=await agent_two.session("s"))
    await agent_two.providers[-1].drain()  # type: ignore[attr-defined]
    [request] = two.requests
    assert "My dog died." not in request.messages[0].text  # the ending was written: not extracted twice
    for store in (store_one, store_two):
        await store.close()


async def test_a_turn_is_not_sent_twice_while_its_background_extraction_runs() -> None:
    """And facts learned late (a background extraction, a retry) became true when their turn was taken."""
    extractor = GatedModel()
    clock = Clock(5.0)
    facts = FactMemory(extractor, MemoryVectorStore(), HashEmbedder(), background=True, clock=clock)
    agent = Agent(ScriptedModel(["Noted.", "Noted again.", "Ok."]), providers=[History(MemoryStore()), facts])
    session = await agent.session("s")
    set_user_id(session, "carol")

    def jazz_fails(request: ModelRequest) -> str | Exception:
        text = request.messages[0].text
        return RuntimeError("extractor down") if "jazz" in text else changes(add=("Carol likes blues.",))

    extractor.enqueue(jazz_fails, jazz_fails)
    await agent.run("I like jazz.", session=session)
    await extractor.started.wait()  # the first extraction is under way
    clock.now = 10.0
    await agent.run("I also like blues.", session=session)
    turns = facts.pending.get(session).turns
    assert [t.text.split("\n")[0] for t in turns] == ["user: I like jazz.", "user: I also like blues."]
    assert turns[0].batch != turns[1].batch  # the second run sent only its own turn
    clock.now = 50.0
    extractor.gate.set()
    await facts.drain()
    sent = sorted(r.messages[0].text.split("New turns:\n")[1] for r in extractor.requests)
    assert sent == ["user: I also like blues.\nassistant: Noted again.", "user: I like jazz.\nassistant: Noted."]
    [[blues]] = await facts.history(session)
    assert blues.valid_from == 10.0  # when it was said, not when it was extracted

    # The first one failed: its turn still waits, and the next run sends it (the second one's is done).
    def retry(request: ModelRequest) -> str:
        new_turns = request.messages[0].text.split("New turns:\n")[1]
        assert new_turns == ("user: I like jazz.\nassistant: Noted.\n\n"
                             "user: Thanks, only jazz after all.\nassistant: Ok.")
        return changes(add=("Carol likes jazz.",), update={blues.id: "Carol no longer likes blues."})

    extractor.gate.clear()
    extractor.enqueue(retry)
    clock.now = 60.0
    await agent.run("Thanks, only jazz after all.", session=session)
    clock.now = 90.0
    extractor.gate.set()
    await facts.drain()
    assert len(extractor.requests) == 3
    history = {h[0].text: h for h in await facts.history(session)}
    assert [(f.valid_from, f.valid_to) for f in history["Carol likes blues."]] == [(10.0, 60.0), (60.0, None)]
    assert history["Carol likes jazz."][0].valid_from == 60.0  # the latest of its turns


async def test_an_update_is_one_write_so_one_that_fails_leaves_the_fact_as_it_was() -> None:
    """The store refuses the write that starts the new version: the old one is not ended either, the turn waits."""
    class Refusing(MemoryVectorStore):
        refuse = True

        async def upsert(self, collection: str, records: Sequence[VectorRecord]) -> None:
            if self.refuse and any("replaces" in r.metadata for r in records):
                raise StoreError("the disk is full")
            await super().upsert(collection, records)

    vectors = Refusing()
    extractor = ScriptedModel([changes(add=("Gil lives in Rome.",))])
    facts = FactMemory(extractor, vectors, HashEmbedder(), clock=Clock(10.0))
    agent = Agent(ScriptedModel(["ok", "ok", "ok"]), providers=[facts])
    session = await agent.session("s")
    set_user_id(session, "gil")
    await agent.run("I live in Rome.", session=session)
    [[rome]] = await facts.history(session)
    moved = changes(update={rome.id: "Gil lives in Milan."})
    extractor.enqueue(moved)
    await agent.run("I moved to Milan.", session=session)
    assert [f.text for f in await facts.recall(session)] == ["Gil lives in Rome."]  # not ended, not doubled
    assert await facts.history(session) == [[rome]]
    [waiting] = facts.pending.get(session).turns
    assert waiting.text.startswith("user: I moved to Milan.")

    vectors.refuse = False
    extractor.enqueue(lambda r: moved if "I moved to Milan." in r.messages[0].text else changes())
    await agent.run("Hi.", session=session)
    assert [f.text for f in await facts.recall(session)] == ["Gil lives in Milan."]
    assert facts.pending.get(session).turns == []


async def test_two_processes_that_update_one_fact_at_once_both_keep_their_version() -> None:
    """Two sessions of one user in two processes (a FactMemory each): neither update is lost, the fact has two
    versions true now (both recalled, both shown to the next extraction, which can end one), the history all three."""
    vectors, clock = MemoryVectorStore(), Clock(10.0)
    seed = FactMemory(ScriptedModel([changes(add=("Fay lives in Oslo.",))]), vectors, HashEmbedder(), clock=clock)
    seeding = Agent(ScriptedModel(["ok"]), providers=[seed])
    first = await seeding.session("a")
    set_user_id(first, "fay")
    await seeding.run("I live in Oslo.", session=first)
    [[oslo]] = await seed.history(first)

    agents = []
    for city in ("Bergen", "Tromso"):
        extractor = GatedModel()
        extractor.enqueue(lambda r, city=city: changes(update={oslo.id: f"Fay lives in {city}."}))
        facts = FactMemory(extractor, vectors, HashEmbedder(), clock=clock)
        agents.append((Agent(ScriptedModel(["ok"]), providers=[facts]), extractor, facts))
    sessions = [await agent.session(name) for (agent, _, _), name in zip(agents, "bc", strict=True)]
    for session in sessions:
        set_user_id(session, "fay")
    clock.now = 20.0
    runs = [asyncio.create_task(agent.run("I moved.", session=session))
            for (agent, _, _), session in zip(agents, sessions, strict=True)]
    for _, extractor, _ in agents:
        await extractor.started.wait()  # both were shown Oslo as true now
    for _, extractor, _ in agents:
        extractor.gate.set()
    await asyncio.gather(*runs)

    assert sorted(t for _, t in await seed.facts(first)) == ["Fay lives in Bergen.", "Fay lives in Tromso."]
    [versions] = await seed.history(first)
    assert versions[0].id == oslo.id and versions[0].valid_to == 20.0
    assert sorted(v.text for v in versions[1:]) == ["Fay lives in Bergen.", "Fay lives in Tromso."]
    assert {v.replaces for v in versions[1:]} == {oslo.id} and versions[0].replaced_by in {v.id for v in versions[1:]}


async def test_a_users_extractions_in_one_process_take_turns_so_each_sees_what_the_one_before_wrote() -> None:
    """A second run's background extraction waits for the first: it updates the version the first started
    instead of starting a second version of the same fact."""
    extractor = GatedModel()
    facts = FactMemory(extractor, MemoryVectorStore(), HashEmbedder(), background=True, clock=Clock(10.0))
    agent = Agent(ScriptedModel(["ok", "ok", "ok"]), providers=[facts])
    session = await agent.session("s")
    set_user_id(session, "hal")
    extractor.enqueue(changes(add=("Hal lives in Oslo.",)))
    extractor.gate.set()
    await agent.run("I live in Oslo.", session=session)
    await facts.drain()

    def move(city: str) -> Callable[[ModelRequest], str]:
        return lambda r: changes(update={next(i for i, t in known_ids(r).items() if "lives in" in t):
                                         f"Hal lives in {city}."})

    extractor.gate.clear()
    extractor.started.clear()
    extractor.enqueue(move("Bergen"), move("Tromso"))
    await agent.run("I moved to Bergen.", session=session)
    await extractor.started.wait()  # the first is under way (shown Oslo) when the second run ends
    await agent.run("And now to Tromso.", session=session)
    extractor.gate.set()
    await facts.drain()
    assert "Hal lives in Bergen." in extractor.requests[-1].messages[0].text  # the second was shown Bergen
    [versions] = await facts.history(session)
    assert [v.text for v in versions] == ["Hal lives in Oslo.", "Hal lives in Bergen.", "Hal lives in Tromso."]
    assert [t for _, t in await facts.facts(session)] == ["Hal lives in Tromso."]
    assert facts._writing == {}  # (nothing kept once the user's extractions are done)


async def test_a_late_retry_never_ends_a_fact_before_it_began() -> None:
    """A turn retried alone after a newer fact was learned elsewhere: the version it ends lasts no time, never less."""
    clock = Clock(5.0)
    vectors = MemoryVectorStore()

    def provider(extractor: ScriptedModel) -> FactMemory:
        return FactMemory(extractor, vectors, HashEmbedder(), clock=clock, store_response_filter=lambda ms: [],
                          store_request_filter=lambda ms: [m for m in external_input(ms) if m.text.startswith("note:")])

    one, two = ScriptedModel([RuntimeError("extractor down")]), ScriptedModel([changes(add=("Dan likes blues.",))])
    agent_one = Agent(ScriptedModel(["ok", "ok"]), providers=[provider(one)])
    agent_two = Agent(ScriptedModel(["ok"]), providers=[provider(two)])
    first, second = await agent_one.session("a"), await agent_two.session("b")
    set_user_id(first, "dan")
    set_user_id(second, "dan")
    await agent_one.run("note: I like jazz, not blues.", session=first)  # at 5: its extraction fails
    clock.now = 10.0
    await agent_two.run("note: I like blues.", session=second)
    [[blues]] = await provider(two).history(second)
    one.enqueue(lambda r: changes(update={blues.id: "Dan likes jazz, not blues."}))
    clock.now = 20.0
    await agent_one.run("hello", session=first)  # nothing to learn of its own: the turn of 5 is retried alone
    [versions] = await provider(two).history(second)
    assert [(f.valid_from, f.valid_to) for f in versions] == [(10.0, 10.0), (10.0, None)]


async def test_as_of_takes_a_datetime_or_seconds_and_history_needs_a_store_that_lists() -> None:
    class Unlisted(MemoryVectorStore):
        records = VectorStore.records  # the base class's: a store of one's own that does not list

    facts = FactMemory(ScriptedModel(), Unlisted(), HashEmbedder())
    session = Session("s", state={"user_id": "dana"})
    with pytest.raises(UsageError, match="as_of must be a datetime or seconds since the epoch, got str"):
        await facts.recall(session, as_of="yesterday")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"Unlisted cannot list its records: implement VectorStore\.records\(\)"):
        await facts.history(session)
    assert await facts.history(Session("no-user")) == [] and await facts.recall(Session("no-user")) == []


Step = tuple[str, int]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "update", "end"]), st.integers(0, 5)), min_size=1, max_size=8))
def test_recall_as_of_any_time_matches_a_replay_of_the_changes(steps: list[Step]) -> None:
    """Whatever adds, updates and ends come, at every time recall gives what a replay says was true then,
    every version is kept, and each fact's versions follow one another without gaps or overlaps."""
    asyncio.run(_replay(steps))


async def _replay(steps: list[Step]) -> None:
    clock = Clock(0.0)
    extractor = ScriptedModel()
    facts = FactMemory(extractor, MemoryVectorStore(), HashEmbedder(), clock=clock, k=100)
    agent = Agent(ScriptedModel(), providers=[facts])
    session = await agent.session("s")
    set_user_id(session, "erin")
    true_at: list[set[str]] = []  # what the replay says is true after each step
    current: list[str] = []
    versions = 0
    for n, (kind, pick) in enumerate(steps):
        clock.now = 10.0 * (n + 1)
        text = f"Erin fact number {n}."

        def answer(request: ModelRequest, kind: str = kind, pick: int = pick, text: str = text) -> str:
            shown = known_ids(request)
            assert sorted(shown.values()) == sorted(current)  # the model sees exactly what is true now
            by_text = {t: i for i, t in shown.items()}
            if kind == "add" or not current:
                return changes(add=(text,))
            target = by_text[current[pick % len(current)]]
            return changes(update={target: text}) if kind == "update" else changes(delete=(target,))

        extractor.enqueue(answer)
        agent.model.enqueue("ok")  # type: ignore[attr-defined]
        await agent.run(f"step {n}", session=session)
        if kind == "add" or not current:
            current.append(text)
            versions += 1
        elif kind == "update":
            current[pick % len(current)] = text
            versions += 1
        else:
            current.pop(pick % len(current))
        true_at.append(set(current))
    for n, expected in enumerate(true_at):
        assert {t for _, t in await facts.facts(session, as_of=10.0 * (n + 1) + 5)} == expected
    assert await facts.facts(session, as_of=5.0) == []
    assert {t for _, t in await facts.facts(session)} == true_at[-1]
    history = await facts.history(session)
    assert sum(len(h) for h in history) == versions == await facts.vectors.count("facts")
    for h in history:
        assert all(a.valid_to == b.valid_from and a.replaced_by == b.id and b.replaces == a.id
                   for a, b in itertools.pairwise(h))
        assert all(f.valid_to is not None for f in h[:-1])
