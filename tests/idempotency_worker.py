"""A worker process for the idempotency-key crash test (run as a script, not collected by pytest).

    python idempotency_worker.py DB KEYS_FILE

One run on session "pay" of tenant "acme": the model calls ``charge``, an idempotent tool that
writes the key its context gives it to KEYS_FILE, prints ``charging`` and waits forever; the test
kills the worker then, and a resumed run in another process runs the call again.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from contextpipe import Agent, Durability, Tool, ToolContext, tool
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call


def charge_tool(keys: Path, *, hang: bool) -> Tool:
    """The tool; each time it runs it appends the call id and its idempotency key to `keys`."""

    @tool(idempotent=True)
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge the card (the payment service deduplicates by the key)."""
        with keys.open("a") as f:
            f.write(f"{ctx.call_id} {ctx.idempotency_key}\n")
        if hang:
            print("charging", flush=True)
            await asyncio.Event().wait()
        return f"charged {amount}"

    return charge


async def main(db: str, keys: str) -> None:
    store = SQLiteStore(db)
    agent = Agent(ScriptedModel([tool_call("charge", amount=5), "never reached"]),
                  tools=[charge_tool(Path(keys), hang=True)], providers=[History(store)],
                  durability=Durability(lease_ttl=0.5))
    await agent.run("Charge 5", session=await agent.session("pay", tenant="acme"))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
