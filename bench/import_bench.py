#!/usr/bin/env python3
"""Import cost against the peers: a new interpreter importing a library, then exiting, and a first run.

Each in a fresh interpreter:

- bare: the package alone (``import contextpipe``, ``import agent_framework``, ``import agents``);
- agent: what a program imports to build an agent (the ``import`` row of ``bench/peers/run.py``:
  ``from contextpipe import Agent``, ``from agent_framework import Agent``, ``from agents import Agent,
  Runner``, ``from langgraph.graph import StateGraph``);
- first run: a program that imports, builds an agent and answers once, in memory, against a model
  that answers at once (``peers/first_run_contextpipe.py`` with `ScriptedModel`, ``peers/first_run_maf.py``
  with the fake chat client of ``peers/peer_maf.py``); contextpipe and MAF only.

Every peer runs in its own virtualenv (``bash bench/peers/setup.sh`` makes them; this script runs it
when one is missing), contextpipe in this checkout's. Rounds are interleaved, the order of the sides
rotating each round, and the table gives medians of the child's CPU time (user + system, from
``getrusage``; steadier than wall time on a loaded machine), of the first run's process wall time, both
including the interpreter's own start-up (the ``python -c pass`` row), and of what ``python -X importtime``
counts for the imports: the sum of the cumulative times of the top-level imports the statement makes
(those after the interpreter's start-up, which ends with ``site``), start-up excluded. The importtime
figures are given as the statement runs, and with ``import asyncio`` before it, the share of the
library itself in a program that has its event loop already; ratios are to contextpipe.

The peers were installed by pip, which compiles their bytecode; contextpipe here is an editable
install whose ``.pyc`` files may be missing (``PYTHONDONTWRITEBYTECODE`` set), which would make every
contextpipe import compile its sources. So contextpipe's bytecode is compiled first, like a wheel
install does, and both sides load cached bytecode.

    python bench/import_bench.py                 # 15 rounds: 3-5 minutes on a 2-core machine (the peers are slow)
    python bench/import_bench.py --sides contextpipe,MAF   # about a minute
    python bench/import_bench.py --rounds 15 --out bench/results/import.json
    mkdir -p /tmp/before && git archive 9e98e2f src | tar -x -C /tmp/before &&
        python bench/import_bench.py --sides contextpipe,MAF --baseline /tmp/before/src   # an older version too

The results also list, for each contextpipe side, the modules with the largest cumulative ``-X importtime``
of ``from contextpipe import Agent`` (medians over the rounds, in ``top_modules``): where the import's time goes.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import re
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
FIRST_RUN = "import + first run in memory"
FIRST_RUNS = {"contextpipe": HERE / "peers" / "first_run_contextpipe.py", "MAF": HERE / "peers" / "first_run_maf.py"}
FIRST_RUNS[BEFORE] = FIRST_RUNS["contextpipe"]
AFTER_ASYNCIO = "agent entry point after import asyncio"
IMPORTTIME = {case: STATEMENTS[case] for case in ("bare package import", "agent entry point")}
IMPORTTIME[AFTER_ASYNCIO] = {side: f"import asyncio; {statement}"  # the library's share, its event loop loaded
                             for side, statement in IMPORTTIME["agent entry point"].items()}
TOP_MODULES = 15
_IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+(?P<cumulative>\d+) \| (?P<indent> *)(?P<module>\S+)$")


def import_time(python: Path, statement: str, env: dict[str, str] | None, after: str = "site") -> float:
    """Milliseconds ``-X importtime`` counts for `statement`'s imports, the interpreter's start-up excluded.

    The sum of the cumulative times of the top-level imports after the one of module `after` (``site``
    is the last of the start-up's): each module loaded then is counted once, in its first importer's line.
    """
    proc = subprocess.run([str(python), "-X", "importtime", "-c", statement], env=env, capture_output=True, text=True,
                          check=True)
    total, started = 0, False
    for line in proc.stderr.splitlines():
        match = _IMPORT_LINE.match(line)
        if match is None or match["indent"]:
            continue
        if started:
            total += int(match["cumulative"])
        started = started or match["module"] == after
    if not started:
        raise SystemExit(f"{python} -X importtime printed no line for {after}: {proc.stderr[-500:]}")
    return total / 1000


def top_modules(python: Path, statement: str, env: dict[str, str] | None) -> dict[str, float]:
    """Cumulative milliseconds of every module ``-X importtime`` reports after ``site`` for `statement`."""
    proc = subprocess.run([str(python), "-X", "importtime", "-c", statement], env=env, capture_output=True, text=True,
                          check=True)
    found: dict[str, float] = {}
    started = False
    for line in proc.stderr.splitlines():
        match = _IMPORT_LINE.match(line)
        if match is None:
            continue
        if started:
            found[match["module"]] = found.get(match["module"], 0.0) + int(match["cumulative"]) / 1000
        started = started or (match["module"] == "site" and not match["indent"])
    return found


def _top(samples: list[dict[str, float]]) -> list[list[Any]]:
    """The `TOP_MODULES` modules of largest median cumulative time over `samples` (a module absent counts 0)."""
    names = {name for sample in samples for name in sample}
    medians = {name: h.stats([sample.get(name, 0.0) for sample in samples])["median"] for name in names}
    return [[name, round(ms, 3)] for name, ms in sorted(medians.items(), key=lambda kv: -kv[1])[:TOP_MODULES]]


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
        "import", "Import cost against the peers: a new interpreter per import or first run (start-up included), "
        "each peer in its own virtualenv, the order of the sides rotating from round to round; CPU of the child "
        "process, the first run's process wall time, and what -X importtime counts (start-up excluded)",
        reference={"name": "the peers" + (f" and {args.baseline}" if args.baseline else ""),
                   "versions": {label[s]: vers.get(s, "") for s in sides if s in vers}})
    cpu, wall, imports, tops = measure(sides, args.rounds, envs)
    results.doc["top_modules"] = {
        "statement": PEERS_RUN.IMPORTS["contextpipe"], "unit": "ms, cumulative -X importtime, median over the rounds",
        "sides": {label[side]: _top(tops[side]) for side in sides if side.startswith("contextpipe")}}
    for case in [*STATEMENTS, AFTER_ASYNCIO, FIRST_RUN]:
        metrics = {"CPU": cpu, "wall": wall if case == FIRST_RUN else {}, "-X importtime": imports}
        for metric, samples in metrics.items():
            for side in (s for s in sides if (case, s) in samples):
                extra = {"wall_ms": h.stats(wall[(case, side)])} if metric == "CPU" else {}
                results.add(case, label[side], metric, "ms", samples=samples[(case, side)],
                            statement=_program(case, side), **extra)
                if side != "contextpipe":
                    results.ratio(case, metric, side=label[side], over="contextpipe")
    doc = results.write(args.out)
    print(h.table(doc))
    for side, top in doc["top_modules"]["sides"].items():
        print(f"\n{side}: top cumulative -X importtime of {doc['top_modules']['statement']}")
        print("\n".join(f"  {ms:8.2f} ms  {name}" for name, ms in top))


Samples = dict[tuple[str, str], list[float]]


def measure(sides: list[str], rounds: int, envs: dict[str, dict[str, str] | None]
            ) -> tuple[Samples, Samples, Samples, dict[str, list[dict[str, float]]]]:
    """Every case on every side once a round, the sides' order rotating: CPU, wall and importtime ms by (case, side),
    and each contextpipe side's modules' cumulative importtime per round."""
    cpu: Samples = {}
    wall: Samples = {}
    imports: Samples = {}
    tops: dict[str, list[dict[str, float]]] = {side: [] for side in sides if side.startswith("contextpipe")}
    for r, order in h.interleave(sides, rounds):
        print(f"round {r + 1}/{rounds}: {', '.join(order)}", file=sys.stderr, flush=True)
        runs = [(case, side, ["-c", statements[side]]) for case, statements in STATEMENTS.items() for side in order]
        runs += [(FIRST_RUN, side, [str(FIRST_RUNS[side])]) for side in order if side in FIRST_RUNS]
        for case, side, argv in runs:
            cost, _ = h.child_cost([str(PYTHON[side]), *argv], envs[side])
            cpu.setdefault((case, side), []).append(cost.cpu * 1000)
            wall.setdefault((case, side), []).append(cost.wall * 1000)
        for case, statements in IMPORTTIME.items():
            for side in order:
                after = "asyncio" if case == AFTER_ASYNCIO else "site"
                imports.setdefault((case, side), []).append(import_time(PYTHON[side], statements[side], envs[side],
                                                                        after))
        for side in (s for s in order if s in tops):
            tops[side].append(top_modules(PYTHON[side], PEERS_RUN.IMPORTS["contextpipe"], envs[side]))
    return cpu, wall, imports, tops


def _program(case: str, side: str) -> str:
    if case == FIRST_RUN:
        return f"python {FIRST_RUNS[side].relative_to(HERE.parent)}"
    return (STATEMENTS.get(case) or IMPORTTIME[case])[side]


if __name__ == "__main__":
    main()
