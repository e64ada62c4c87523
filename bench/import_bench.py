#!/usr/bin/env python3
"""Import cost against the peers: a new interpreter importing a library, then exiting.

Two statements per side, each in a fresh interpreter:

- bare: the package alone (``import contextpipe``, ``import agent_framework``, ``import agents``);
- agent: what a program imports to build an agent (the ``import`` row of ``bench/peers/run.py``:
  ``from contextpipe import Agent``, ``from agent_framework import Agent``, ``from agents import Agent,
  Runner``, ``from langgraph.graph import StateGraph``).

Every peer runs in its own virtualenv (``bash bench/peers/setup.sh`` makes them; this script runs it
when one is missing), contextpipe in this checkout's. Rounds are interleaved, the order of the sides
rotating each round, and the table gives medians of the child's CPU time (user + system, from
``getrusage``; steadier than wall time on a loaded machine) and of its wall time, both including the
interpreter's own start-up (the ``python -c pass`` row), with ratios to contextpipe.

The peers were installed by pip, which compiles their bytecode; contextpipe here is an editable
install whose ``.pyc`` files may be missing (``PYTHONDONTWRITEBYTECODE`` set), which would make every
contextpipe import compile its sources. So contextpipe's bytecode is compiled first, like a wheel
install does, and both sides load cached bytecode.

    python bench/import_bench.py                 # 15 rounds: 2-4 minutes on a 2-core machine (the peers are slow)
    python bench/import_bench.py --sides contextpipe,MAF   # about 40 s
    python bench/import_bench.py --rounds 31 --json import.json
    mkdir -p /tmp/before && git archive 3a30da9 src | tar -x -C /tmp/before &&
        python bench/import_bench.py --sides contextpipe,MAF --baseline /tmp/before/src   # an older version too
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import contextpipe

HERE = Path(__file__).resolve().parent


def _peers_module() -> Any:
    """bench/peers/run.py, for its table of virtualenvs and agent imports (one source of truth)."""
    spec = importlib.util.spec_from_file_location("peers_run", HERE / "peers" / "run.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PEERS_RUN = _peers_module()
SIDES = ["contextpipe", "MAF", "OpenAI Agents SDK", "LangGraph"]
BEFORE = "contextpipe before"  # the --baseline side: contextpipe from another source tree
PYTHON = {side: Path(PEERS_RUN.PEERS[side][0]) for side in SIDES} | {BEFORE: Path(sys.executable)}
STATEMENTS = {
    "python -c pass (interpreter start-up)": dict.fromkeys([*SIDES, BEFORE], "pass"),
    "bare package import": {"contextpipe": "import contextpipe", BEFORE: "import contextpipe",
                            "MAF": "import agent_framework", "OpenAI Agents SDK": "import agents",
                            "LangGraph": "import langgraph.graph"},
    "agent entry point": {side: PEERS_RUN.IMPORTS[side] for side in SIDES} | {BEFORE: PEERS_RUN.IMPORTS["contextpipe"]},
}


def child_cost(python: Path, statement: str, env: dict[str, str] | None = None) -> tuple[float, float]:
    """CPU ms (user + system) and wall ms of a new interpreter running `statement`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([str(python), "-c", statement], check=True, env=env)
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another version's src/ directory, measured as one more side ('contextpipe before')")
    parser.add_argument("--sides", default=",".join(SIDES), help="which sides (comma-separated; contextpipe first)")
    args = parser.parse_args()
    sides = args.sides.split(",")
    if sides[0] != "contextpipe" or not set(sides) <= set(SIDES):
        parser.error(f"--sides: contextpipe first, then any of {', '.join(SIDES[1:])}")
    if any(not PYTHON[side].exists() for side in sides):
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)
    src = Path(contextpipe.__file__).resolve().parents[1]
    trees = {"contextpipe": src} | ({BEFORE: args.baseline.resolve()} if args.baseline else {})
    envs: dict[str, dict[str, str] | None] = dict.fromkeys(sides, None)
    for side, tree in trees.items():
        compileall.compile_dir(tree / "contextpipe", quiet=1)
        envs[side] = dict(os.environ, PYTHONPATH=str(tree))
    if args.baseline:
        sides.insert(1, BEFORE)
    cpu: dict[tuple[str, str], list[float]] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", file=sys.stderr, flush=True)
        for case, statements in STATEMENTS.items():
            for side in order:
                c, w = child_cost(PYTHON[side], statements[side], envs[side])
                cpu.setdefault((case, side), []).append(c)
                wall.setdefault((case, side), []).append(w)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} rounds interleaved; medians, ratio: side / contextpipe; "
          + ", ".join(f"{side} from {tree}" for side, tree in trees.items()) + ".\n")
    for title, samples in (("CPU ms", cpu), ("wall ms", wall)):
        print(f"| {title} | " + " | ".join(sides) + " |")
        print("|---|" + "---:|" * len(sides))
        for case in STATEMENTS:
            base = statistics.median(samples[(case, "contextpipe")])
            cells = [f"{statistics.median(samples[(case, side)]):,.0f}" for side in sides[:1]]
            cells += [f"{statistics.median(samples[(case, side)]):,.0f} "
                      f"({statistics.median(samples[(case, side)]) / base:.2f}x)" for side in sides[1:]]
            print(f"| {case} | " + " | ".join(cells) + " |")
        print()
    if args.json:
        results = [{"case": case, "side": side, "statement": STATEMENTS[case][side],
                    "cpu_ms": statistics.median(cpu[(case, side)]), "wall_ms": statistics.median(wall[(case, side)]),
                    "cpu_samples_ms": cpu[(case, side)], "wall_samples_ms": wall[(case, side)]}
                   for case in STATEMENTS for side in sides]
        args.json.write_text(json.dumps({"rounds": args.rounds, "results": results}, indent=1))


if __name__ == "__main__":
    main()
