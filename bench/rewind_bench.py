#!/usr/bin/env python3
"""What rewinding and forking cost on `SQLiteStore`, at 10,000 and 1,000,000 messages.

For each size, one session holds a realistic log (`sqlite_log_bench.conversation`). Measured, in
milliseconds (median of the rounds):

- ``probe``: finding a session's rewinds when it has none (the one index lookup every fresh load pays);
- ``rewind``: `Agent.rewind` to ten messages before the end (lease, probe, snap, one marker appended);
- ``load_after_rewind``: `History.load_view` (default bound) of the rewound session, stepping over the range;
- ``fork``: `Agent.fork` of the whole view into a new session. It copies (see `contextpipe.rewind.fork`),
  so it grows with the log; ``fork_rows_per_s`` says how fast.

    python bench/rewind_bench.py --json bench/results/rewind.json
    python bench/rewind_bench.py --sizes 10000 --rounds 5        # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import _harness as h
from contextpipe import Agent
from contextpipe.providers import History
from contextpipe.rewind import rewound_ranges, view_messages
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel
from sqlite_log_bench import conversation


async def measure(size: int, rounds: int, fork_rounds: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"probe": [], "rewind": [], "load_after_rewind": [], "fork": []}
    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteStore(Path(folder) / "log.db") as store:
            log = conversation(size)
            for start in range(0, size, 10_000):
                await store.append("t", "s", log[start:start + 10_000])
            agent = Agent(ScriptedModel([]), providers=[History(store)])
            for _ in range(rounds):
                with h.Stopwatch() as watch:
                    await rewound_ranges(store, "t", "s")
                times["probe"].append(watch.wall * 1000)
            session = await agent.session("s", tenant="t")
            history = History(store)
            for i in range(rounds):
                end = (await view_messages(store, "t", "s", limit=1))[0][0]
                await store.append("t", "s", conversation(12)[:10])  # something to rewind each round
                with h.Stopwatch() as watch:
                    await agent.rewind("s", to=end, tenant="t")
                times["rewind"].append(watch.wall * 1000)
                with h.Stopwatch() as watch:
                    view = await history.load_view(session)
                times["load_after_rewind"].append(watch.wall * 1000)
                assert view.messages, i
            for i in range(fork_rounds):
                end = (await view_messages(store, "t", "s", limit=1))[0][0]
                with h.Stopwatch() as watch:
                    await agent.fork("s", at=end, new_id=f"f{i}", tenant="t")
                times["fork"].append(watch.wall * 1000)
    median = {name: h.stats(t)["median"] for name, t in times.items()}
    return {
        "size": size, "rounds": rounds, "fork_rounds": fork_rounds,
        "median_ms": {n: round(v, 3) for n, v in median.items()},
        "best_ms": {n: round(min(t), 3) for n, t in times.items()},
        "fork_rows_per_s": round(size / (median["fork"] / 1000)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--fork-rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [asyncio.run(measure(int(s), args.rounds, args.fork_rounds)) for s in args.sizes.split(",")]
    print("| messages | probe ms | rewind ms | load after rewind ms | fork ms | fork rows/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        m = r["median_ms"]
        print(f"| {r['size']:,} | {m['probe']} | {m['rewind']} | {m['load_after_rewind']} | {m['fork']} | "
              f"{r['fork_rows_per_s']:,} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"bench": "bench/rewind_bench.py", "python": sys.version.split()[0],
                    "machine": platform.machine(), "store": "sqlite", "commit": h.git_commit(),
                    "note": "median of the rounds; ms per operation", "results": results}
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
