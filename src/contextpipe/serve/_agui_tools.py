"""AG-UI front-end tools: the request's ``tools`` are the run's client tools (`contextpipe.ClientTool`).

A run that stops on calls to them streams each call (``TOOL_CALL_START`` / ``ARGS`` / ``END``,
attached to the stored assistant message by ``parentMessageId``) and finishes with
``stop_reason`` ``client_tool_calls`` (``outcome.pendingToolCallIds``). The client runs them and
sends its next request with a ``tool`` message per call (``toolCallId``, its result as content;
``error`` set for a failed one): each becomes the `Answer` of its open call (`agui_answers`), and
the run continues the same exchange. Tool messages of calls the session has answered already are
history the client resends, and are left alone; one naming no call of the session is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..approvals import Decision, answer
from ..client_tools import ClientTool
from ..errors import UsageError
from ._json import HTTPError

if TYPE_CHECKING:
    from ..agent import Agent
    from ..session import Session

__all__ = ["TOOL_NAME", "agui_answers", "agui_approvals", "agui_tools", "client_call_events"]

TOOL_NAME: Final = r"^[A-Za-z0-9_-]{1,64}$"
"""A front-end tool's name, as any tool's."""


def agui_tools(run_input: Any, agent: Agent) -> list[ClientTool]:
    """Return the request's ``tools`` as the run's client tools; a 409 for a name the agent's tools use already."""
    out: list[ClientTool] = []
    for i, t in enumerate(run_input.tools or ()):
        if t.name in agent.tools or any(o.name == t.name for o in out):
            whose = "one of the agent's own tools" if t.name in agent.tools else "another tool of the request"
            raise HTTPError(409, "ToolConflict", f"tools[{i}].name: {t.name!r} is the name of {whose}; give each "
                            "front-end tool a name of its own: nothing ran")
        try:
            out.append(ClientTool(t.name, t.description, t.parameters))
        except UsageError as exc:
            raise HTTPError(400, "BadRequest", f"invalid request: tools[{i}]: {exc}") from None
    return out


async def agui_approvals(run_input: Any, at: int, agent: Agent, session: Session | None,
                         approvals: dict[str, Decision] | None) -> dict[str, Decision] | None:
    """Return the decisions of `approvals` (``resume``) and the results the tool messages after message `at` give."""
    answers = await agui_answers(run_input.messages[at + 1:], agent, session)
    if twice := sorted(set(answers) & set(approvals or {})):
        raise HTTPError(409, "ApprovalError", f"calls {twice} are answered by a tool message and in resume both: "
                        "answer each once; nothing ran")
    return {**(approvals or {}), **answers} or None


async def agui_answers(messages: list[Any], agent: Agent, session: Session | None) -> dict[str, Decision]:
    """Return the `Answer` each ``tool`` message of `messages` (those after the last one the session holds) gives.

    A tool message answers the open call its ``toolCallId`` names when that is a client tool's call;
    one of a call answered in the log already is left out (resent history); one naming a call the
    session never made, or answering one call twice, is a 409.
    """
    tool_messages = [m for m in messages if getattr(m, "role", None) == "tool"]
    if not tool_messages:
        return {}
    open_ = {p.call_id for p in await agent.pending_approvals(session)} if session is not None else set()
    made: set[str] | None = None
    out: dict[str, Decision] = {}
    for m in tool_messages:
        call_id = m.tool_call_id
        if call_id in out:
            raise HTTPError(409, "ApprovalError", f"the tool messages answer call {call_id!r} twice: send one result "
                            "per call; nothing ran")
        if call_id in open_:  # a call awaiting approval is refused by its run, saying so, before the stream
            out[call_id] = answer(_text(m), is_error=m.error is not None)
            continue
        if made is None:
            made = {c.call_id for h in await agent.history(session) for c in h.function_calls} \
                if session is not None else set()
        if call_id not in made:
            raise HTTPError(409, "ApprovalError", f"tool message {m.id!r} answers call {call_id!r}, which the thread "
                            "never made (or no longer waits for): send results only for the tool calls the run "
                            "streamed; nothing ran")
    return out


def _text(m: Any) -> str:
    content = m.content
    text = content if isinstance(content, str) else "".join(getattr(p, "text", "") for p in content)
    if not isinstance(content, str) and any(p.type != "text" for p in content):
        raise HTTPError(400, "BadRequest", f"invalid request: tool message {m.id!r}: give a front-end tool's result "
                        "as text (text parts only)")
    return text or (m.error or "")


def client_call_events(core: Any, pending: list[dict[str, Any]]) -> list[Any]:
    """Return the AG-UI events streaming the client tools' calls among `pending` (`_runs.pending_to_json`)."""
    out: list[Any] = []
    for p in pending:
        if not p.get("client"):
            continue
        out.append(core.ToolCallStartEvent(tool_call_id=p["call_id"], tool_call_name=p["tool_name"],
                                           parent_message_id=p["message_id"]))
        if p["arguments"]:  # the protocol refuses an empty delta
            out.append(core.ToolCallArgsEvent(tool_call_id=p["call_id"], delta=p["arguments"]))
        out.append(core.ToolCallEndEvent(tool_call_id=p["call_id"]))
    return out
