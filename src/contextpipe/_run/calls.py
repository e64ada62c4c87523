"""One tool call: its context (`CallContexts`), running it (`invoke_tool`), and the answers for unfinished calls.

The message that carries a call's result also carries the call's outbox entries (`CallContexts.attach`,
`contextpipe.outbox`), so the store commits them in the same transaction, once.

No model ever sees a call without a result. A call whose run stopped before it finished is
answered with an explicit error instead: `interrupted` when a previous run stopped (the next run
answers the calls it left open, unless their tool runs again: `Tool.runs_again`), `not_run_again`
when the run that was to run such a call again was cut first and must answer it before it keeps its
input (`contextpipe._run.repair`), `stopped_with_run` when this run was cancelled while an async
tool ran and a late result must follow the exchange (`contextpipe._run.threads`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..exchanges import LATE_RESULT_KEY
from ..messages import FunctionCall, FunctionResult, Message
from ..outbox import OUTBOX_KEY

if TYPE_CHECKING:  # `tool_context` and `tools` are imported with a tool call: a run without one never loads them
    from ..outbox import Outbox
    from ..session import Session
    from ..tool_context import ToolContext
    from ..tools import Tool, ToolOutcome
    from .threads import RunThreads

__all__ = ["CallContexts", "interrupted", "invoke_tool", "not_run_again", "returned", "stopped_with_run"]


@dataclass(slots=True)
class CallContexts:
    """Makes the `ToolContext` of each tool call of one run (the same for a call on every re-run)."""

    session: Session | None
    agent: Any
    deps: Any = None
    """The run's ``deps`` (kept for the run only, never stored)."""
    state_owners: Mapping[str, str] = field(default_factory=dict)
    """The session state keys tools may not use, with who keeps each."""
    outbox_problem: str | None = "its run was told of no store to keep outbox entries in"
    """Why the run's tools cannot add outbox entries (`StepWriter.outbox_problem`); None when they can."""
    _made_by: dict[str, str] = field(default_factory=dict)
    _outboxes: dict[int, tuple[FunctionCall, Outbox]] = field(default_factory=dict)  # by id(call), while it may commit

    def expect(self, messages: Sequence[Message], calls: Sequence[FunctionCall]) -> None:
        """Note which of `messages` (the latest that did) made each of `calls`, about to run: its id is in their key."""
        wanted = {c.call_id for c in calls}
        made_by: dict[str, str] = {}
        for message in reversed(messages):
            for c in message.function_calls if message.role == "assistant" else ():
                if c.call_id in wanted:
                    made_by.setdefault(c.call_id, message.id)
            if len(made_by) == len(wanted):
                break
        self._made_by = made_by

    def for_call(self, call: FunctionCall) -> ToolContext[Any]:
        """Return the context of `call` (one of the calls `expect` was told about last)."""
        from ..tool_context import ToolContext

        context = ToolContext.for_call(call.call_id, call.name, deps=self.deps, session=self.session,
                                       message_id=self._made_by.get(call.call_id, ""), agent=self.agent,
                                       state_owners=self.state_owners, outbox_problem=self.outbox_problem)
        self._outboxes[id(call)] = (call, context.outbox)
        return context

    def attach(self, message: Message, calls: Sequence[FunctionCall]) -> Message:
        """Return `message` (the answer of `calls`, or a late result) carrying their outbox entries, if any.

        A call's entries go with the first message that answers it after its tool returned: its
        result, or its late result when it timed out (`contextpipe.outbox`); never twice.
        """
        answered = {r.call_id for r in message.function_results} or {message.metadata.get(LATE_RESULT_KEY, "")}
        entries = []
        for call in calls:
            kept = self._outboxes.get(id(call)) if call.call_id in answered else None
            if kept is not None and (taken := kept[1]._take()):
                entries.extend(taken)
                del self._outboxes[id(call)]
        if not entries:
            return message
        return Message(message.role, message.parts, message.id, message.author_name, message.created_at,
                       {**message.metadata, OUTBOX_KEY: entries}, message.source)


async def invoke_tool(tools: dict[str, Tool], call: FunctionCall, arguments: str,
                      threads: RunThreads | None = None, context: ToolContext[Any] | None = None) -> ToolOutcome:
    """Run the tool `call` names with `arguments` (the model's, or as tool middleware passed them on).

    An unknown name becomes an error outcome for the model. A sync tool's worker thread is handed
    to `threads` (when given), which keeps it if the wait for it ends early. `context` is the call's
    `ToolContext`, for a tool that takes one.
    """
    tool = tools.get(call.name)
    if tool is None:
        from ..tools import ToolOutcome

        names = ", ".join(sorted(tools)) or "none"
        return ToolOutcome(f"Error: there is no tool named {call.name!r}. Available tools: {names}.", is_error=True)
    return await tool._invoke(arguments, None if threads is None else functools.partial(threads.started, call),
                              context)


def deferrable(tools: Mapping[str, Tool], call: FunctionCall, message: Message) -> bool:
    """Tell whether `message`, answering `call`, may be saved without waiting for it to be durable.

    Only an idempotent tool's result, which a crash repairs by running the call again, and only
    when it carries no outbox entries (those must be as durable as any effect).
    """
    tool = tools.get(call.name)
    return tool is not None and tool.idempotent and OUTBOX_KEY not in message.metadata


def interrupted(call: FunctionCall) -> FunctionResult:
    """Return the answer for a call a previous run left without a result, to a tool that is not idempotent."""
    return FunctionResult(
        call.call_id,
        f"Error: the call to {call.name!r} was interrupted before it finished (the previous run stopped); "
        "it was not run again because the tool is not marked idempotent (nor retry_with_key, nor outbox). Check its "
        "effect before retrying.",
        is_error=True,
    )


def not_run_again(call: FunctionCall) -> FunctionResult:
    """Return the answer for a call to an idempotent tool a previous run left open, that a cut run did not finish."""
    return FunctionResult(
        call.call_id,
        f"Error: the call to {call.name!r} was interrupted before it finished (the previous run stopped), and the "
        "run that was to run it again stopped before it had a result. Check its effect before retrying.",
        is_error=True,
    )


def stopped_with_run(call: FunctionCall) -> FunctionResult:
    """Return the answer for a call this run stopped (an async tool cancelled with the run)."""
    return FunctionResult(
        call.call_id,
        f"Error: the call to {call.name!r} was stopped before it finished: its run was cancelled (or failed) while "
        "it ran. It was not run again. Check its effect before retrying.",
        is_error=True,
    )


def returned(task: asyncio.Future[FunctionResult]) -> FunctionResult | None:
    """Return the result of a call's task that returned (None while it runs, or if it was cancelled or raised).

    A cancellation that reaches the run just after the task returned, before the run took its
    result, is raised where the run awaits it: the result is there all the same.
    """
    if not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()
