#!/usr/bin/env python3
"""What `SQLiteStore`'s streamed log read buys: the tail of a 10,000-message session, streamed vs plain.

Streamed is the store's own `load` / `load_context` (`stores/_sqlite_log.py`: JSON arrays made by
``group_concat``, decoded on the event loop while the thread reads the next one). Plain is the same
transaction read row by row and decoded with the batch decoder (what the store does when an array
fails a check), and the reference decodes each row on its own. Rounds interleave the three, in a
rotating order; the figures are the median and the best of the rounds, in milliseconds.

    python bench/sqlite_log_bench.py                              # Markdown table on stdout
    python bench/sqlite_log_bench.py --json bench/results/sqlite_log.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _harness as h
from contextpipe import FunctionCall, FunctionResult, Message
from contextpipe.session import SessionKey
from contextpipe.stores import SQLiteStore
from contextpipe.stores import _sqlite_log as log
from contextpipe.stores._rows import make_page


def conversation(n: int) -> list[Message]:
    """Realistic shapes: questions, answers of varied length, a tool exchange every fourth turn."""
    out: list[Message] = []
    for i in range(n):
        if i % 8 == 5:
            out.append(Message("assistant", (FunctionCall(f"c{i}", "get_order", f'{{"id": "A-{i}"}}'),)))
        elif i % 8 == 6:
            out.append(Message("tool", (FunctionResult(f"c{i - 1}", f'{{"status": "shipped", "n": {i}}}'),)))
        elif i % 2 == 0:
            out.append(Message.user(f"Question {i}: where is my order, and when will it arrive?"))
        else:
            out.append(Message.assistant(f"Answer {i}: " + "it left the warehouse this morning. " * (1 + i % 5)))
    return out


async def measure(size: int, limit: int | None, rounds: int) -> dict[str, Any]:
    key = SessionKey("t", "s")
    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteStore(Path(folder) / "log.db") as store:
            await store.append("t", "s", conversation(size))

            async def streamed() -> int:
                return len((await store.load("t", "s", limit=limit)).messages)

            async def plain() -> int:
                end, rows = await store._run(store._load_rows, key, limit, None, None, None)
                return len(make_page(store.backend, key, end, rows or []).messages)

            async def one_by_one() -> int:
                end, rows = await store._run(store._load_rows, key, limit, None, None, None)
                return len(log.decode_rows_one_by_one(store.backend, key, end, rows or []).messages)

            cases: dict[str, Callable[[], Awaitable[int]]] = {
                "streamed": streamed, "plain": plain, "one_by_one": one_by_one}
            times: dict[str, list[float]] = {name: [] for name in cases}
            for name in cases:  # warm the page cache and the decoders
                await cases[name]()
            names = list(cases)
            for _, order in h.interleave(names, rounds):
                for name in order:
                    with h.Stopwatch() as watch:
                        count = await cases[name]()
                    times[name].append(watch.wall * 1000)
            assert count == (size if limit is None else min(limit, size))
    median = {name: h.stats(t)["median"] for name, t in times.items()}
    return {
        "size": size, "limit": limit, "rounds": rounds,
        "median_ms": {n: round(v, 2) for n, v in median.items()},
        "best_ms": {n: round(min(t), 2) for n, t in times.items()},
        "streamed_over_plain": round(median["streamed"] / median["plain"], 3),
        "streamed_over_one_by_one": round(median["streamed"] / median["one_by_one"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--limits", default="none,1000", help="tails to load (none: the whole log)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    limits = [None if x == "none" else int(x) for x in args.limits.split(",")]
    results = [asyncio.run(measure(args.size, limit, args.rounds)) for limit in limits]
    print("| messages | tail | streamed ms | plain ms | one by one ms | streamed / plain |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        m = r["median_ms"]
        print(f"| {r['size']:,} | {r['limit'] or 'all'} | {m['streamed']} | {m['plain']} | {m['one_by_one']} | "
              f"{r['streamed_over_plain']} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"bench": "bench/sqlite_log_bench.py", "python": sys.version.split()[0],
                    "machine": platform.machine(), "note": "median of interleaved rounds; ms per load",
                    "results": results}
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
