#!/usr/bin/env python3
"""What the session queue costs: enqueue latency, and the queue read a run makes before each model call.

    PYTHONPATH=src python bench/queue_latency.py [--enqueues 1000] [--runs 30] [--backends memory,sqlite,...]
        [--out bench/results/queue-latency.json]

Two tables (``queue-latency-enqueue.json``, ``queue-latency-idle-read.json`` beside ``--out``'s stem):

- **enqueue**: `Agent.enqueue` (``asap``) of a short message to one of ten sessions, one call at a time;
  p50 and p99 of `--enqueues` calls, in ms. SQLite is the default `SQLiteStore` (WAL, ``synchronous=FULL``:
  each enqueue is a transaction that reaches the disk).
- **idle read**: a run's inbox asks the store for queued messages at every step boundary (before each model
  call). Measured on runs with nothing queued: a 5-model-call tool loop (4 tool calls, then an answer) on a
  fresh session, ``with`` the inbox's read and ``without`` it (``contextpipe._run.inbox.deliver`` replaced by
  one that returns nothing: the seam the run calls; no other change), the sides alternating run by run, the
  side going first rotating. Per model call: the run's median wall time over 5. ``read alone`` is the
  read itself (`contextpipe.queue.pending` on an empty queue), the figure the difference should come near;
  on a shared machine the run difference is within the runs' noise, so read both.

PostgreSQL and Redis are measured when ``CONTEXTPIPE_TEST_POSTGRES_DSN`` / ``CONTEXTPIPE_TEST_REDIS_URL`` are set
(after ``source scripts/services.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import _harness as h
import contextpipe._run.inbox as inbox
from contextpipe import Agent, tool
from contextpipe.queue import pending
from contextpipe.session import SessionKey
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call

CALLS = 5
"""Model calls per measured run."""


@tool
def lookup(city: str) -> str:
    """Return the location code of a city."""
    return city.upper()[:3]


def open_store(backend: str, folder: str) -> SessionStore | None:
    """The store of `backend`, or None when its server is not configured."""
    if backend == "memory":
        return MemoryStore()
    if backend == "sqlite":
        return SQLiteStore(Path(folder) / "queue.db")
    if backend == "postgres" and (dsn := os.environ.get("CONTEXTPIPE_TEST_POSTGRES_DSN")):
        from contextpipe.stores import PostgresStore

        return PostgresStore(dsn)
    if backend == "redis" and (url := os.environ.get("CONTEXTPIPE_TEST_REDIS_URL")):
        from contextpipe.stores import RedisStore

        return RedisStore(url)
    return None


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


async def timed(op: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await op()
    return (time.perf_counter() - start) * 1000


async def enqueue_latency(store: SessionStore, tenant: str, count: int) -> list[float]:
    agent = Agent(ScriptedModel(), store=store)
    for i in range(20):  # warm up: connections, prepared statements, the queue table
        await agent.enqueue(f"warm-{i % 10}", "warm up", tenant=tenant)
    return [await timed(lambda i=i: agent.enqueue(f"s-{i % 10}", f"message {i}", tenant=tenant))  # type: ignore[misc]
            for i in range(count)]


async def nothing_queued(store: SessionStore, key: SessionKey, lease: object) -> list[object]:
    """The ``without`` side's delivery: no read of the queue."""
    return []


async def idle_runs(store: SessionStore, tenant: str, runs: int) -> dict[str, list[float]]:
    """Wall ms per model call of runs with nothing queued, with and without the inbox's read."""
    real = inbox.deliver
    sides: dict[str, list[float]] = {"with": [], "without": []}
    script = [tool_call("lookup", city=f"c{i}") for i in range(CALLS - 1)] + ["done"]
    for turn, order in h.interleave(list(sides), rounds=runs + 2):
        for side in order:
            inbox.deliver = real if side == "with" else nothing_queued  # type: ignore[assignment]
            agent = Agent(ScriptedModel(script), tools=[lookup], store=store)
            session = await agent.session(uuid.uuid4().hex, tenant=tenant)
            elapsed = await timed(lambda agent=agent, session=session: agent.run("Codes?", session=session))
            if turn >= 2:  # the first two rounds warm up
                sides[side].append(elapsed / CALLS)
    inbox.deliver = real
    return sides


async def bench(backend: str, args: argparse.Namespace, enqueue: h.Results, idle: h.Results) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(backend, folder)
        if store is None:
            print(f"{backend}: no server configured, skipped")
            return False
        tenant = f"bench{uuid.uuid4().hex[:8]}"
        try:
            samples = await enqueue_latency(store, tenant, args.enqueues)
            enqueue.add(backend, "p50", "enqueue", "ms", value=statistics.median(samples))
            enqueue.add(backend, "p99", "enqueue", "ms", value=p99(samples))
            sides = await idle_runs(store, tenant, args.runs)
            read = [await timed(lambda: pending(store, SessionKey(tenant, "empty"))) for _ in range(args.enqueues)]
            for side, values in sides.items():
                idle.add(backend, side, "per model call", "ms", samples=values, keep_samples=False)
            idle.add(backend, "added", "per model call", "ms",
                     value=statistics.median(sides["with"]) - statistics.median(sides["without"]))
            idle.add(backend, "read alone", "per model call", "ms", samples=read, keep_samples=False)
            idle.ratio(backend, "per model call", side="with", over="without")
        finally:
            await store.close()
    print(f"{backend}: enqueue p50 {statistics.median(samples):.3f} ms p99 {p99(samples):.3f} ms; per model call "
          f"with {statistics.median(sides['with']):.3f} without {statistics.median(sides['without']):.3f} "
          f"read alone {statistics.median(read):.3f} ms")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="memory,sqlite,postgres,redis")
    parser.add_argument("--enqueues", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=30, help="measured runs per side and backend")
    h.out_argument(parser, "queue-latency")
    args = parser.parse_args()
    enqueue = h.Results("queue-latency-enqueue", "Agent.enqueue latency, one call at a time, by store", notes=[
        f"{args.enqueues} enqueues of a short `asap` message over ten sessions after 20 to warm up; SQLite is "
        "the default `SQLiteStore` (WAL, `synchronous=FULL`), PostgreSQL and Redis local servers."])
    idle = h.Results("queue-latency-idle-read", "What the inbox's queue read adds per model call, nothing queued",
                     notes=[f"Wall time per model call of a {CALLS}-call tool loop on a fresh session, nothing "
                            "queued: `with` the read the inbox makes before each model call, `without` it (the "
                            "inbox's `deliver` replaced by one returning nothing), alternating run by run; "
                            "`added` is the difference of the medians, `read alone` one `contextpipe.queue."
                            "pending` call on an empty queue. On a shared machine the difference of two runs "
                            "is within their noise: `read alone` is the figure to trust."])
    for backend in args.backends.split(","):
        asyncio.run(bench(backend, args, enqueue, idle))
    for results, suffix in ((enqueue, "enqueue"), (idle, "idle-read")):
        out = args.out.with_name(f"{args.out.stem}-{suffix}.json") if args.out else None
        print(h.table(results.write(out)))


if __name__ == "__main__":
    main()
