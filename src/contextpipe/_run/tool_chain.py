"""Tool middleware around each tool call of a run, and the record of what each middleware did.

Providers add `ToolMiddleware` with `RunContext.add_tool_middleware`; the loop runs every call
through `ToolChain.run`: the middleware in provider order (the first added is outermost, as for
model middleware), then the tool. What the outermost middleware returns is the result the model
sees and the session stores, so a resumed run reads exactly what the model was given. Each call
gets a `TracedToolCall` in the run's journal saying which middleware saw it and what each did
(changed the arguments, blocked the call, changed the result, raised).

A middleware that raises does not leave its call without a result: the call is answered with an
error result (saying whether the tool had run), the step's other calls finish and are saved, and
then the loop raises `ToolMiddlewareError` (`ToolChain.raise_failure`), naming the provider.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from ..errors import ToolMiddlewareError, UsageError, clause, shorten
from ..messages import FunctionCall, FunctionResult
from ..trace import ApprovalAction, RunJournal, ToolMiddlewareAction, TracedToolCall, TracedToolMiddleware

if TYPE_CHECKING:  # `tools` is imported with a call through middleware: a run without tool calls never loads it
    from ..tool_context import ToolContext
    from ..tools import CallTool, ToolInvocation, ToolMiddleware, ToolOutcome

__all__ = ["ToolChain"]

Invoke: TypeAlias = "Callable[[FunctionCall, str, ToolContext[Any]], Awaitable[ToolOutcome]]"
"""Runs the tool the model's call names with JSON arguments and the call's context (`_run.calls.invoke_tool`)."""


@dataclass(slots=True)
class _Call:
    """What one call's chain learned on its way: each middleware's record, whether the tool ran, who raised."""

    seen: list[TracedToolMiddleware | None]
    ran: bool = False
    culprit: int = 0
    error: BaseException | None = field(default=None, repr=False)


class ToolChain:
    """Runs tool calls through the providers' tool middleware and records each call in the journal."""

    def __init__(self, invoke: Invoke, middleware: Sequence[tuple[str, ToolMiddleware]],
                 journal: RunJournal) -> None:
        self._invoke = invoke
        self._middleware = tuple(middleware)
        self._journal = journal
        self._failure: ToolMiddlewareError | None = None

    async def run(self, call: FunctionCall, step: int, context: ToolContext[Any],
                  approval: ApprovalAction | None = None) -> FunctionResult:
        """Run `call` (asked for by model call `step`; 0 on resume) through the middleware; return its result.

        The tool is given `context`, the one the middleware sees (`ToolInvocation.context`), whatever they pass on.
        `approval` says how a person's approval let it run, for the trace.
        """
        if not self._middleware:
            outcome = await self._invoke(call, call.arguments, context)
            self._journal.record_tool_call(TracedToolCall(step, call.call_id, call.name, outcome.is_error,
                                                          approval=approval))
            return _answer(call, outcome)
        from ..tools import ToolInvocation

        state = _Call([None] * len(self._middleware))
        chain = self._terminal(call, state, context)
        for index in reversed(range(len(self._middleware))):
            chain = self._bind(index, chain, state)
        try:
            outcome = await chain(ToolInvocation(name=call.name, call_id=call.call_id, arguments=call.arguments,
                                                resumed=step == 0 and approval is None, context=context))
        except Exception as exc:  # a middleware failed: answer the call, raise once the step is saved
            outcome = self._failed(call, state, exc)
        seen = tuple(m for m in state.seen if m is not None)
        self._journal.record_tool_call(TracedToolCall(step, call.call_id, call.name, outcome.is_error, seen, approval))
        return _answer(call, outcome)

    def raise_failure(self) -> None:
        """Raise the first `ToolMiddlewareError` of the calls run so far (call it once their results are saved)."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _terminal(self, model_call: FunctionCall, state: _Call, context: ToolContext[Any]) -> CallTool:
        async def run_tool(call: ToolInvocation) -> ToolOutcome:
            state.ran = True
            return await self._invoke(model_call, call.arguments, context)

        return run_tool

    def _bind(self, index: int, call_next: CallTool, state: _Call) -> CallTool:
        from ..tools import ToolInvocation, ToolOutcome

        source_id, middleware = self._middleware[index]

        async def bound(call: ToolInvocation) -> ToolOutcome:
            passed: ToolInvocation | None = None
            got: ToolOutcome | None = None

            async def next_step(forwarded: ToolInvocation) -> ToolOutcome:
                nonlocal passed, got
                if not isinstance(forwarded, ToolInvocation) or not isinstance(forwarded.arguments, str):
                    what = (f"arguments of type {type(forwarded.arguments).__name__}"
                            if isinstance(forwarded, ToolInvocation) else type(forwarded).__name__)
                    raise UsageError(
                        f"tool middleware of context provider {source_id!r} passed {what} to call_next for call "
                        f"{shorten(call.call_id)}; pass the ToolInvocation it was given, or "
                        "call.with_arguments({...}) (a dict or JSON text)")
                if forwarded.name != call.name or forwarded.call_id != call.call_id:
                    raise UsageError(
                        f"tool middleware of context provider {source_id!r} passed call {shorten(call.call_id)} to "
                        f"{shorten(call.name)} on as call {shorten(forwarded.call_id)} to {shorten(forwarded.name)}; "
                        "only the arguments may change (call_next(call.with_arguments(...))). To run another tool, "
                        "call it yourself and return its outcome")
                passed = forwarded
                got = await call_next(forwarded)
                return got

            try:
                outcome = await middleware(call, next_step)
                if not isinstance(outcome, ToolOutcome):
                    raise UsageError(
                        f"tool middleware of context provider {source_id!r} returned {type(outcome).__name__} "
                        f"for call {shorten(call.call_id)}; return a ToolOutcome (the one call_next returned, "
                        "or your own)")
            except Exception as exc:
                raised = exc is not state.error  # not merely passed on from an inner middleware or the tool
                if raised:
                    state.culprit, state.error = index, exc
                state.seen[index] = TracedToolMiddleware(source_id, _actions(call, passed, None, None, raised))
                raise
            state.seen[index] = TracedToolMiddleware(source_id, _actions(call, passed, got, outcome, False))
            return outcome

        return bound

    def _failed(self, call: FunctionCall, state: _Call, exc: Exception) -> ToolOutcome:
        """Note the failure to raise after the step; return the error result the call is answered with."""
        from ..tools import ToolOutcome

        source_id = self._middleware[state.culprit][0]  # the outermost one notes an exception no inner one raised
        ran = "the tool had run, but its result was lost" if state.ran else "the tool did not run"
        failure = ToolMiddlewareError(
            f"tool middleware of context provider {source_id!r} raised {type(exc).__name__} on call "
            f"{shorten(call.call_id)} to tool {shorten(call.name)}: {clause(exc)}. The call was answered with an error "
            f"result ({ran}). Fix the middleware; to refuse a call, return ToolOutcome(..., is_error=True) "
            "instead of raising", source_id=source_id, tool_name=call.name, call_id=call.call_id)
        failure.__cause__ = exc
        if self._failure is None:
            self._failure = failure
        else:  # a parallel call of the same step failed too: say so on the error that is raised
            self._failure.add_note(f"Tool middleware of context provider {source_id!r} also raised "
                                   f"{type(exc).__name__} on call {shorten(call.call_id)}: {clause(exc)}")
        return ToolOutcome(f"Error: the call to {call.name!r} was not completed: a tool middleware failed "
                           f"({ran}). Check its effect before retrying.", is_error=True)


def _actions(call: ToolInvocation, passed: ToolInvocation | None, got: ToolOutcome | None, outcome: ToolOutcome | None,
             raised: bool) -> tuple[ToolMiddlewareAction, ...]:
    actions: list[ToolMiddlewareAction] = []
    if passed is None:
        if outcome is not None:
            actions.append("blocked")
    elif passed.arguments != call.arguments:
        actions.append("changed_arguments")
    if passed is not None and outcome is not None and outcome != got:  # got is None: it caught an inner error
        actions.append("changed_result")
    if raised:
        actions.append("raised")
    return tuple(actions)


def _answer(call: FunctionCall, outcome: ToolOutcome) -> FunctionResult:
    """Return the result of `call`, warning of a file in it too big to re-send with every request."""
    if outcome.parts:
        from .._media import warn_kept

        warn_kept(call.name, call.call_id, outcome.parts)
    return FunctionResult(call.call_id, outcome.result, outcome.is_error, outcome.parts)
