"""A separate OS process for the concurrency and crash tests (run as a script, not collected by pytest).

    python proc_worker.py append SPEC TENANT WORKER SESSIONS BATCHES
    python proc_worker.py run    SPEC TENANT WORKER SESSION RUNS
    python proc_worker.py crash  SPEC TENANT SESSION STEPS EFFECTS_FILE VIOLATIONS_FILE
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import open_spec

from contextpipe import Agent, Message, RunLimits, tool
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.testing import ScriptedModel, Turn, tool_call


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


def broken_exchange(messages: Sequence[Message]) -> str | None:
    """Describe the first unanswered call or orphan result in a request, if any."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if m.role == "assistant":
            if open_calls:
                return f"message {i}: calls {sorted(open_calls)} unanswered before the next assistant turn"
            open_calls = {c.call_id for c in m.function_calls}
        elif m.role == "tool":
            for r in m.function_results:
                if r.call_id not in open_calls:
                    return f"message {i}: orphan result for {r.call_id}"
                open_calls.discard(r.call_id)
        elif open_calls:
            return f"message {i}: calls {sorted(open_calls)} unanswered before a {m.role} message"
    if open_calls:
        return f"end: calls {sorted(open_calls)} unanswered"
    return None


async def crash_worker(spec: str, tenant: str, session_id: str, steps: int, effects: str, violations: str) -> None:
    """Drive a long tool loop; the parent kills this process at random points."""

    def effect(kind: str, step: int, nonce: str) -> str:
        with open(effects, "a") as f:
            f.write(f"{kind} {step} {nonce}\n")
            f.flush()
        time.sleep(0.02)
        return f"{kind} {step} ok"

    @tool(idempotent=True, run_in_thread=False)
    def lookup(step: int, nonce: str) -> str:
        """Idempotent: safe to run again."""
        return effect("lookup", step, nonce)

    @tool(run_in_thread=False)
    def record(step: int, nonce: str) -> str:
        """Not idempotent: must never be re-run by recovery."""
        return effect("record", step, nonce)

    def plan(request: ModelRequest) -> Turn | str:
        problem = broken_exchange(request.messages)
        if problem is not None:
            with open(violations, "a") as f:
                f.write(f"pid {os.getpid()}: {problem}\n")
            raise RuntimeError(problem)
        done = sum(1 for m in request.messages for r in m.function_results if not r.is_error)
        if done >= steps:
            return "done"
        name = "record" if done % 2 == 0 else "lookup"
        nonce = uuid.uuid4().hex[:12]  # unique across processes, like a real model's call ids
        return tool_call(name, step=done, nonce=nonce, call_id=f"call_{nonce}")

    store = open_spec(spec)
    try:
        model = ScriptedModel([plan] * (steps * 4 + 10))

        # A short lease, so that after a kill the next process takes over within half a second.
        agent = Agent(model, tools=[lookup, record], providers=[History(store)], lease_ttl=0.5,
                      limits=RunLimits(max_steps=steps * 4, max_consecutive_tool_errors=steps))
        session = await agent.session(session_id, tenant=tenant)
        log = await agent.history(session)
        print("ready", flush=True)
        if log and log[-1].role == "assistant" and log[-1].text == "done":
            print("finished", flush=True)
            return
        await agent.run(None if log else "start", session=session, lease_wait=60)
        print("finished", flush=True)
    finally:
        await store.close()


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "append":
        asyncio.run(append_worker(args[0], args[1], int(args[2]), int(args[3]), int(args[4])))
    elif command == "run":
        asyncio.run(run_worker(args[0], args[1], int(args[2]), args[3], int(args[4])))
    elif command == "crash":
        asyncio.run(crash_worker(args[0], args[1], args[2], int(args[3]), args[4], args[5]))
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps({"ok": True}), flush=True)


if __name__ == "__main__":
    main()
