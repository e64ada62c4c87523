"""Client tools: tools the caller runs (a web page, a desktop app), offered to the model beside the agent's.

A `ClientTool` is only a name, a description and the JSON schema of its arguments. The model sees it
like any tool; when it calls one, nothing runs on the server: the run saves the call, leaves it open
and stops with ``stop_reason="client_tool_calls"``, listing it in `RunResult.pending_approvals` (with
``client=True``). The caller runs it and resumes the session with the result, which the run stores as
the call's result before it calls the model again:

>>> import asyncio
>>> from contextpipe import Agent, ClientTool
>>> from contextpipe.testing import ScriptedModel, tool_call
>>> where = ClientTool("user_location", "Return where the user is, from the browser.")
>>> agent = Agent(ScriptedModel([tool_call("user_location"), "You are in Suzhou."]))
>>> async def main():
...     session = await agent.session("alice-chat")
...     first = await agent.run("Where am I?", session=session, tools=[where])
...     [call] = first.pending_approvals  # the page runs it: here, the test does
...     done = await agent.run(None, session=session, tools=[where],
...                            approvals={call.call_id: call.answer("Suzhou, China")})
...     return first.stop_reason, call.client, done.text
>>> asyncio.run(main())
('client_tool_calls', True, 'You are in Suzhou.')

This is the approvals machinery (`contextpipe.approvals`): a client call is a call that always waits,
and its only decisions are an `Answer` (its result) or a `Rejection` (the client would not run it).
So it is as durable as an approval: the open call is in the session's log, any process can answer it
after a restart, and a run given new input while it waits is refused (`ApprovalError`, naming it).
Offer client tools per run (``agent.run(..., tools=[...])``, as a front end does with each request)
or with the agent's own tools; a name the agent's tools use already is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .approvals import Answer, Approval
from .errors import ApprovalError, UsageError, shorten
from .tools import Tool, as_tool

if TYPE_CHECKING:
    from .approvals import Decision
    from .messages import FunctionCall

__all__ = ["ClientTool", "client_why", "misfit", "own_tools"]


def client_why(name: str) -> str:
    """Return why a call to client tool `name` waits (`PendingApproval.why`)."""
    return f"tool {name!r} runs in the client: the run waits for its result"


def own_tools(agent_tools: Mapping[str, Tool], tools: Sequence[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Return a run's own `tools` by name (``agent.run(..., tools=)``), refusing a name taken already."""
    out: dict[str, Tool] = {}
    for item in tools:
        t = as_tool(item)
        if t.name in agent_tools or t.name in out:
            whose = "the agent's tools" if t.name in agent_tools else "another of the run's tools"
            raise UsageError(f"the run's tool {t.name!r} has the name of one of {whose}; tool names must be unique: "
                             "rename the run's tool")
        out[t.name] = t
    return out


def misfit(call: FunctionCall, decision: Decision, client: bool) -> None:
    """Raise `ApprovalError` for an `Approval` of a `client` call, or an `Answer` of a call awaiting approval."""
    if client and isinstance(decision, Approval):
        raise ApprovalError(
            f"call {shorten(call.call_id)} to {call.name!r} is a client tool's call: the client runs it, not the "
            "server; nothing was run. Give its result (pending.answer(result)) or reject it (pending.reject('why'))",
            call_ids=[call.call_id])
    if not client and isinstance(decision, Answer):
        raise ApprovalError(
            f"call {shorten(call.call_id)} to {call.name!r} awaits a person's approval, not a client's result; nothing "
            "was run. Approve it (pending.approve()) or reject it (pending.reject('why'))", call_ids=[call.call_id])


class ClientTool(Tool):
    """A tool the caller runs: the model may call it, the run stops and waits for the call's result.

    `parameters` is the JSON schema of the arguments (an object schema; none: no arguments). The
    arguments the model sends are not checked against it: the client checks them when it runs the call.
    """

    __slots__ = ()

    def __init__(self, name: str, description: str = "", parameters: Mapping[str, Any] | None = None) -> None:
        if parameters is not None and (not isinstance(parameters, Mapping) or parameters.get("type", "object")
                                       != "object"):
            raise UsageError(f"client tool {name!r}: parameters must be a JSON schema of an object "
                             '({"type": "object", "properties": {...}}), or None for no arguments')
        schema = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}

        async def not_here(arguments: dict[str, Any]) -> str:
            return f"Error: tool {name!r} runs in the client, not on the server; it was not run."

        built = Tool.from_schema(name, description, schema, not_here, needs_approval=True)
        for slot in Tool.__slots__:  # a Tool built from a schema, as a ClientTool
            object.__setattr__(self, slot, getattr(built, slot))

    def __repr__(self) -> str:
        return f"ClientTool({self.name!r})"
