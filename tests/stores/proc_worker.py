"""A separate OS process for the concurrency and crash tests (run as a script, not collected by pytest).

    python proc_worker.py append SPEC TENANT WORKER SESSIONS BATCHES
    python proc_worker.py run    SPEC TENANT WORKER SESSION RUNS
    python proc_worker.py storm  SPEC TENANT SLOT SESSION RUNS STEPS EFFECTS_FILE VIOLATIONS_FILE
    python proc_worker.py waiting SPEC TENANT SESSION TEXT   (a run whose model never answers; stop it with SIGINT)
    python proc_worker.py retried SPEC TENANT SESSION MESSAGE_ID TEXT   (a run whose tool never returns; SIGKILL it)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import open_spec

from contextpipe import Agent, Durability, Message, RunLimits, tool
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


def say(*words: str) -> None:
    """Report progress to the parent (which picks its kill points from these lines), one write per line."""
    sys.stdout.write(" ".join(("p", *words)) + "\n")
    sys.stdout.flush()


async def storm_worker(spec: str, tenant: str, slot: str, session_id: str, runs: int, steps: int,
                       effects: str, violations: str) -> None:
    """Run `runs` agent runs of `steps` parallel tool steps each on a (possibly shared) session.

    Each step calls `record` (not idempotent) and `lookup` (idempotent, slow: it waits until the
    sibling `record` result is saved, or ``CP_SAVE_WAIT`` seconds) in parallel. Progress lines go
    to stdout; tool effects are appended to `effects`; broken requests to `violations`.
    Environment: ``CP_LEASE_TTL`` (seconds), ``CP_CLOCK_OFFSET`` (a SQLite store's clock runs that
    far ahead, so a killed predecessor's lease has expired at once), ``CP_GENERATION``.
    """
    ttl = float(os.environ.get("CP_LEASE_TTL", "60"))
    save_wait = float(os.environ.get("CP_SAVE_WAIT", "1.0"))
    generation = os.environ.get("CP_GENERATION", "0")
    store = open_spec(spec, clock_offset=float(os.environ.get("CP_CLOCK_OFFSET", "0")))
    saving: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
    saved: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
    original = store.append

    async def append(tenant: str, session_id: str, messages: Sequence[Message], **kwargs: Any) -> int:
        results = [r.call_id for m in messages for r in m.function_results]
        for call_id in results:
            saving[call_id].set()
        last = await original(tenant, session_id, messages, **kwargs)
        for call_id in results:
            saved[call_id].set()
        say("saved", *(m.id for m in messages))
        return last

    store.append = append  # type: ignore[method-assign]

    def effect(kind: str, pair: str) -> None:
        with open(effects, "a") as f:
            f.write(f"{kind} {pair} {os.getpid()}\n")
            f.flush()

    returned: set[str] = set()

    @tool(run_in_thread=False)
    def record(pair: str) -> str:
        """Not idempotent: must never be run twice."""
        effect("record", pair)
        returned.add(pair)
        say("returned", "record", pair)
        return f"recorded {pair}"

    @tool(idempotent=True)
    async def lookup(pair: str) -> str:
        """Idempotent and slow: recovery may run it again."""
        effect("lookup", pair)
        say("started", "lookup", pair)
        if pair not in returned:  # re-run by recovery: its sibling did not run in this process
            return f"looked up {pair}"
        try:  # a result saved as soon as it is produced is being saved by now; then wait for that save
            await asyncio.wait_for(saving[f"call_r_{pair}"].wait(), save_wait)
            await saved[f"call_r_{pair}"].wait()
            sibling = "saved"
        except TimeoutError:
            sibling = "unsaved"
        say("midway", pair, sibling)  # from here on the sibling record call counts as completed
        return f"looked up {pair}"

    def plan(request: ModelRequest) -> Turn | str:
        problem = broken_exchange(request.messages)
        if problem is not None:
            with open(violations, "a") as f:
                f.write(f"pid {os.getpid()}: {problem}\n")
            raise RuntimeError(problem)
        users = [i for i, m in enumerate(request.messages) if m.role == "user"]
        since = request.messages[users[-1] + 1:] if users else request.messages
        if sum(1 for m in since if m.function_calls) >= steps:
            return f"done {request.messages[users[-1]].text}" if users else "done"
        pair = uuid.uuid4().hex[:12]  # unique across processes, like a real model's call ids
        return tool_call("record", pair=pair, call_id=f"call_r_{pair}") + tool_call(
            "lookup", pair=pair, call_id=f"call_l_{pair}")

    try:
        model = ScriptedModel([plan] * (runs * (steps + 2) * 2 + 10))
        agent = Agent(model, tools=[record, lookup], providers=[History(store)], durability=Durability(lease_ttl=ttl),
                      limits=RunLimits(max_steps=steps * 4, max_consecutive_tool_errors=steps * 4))
        session = await agent.session(session_id, tenant=tenant)
        for r in range(runs):
            text = f"{slot}:{generation}:{r}"
            say("run", text)
            await agent.run(text, session=session, lease_wait=600)
            say("finished", text)
    finally:
        await store.close()


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
    elif command == "storm":
        asyncio.run(storm_worker(args[0], args[1], args[2], args[3], int(args[4]), int(args[5]), args[6], args[7]))
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps({"ok": True}), flush=True)


if __name__ == "__main__":
    main()
