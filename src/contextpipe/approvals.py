"""Human approval of tool calls: which calls wait for a person, and the decisions sent back.

A tool marked ``@tool(needs_approval=True)`` (or given a function of the call's `ToolContext` and
arguments that decides per call), or covered by the agent's policy (``Agent(needs_approval=...)``,
for tools you did not write, such as MCP tools), is not run when the model asks for it: the run
saves the model's message with the call, marks the call as awaiting approval in that message, and
stops with ``stop_reason="approval_required"`` and `RunResult.pending_approvals`. Nothing else
holds it: the session's log does, so any process can decide later, after a restart too:

>>> pending = PendingApproval("call_1", "delete_file", '{"path": "report.txt"}', "deletes a file")
>>> pending.approve()  # bound to this call's arguments
Approval(digest='...', always=False)
>>> pending.reject("keep it").reason
'keep it'

``agent.run(None, session=session, approvals={pending.call_id: pending.approve()})`` resumes the run.
A decision made from a `PendingApproval` carries the digest of the arguments it was shown
(`arguments_digest`), and the run refuses it (`contextpipe.ApprovalError`) when the call awaiting
approval under that id has other arguments; `approve()` and `reject()` alone are bound to the call
id only. ``approve(always=True)`` also allows the tool for the rest of the session (kept in the
session's state under `STATE_KEY`).

A call to a `contextpipe.ClientTool` (a tool the caller runs, such as a web page's) waits the same way,
marked `PendingApproval.client`: the caller runs it and resumes with its result,
``approvals={pending.call_id: pending.answer("the result")}`` (an `Answer`, stored as the call's
result, never run on the server), or declines it with ``pending.reject("why")``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    from .messages import Message
    from .tool_context import ToolContext

__all__ = ["AWAITING_KEY", "CLIENT_KEY", "DECISIONS_KEY", "STATE_KEY", "AgentApprovalPolicy", "Answer", "Approval",
           "ApprovalCheck", "Decision", "PendingApproval", "Rejection", "answer", "approve", "arguments_digest",
           "awaiting_approval", "client_calls", "reject"]

AWAITING_KEY: Final = "awaiting_approval"
"""Metadata key of a model message whose calls await approval: ``{call_id: why}``."""

CLIENT_KEY: Final = "client_calls"
"""Metadata key of a model message whose calls are a client's to run (`contextpipe.ClientTool`): their ids."""

DECISIONS_KEY: Final = "approvals"
"""Metadata key of the tool message answering decided calls: ``{call_id: {"decision": ..., "digest": ...}}``."""

STATE_KEY: Final = "approvals"
"""Session state key of the session's approvals: the tools always allowed, approved calls not yet answered,
and late results held while calls wait for a person (given back after their answer)."""

_DIGEST_VERSION: Final = "contextpipe.approval.v1"

ApprovalCheck: TypeAlias = Callable[["ToolContext[Any]", dict[str, Any]], "bool | str | Awaitable[bool | str]"]
"""Decides per call whether a person must approve it: ``check(ctx, arguments)``, sync or async.

True (or a text saying why) asks for approval; False runs the call. It gets the call's
`ToolContext` (``ctx.tool_name``, the user, deps) and the arguments the model sent, as a dict. A
check that raises asks for approval (the reason says what it raised)."""

AgentApprovalPolicy: TypeAlias = "ApprovalCheck | Iterable[str]"
"""``Agent(needs_approval=...)``: an `ApprovalCheck` for every call, or tool names (``fnmatch`` patterns
such as ``"git_*"``) whose every call needs approval."""


def arguments_digest(tool_name: str, arguments: str) -> str:
    """Return the SHA-256 (hex) of a call's tool name and arguments (the JSON text the model sent).

    >>> arguments_digest("delete_file", '{"path": "a"}') == arguments_digest("delete_file", '{"path": "b"}')
    False
    """
    import hashlib  # here: importing contextpipe stays fast

    text = json.dumps([_DIGEST_VERSION, tool_name, arguments], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def awaiting_approval(message: Message | None) -> dict[str, str]:
    """Return the calls a model message marked as awaiting approval when it was saved, with why (`AWAITING_KEY`).

    Those of them with no result after the message in the log are the calls still waiting.
    """
    marked = message.metadata.get(AWAITING_KEY) if message is not None and message.metadata else None
    return {str(k): str(v) for k, v in marked.items()} if isinstance(marked, dict) else {}


def client_calls(message: Message | None) -> set[str]:
    """Return the ids of the calls a model message marked as the client's to run (`CLIENT_KEY`) when it was saved."""
    marked = message.metadata.get(CLIENT_KEY) if message is not None and message.metadata else None
    return {str(i) for i in marked} if isinstance(marked, list) else set()


@dataclass(frozen=True, slots=True)
class Approval:
    """A person approved a call: it runs when the run resumes (see `approve`)."""

    digest: str | None = field(default=None, repr=False)
    """The `arguments_digest` of the arguments approved; None approves the call id whatever they are."""
    always: bool = False
    """Also allow every later call of this tool in the session, without asking."""

    def __repr__(self) -> str:
        digest = "None" if self.digest is None else "'...'"
        return f"Approval(digest={digest}, always={self.always})"


@dataclass(frozen=True, slots=True)
class Rejection:
    """A person rejected a call: it is not run, and the model gets `reason` as the call's (error) result."""

    reason: str = ""
    """Why, for the model (it reads it and can answer or try another way)."""
    digest: str | None = field(default=None, repr=False)
    """The `arguments_digest` of the arguments rejected; None rejects the call id whatever they are."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The client ran a call to a `contextpipe.ClientTool`: `result` is stored as the call's result (see `answer`)."""

    result: str
    """What the call returned, as the model reads it."""
    is_error: bool = False
    """True when the call failed (`result` then says how)."""
    digest: str | None = field(default=None, repr=False)
    """The `arguments_digest` of the arguments the client ran the call with; None: the call id, whatever they are."""


Decision: TypeAlias = Approval | Rejection | Answer
"""What ``agent.run(..., approvals={call_id: decision})`` takes for each call."""


def approve(*, digest: str | None = None, always: bool = False) -> Approval:
    """Approve a call; with `always`, allow its tool for the rest of the session too.

    Prefer ``pending.approve()`` (`PendingApproval.approve`), which binds the decision to the arguments shown.
    """
    return Approval(digest, always)


def reject(reason: str = "", *, digest: str | None = None) -> Rejection:
    """Reject a call, telling the model `reason`; prefer ``pending.reject(reason)``, bound to the arguments shown."""
    return Rejection(reason, digest)


def answer(result: str, *, is_error: bool = False, digest: str | None = None) -> Answer:
    """Give the result of a client tool's call (`PendingApproval.client`); prefer ``pending.answer(result)``."""
    return Answer(result, is_error, digest)


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call the model asked for that waits for a person's decision (`RunResult.pending_approvals`)."""

    call_id: str
    """The model's id for the call: the key of the decision in ``agent.run(..., approvals={...})``."""
    tool_name: str
    """The tool the model called."""
    arguments: str
    """The arguments, as JSON text (what the call will run with)."""
    why: str
    """Why it needs approval (the tool's or the agent's policy said so)."""
    message_id: str = ""
    """The id of the model message that made the call (in the session's log)."""
    digest: str = ""
    """The `arguments_digest` of `tool_name` and `arguments` (computed when not given)."""
    client: bool = False
    """True for a call to a `contextpipe.ClientTool`: it waits for the caller's result (`answer`), not for approval."""

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", arguments_digest(self.tool_name, self.arguments))

    def parsed_arguments(self) -> dict[str, Any] | None:
        """Return the arguments as a dict; None when the model sent something else than a JSON object."""
        try:
            parsed = json.loads(self.arguments) if self.arguments.strip() not in ("", "null") else {}
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def approve(self, *, always: bool = False) -> Approval:
        """Approve this call with these arguments (refused if the call's arguments are other ones)."""
        return Approval(self.digest, always)

    def reject(self, reason: str = "") -> Rejection:
        """Reject this call with these arguments, telling the model `reason`."""
        return Rejection(reason, self.digest)

    def answer(self, result: str, *, is_error: bool = False) -> Answer:
        """Give the result the client got running this call (a `client` one) with these arguments."""
        return Answer(result, is_error, self.digest)
