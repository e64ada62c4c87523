#!/usr/bin/env python3
"""Vector search latency of the embedded SQLite vector store (and optionally pgvector) as it grows.

    python bench/vector_bench.py                    # SQLite, up to 100,000 vectors of 384 dimensions
    python bench/vector_bench.py --pgvector DSN     # also PostgreSQL + pgvector (HNSW)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from contextpipe.vectors import SQLiteVectorStore, VectorRecord, VectorStore


async def bench(store: VectorStore, name: str, sizes: list[int], dim: int, queries: int) -> None:
    rng = np.random.default_rng(7)
    have = 0
    for n in sizes:
        while have < n:
            batch = min(5000, n - have)
            vectors = rng.standard_normal((batch, dim), dtype=np.float32)
            await store.upsert("bench", [VectorRecord(f"v{have + i}", vectors[i], f"text {have + i}",
                                                      {"user_id": f"u{(have + i) % 100}"})
                                         for i in range(batch)])
            have += batch
        probes = rng.standard_normal((queries, dim), dtype=np.float32)
        started = time.perf_counter()
        await store.search("bench", probes[0], k=5)
        first = time.perf_counter() - started
        times, filtered = [], []
        for q in probes:
            t0 = time.perf_counter()
            hits = await store.search("bench", q, k=5)
            times.append(time.perf_counter() - t0)
            assert len(hits) == 5
            t0 = time.perf_counter()
            await store.search("bench", q, k=5, where={"user_id": "u7"})
            filtered.append(time.perf_counter() - t0)
        print(f"| {name} | {n:,} | {first * 1000:,.1f} | {statistics.median(times) * 1000:,.2f} | "
              f"{statistics.median(filtered) * 1000:,.2f} |", flush=True)
    if isinstance(store, SQLiteVectorStore):
        cold = SQLiteVectorStore(store.path)  # another process's view: loads the collection once
        started = time.perf_counter()
        await cold.search("bench", probes[0], k=5)
        print(f"| {name}, cold start | {have:,} | {(time.perf_counter() - started) * 1000:,.1f} | | |", flush=True)
        await cold.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--pgvector", default=None, help="DSN of a PostgreSQL server with pgvector")
    parser.add_argument("--pgvector-sizes", default="1000,10000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| store | vectors | first search ms | search ms (median) | search filtered to 1% ms (median) |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteVectorStore(Path(tmp) / "vectors.db")
        await bench(store, "SQLite (exact)", sizes, args.dim, args.queries)
        await store.close()
    if args.pgvector:
        from contextpipe.vectors.pgvector import PgVectorStore

        pg = PgVectorStore(args.pgvector, table=f"bench{int(time.time())}")
        await bench(pg, "pgvector (HNSW)", [int(x) for x in args.pgvector_sizes.split(",")], args.dim, args.queries)
        await pg.close()


if __name__ == "__main__":
    asyncio.run(main())
