"""How fast, and in what order, 50 runs of one process waiting on one busy session get its lease.

    PYTHONPATH=src python bench/lease_line_bench.py [--runs 50] [--rounds 5] [--backends sqlite,postgres]
        [--out bench/results/lease-line.json]

`SessionStore.acquire_lease` with ``wait`` puts the runs of a process waiting on one session in a line
(`contextpipe.stores._lease_line`): only the head asks the store, and a release by a run of this
process wakes the next at once. ``store._lease_polling = True`` is the store before the line, every
waiter polling the store on its own (5 ms doubling to 100 ms). Measured: a run holds the session's
lease; `--runs` runs arrive one after another, each waiting for the lease, appending one message
with it and releasing it; the clock runs from the first holder's release until the last run has
released. Also counted: the runs that got the lease while a run that arrived before them still
waited (out of order). The two sides alternate round by round, the side going first rotating;
PostgreSQL is measured when ``CONTEXTPIPE_TEST_POSTGRES_DSN`` is set (after ``source
scripts/services.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import _harness as h
from contextpipe import Message
from contextpipe.stores import SessionStore, SQLiteStore

SIDES = ["line", "polling"]


async def queue_up(store: SessionStore, runs: int) -> tuple[float, int]:
    """Seconds from the holder's release until `runs` waiting runs have each held and released the lease,
    and how many of them got it ahead of an earlier arrival."""
    tenant, session = "bench", uuid.uuid4().hex
    held = await store.acquire_lease(tenant, session, "holder", ttl=600)
    served: list[int] = []

    async def run(i: int) -> None:
        lease = await store.acquire_lease(tenant, session, f"run-{i}", ttl=600, wait=600)
        served.append(i)
        await store.append(tenant, session, [Message.user(f"run {i}")], lease=lease)
        await store.release_lease(lease)

    tasks = []
    for i in range(runs):
        tasks.append(asyncio.create_task(run(i)))
        await asyncio.sleep(0)  # it has asked (and joined the line) before the next arrives
    t0 = time.perf_counter()
    await store.release_lease(held)
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    out_of_order = sum(1 for k, i in enumerate(served) if any(j < i for j in served[k + 1:]))
    return wall, out_of_order


async def open_backend(backend: str, folder: str) -> SessionStore:
    if backend == "sqlite":
        return SQLiteStore(Path(folder) / "lease.db")
    from contextpipe.stores import PostgresStore

    return PostgresStore(os.environ["CONTEXTPIPE_TEST_POSTGRES_DSN"], max_size=4)


async def main(runs: int, rounds: int, backends: list[str], out: Path | None) -> None:
    results = h.Results("lease-line", f"{runs} runs of one process queued on one busy session: the line "
                        "against every waiter polling the store on its own",
                        notes=["'line': the runs of the process wait in line (the head asks the store; a "
                               "release wakes the next at once); 'polling': store._lease_polling = True, each "
                               "waiter asks the store every 5 ms doubling to 100 ms. Each run appends one "
                               "message with the lease, then releases it; time from the first holder's release "
                               "to the last run's; 'out of order': runs that got the lease while an earlier "
                               "arrival still waited (median over rounds); sides interleaved round by round"])
    with tempfile.TemporaryDirectory() as folder:
        for backend in backends:
            store = await open_backend(backend, folder)
            try:
                await queue_up(store, 3)  # warm up: tables, connections, the line's import
                walls: dict[str, list[float]] = {side: [] for side in SIDES}
                orders: dict[str, list[float]] = {side: [] for side in SIDES}
                for _, order in h.interleave(SIDES, rounds):
                    for side in order:
                        store._lease_polling = side == "polling"
                        wall, out_of_order = await queue_up(store, runs)
                        walls[side].append(wall)
                        orders[side].append(out_of_order)
                        print(f"{backend} {side}: {wall:.3f} s, {out_of_order} out of order")
            finally:
                await store.close()
            name = {"sqlite": "SQLiteStore", "postgres": "PostgresStore"}[backend]
            for side in SIDES:
                results.add(f"{name}: all {runs} served", side, "wall", "s", samples=walls[side])
                results.add(f"{name}: out of order", side, "runs", "", samples=orders[side])
            ratio = results.ratio(f"{name}: all {runs} served", "wall", side="polling", over="line")
            print(f"{backend}: polling takes {ratio:.2f}x the line's time")
    results.write(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgres",
                        help="comma-separated; postgres needs CONTEXTPIPE_TEST_POSTGRES_DSN (skipped without it)")
    h.out_argument(parser, "lease-line")
    args = parser.parse_args()
    chosen = [b for b in args.backends.split(",") if b != "postgres" or os.environ.get("CONTEXTPIPE_TEST_POSTGRES_DSN")]
    asyncio.run(main(args.runs, args.rounds, chosen, args.out))
