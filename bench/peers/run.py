#!/usr/bin/env python3
"""contextpipe against its peers on the same durable workloads, interleaved in one run; medians and ratios.

Peers, each in its own virtualenv under ``bench/`` (made by ``bash bench/peers/setup.sh``, which this
script runs when one is missing): the OpenAI Agents SDK (``SQLiteSession``), LangGraph
(``AsyncSqliteSaver``, ``durability="sync"``) and Microsoft Agent Framework (``FileHistoryProvider``
with per-service-call persistence). contextpipe runs in this interpreter (``SQLiteStore``,
``synchronous="FULL"``, per-step persistence; the side "contextpipe NORMAL" uses ``synchronous="NORMAL"``:
durable through a process crash but not a power loss, as the peers' stores are by default). No LLM: each
side has a fake model that answers at once.

Workloads (see ``common.py``): ``run N`` (a run over N stored messages, the process running the
session again), ``loop`` (20 tool calls, every step persisted), ``cold`` (a new process: imports,
opening the store and one run over 1,000 stored messages), ``import`` (a new interpreter importing what
a program needs to build an agent, then exiting: ``from contextpipe import Agent``, ``from agents import
Agent, Runner``, ``from langgraph.graph import StateGraph``, ``from agent_framework import Agent``). Every round
runs every case on every side, the order of the sides rotating from round to round, so background load
falls on all of them.

    python bench/peers/run.py                      # 5 rounds, N = 1,000 and 10,000
    python bench/peers/run.py --rounds 3 --sizes 1000 --json peers.json
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
PEERS = {
    "contextpipe": (Path(sys.executable), "peer_contextpipe.py"),
    "contextpipe NORMAL": (Path(sys.executable), "peer_contextpipe.py"),
    "OpenAI Agents SDK": (BENCH / ".venv-peer-openai-agents" / "bin" / "python", "peer_openai_agents.py"),
    "LangGraph": (BENCH / ".venv-peer-langgraph" / "bin" / "python", "peer_langgraph.py"),
    "MAF": (BENCH / ".venv-peer-maf" / "bin" / "python", "peer_maf.py"),
}
COLD_N = 1000
# What a program imports to build an agent (agent_framework and agents load most of their modules lazily,
# on first attribute access, so a bare "import agent_framework" would measure almost nothing).
IMPORTS = {"contextpipe": "from contextpipe import Agent", "contextpipe NORMAL": "from contextpipe import Agent",
           "OpenAI Agents SDK": "from agents import Agent, Runner",
           "LangGraph": "from langgraph.graph import StateGraph", "MAF": "from agent_framework import Agent"}


def versions() -> dict[str, str]:
    out = {}
    for name, package in [("contextpipe", "contextpipe"), ("contextpipe NORMAL", "contextpipe"),
                          ("OpenAI Agents SDK", "openai-agents"),
                          ("LangGraph", "langgraph"), ("MAF", "agent-framework-core")]:
        python = PEERS[name][0]
        proc = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version('{package}'))"],
                              capture_output=True, text=True)
        out[name] = proc.stdout.strip() or "?"
    return out


def import_time(peer: str) -> tuple[dict[str, Any], float]:
    """Wall time of a new interpreter importing the peer's agent entry point (and exiting)."""
    python = PEERS[peer][0]
    t0 = time.perf_counter()
    subprocess.run([str(python), "-c", IMPORTS[peer]], check=True)
    return {"samples_ms": [], "check": {"import": IMPORTS[peer]}}, (time.perf_counter() - t0) * 1000


def worker(peer: str, workload: str, n: int, samples: int, workdir: str) -> tuple[dict[str, Any], float]:
    if workload == "import":
        return import_time(peer)
    python, script = PEERS[peer]
    env = dict(os.environ, CONTEXTPIPE_BENCH_SYNCHRONOUS="NORMAL" if peer.endswith("NORMAL") else "FULL")
    t0 = time.perf_counter()
    proc = subprocess.run([str(python), str(HERE / script), workload, str(n), str(samples), workdir],
                          capture_output=True, text=True, env=env)
    wall = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"{peer} {workload} N={n} failed:\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data, wall


def fmt(ms: float) -> str:
    return f"{ms:,.1f}" if ms < 100 else f"{ms:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--samples", type=int, default=5, help="timed runs per worker process")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "contextpipe-peers"))
    parser.add_argument("--cases", default="run,loop,cold,import", help="which workloads (comma-separated)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if any(not python.exists() for python, _ in PEERS.values()):
        subprocess.run(["bash", str(HERE / "setup.sh")], check=True)
    # The peers' bytecode was compiled by pip; compile contextpipe's too (an editable install under
    # PYTHONDONTWRITEBYTECODE would otherwise compile its sources in every new process).
    compileall.compile_dir(str(Path(__file__).resolve().parents[2] / "src" / "contextpipe"), quiet=1)
    sizes = [int(s) for s in args.sizes.split(",")]
    names = list(PEERS)
    wanted = set(args.cases.split(","))
    cases = [c for c in [("run", n) for n in sizes] + [("loop", 0), ("cold", COLD_N), ("import", 0)] if c[0] in wanted]
    workdirs = {}
    for peer in names:  # fixtures are built once per side, untimed
        workdirs[peer] = os.path.join(args.workdir, peer.replace(" ", "-"))
        os.makedirs(workdirs[peer], exist_ok=True)
        for n in sorted(set(sizes) | {COLD_N}) if wanted & {"run", "cold"} else []:
            print(f"preparing {peer} N={n:,} ...", file=sys.stderr, flush=True)
            worker(peer, "run", n, 1, workdirs[peer])
    samples: dict[tuple[str, str, int], list[float]] = {}
    checks: dict[tuple[str, str, int], Any] = {}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", file=sys.stderr, flush=True)
        for workload, n in cases:
            for peer in order:
                data, wall = worker(peer, workload, n, args.samples, workdirs[peer])
                key = (peer, workload, n)
                samples.setdefault(key, []).extend([wall] if workload in ("cold", "import") else data["samples_ms"])
                checks[key] = data["check"]
    vers = versions()
    lines = ["Sides: " + ", ".join(f"{p} {vers[p]}" for p in names) + f"; Python {sys.version.split()[0]}, "
             f"{os.cpu_count()} cores; {args.rounds} rounds interleaved, medians in ms (ratio: side / contextpipe).",
             "", "| workload | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    titles = {"run": "run over {n:,} stored messages (same process again)",
              "loop": "20-step tool loop, every step persisted", "cold": "cold start: new process to first answer "
              "over {n:,} stored messages",
              "import": "import the agent entry point in a new interpreter (process wall time)"}
    out: dict[str, Any] = {"versions": vers, "rounds": args.rounds, "results": []}
    for workload, n in cases:
        base = statistics.median(samples[("contextpipe", workload, n)])
        cells = []
        for peer in names:
            med = statistics.median(samples[(peer, workload, n)])
            cells.append(fmt(med) if peer == "contextpipe" else f"{fmt(med)} ({med / base:,.1f}x)")
            out["results"].append({"peer": peer, "workload": workload, "n": n, "median_ms": med,
                                   "samples_ms": samples[(peer, workload, n)], "check": checks[(peer, workload, n)]})
        lines.append(f"| {titles[workload].format(n=n)} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
