"""A separate OS process for the concurrency and crash tests (run as a script, not collected by pytest).

    python proc_worker.py append SPEC TENANT WORKER SESSIONS BATCHES
    python proc_worker.py run    SPEC TENANT WORKER SESSION RUNS
    python proc_worker.py waiting SPEC TENANT SESSION TEXT   (a run whose model never answers; stop it with SIGINT)
    python proc_worker.py retried SPEC TENANT SESSION MESSAGE_ID TEXT   (a run whose tool never returns; SIGKILL it)
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import open_spec

from contextpipe import Agent, Durability, Message, tool
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.testing import ScriptedModel, tool_call


async def append_worker(spec: str, tenant: str, worker: int, sessions: int, batches: int) -> None:
    """Append `batches` two-message batches to each session, each batch sent twice (a retry)."""
    store = open_spec(spec)
    try:
        for b in range(batches):
            for s in range(sessions):
                batch = [Message.user(f"w{worker}:b{b}:m{j}") for j in range(2)]
                await store.append(tenant, f"s{s}", batch)
                await store.append(tenant, f"s{s}", batch)  # a retried append must not duplicate
    finally:
        await store.close()


async def run_worker(spec: str, tenant: str, worker: int, session_id: str, runs: int) -> None:
    """Run the agent `runs` times on one shared session; each run is a tool call then an answer."""

    @tool(run_in_thread=False)
    def note(text: str) -> str:
        """Note something."""
        return f"noted {text}"

    store = open_spec(spec)
    try:
        model = ScriptedModel()
        agent = Agent(model, tools=[note], providers=[History(store)])
        for r in range(runs):
            model.enqueue(tool_call("note", text=f"w{worker}:r{r}"), f"w{worker}:r{r}:done")
            session = await agent.session(session_id, tenant=tenant)
            await agent.run(f"w{worker}:r{r}", session=session, lease_wait=120)
    finally:
        await store.close()


def say(*words: str) -> None:
    """Report progress to the parent, one write per line."""
    sys.stdout.write(" ".join(("p", *words)) + "\n")
    sys.stdout.flush()


async def waiting_worker(spec: str, tenant: str, session_id: str, text: str) -> None:
    """Run the agent on `text` with a model that never answers; say "model called" once it is waiting."""

    async def never(request: ModelRequest) -> str:
        say("model called")
        await asyncio.Event().wait()
        return "never"

    store = open_spec(spec)
    try:
        agent = Agent(ScriptedModel([never]), providers=[History(store)])
        session = await agent.session(session_id, tenant=tenant)
        await agent.run(text, session=session)
    finally:
        await store.close()


async def retried_worker(spec: str, tenant: str, session_id: str, message_id: str, text: str) -> None:
    """Run the agent on the message `message_id`; its (idempotent) tool says "tool started" and never returns.

    The model's call is saved before the tool starts, so a process killed then leaves the input and
    an unanswered call in the log: the test retries the same message and expects it resumed.
    """

    @tool(idempotent=True)
    async def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        say("tool started")
        await asyncio.Event().wait()
        return "SZ"

    store = open_spec(spec)
    try:
        model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "never reached"])
        agent = Agent(model, tools=[lookup_location_code], providers=[History(store)],
                      durability=Durability(lease_ttl=0.5))
        session = await agent.session(session_id, tenant=tenant)
        await agent.run(Message.user(text, id=message_id), session=session)
    finally:
        await store.close()


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "append":
        asyncio.run(append_worker(args[0], args[1], int(args[2]), int(args[3]), int(args[4])))
    elif command == "run":
        asyncio.run(run_worker(args[0], args[1], int(args[2]), args[3], int(args[4])))
    elif command == "waiting":
        asyncio.run(waiting_worker(args[0], args[1], args[2], args[3]))
    elif command == "retried":
        asyncio.run(retried_worker(args[0], args[1], args[2], args[3], args[4]))
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps({"ok": True}), flush=True)


if __name__ == "__main__":
    main()
