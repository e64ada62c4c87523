#!/usr/bin/env python3
"""Session store benchmark: per-step append latency and tail-load latency as sessions grow.

For each backend and each session size N (100 to 1,000,000 messages), a session is filled with N
messages, then two operations are timed many times:

- append: one step of a run, two messages appended under the run's lease (what per-step
  persistence does after each model call);
- tail: ``load(limit=50)``, the bounded load a history provider does before a run.

The point is that neither cost grows with N: the table ends with the ratio of the largest session's
median to the smallest's.

    python bench/store_bench.py                                   # memory and sqlite
    python bench/store_bench.py --backends sqlite,postgres,redis \\
        --postgres postgresql://postgres@127.0.0.1:54329/postgres --redis redis://127.0.0.1:63799/0
    python bench/store_bench.py --sizes 100,10000 --iterations 100    # quicker
    python bench/store_bench.py --backends memory,sqlite,postgres,redis --out bench/results/stores.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from typing import Any

import _harness as h
from contextpipe import Message
from contextpipe.stores import MemoryStore, SessionStore

FILL_BATCH = 5000


def open_store(backend: str, args: argparse.Namespace, workdir: str) -> SessionStore:
    if backend == "memory":
        return MemoryStore()
    if backend == "sqlite":
        from contextpipe.stores import SQLiteStore

        return SQLiteStore(os.path.join(workdir, "bench.db"))
    if backend == "postgres":
        from contextpipe.stores import PostgresStore

        if not args.postgres:
            raise SystemExit("--postgres DSN is needed for the postgres backend")
        return PostgresStore(args.postgres)
    if backend == "redis":
        from contextpipe.stores import RedisStore

        if not args.redis:
            raise SystemExit("--redis URL is needed for the redis backend")
        return RedisStore(args.redis)
    raise SystemExit(f"unknown backend {backend!r}")


async def fill(store: SessionStore, tenant: str, session_id: str, n: int) -> float:
    with h.Stopwatch() as watch:
        done = 0
        while done < n:
            count = min(FILL_BATCH, n - done)
            batch = [Message.user(f"This is message number {done + i} in the conversation history.")
                     if (done + i) % 2 == 0 else
                     Message.assistant(f"This is message number {done + i} in the conversation history.")
                     for i in range(count)]
            await store.append(tenant, session_id, batch)
            done += count
    return watch.wall


async def timed(op: Any, iterations: int) -> list[float]:
    """Wall µs of each of `iterations` calls, after a tenth as many untimed."""
    return [s.wall * 1e6 for s in await h.ameasure(lambda _: op(), iterations, warmup=max(3, iterations // 10))]


async def bench_backend(backend: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as workdir:
        store = open_store(backend, args, workdir)
        tenant = f"bench{uuid.uuid4().hex[:8]}"
        try:
            for n in args.sizes:
                session_id = f"n{n}"
                fill_s = await fill(store, tenant, session_id, n)
                lease = await store.acquire_lease(tenant, session_id, "bench", ttl=600)

                async def append_step(session_id: str = session_id, lease: Any = lease) -> None:
                    await store.append(tenant, session_id, [Message.user("hi"), Message.assistant("ok")], lease=lease)

                async def tail(session_id: str = session_id) -> None:
                    page = await store.load(tenant, session_id, limit=50)
                    assert len(page.messages) == 50

                append = await timed(append_step, args.iterations)
                load = await timed(tail, args.iterations)
                await store.release_lease(lease)
                rows.append({"backend": backend, "N": n, "fill_s": round(fill_s, 1), "append": append, "tail50": load})
                print(f"  {backend:<9} N={n:>9,}  append median {h.stats(append)['median']:>9,.1f} us  "
                      f"tail(50) median {h.stats(load)['median']:>9,.1f} us   (filled in {fill_s:.1f} s)",
                      file=sys.stderr, flush=True)
            for n in args.sizes:
                await store.delete_session(tenant, f"n{n}")
        finally:
            await store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="memory,sqlite")
    parser.add_argument("--sizes", default="100,1000,10000,100000,1000000")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--postgres", default=os.environ.get("CONTEXTPIPE_TEST_POSTGRES_DSN"))
    parser.add_argument("--redis", default=os.environ.get("CONTEXTPIPE_TEST_REDIS_URL"))
    h.out_argument(parser, "stores")
    args = parser.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",")]
    out = h.Results("stores", "Session stores as the session grows: one step's append (two messages, under the "
                    "run's lease) and a 50-message tail load, wall µs; the ratio is the largest session's "
                    "median over the smallest's")
    results: list[dict[str, Any]] = []
    for backend in args.backends.split(","):
        results += asyncio.run(bench_backend(backend.strip(), args))

    smallest, largest = min(args.sizes), max(args.sizes)
    for r in results:
        for op, metric in (("append", "append"), ("tail50", "tail(50)")):
            out.add(r["backend"], f"N={r['N']:,}", metric, "µs", samples=r[op], keep_samples=False,
                    fill_s=r["fill_s"])
    if largest != smallest:
        for backend in dict.fromkeys(r["backend"] for r in results):
            for metric in ("append", "tail(50)"):
                out.ratio(backend, metric, side=f"N={largest:,}", over=f"N={smallest:,}")
    print(h.table(out.write(args.out)))


if __name__ == "__main__":
    main()
