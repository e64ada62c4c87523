"""The OpenAI Agents SDK side of ``durability_bench.py``; runs in the SDK's own virtualenv
(``bench/.venv-peer-openai-agents``, made by ``bash bench/peers/setup.sh``).

Reads commands from stdin, one JSON object per line (``{"loops": N, "steps": 20}``), and answers each
with one JSON line: the seconds of each 20-step tool loop (``Runner.run`` with a ``SQLiteSession`` in
a file, the SDK's own ``ScriptedModel`` calling a function tool every step), the SQLite commits the
session made, and the ``synchronous`` setting its connection ran with.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import tempfile
from typing import Any

import _harness as h

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.memory import sqlite_session
from agents.testing.model import ScriptedModel, assistant_message, function_call

set_tracing_disabled(True)

COMMITS = [0]
SYNCHRONOUS: list[int] = []


class CountingConnection(sqlite3.Connection):
    """A connection that counts its commits (each one an fsync of the WAL under synchronous=FULL)."""

    def commit(self) -> None:
        COMMITS[0] += 1
        super().commit()


_connect = sqlite3.connect


def counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _connect(*args, factory=CountingConnection, **kwargs)
    return conn


sqlite_session.sqlite3.connect = counting_connect  # type: ignore[attr-defined]


@function_tool
def lookup(step: int) -> str:
    """Look something up (the same work as contextpipe's side: return a short string)."""
    return f"result {step}"


async def one_loop(db: str, n: int, steps: int) -> tuple[float, int]:
    script: list[Any] = [[function_call("lookup", {"step": i}, call_id=f"call_{n}_{i}")] for i in range(steps)]
    script.append([assistant_message("done")])
    agent = Agent(name="bench", model=ScriptedModel(script), tools=[lookup])
    session = SQLiteSession(f"loop-{n}", db)
    before = COMMITS[0]
    with h.Stopwatch() as watch:
        await Runner.run(agent, "start", session=session, max_turns=steps + 5)
    if not SYNCHRONOUS:
        conn = session._get_connection()
        SYNCHRONOUS.append(int(conn.execute("PRAGMA synchronous").fetchone()[0]))
    items = await session.get_items()
    assert len(items) >= 2 * steps + 2, len(items)
    session.close()
    return watch.wall, COMMITS[0] - before


async def main() -> None:
    db = os.path.join(tempfile.mkdtemp(prefix="agents-bench-"), "sessions.db")
    n = 0
    for line in sys.stdin:
        command = json.loads(line)
        times, commits = [], []
        for _ in range(int(command["loops"])):
            n += 1
            seconds, made = await one_loop(db, n, int(command["steps"]))
            times.append(seconds)
            commits.append(made)
        print(json.dumps({"times": times, "commits": commits, "synchronous": SYNCHRONOUS[0]}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
