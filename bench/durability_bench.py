#!/usr/bin/env python3
"""Durable per-step persistence on SQLite: fsyncs per tool-loop step, and a 20-step tool loop's time,
contextpipe next to the OpenAI Agents SDK's ``SQLiteSession`` (both durable against power loss).

    python bench/durability_bench.py --out bench/results/durability.json
    python bench/durability_bench.py --rounds 9 --loops 5 --steps 20

The peer runs in its own virtualenv (``bench/.venv-peer-openai-agents``, made by ``bash
bench/peers/setup.sh``, which this script runs when it is missing) as a long-lived subprocess
(``durability_peer_agents.py``); the three sides take turns round by round in one run, the side
going first rotating, and the first round (a warm-up) is not counted. Each loop is a fresh session
in one database file per side: the model (each side's own scripted test model) calls a tool
returning a short string 20 times, then answers. Durable commits are counted by the stores
(contextpipe's ``SQLiteStore`` counters; a counting ``sqlite3.Connection`` on the peer's side); in
WAL mode under ``synchronous=FULL`` each one is an fsync of the log.

contextpipe rows:
- *as built*: the agent loop as this build persists it: every model output durable, the result of an
  idempotent tool (this benchmark's) appended with ``durable=False`` (a power loss before the next
  durable write re-runs that tool on resume; the call record and the answer are still fsynced before
  anything depends on them).
- *idempotent results relaxed*: the same loop with those results relaxed by a ``History`` subclass,
  as a release whose run fsynced every save needed; it now makes the same commits as *as built*.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import _harness as h
from contextpipe import Agent, Message, RunLimits, tool
from contextpipe.providers import History
from contextpipe.session import Session
from contextpipe.stores import Lease, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call

HERE = Path(__file__).resolve().parent
PEER_PYTHON = HERE / ".venv-peer-openai-agents" / "bin" / "python"


@tool(idempotent=True)
def lookup(step: int) -> str:
    """Look something up."""
    return f"result {step}"


class RelaxedToolResults(History):
    """History that appends idempotent tool results without an fsync (``durable=False``)."""

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        only_results = all(m.role == "tool" for m in messages)
        await self.store.append(session.tenant, session.id, messages, lease=lease, durable=not only_results)


async def cp_loop(store: SQLiteStore, history: History, n: int, steps: int) -> tuple[float, int]:
    script: list[object] = [tool_call("lookup", step=i, call_id=f"call_{n}_{i}") for i in range(steps)]
    script.append("done")
    agent = Agent(ScriptedModel(script), tools=[lookup], providers=[history],
                  limits=RunLimits(max_steps=steps + 5))
    session = Session(f"loop-{n}")
    before = store.durable_commits
    with h.Stopwatch() as watch:
        await agent.run("start", session=session)
    assert len((await store.load("default", session.id)).messages) == 2 * steps + 2
    return watch.wall, store.durable_commits - before


def peer_python(path: Path | None) -> Path:
    if path is not None:
        return path
    if not PEER_PYTHON.exists():
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)
    return PEER_PYTHON


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loops", type=int, default=4, help="loops per side per round")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peer-python", type=Path, default=None)
    h.out_argument(parser, "durability")
    args = parser.parse_args()

    peer = subprocess.Popen([str(peer_python(args.peer_python)), str(HERE / "durability_peer_agents.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert peer.stdin is not None
    assert peer.stdout is not None
    stdin, stdout = peer.stdin, peer.stdout
    workdir = Path(tempfile.mkdtemp(prefix="cp-durability-"))
    built = SQLiteStore(workdir / "built.db")  # synchronous=FULL, the default
    relaxed = SQLiteStore(workdir / "relaxed.db")
    sides: dict[str, tuple[list[float], list[int]]] = {k: ([], []) for k in ("built", "relaxed", "peer")}
    synchronous = {"peer": -1}
    n = 0

    async def ours(store: SQLiteStore, history: History) -> list[tuple[float, int]]:
        nonlocal n
        out = []
        for _ in range(args.loops):
            n += 1
            out.append(await cp_loop(store, history, n, args.steps))
        return out

    def theirs() -> list[tuple[float, int]]:
        stdin.write(json.dumps({"loops": args.loops, "steps": args.steps}) + "\n")
        stdin.flush()
        answer = json.loads(stdout.readline())
        synchronous["peer"] = answer["synchronous"]
        return list(zip(answer["times"], answer["commits"], strict=True))

    results = h.Results("durability", "", reference={"name": "OpenAI Agents SDK 0.24 (SQLiteSession)"},
                        layout={"rows": ["side", "case"], "columns": "metric"})
    with asyncio.Runner() as runner:
        runs = {"built": lambda: runner.run(ours(built, History(built))),
                "relaxed": lambda: runner.run(ours(relaxed, RelaxedToolResults(relaxed))), "peer": theirs}
        try:
            for r, order in h.interleave(list(runs), args.rounds):
                for name in order:
                    for seconds, commits in runs[name]():
                        if r > 0:  # round 0 warms every side up
                            sides[name][0].append(seconds)
                            sides[name][1].append(commits)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
            level_ours = runner.run(built._run(lambda conn: int(conn.execute("PRAGMA synchronous").fetchone()[0])))
        finally:
            peer.stdin.close()
            peer.wait()
            runner.run(built.close())
            runner.run(relaxed.close())

    labels = {"built": "contextpipe, as built", "relaxed": "contextpipe, idempotent results relaxed",
              "peer": "OpenAI Agents SDK 0.24, Runner + SQLiteSession"}
    level = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    results.doc["description"] = (
        f"A {args.steps}-step tool loop with every step persisted on SQLite (WAL): durable commits "
        f"(each an fsync) and wall ms per loop; contextpipe synchronous={level.get(level_ours, level_ours)}, the "
        f"peer's {level.get(synchronous['peer'], synchronous['peer'])}; {len(sides['peer'][0])} loops per side "
        f"over {args.rounds - 1} measured rounds")
    case = f"{args.steps}-step tool loop"
    for name in ("built", "relaxed", "peer"):
        times, commits = sides[name]
        results.add(case, labels[name], "fsyncs per loop", "", value=h.stats(commits)["median"])
        results.add(case, labels[name], "fsyncs per step", "", value=h.stats(commits)["median"] / args.steps)
        results.add(case, labels[name], "per loop", "ms", samples=[t * 1000 for t in times])
    for name in ("built", "relaxed"):
        results.ratio(case, "per loop", side=labels[name], over=labels["peer"])
    print(h.table(results.write(args.out)))


if __name__ == "__main__":
    main()
