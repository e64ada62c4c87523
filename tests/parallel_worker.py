"""A worker process for the parallel-tools crash test (run as a script, not collected by pytest).

    python parallel_worker.py DB EFFECTS_FILE

One run on session "pay": the model calls a fast, non-idempotent ``charge`` and a slow ``audit``
in parallel. The worker prints ``saved-charge`` once the charge's result is saved, while the audit
is still running; the test kills it then.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from contextpipe import Agent, Durability, StepPersisted, tool
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call


def tools(effects: Path) -> list[object]:
    """The two tools; `charge` records each time it really runs in `effects`."""

    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card (not idempotent)."""
        with effects.open("a") as f:
            f.write(f"charged {amount}\n")
        return f"charged {amount}"

    @tool
    async def audit() -> str:
        """A slow check (not idempotent)."""
        await asyncio.Event().wait()
        return "audited"

    return [charge, audit]


async def main(db: str, effects: str) -> None:
    store = SQLiteStore(db)
    model = ScriptedModel([tool_call("charge", amount=5) + tool_call("audit"), "never reached"])
    agent = Agent(model, tools=tools(Path(effects)), providers=[History(store)],
                  durability=Durability(lease_ttl=0.5))
    session = await agent.session("pay")
    async for event in agent.stream("Charge 5 and audit", session=session):
        if isinstance(event, StepPersisted) and any(r.result == "charged 5" for m in event.messages
                                                    for r in m.function_results):
            print("saved-charge", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
