"""A process killed between spilling a big tool result and saving it (run as a script, not collected by pytest).

    python artifact_worker.py SPEC TENANT SESSION

It runs an agent whose idempotent tool returns `BIG`; a provider registered before `Artifacts` (so its
middleware is outside) says "p spilled" once the artifact is written, and holds the result there: the
parent SIGKILLs the process at that point, before the step's messages are saved.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import open_spec

from contextpipe import Agent, Durability, tool
from contextpipe.providers import Artifacts, ContextProvider
from contextpipe.testing import ScriptedModel, tool_call

BIG = "".join(f"row {i:07d}: a line of the export\n" for i in range(40_000))  # 1.2 MB


@tool(idempotent=True)
def export() -> str:
    """Return the export."""
    return BIG


class Hold(ContextProvider):
    """Says when the result under it was spilled, then never returns it."""

    async def before_run(self, ctx: Any) -> None:
        async def hold(call: Any, call_next: Any) -> Any:
            outcome = await call_next(call)
            sys.stdout.write("p spilled\n")
            sys.stdout.flush()
            await asyncio.Event().wait()
            return outcome

        ctx.add_tool_middleware(hold)


async def main(spec: str, tenant: str, session_id: str) -> None:
    store = open_spec(spec)
    model = ScriptedModel([tool_call("export"), "never reached"])
    agent = Agent(model, store=store, tools=[export], providers=[Hold("hold"), Artifacts(store)],
                  durability=Durability(lease_ttl=0.5))
    await agent.run("export it", session=await agent.session(session_id, tenant=tenant))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
