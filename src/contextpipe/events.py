"""Every event `Agent.stream` yields, the `StreamEvent` union, and the `RunResult` the last one carries.

Text and reasoning deltas come from the model (`contextpipe.models.base` defines them, since model
clients stream them too); the others come from the run. Each is a frozen dataclass with a ``kind``
literal to dispatch on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeAlias, cast

from .approvals import PendingApproval  # at run time, as Session below
from .errors import UsageError
from .messages import FunctionCall, FunctionResult, Message
from .models.base import ReasoningDelta, TextDelta, Usage
from .session import Session  # at run time, so that typing.get_type_hints resolves the events' fields
from .trace import PromptTrace

if TYPE_CHECKING:
    from typing_extensions import TypeVar  # a default (PEP 696), which typing has from Python 3.13 on

    OutputT = TypeVar("OutputT", default=str)
else:
    from typing import TypeVar

    OutputT = TypeVar("OutputT")

__all__ = [
    "ApprovalRequired",
    "MessageDelivered",
    "ReasoningDelta",
    "RunDone",
    "RunEvent",
    "RunResult",
    "StepPersisted",
    "StopReason",
    "StreamEvent",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
]

StopReason: TypeAlias = Literal["completed", "max_steps", "tool_errors", "approval_required", "client_tool_calls"]
"""Why the tool loop ended: it ``completed``, was cut short at the step or tool-error limit, waits
for a person to decide on tool calls (``approval_required``: see `RunResult.pending_approvals`), or
waits only for the caller to run calls of its client tools (``client_tool_calls``: `contextpipe.ClientTool`)."""


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A tool call is about to run."""

    call: FunctionCall
    """The call, as the model made it."""
    kind: Literal["tool_call_started"] = "tool_call_started"


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """A tool call finished (successfully or with an error result); with per-step persistence its result is saved."""

    call: FunctionCall
    """The call."""
    result: FunctionResult
    """Its result, as the model will see it."""
    kind: Literal["tool_call_finished"] = "tool_call_finished"


@dataclass(frozen=True, slots=True)
class StepPersisted:
    """Messages were saved to the session's history."""

    step: int
    """The step (model call number, from 1; 0 for the repair of an interrupted run) the messages belong to."""
    messages: Sequence[Message]
    """What was saved."""
    kind: Literal["step_persisted"] = "step_persisted"


@dataclass(frozen=True, slots=True)
class MessageDelivered:
    """A message queued for the session (``agent.enqueue(..., when="asap")``) joined the run at a step boundary.

    It is in the session's log (delivered exactly once, `contextpipe.queue`), and the model sees it in its next call.
    """

    message: Message
    """The delivered user message (its id is the queued entry's)."""
    step: int
    """Model calls made before it: 0 when it came before the run's input, at the run's start."""
    kind: Literal["message_delivered"] = "message_delivered"


@dataclass(frozen=True, slots=True)
class ApprovalRequired:
    """The run stops here: these tool calls wait for a person's decision or a client's result (then `RunDone`).

    The calls are in the session's log; resume with ``agent.run(None, session=..., approvals={...})``.
    """

    pending: tuple[PendingApproval, ...]
    """The calls awaiting a decision, in the order the model made them."""
    kind: Literal["approval_required"] = "approval_required"


@dataclass(frozen=True, slots=True)
class NoOutput:
    """Why a run's result has no `RunResult.output` (it stopped before a final answer)."""

    why: str
    """What to do instead."""


_TEXT: Final = NoOutput("")  # `RunResult.output` is the text: the run had no output type


@dataclass(slots=True)
class RunResult(Generic[OutputT]):
    """What a run produced; `output` is its answer, typed (``RunResult[City]`` for ``output_type=City``).

    >>> import asyncio
    >>> from pydantic import BaseModel
    >>> from contextpipe import Agent
    >>> from contextpipe.testing import ScriptedModel
    >>> class City(BaseModel):
    ...     name: str
    >>> agent = Agent(ScriptedModel(['{"name": "Suzhou"}']))
    >>> asyncio.run(agent.run("Which city?", output_type=City)).output
    City(name='Suzhou')
    """

    text: str
    """The final answer: text of the last assistant message."""
    messages: list[Message]
    """Messages the run produced, in order: model output and tool results."""
    input: list[Message]
    """The caller's input messages, as tagged and stored."""
    usage: Usage
    """Tokens used over all model calls, as the model reported them."""
    traces: list[PromptTrace]
    """One provenance record per model call: every instruction, message and tool, its source and tokens."""
    stop_reason: StopReason
    """``completed``, or why the tool loop was cut short (``max_steps``, ``tool_errors``), or
    ``approval_required`` / ``client_tool_calls`` (see `pending_approvals`)."""
    steps: int
    """Model calls made."""
    session: Session | None = None
    """The session the run used, with its updated state and version."""
    replayed: bool = False
    """True when the input had been answered in the session before (a retry, same message id): this is
    that earlier run's result read back from the log, with no model call and nothing stored (`usage`,
    `traces` and `steps` are this call's: none)."""
    pending_approvals: list[PendingApproval] = field(default_factory=list)
    """With ``stop_reason="approval_required"`` or ``"client_tool_calls"``: the tool calls waiting for a person's
    decision or a client's result (call id, tool, arguments, why, `client`). Decide with
    ``agent.run(None, session=..., approvals={call_id: decision})``."""
    _output: Any = field(default=_TEXT, repr=False, compare=False)

    @property
    def output(self) -> OutputT:
        """The answer: with ``output_type=`` given to the run, validated into that type; otherwise `text`.

        A run that stopped before its final answer (waiting for approvals, at a limit without one)
        has none: reading it raises `UsageError` saying why.
        """
        if self._output is _TEXT:
            return cast("OutputT", self.text)
        if isinstance(self._output, NoOutput):
            raise UsageError(self._output.why)
        return cast("OutputT", self._output)


@dataclass(frozen=True, slots=True)
class RunDone:
    """The last event of a stream: the run's result."""

    result: RunResult[Any]
    """The result, as `Agent.run` would return it."""
    kind: Literal["run_done"] = "run_done"


RunEvent: TypeAlias = (TextDelta | ReasoningDelta | ToolCallStarted | ToolCallFinished | StepPersisted
                      | MessageDelivered | ApprovalRequired)
"""Events of the tool loop."""

StreamEvent: TypeAlias = (TextDelta | ReasoningDelta | ToolCallStarted | ToolCallFinished | StepPersisted
                          | MessageDelivered | ApprovalRequired | RunDone)
"""Events `Agent.stream` yields; the last is always `RunDone`."""
