#!/usr/bin/env python3
"""The run core's own cost: CPU time and Python function calls per run, against an earlier tree of itself.

    python bench/overhead_bench.py --before /tmp/cp-before            # ~2 minutes
    python bench/overhead_bench.py --before /tmp/cp-before --rounds 5 --json overhead.json

Cases (no LLM: the fake model of ``contextpipe_bench.py`` answers at once):

- ``W1``: one run on an in-memory session with no history (the fixed cost of a run: lease, hooks,
  one model call, saving the step and the session);
- ``loop memory`` / ``loop sqlite``: a run of 20 tool calls (21 model calls), every step saved, on
  ``MemoryStore`` and on ``SQLiteStore`` (``synchronous="NORMAL"``, so few fsyncs: what is left is
  CPU); reported per model call ("step").

Each figure is CPU time (``time.process_time``: this process, the SQLite worker thread included), not
wall time, so other processes on a shared machine disturb it less; the median over the runs of a
round, then the median over rounds. Each case runs in a fresh interpreter per side and round, the
side going first alternating, so background load falls on both. Calls per run are counted by
``cProfile`` in a separate pass (deterministic: they do not depend on load). The earlier tree
(``--before DIR``, e.g. ``mkdir -p DIR && git archive af1a54e | tar -x -C DIR``) runs with its ``src``
first on the ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = ("W1", "loop memory", "loop sqlite")
LOOP_STEPS = 20


async def _case(case: str, runs: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import contextpipe_bench as cb
    from contextpipe import Agent
    from contextpipe.providers import History
    from contextpipe.stores import MemoryStore, SQLiteStore

    model = cb.FakeModel()
    workdir = tempfile.mkdtemp(prefix="cp-overhead-")
    store: Any = MemoryStore() if case != "loop sqlite" else SQLiteStore(
        os.path.join(workdir, "overhead.db"), synchronous="NORMAL")
    loop_case = case.startswith("loop")
    agent = Agent(model, tools=[cb.lookup_inline] if loop_case else [], providers=[History(store)])
    count = iter(range(10**9))

    async def setup() -> Any:
        if loop_case:
            model.script(tool_calls=LOOP_STEPS, reply_text="done")
            return await store.load_or_create("default", f"loop-{next(count)}")
        await store.delete_session("default", "w1")
        model.script()
        return await store.load_or_create("default", "w1")

    async def run(session: Any) -> None:
        result = await agent.run("hi", session=session)
        assert result.text == ("done" if loop_case else cb.REPLY_TEXT)

    async def timed(op: Callable[[Any], Awaitable[None]], n: int) -> list[int]:
        out = []
        for _ in range(n):
            session = await setup()
            t0 = time.process_time_ns()
            await op(session)
            out.append(time.process_time_ns() - t0)
        return out

    await timed(run, max(10, runs // 10))  # warm-up: first-use costs, caches
    gc.collect()
    cpu = await timed(run, runs)
    profile = cProfile.Profile()
    profiled = max(5, runs // 20)
    for _ in range(profiled):
        session = await setup()
        profile.enable()
        await run(session)
        profile.disable()
    calls = sum(row[1] for row in pstats.Stats(profile).stats.values()) / profiled  # type: ignore[attr-defined]
    if case == "loop sqlite":
        await store.close()
    per = LOOP_STEPS + 1 if loop_case else 1
    return {"case": case, "cpu_us": statistics.median(cpu) / 1000 / per, "calls": calls / per,
            "unit": "per step" if loop_case else "per run"}


def worker(case: str, runs: int) -> None:
    print(json.dumps(asyncio.run(_case(case, runs))))


def side(case: str, runs: int, src: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    script = Path(__file__)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
        # The earlier tree's own copy of this harness, when it has one: the same cases, spelled in the
        # API of that tree (a renamed argument would otherwise stop the comparison).
        own = src.parent / "bench" / script.name
        script = own if own.exists() else script
    proc = subprocess.run([sys.executable, str(script), "--worker", case, "--runs", str(runs)],
                          stdout=subprocess.PIPE, text=True, check=True, env=env)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=False, help="an earlier contextpipe source tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=0, help="runs per round (default: 3000 W1, 150 loops)")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.runs or (3000 if args.worker == "W1" else 150))
        return
    cases = args.only.split(",")
    sides: list[tuple[str, Path | None]] = [("after", None)]
    if args.before is not None:
        sides.insert(0, ("before", args.before / "src"))
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    turn = 0
    for _ in range(args.rounds):
        for case in cases:
            order = sides if turn % 2 == 0 else sides[::-1]
            turn += 1
            for name, src in order:
                runs = args.runs or (3000 if case == "W1" else 150)
                print(f"round: {case} {name}", file=sys.stderr, flush=True)
                results.setdefault((case, name), []).append(side(case, runs, src))
    if args.json is not None:
        args.json.write_text(json.dumps({f"{c}|{s}": v for (c, s), v in results.items()}, indent=2))
    print(f"{'case':<12} {'unit':<9} " + " ".join(f"{name + ' CPU us':>15} {name + ' calls':>13}" for name, _ in sides)
          + ("   after/before CPU" if len(sides) == 2 else ""))
    for case in cases:
        row = [f"{case:<12} {results[(case, 'after')][0]['unit']:<9}"]
        cpu = {}
        for name, _ in sides:
            got = results[(case, name)]
            cpu[name] = statistics.median(r["cpu_us"] for r in got)
            row.append(f"{cpu[name]:>15.1f} {statistics.median(r['calls'] for r in got):>13.1f}")
        if len(sides) == 2:
            row.append(f"   {cpu['after'] / cpu['before']:.2f}x")
        print(" ".join(row))


if __name__ == "__main__":
    main()
