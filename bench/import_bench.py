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
    python bench/import_bench.py --rounds 15 --out bench/results/import.json
    mkdir -p /tmp/before && git archive 3a30da9 src | tar -x -C /tmp/before &&
        python bench/import_bench.py --sides contextpipe,MAF --baseline /tmp/before/src   # an older version too
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import _harness as h
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    h.out_argument(parser, "import")
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
    vers = PEERS_RUN.versions()
    label = {side: side if side.startswith("contextpipe") else f"{side} {vers[side]}" for side in sides}
    results = h.Results(
        "import", "Import cost against the peers: a new interpreter per import (start-up included), each peer "
        "in its own virtualenv, the order of the sides rotating from round to round; CPU of the child process",
        reference={"name": "the peers" + (f" and {args.baseline}" if args.baseline else ""),
                   "versions": {label[s]: vers.get(s, "") for s in sides if s in vers}})
    cpu: dict[tuple[str, str], list[float]] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    for r, order in h.interleave(sides, args.rounds):
        print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", file=sys.stderr, flush=True)
        for case, statements in STATEMENTS.items():
            for side in order:
                cost, _ = h.child_cost([str(PYTHON[side]), "-c", statements[side]], envs[side])
                cpu.setdefault((case, side), []).append(cost.cpu * 1000)
                wall.setdefault((case, side), []).append(cost.wall * 1000)
    for case in STATEMENTS:
        for side in sides:
            results.add(case, label[side], "CPU", "ms", samples=cpu[(case, side)],
                        statement=STATEMENTS[case][side], wall_ms=h.stats(wall[(case, side)]))
        for side in sides[1:]:
            results.ratio(case, "CPU", side=label[side], over="contextpipe")
    print(h.table(results.write(args.out)))


if __name__ == "__main__":
    main()
