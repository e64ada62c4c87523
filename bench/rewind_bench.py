#!/usr/bin/env python3
"""What rewinding and forking cost, at 10,000 and 1,000,000 messages, on SQLite (or PostgreSQL).

Redis has no copy of its own (a fork copies page by page there: `RedisStore` says why), so it is not measured.

For each size, one session holds a realistic log (`sqlite_log_bench.conversation`). Measured, in
milliseconds (median of the rounds):

- ``probe``: finding a session's rewinds when it has none (the one index lookup every fresh load pays);
- ``rewind``: `Agent.rewind` to ten messages before the end (lease, probe, snap, one marker appended);
- ``load after rewind``: `History.load_view` (default bound) of the rewound session, stepping over the range;
- ``fork``: `Agent.fork` of the whole view into a new session, two ways, interleaved: the store copying
  the rows on its side (``SessionStore.copy_view``, what a fork does) and page by page, decoded and
  appended again (``rewind.copy_pages``, the plain copy: the store's copy switched off). Each fork is
  deleted after it is timed. ``fork rows/s`` says how fast each copies.

    python bench/rewind_bench.py --sizes 10000 --fork-rounds 7 --out bench/results/rewind.json
    python bench/rewind_bench.py --sizes 1000000 --out bench/results/rewind-1m.json
    python bench/rewind_bench.py --store postgres --url postgresql://... --sizes 10000 \\
        --fork-rounds 7 --out bench/results/rewind-postgres.json
    python bench/rewind_bench.py --sizes 10000 --rounds 5        # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import _harness as h
from contextpipe import Agent
from contextpipe.providers import History
from contextpipe.rewind import rewound_ranges, view_messages
from contextpipe.stores import PostgresStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel
from sqlite_log_bench import conversation

STORE, PLAIN = "copied by the store", "copied page by page"


@contextlib.asynccontextmanager
async def opened(kind: str, url: str | None) -> AsyncIterator[SessionStore]:
    """The store to measure: a fresh SQLite file, or the server at `url`."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            async with SQLiteStore(Path(folder) / "log.db") as store:
                yield store
        return
    if url is None:
        raise SystemExit(f"--store {kind} needs --url (the server to measure against)")
    async with PostgresStore(url) as server:
        yield server


async def offered_none(*args: object, **kwargs: object) -> None:
    """`SessionStore.copy_view` switched off: `rewind.fork` falls back to the page-by-page copy."""


async def measure(results: h.Results, store: SessionStore, size: int, rounds: int, fork_rounds: int) -> None:
    tenant, case = f"bench-{uuid.uuid4().hex[:8]}", f"{size:,} messages"
    times: dict[str, list[float]] = {"probe": [], "rewind": [], "load after rewind": [], STORE: [], PLAIN: []}
    log = conversation(size)
    for start in range(0, size, 10_000):
        await store.append(tenant, "s", log[start:start + 10_000])
    agent = Agent(ScriptedModel([]), providers=[History(store)])
    for _ in range(rounds):
        with h.Stopwatch() as watch:
            await rewound_ranges(store, tenant, "s")
        times["probe"].append(watch.wall * 1000)
    session = await agent.session("s", tenant=tenant)
    history = History(store)
    for i in range(rounds):
        end = (await view_messages(store, tenant, "s", limit=1))[0][0]
        await store.append(tenant, "s", conversation(12)[:10])  # something to rewind each round
        with h.Stopwatch() as watch:
            await agent.rewind("s", to=end, tenant=tenant)
        times["rewind"].append(watch.wall * 1000)
        with h.Stopwatch() as watch:
            view = await history.load_view(session)
        times["load after rewind"].append(watch.wall * 1000)
        assert view.messages, i
    end = (await view_messages(store, tenant, "s", limit=1))[0][0]
    for turn, sides in h.interleave([STORE, PLAIN], fork_rounds):
        for side in sides:
            if side == PLAIN:
                store.copy_view = offered_none  # type: ignore[method-assign]
            try:
                with h.Stopwatch() as watch:
                    forked = await agent.fork("s", at=end, new_id=f"f{turn}", tenant=tenant)
            finally:
                vars(store).pop("copy_view", None)
            times[side].append(watch.wall * 1000)
            assert (await store.load(tenant, forked.id, limit=1)).last_seq == size, side  # the whole view
            await store.delete_session(tenant, forked.id)
    await store.delete_session(tenant, "s")
    for metric in ("probe", "rewind", "load after rewind"):
        results.add(case, STORE, metric, "ms", samples=times[metric])
    for side in (STORE, PLAIN):
        results.add(case, side, "fork", "ms", samples=times[side])
        results.add(case, side, "fork rows/s", "", value=round(size / (h.stats(times[side])["median"] / 1000)))
    results.ratio(case, "fork", side=STORE, over=PLAIN)


async def main_async(args: argparse.Namespace) -> h.Results:
    results = h.Results(
        "rewind", f"Rewind, the view after it and fork on {args.store}, by log size: fork copied by the store "
        "(SessionStore.copy_view) against page by page (rewind.copy_pages)",
        notes=["Probe, rewind and load do not depend on how a fork copies: they are measured once, in the first "
               "column."])
    async with opened(args.store, args.url) as store:
        for size in args.sizes.split(","):
            await measure(results, store, int(size), args.rounds, args.fork_rounds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--url", help="the PostgreSQL DSN for --store postgres")
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--fork-rounds", type=int, default=3, help="forks of each kind, interleaved")
    h.out_argument(parser, "rewind")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    print(h.table(results.doc))
    results.write(args.out)


if __name__ == "__main__":
    main()
