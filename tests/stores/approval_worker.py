"""A worker process for the approval tests (run as a script, not collected by pytest).

    python approval_worker.py stop   SPEC TENANT SESSION EFFECTS
        a run whose model asks to pay an invoice (the tool needs approval); it prints
        ``p pending CALL_ID DIGEST`` once the run stopped for it, then waits to be killed
    python approval_worker.py decide SPEC TENANT SESSION EFFECTS CALL_ID DECISION DIGEST
        resumes the session with DECISION (approve, reject, or approve-hang: the tool says
        ``p tool started`` and never returns), DIGEST the one shown ("-": none); prints one JSON line:
        the result (stop reason, text, what the model was last told of the call) or the error
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backends import open_spec

from contextpipe import Agent, ApprovalError, Durability, SessionBusy, approve, reject, tool
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel, tool_call


def say(*words: str) -> None:
    sys.stdout.write(" ".join(("p", *words)) + "\n")
    sys.stdout.flush()


def record(effects: str, line: str) -> None:
    with open(effects, "a") as f:
        f.write(line)


def payments_agent(store: SessionStore, model: ScriptedModel, effects: str, *, hang: bool = False) -> Agent:
    """An agent whose `pay` tool (not idempotent) needs approval; each payment is a line in `effects`."""

    @tool(needs_approval=lambda ctx, arguments: f"pays {arguments['amount']} EUR")
    async def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        record(effects, f"paid {invoice} {amount} {os.getpid()}\n")
        if hang:
            say("tool started")
            await asyncio.Event().wait()
        return f"paid {invoice}"

    return Agent(model, tools=[pay], providers=[History(store)], durability=Durability(lease_ttl=0.5))


async def stop(spec: str, tenant: str, session_id: str, effects: str) -> None:
    store = open_spec(spec)
    model = ScriptedModel([tool_call("pay", invoice="INV-7", amount=120)])
    agent = payments_agent(store, model, effects)
    result = await agent.run("Pay invoice INV-7 (120 EUR).", session=await agent.session(session_id, tenant=tenant))
    assert result.stop_reason == "approval_required", result
    pending = result.pending_approvals[0]
    say("pending", pending.call_id, pending.digest)
    await asyncio.Event().wait()  # killed here: the run is over, the call waits in the log


def told(request: ModelRequest) -> str:
    """What the model was told of the payment: the last tool result in its request."""
    results = [r.result for m in request.messages for r in m.function_results]
    return f"done ({results[-1] if results else 'nothing'})"


async def decide(spec: str, tenant: str, session_id: str, effects: str, call_id: str, decision: str,
                 digest: str) -> None:
    store = open_spec(spec)
    model = ScriptedModel([told])
    agent = payments_agent(store, model, effects, hang=decision == "approve-hang")
    shown = None if digest == "-" else digest
    chosen = reject("not this month", digest=shown) if decision == "reject" else approve(digest=shown)
    try:
        session = await agent.session(session_id, tenant=tenant)
        result = await agent.run(None, session=session, approvals={call_id: chosen}, lease_wait=60)
    except (ApprovalError, SessionBusy) as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return
    finally:
        await store.close()
    print(json.dumps({"stop_reason": result.stop_reason, "text": result.text}), flush=True)


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "stop":
        asyncio.run(stop(*args[:4]))
    elif command == "decide":
        asyncio.run(decide(*args[:7]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
