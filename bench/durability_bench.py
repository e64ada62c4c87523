#!/usr/bin/env python3
"""Durable per-step persistence on SQLite: fsyncs per tool-loop step, and a 20-step tool loop's time,
contextpipe next to the OpenAI Agents SDK's ``SQLiteSession`` (both durable against power loss).

    python bench/durability_bench.py                 # creates bench/.venv-agents on first use
    python bench/durability_bench.py --rounds 9 --loops 5 --steps 20

The peer runs in its own virtualenv (``bench/.venv-agents`` with ``openai-agents``; made on first
use, or by hand: ``python -m venv bench/.venv-agents && bench/.venv-agents/bin/pip install
openai-agents==0.24.0``) as a long-lived subprocess (``durability_peer_agents.py``); the sides
take turns round by round in one run. Each loop is a fresh session in one database file per side:
the model (each side's own scripted test model) calls a tool returning a short string 20 times,
then answers. Durable commits are counted by the stores (contextpipe's ``SQLiteStore`` counters;
a counting ``sqlite3.Connection`` on the peer's side); in WAL mode under ``synchronous=FULL``
each one is an fsync of the log.

contextpipe rows:
- *as built*: the agent loop as this build persists it (every save durable).
- *idempotent results relaxed*: the same loop, with a tool result of an idempotent tool appended
  with ``durable=False`` (a power loss before the next durable write re-runs that tool on resume;
  the call record and the answer are still fsynced before anything depends on them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from contextpipe import Agent, Message, RunLimits, tool
from contextpipe.providers import History
from contextpipe.session import Session
from contextpipe.stores import Lease, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call

HERE = Path(__file__).resolve().parent
PEER_VERSION = "openai-agents==0.24.0"


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
    started = time.perf_counter()
    await agent.run("start", session=session)
    elapsed = time.perf_counter() - started
    assert len((await store.load("default", session.id)).messages) == 2 * steps + 2
    return elapsed, store.durable_commits - before


def peer_python(path: Path | None) -> Path:
    if path is not None:
        return path
    venv = HERE / ".venv-agents"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {PEER_VERSION} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", PEER_VERSION], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loops", type=int, default=4, help="loops per side per round")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peer-python", type=Path, default=None)
    args = parser.parse_args()

    peer = subprocess.Popen([str(peer_python(args.peer_python)), str(HERE / "durability_peer_agents.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert peer.stdin is not None
    assert peer.stdout is not None
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

    with asyncio.Runner() as runner:
        try:
            for r in range(args.rounds):
                for name, store, history in (("built", built, History(built)),
                                             ("relaxed", relaxed, RelaxedToolResults(relaxed))):
                    for seconds, commits in runner.run(ours(store, history)):
                        if r > 0:  # round 0 warms both sides up
                            sides[name][0].append(seconds)
                            sides[name][1].append(commits)
                peer.stdin.write(json.dumps({"loops": args.loops, "steps": args.steps}) + "\n")
                peer.stdin.flush()
                answer = json.loads(peer.stdout.readline())
                synchronous["peer"] = answer["synchronous"]
                if r > 0:
                    sides["peer"][0].extend(answer["times"])
                    sides["peer"][1].extend(answer["commits"])
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
            level_ours = runner.run(built._run(lambda conn: int(conn.execute("PRAGMA synchronous").fetchone()[0])))
        finally:
            peer.stdin.close()
            peer.wait()
            runner.run(built.close())
            runner.run(relaxed.close())

    peer_ms = statistics.median(sides["peer"][0]) * 1000
    labels = {"built": "contextpipe, as built", "relaxed": "contextpipe, idempotent results relaxed",
              "peer": "OpenAI Agents SDK, SQLiteSession"}
    level = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    theirs = synchronous["peer"]
    print(f"\n{args.steps}-step tool loop, every step persisted, SQLite WAL; contextpipe synchronous="
          f"{level.get(level_ours, level_ours)}, peer synchronous={level.get(theirs, theirs)}; "
          f"{len(sides['peer'][0])} loops per side over {args.rounds - 1} measured rounds\n")
    print("| side | durable commits (fsyncs) per loop | per step | median ms per loop | vs peer |")
    print("|---|---:|---:|---:|---:|")
    for name in ("built", "relaxed", "peer"):
        times, commits = sides[name]
        ms = statistics.median(times) * 1000
        per_loop = statistics.median(commits)
        print(f"| {labels[name]} | {per_loop:g} | {per_loop / args.steps:.2f} | {ms:,.1f} | "
              f"{ms / peer_ms:.2f}x |")


if __name__ == "__main__":
    main()
