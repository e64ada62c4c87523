#!/usr/bin/env python3
"""The embedded SQLite vector store (HNSW index, usearch) as it grows; optionally pgvector too.

    python bench/vector_bench.py                        # SQLite: 10,000 and 100,000 vectors of 384 dimensions
    python bench/vector_bench.py --sizes 1000000        # the 1,000,000 run (long: builds the index once)
    python bench/vector_bench.py --pgvector DSN         # also PostgreSQL + pgvector (HNSW)

Per size: loading time (batches of 5,000, index kept up to date as they land), one-record upsert p50
(a committed SQLite transaction plus the index update) and search p50 (top 10), each with the CPU time
the process spent (a busy machine inflates it less than wall-clock time), search filtered to 1% of the
records, recall@10 against exact search over the same vectors, and a cold start (another process's
first search: the saved index loaded). The vectors are 2,000 Gaussian clusters on the unit sphere,
shaped like sentence embeddings; the queries are drawn the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from contextpipe.vectors import SQLiteVectorStore, VectorRecord, VectorStore


def clustered(rng: np.random.Generator, centres: np.ndarray[Any, Any], m: int) -> np.ndarray[Any, Any]:
    x = centres[rng.integers(0, len(centres), m)] + 0.6 * rng.standard_normal((m, centres.shape[1]), dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def exact_top(matrix: np.ndarray[Any, Any], query: np.ndarray[Any, Any], k: int) -> set[int]:
    scores = matrix @ query
    return set(np.argpartition(-scores, k)[:k].tolist())


async def bench(store: VectorStore, name: str, sizes: list[int], dim: int, queries: int, inserts: int) -> None:
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((2000, dim), dtype=np.float32)
    blocks: list[np.ndarray[Any, Any]] = []
    have = 0
    for n in sizes:
        started = time.perf_counter()
        while have < n:
            batch = min(5000, n - have)
            vectors = clustered(rng, centres, batch)
            blocks.append(vectors)
            await store.upsert("bench", [VectorRecord(f"v{have + i}", vectors[i], f"text {have + i}",
                                                      {"user_id": f"u{(have + i) % 100}"}) for i in range(batch)])
            if have == 0:
                await store.search("bench", vectors[0], k=1)  # from now on the index follows each upsert
            have += batch
        load = time.perf_counter() - started
        matrix = np.concatenate(blocks)
        probes = clustered(rng, centres, queries)
        times, filtered, found, cpu = [], [], 0, []
        for q in probes:
            t0, c0 = time.perf_counter(), time.process_time()
            hits = await store.search("bench", q, k=10)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            found += len(exact_top(matrix, q, 10) & {int(h.id[1:]) for h in hits})
            t0 = time.perf_counter()
            await store.search("bench", q, k=10, where={"user_id": "u7"})
            filtered.append(time.perf_counter() - t0)
        insert_times, insert_cpu = [], []
        extra = clustered(rng, centres, inserts)
        for i, v in enumerate(extra):
            t0, c0 = time.perf_counter(), time.process_time()
            await store.upsert("bench", [VectorRecord(f"x{have}-{i}", v, "inserted", {"user_id": "new"})])
            insert_times.append(time.perf_counter() - t0)
            insert_cpu.append(time.process_time() - c0)
        await store.delete("bench", where={"user_id": "new"})
        print(f"| {name} | {n:,} | {load:,.1f} | {statistics.median(insert_times) * 1000:,.2f} "
              f"({statistics.median(insert_cpu) * 1000:,.2f}) | {statistics.median(times) * 1000:,.2f} "
              f"({statistics.median(cpu) * 1000:,.2f}) | {statistics.median(filtered) * 1000:,.2f} | "
              f"{found / (10 * len(probes)):.3f} |", flush=True)
    if isinstance(store, SQLiteVectorStore):
        await store.save_indexes()
        cold = SQLiteVectorStore(store.path)  # another process's view: loads the saved index and metadata
        started = time.perf_counter()
        await cold.search("bench", probes[0], k=10)
        print(f"| {name}, cold start (saved index loaded) | {have:,} | {time.perf_counter() - started:,.1f} "
              "| | | | |", flush=True)
        await cold.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--inserts", type=int, default=200)
    parser.add_argument("--pgvector", default=None, help="DSN of a PostgreSQL server with pgvector")
    parser.add_argument("--pgvector-sizes", default="10000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| store | vectors | load s | upsert one ms, p50 (CPU ms) | search ms, p50 (CPU ms) | "
          "filtered to 1% ms (p50) | recall@10 vs exact |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteVectorStore(Path(tmp) / "vectors.db")
        await bench(store, "SQLite + usearch HNSW", sizes, args.dim, args.queries, args.inserts)
        await store.close()
    if args.pgvector:
        from contextpipe.vectors.pgvector import PgVectorStore

        pg = PgVectorStore(args.pgvector, table=f"bench{int(time.time())}")
        await bench(pg, "pgvector (HNSW)", [int(x) for x in args.pgvector_sizes.split(",")], args.dim, args.queries,
                    args.inserts)
        await pg.close()


if __name__ == "__main__":
    asyncio.run(main())
