#!/usr/bin/env python3
"""The run core's own cost: CPU time and Python function calls per run, against an earlier tree of itself.

    python bench/overhead_bench.py --before /tmp/cp-before            # ~2 minutes
    python bench/overhead_bench.py --before /tmp/cp-before --rounds 5 --out bench/results/overhead.json

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
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _harness as h

HERE = Path(__file__).resolve().parent
CASES = ("W1", "loop memory", "loop sqlite")
LOOP_STEPS = 20


async def _case(case: str, runs: int) -> dict[str, Any]:
    # The fake model and tool of the tree measured (an earlier tree's spelling of the same cases).
    sys.path.insert(0, os.environ.get("CONTEXTPIPE_BENCH_DIR", str(HERE)))
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

    await h.ameasure(run, max(10, runs // 10), warmup=0, setup=setup)  # warm-up: first-use costs, caches
    gc.collect()
    cpu = [sample.cpu for sample in await h.ameasure(run, runs, warmup=0, setup=setup)]
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
    return {"case": case, "cpu_us": h.stats(cpu)["median"] * 1e6 / per, "calls": calls / per,
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
        if (src.parent / "bench" / "contextpipe_bench.py").exists():
            env["CONTEXTPIPE_BENCH_DIR"] = str(src.parent / "bench")
    proc = subprocess.run([sys.executable, str(script), "--worker", case, "--runs", str(runs)],
                          stdout=subprocess.PIPE, text=True, check=True, env=env)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=False, help="an earlier contextpipe source tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated cases")
    h.out_argument(parser, "overhead")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=0, help="runs per round (default: 3000 W1, 150 loops)")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.runs or (3000 if args.worker == "W1" else 150))
        return
    cases = args.only.split(",")
    sides: list[tuple[str, Path | None]] = [("after", None)]
    reference = None
    if args.before is not None:
        commit = h.git_commit(args.before)
        sides.insert(0, ("before", args.before / "src"))
        reference = {"name": f"an earlier tree ({commit or args.before})", "commit": commit, "side": "before"}
    results = h.Results("overhead", "The run core's own cost, no LLM: CPU time and Python function calls per run "
                        "(W1) and per model call of a 20-step tool loop, each case in a fresh interpreter per "
                        "side and round, the sides interleaved", reference=reference)
    got: dict[tuple[str, str], list[dict[str, Any]]] = {}
    turn = 0  # the side going first alternates from case to case and round to round
    for _ in range(args.rounds):
        for case in cases:
            for name, src in h.rotated(sides, turn):
                runs = args.runs or (3000 if case == "W1" else 150)
                print(f"round: {case} {name}", file=sys.stderr, flush=True)
                got.setdefault((case, name), []).append(side(case, runs, src))
            turn += 1
    for case in cases:
        for name, _ in sides:
            rounds = got[(case, name)]
            label = f"{case}, {rounds[0]['unit']}"
            results.add(label, name, "CPU", "µs", samples=[r["cpu_us"] for r in rounds])
            results.add(label, name, "calls", "", samples=[r["calls"] for r in rounds])
        if len(sides) == 2:
            for metric in ("CPU", "calls"):
                results.ratio(label, metric, side="after", over="before")
    print(h.table(results.write(args.out)))


if __name__ == "__main__":
    main()
