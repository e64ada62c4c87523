"""What the heartbeat's shared first-renewal timer buys: µs per short run, many runs at once on one loop.

    PYTHONPATH=src python bench/heartbeat_bench.py [runs]

Each run holds its session's lease for one model call (a scripted reply) on a `MemoryStore`; all
runs start together. ``shared_timer=True`` (the default) waits for the first renewal on one timer
per event loop; ``shared_timer=False`` starts a heartbeat task per run.
"""

from __future__ import annotations

import asyncio
import sys

import _harness as h
from contextpipe import Agent, Durability, Heartbeat
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel


async def _per_run(runs: int, shared: bool) -> float:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["ok"] * runs), store=store, default_history=False,  # the lease timer alone
                  durability=Durability(heartbeat=Heartbeat(shared_timer=shared)))
    sessions = [await agent.session(f"s{i}") for i in range(runs)]
    with h.Stopwatch() as watch:
        await asyncio.gather(*(agent.run("hi", session=s) for s in sessions))
    return watch.wall / runs * 1e6


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    best = {True: float("inf"), False: float("inf")}
    for _ in range(5):
        for shared in (True, False):
            best[shared] = min(best[shared], asyncio.run(_per_run(runs, shared)))
    print(f"{runs} concurrent runs: shared timer {best[True]:.1f} µs/run, "
          f"a task per run {best[False]:.1f} µs/run ({best[False] / best[True]:.2f}x)")


if __name__ == "__main__":
    main()
