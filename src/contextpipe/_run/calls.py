"""One tool call: running it (`invoke_tool`), and the answers for calls that did not finish.

No model ever sees a call without a result. A call whose run stopped before it finished is
answered with an explicit error instead: `interrupted` when a previous run stopped (the next run
answers the calls it left open, unless their tool is idempotent and runs again), `not_run_again`
when the run that was to run such a call again was cut first and must answer it before it keeps its
input (`contextpipe._run.repair`), `stopped_with_run` when this run was cancelled while an async
tool ran and a late result must follow the exchange (`contextpipe._run.threads`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ..messages import FunctionCall, FunctionResult
from ..tools import ToolOutcome

if TYPE_CHECKING:
    from ..tools import Tool
    from .threads import RunThreads

__all__ = ["interrupted", "invoke_tool", "not_run_again", "stopped_with_run"]


async def invoke_tool(tools: dict[str, Tool], call: FunctionCall, arguments: str,
                      threads: RunThreads | None = None) -> ToolOutcome:
    """Run the tool `call` names with `arguments` (the model's, or as tool middleware passed them on).

    An unknown name becomes an error outcome for the model. A sync tool's worker thread is handed
    to `threads` (when given), which keeps it if the wait for it ends early.
    """
    tool = tools.get(call.name)
    if tool is None:
        names = ", ".join(sorted(tools)) or "none"
        return ToolOutcome(f"Error: there is no tool named {call.name!r}. Available tools: {names}.", is_error=True)
    return await tool._invoke(arguments, None if threads is None else functools.partial(threads.started, call))


def interrupted(call: FunctionCall) -> FunctionResult:
    """Return the answer for a call a previous run left without a result, to a tool that is not idempotent."""
    return FunctionResult(
        call.call_id,
        f"Error: the call to {call.name!r} was interrupted before it finished (the previous run stopped); "
        "it was not run again because the tool is not marked idempotent. Check its effect before retrying.",
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
