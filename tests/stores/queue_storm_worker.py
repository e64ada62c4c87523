"""One of the two workers of the queue's crash storm (run as a script, not collected by pytest); SIGKILL it.

    python queue_storm_worker.py SPEC TENANT SESSION [SESSION ...]

Runs the sessions round robin, forever, each run a tool call then an answer; a session another worker holds
is passed over. It stops twice per run and waits for a line on stdin ("go") before going on, saying where:

    p tool SESSION      in the tool: the run holds the session, its queued messages are not delivered yet
    p settling SESSION  the delivery's append returned (the messages are in the log), not settled yet
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import open_spec

import contextpipe.queue
from contextpipe import Agent, Durability, SessionBusy, tool
from contextpipe.session import SessionKey
from contextpipe.testing import ScriptedModel, tool_call

LEASE = Durability(lease_ttl=1.0)  # the other worker takes a killed one's session over soon after the kill


async def stop_at(words: str) -> None:
    """Say where the worker is, then wait for the test's go-ahead (end of input: leave)."""
    sys.stdout.write(f"p {words}\n")
    sys.stdout.flush()
    if not await asyncio.to_thread(sys.stdin.readline):
        raise SystemExit(0)


async def main(spec: str, tenant: str, sessions: list[str]) -> None:
    store = open_spec(spec)
    settle = contextpipe.queue.settle

    async def settling(store: object, key: SessionKey, entry_ids: list[str]) -> None:
        await stop_at(f"settling {key.id}")
        await settle(store, key, entry_ids)  # type: ignore[arg-type]

    contextpipe.queue.settle = settling  # type: ignore[assignment]

    @tool
    async def hold(session: str) -> str:
        """Hold the session in a tool exchange."""
        await stop_at(f"tool {session}")
        return "held"

    n = 0
    try:
        while True:
            for session_id in sessions:
                n += 1
                agent = Agent(ScriptedModel([tool_call("hold", session=session_id), "done", "done"]), tools=[hold],
                              store=store, durability=LEASE)
                try:
                    await agent.run(f"input {n}", session=await agent.session(session_id, tenant=tenant),
                                    lease_wait=0.5)
                except SessionBusy:
                    continue  # the other worker holds it (or a killed one did, until its lease expires)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
