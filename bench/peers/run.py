#!/usr/bin/env python3
"""contextpipe against its peers on the same durable workloads, interleaved in one run; medians and ratios.

Peers, each in its own virtualenv under ``bench/`` (made by ``bash bench/peers/setup.sh``, which this
script runs when one is missing): the OpenAI Agents SDK (``SQLiteSession``), LangGraph
(``AsyncSqliteSaver``, ``durability="sync"``) and Microsoft Agent Framework (``FileHistoryProvider``
with per-service-call persistence). contextpipe runs in this interpreter (``SQLiteStore``,
``synchronous="FULL"``, per-step persistence; the side "contextpipe NORMAL" uses ``synchronous="NORMAL"``:
durable through a process crash but not a power loss). The SDK's and LangGraph's SQLite stores run in WAL
mode at SQLite's default ``synchronous=FULL``, an fsync per commit as well; MAF appends to its file without
an fsync. No LLM: each side has a fake model that answers at once.

Workloads (see ``common.py``): ``run N`` (a run over N stored messages, the process running the
session again), ``loop`` (20 tool calls, every step persisted), ``cold`` (a new process: imports,
opening the store and one run over 1,000 stored messages), ``import`` (a new interpreter importing what
a program needs to build an agent, then exiting: ``from contextpipe import Agent``, ``from agents import
Agent, Runner``, ``from langgraph.graph import StateGraph``, ``from agent_framework import Agent``). Every round
runs every case on every side, the order of the sides rotating from round to round, so background load
falls on all of them.

    python bench/peers/run.py                      # 5 rounds, N = 1,000 and 10,000
    python bench/peers/run.py --rounds 3 --out bench/results/peers.json
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
sys.path.insert(0, str(BENCH))
import _harness as h  # noqa: E402 - bench/, found from here

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
        if not python.exists():  # a peer not set up (a run of some sides only)
            continue
        proc = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version('{package}'))"],
                              capture_output=True, text=True)
        out[name] = proc.stdout.strip() or "?"
    return out


def worker(peer: str, workload: str, n: int, samples: int, workdir: str) -> tuple[dict[str, Any], float]:
    """Run one worker process: what it printed, and the process's wall ms (start to exit)."""
    python, script = PEERS[peer]
    if workload == "import":  # a new interpreter importing the peer's agent entry point, then exiting
        cost, _ = h.child_cost([str(python), "-c", IMPORTS[peer]])
        return {"samples_ms": [], "check": {"import": IMPORTS[peer]}}, cost.wall * 1000
    env = dict(os.environ, CONTEXTPIPE_BENCH_SYNCHRONOUS="NORMAL" if peer.endswith("NORMAL") else "FULL")
    try:
        cost, stdout = h.child_cost([str(python), str(HERE / script), workload, str(n), str(samples), workdir],
                                    env=env, stderr=subprocess.PIPE)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{peer} {workload} N={n} failed:\n{exc.stderr[-3000:]}") from exc
    data: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return data, cost.wall * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--samples", type=int, default=5, help="timed runs per worker process")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "contextpipe-peers"))
    parser.add_argument("--cases", default="run,loop,cold,import", help="which workloads (comma-separated)")
    h.out_argument(parser, "peers")
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
    vers = versions()
    results = h.Results(
        "peers", "Durable runs against the peers, no LLM (a fake model that answers at once): each peer in its "
        "own virtualenv on its durable store, the order of the sides rotating from round to round; wall ms",
        reference={"name": "the peers", "versions": vers})
    samples: dict[tuple[str, str, int], list[float]] = {}
    checks: dict[tuple[str, str, int], Any] = {}
    for r, order in h.interleave(names, args.rounds):
        print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", file=sys.stderr, flush=True)
        for workload, n in cases:
            for peer in order:
                data, wall = worker(peer, workload, n, args.samples, workdirs[peer])
                key = (peer, workload, n)
                samples.setdefault(key, []).extend([wall] if workload in ("cold", "import") else data["samples_ms"])
                checks[key] = data["check"]
    titles = {"run": "run over {n:,} stored messages (same process again)",
              "loop": "20-step tool loop, every step persisted", "cold": "cold start: new process to first answer "
              "over {n:,} stored messages",
              "import": "import the agent entry point in a new interpreter (process wall time)"}
    stores = {"contextpipe": "SQLiteStore, FULL", "contextpipe NORMAL": "SQLiteStore, NORMAL",
              "OpenAI Agents SDK": "SQLiteSession", "LangGraph": "AsyncSqliteSaver",
              "MAF": "FileHistoryProvider, per-call"}
    label = {p: f"{p} ({stores[p]})" if p.startswith("contextpipe") else f"{p} {vers[p]} ({stores[p]})"
             for p in names}
    for workload, n in cases:
        case = titles[workload].format(n=n)
        for peer in names:
            results.add(case, label[peer], "wall", "ms", samples=samples[(peer, workload, n)],
                        check=checks[(peer, workload, n)])
        for peer in names[1:]:
            results.ratio(case, "wall", side=label[peer], over=label["contextpipe"])
    print(h.table(results.write(args.out)))


if __name__ == "__main__":
    main()
