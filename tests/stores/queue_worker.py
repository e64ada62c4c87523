"""A separate OS process for the queue's crash tests (run as a script, not collected by pytest); SIGKILL it.

    python queue_worker.py in_tool    SPEC TENANT SESSION   (a run whose tool never returns: "p in tool")
    python queue_worker.py delivering SPEC TENANT SESSION   (a run stopped after its delivery's append: "p appended")
    python queue_worker.py draining   SPEC TENANT SESSION   (drain_queue, whose run's model never answers: "p model")
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import open_spec

import contextpipe.queue
from contextpipe import Agent, Durability, tool
from contextpipe.models import ModelRequest
from contextpipe.session import SessionKey
from contextpipe.testing import ScriptedModel, tool_call

LEASE = Durability(lease_ttl=1.0)  # the next process takes the session over soon after the kill


def say(words: str) -> None:
    sys.stdout.write(f"p {words}\n")
    sys.stdout.flush()


async def forever() -> None:
    await asyncio.Event().wait()


async def main(mode: str, spec: str, tenant: str, session_id: str) -> None:
    store = open_spec(spec)

    @tool
    async def lookup(city: str) -> str:
        """Return the location code of a city."""
        say("in tool")
        await forever()
        return city

    async def stuck_settle(store: object, key: SessionKey, entry_ids: object) -> None:
        say("appended")  # the delivery's append returned: the kill lands before the entries are settled
        await forever()

    async def never(request: ModelRequest) -> str:
        say("model")
        await forever()
        return "never"

    try:
        if mode == "in_tool":
            agent = Agent(ScriptedModel([tool_call("lookup", city="Suzhou")]), tools=[lookup], store=store,
                          durability=LEASE)
            await agent.run("Code of Suzhou?", session=await agent.session(session_id, tenant=tenant))
        elif mode == "delivering":
            contextpipe.queue.settle = stuck_settle  # type: ignore[assignment]
            agent = Agent(ScriptedModel(["never sent"]), store=store, durability=LEASE)
            await agent.run("Hello", session=await agent.session(session_id, tenant=tenant))
        else:
            agent = Agent(ScriptedModel([never]), store=store, durability=LEASE)
            await agent.drain_queue(session_id, tenant=tenant)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
