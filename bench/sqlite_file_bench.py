"""What checking that the SQLite file is still at its path costs a write: µs per append, with and without it.

    PYTHONPATH=src python bench/sqlite_file_bench.py [--appends N] [--rounds R] [--out bench/results/sqlite_file.json]

`SQLiteStore` stats its path before and after every commit (`contextpipe._sqlite.OpenedFile`), so a file
deleted, replaced or moved while the store is open fails the next write instead of taking writes
nobody will read. Measured: the check alone, and a one-message append with ``synchronous="NORMAL"``
(no fsync: the cheapest write, where the check weighs most) with the check and without it
(``store._file = None``, the store as it was before), in interleaved rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import _harness as h
from contextpipe import Message
from contextpipe._sqlite import OpenedFile
from contextpipe.stores import SQLiteStore


def check_cost(path: str, calls: int) -> float:
    """µs per `OpenedFile.check` of an existing file."""
    opened = OpenedFile(path)
    t0 = time.perf_counter()
    for _ in range(calls):
        opened.check()
    return (time.perf_counter() - t0) / calls * 1e6


async def append_cost(store: SQLiteStore, session: str, appends: int) -> float:
    """µs per one-message append (wall)."""
    t0 = time.perf_counter()
    for i in range(appends):
        await store.append("bench", session, [Message.user(f"message {i}")])
    return (time.perf_counter() - t0) / appends * 1e6


async def main(appends: int, rounds: int, out: Path | None) -> None:
    results = h.Results("sqlite_file", "What SQLiteStore's check that its file is still at its path costs a write",
                        notes=["'checked' stats the path before and after each commit; 'unchecked' is the store "
                               "without the "
                               "check; synchronous=NORMAL, one message per append, interleaved rounds"])
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "bench.db")
        samples: dict[str, list[float]] = {"checked": [], "unchecked": []}
        async with SQLiteStore(path, synchronous="NORMAL") as store:
            await store.append("bench", "warm", [Message.user("warm up")])
            opened = store._file
            for turn, order in h.interleave(["checked", "unchecked"], rounds):
                for side in order:
                    store._file = opened if side == "checked" else None
                    samples[side].append(await append_cost(store, f"{side}-{turn}", appends))
            store._file = opened
        checks = [check_cost(path, 20_000) for _ in range(rounds)]
    results.add("stat of the path", "checked", "µs per check", "µs", samples=checks)
    for side, values in samples.items():
        results.add("append one message", side, "µs per append", "µs", samples=values)
    ratio = results.ratio("append one message", "µs per append", side="checked", over="unchecked")
    check = results.get("stat of the path", "checked", "µs per check")["value"]
    print(f"check {check:.2f} µs; append {results.get('append one message', 'checked', 'µs per append')['value']:.1f} "
          f"µs checked, {results.get('append one message', 'unchecked', 'µs per append')['value']:.1f} µs "
          f"unchecked ({ratio:.3f}x)")
    results.write(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    h.out_argument(parser, "sqlite_file")
    args = parser.parse_args()
    asyncio.run(main(args.appends, args.rounds, args.out))
