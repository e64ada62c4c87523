"""The step loop: model call, then tool calls, then the next model call, persisting every step.

One step is a model call and the tool calls it asked for. With per-step persistence (the default)
the model's new messages are saved right after the call and the tool results right after they are
produced, so a crash at step k loses nothing before it. The loop keeps its working set in memory and
saves deltas: a step costs O(new messages), never a re-read of the history.

Before the first call the loop repairs a session whose log ends in tool calls without results (a
crash, a kill, a cancelled stream): recorded results are kept, calls to idempotent tools are run
again, and every other call gets an explicit "interrupted" result, so no model ever sees an
unanswered call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

from .errors import ModelResponseError
from .invariants import check_messages
from .messages import FunctionCall, FunctionResult, Message, Source
from .models.base import (
    CallModel,
    ChatModel,
    ModelMiddleware,
    ModelRequest,
    ModelResponse,
    ReasoningDelta,
    ResponseComplete,
    TextDelta,
    Usage,
)
from .pipeline import RunContext, Segment

if TYPE_CHECKING:
    from .compaction import CompactionDecision
    from .tools import Tool

__all__ = [
    "CallTrace",
    "RunEvent",
    "RunLimits",
    "StepPersisted",
    "StopReason",
    "ToolCallFinished",
    "ToolCallStarted",
]

StopReason: TypeAlias = Literal["completed", "max_steps", "tool_errors"]


@dataclass(frozen=True, slots=True)
class RunLimits:
    """Bounds on one run's tool loop."""

    max_steps: int = 20
    """Model calls that may request tools; after that, one final call without tools."""
    max_consecutive_tool_errors: int = 3
    """Steps in a row whose tool calls all failed before the loop stops calling tools."""


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A tool call is about to run."""

    call: FunctionCall
    kind: Literal["tool_call_started"] = "tool_call_started"


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """A tool call finished (successfully or with an error result)."""

    call: FunctionCall
    result: FunctionResult
    kind: Literal["tool_call_finished"] = "tool_call_finished"


@dataclass(frozen=True, slots=True)
class StepPersisted:
    """Messages were saved to the session's history."""

    step: int
    """The step (model call number, from 1) the messages belong to."""
    messages: Sequence[Message]
    """What was saved."""
    kind: Literal["step_persisted"] = "step_persisted"


@dataclass(frozen=True, slots=True)
class CallTrace:
    """A short record of one model call (the full prompt trace builds on this)."""

    step: int
    """Model call number within the run, from 1."""
    model: str
    """The model called."""
    message_count: int
    """Messages sent."""
    tool_names: tuple[str, ...]
    """Tools offered."""
    usage: Usage | None
    """Tokens the model reported."""
    latency_s: float
    """Wall time of the call, including middleware."""
    finish_reason: str | None
    """Why the model stopped."""
    compaction: tuple[CompactionDecision, ...] = ()
    """What compaction changed in the context for this call (dropped, summarised, cleared)."""


RunEvent: TypeAlias = "TextDelta | ReasoningDelta | ToolCallStarted | ToolCallFinished | StepPersisted"


@dataclass(slots=True)
class LoopState:
    """What the loop produced; read by the agent to build the result."""

    new_messages: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    traces: list[CallTrace] = field(default_factory=list)
    stop_reason: StopReason = "completed"
    steps: int = 0


_MODEL = "model"
_DONE = object()


def _interrupted(call: FunctionCall) -> FunctionResult:
    return FunctionResult(
        call.call_id,
        f"Error: the call to {call.name!r} was interrupted before it finished (the previous run stopped); "
        "it was not run again because the tool is not marked idempotent. Check its effect before retrying.",
        is_error=True,
    )


def unanswered_calls(messages: Sequence[Message]) -> list[FunctionCall]:
    """Return the calls of the last assistant message in `messages` that have no result after it.

    Only the tail is read: trailing tool messages and the assistant message before them.
    """
    answered: set[str] = set()
    i = len(messages) - 1
    while i >= 0 and messages[i].role == "tool":
        answered.update(r.call_id for r in messages[i].function_results)
        i -= 1
    if i < 0 or messages[i].role != "assistant":
        return []
    return [c for c in messages[i].function_calls if c.call_id not in answered]


async def _execute(tools: dict[str, Tool], call: FunctionCall) -> FunctionResult:
    tool = tools.get(call.name)
    if tool is None:
        names = ", ".join(sorted(tools)) or "none"
        return FunctionResult(
            call.call_id, f"Error: there is no tool named {call.name!r}. Available tools: {names}.", is_error=True
        )
    outcome = await tool.invoke(call.arguments)
    return FunctionResult(call.call_id, outcome.result, outcome.is_error)


def _tool_message(calls: Sequence[FunctionCall], results: Sequence[FunctionResult]) -> Message:
    names = {c.name for c in calls}
    source = Source("tool", names.pop() if len(names) == 1 else None)
    return Message("tool", tuple(results), source=source)


def _chain(middleware: Sequence[ModelMiddleware], terminal: CallModel) -> CallModel:
    call = terminal
    for mw in reversed(middleware):
        call = _bind(mw, call)
    return call


def _bind(mw: ModelMiddleware, call_next: CallModel) -> CallModel:
    async def bound(request: ModelRequest) -> ModelResponse:
        return await mw(request, call_next)

    return bound


class StepLoop:
    """Runs the tool loop of one run; iterate `events()` to drive it."""

    def __init__(self, ctx: RunContext, model: ChatModel, limits: RunLimits, *, stream: bool,
                 want_events: bool) -> None:
        self.ctx = ctx
        self.model = model
        self.limits = limits
        self.stream = stream
        self.want_events = want_events
        self.state = LoopState()
        self._model_source = Source("model", model.name)

    async def events(self) -> AsyncIterator[RunEvent]:
        """Drive the loop, yielding events (only a few when `want_events` is False)."""
        ctx, limits, state = self.ctx, self.limits, self.state
        async for event in self._repair():
            yield event
        working = ctx.messages
        tools = ctx.tools
        specs = [t.spec for t in tools.values()]
        instructions = ctx.instructions
        call = _chain(ctx.middleware, self._terminal) if ctx.middleware else None
        persists = ctx.persists and ctx.per_step_persistence
        error_steps = 0
        step = 0
        while True:
            step += 1
            final = step > limits.max_steps or error_steps >= limits.max_consecutive_tool_errors
            # Each request gets its own snapshot: middleware and models may keep the request.
            request = ModelRequest(tuple(working), instructions, () if final else specs, ctx.settings)
            started = time.perf_counter()
            if call is not None:
                response = None
                if self.stream:
                    async for item in self._stream_through(call, request):
                        if isinstance(item, ModelResponse):
                            response = item
                        else:
                            yield item
                else:
                    response = await call(request)
                assert response is not None
            elif self.stream:
                response = None
                self._check(request)
                async for model_event in self.model.stream(request):
                    if isinstance(model_event, ResponseComplete):
                        response = model_event.response
                    else:
                        yield model_event
                if response is None:
                    raise ModelResponseError(f"model {self.model.name!r} ended its stream without a response")
            else:
                self._check(request)
                response = await self.model.complete(request)
            latency = time.perf_counter() - started
            state.steps = step
            if response.usage is not None:
                state.usage = state.usage + response.usage
            state.traces.append(CallTrace(step, self.model.name, len(working), tuple(s.name for s in request.tools),
                                          response.usage, latency, response.finish_reason,
                                          tuple(ctx.take_compaction_decisions())))
            produced = [m.with_source(self._model_source) for m in response.messages]
            working.extend(produced)
            state.new_messages.extend(produced)
            calls = [c for m in produced for c in m.function_calls]
            if final and calls:
                # The model called tools after they were withdrawn: answer every call so the log
                # never holds an unanswered call, and stop.
                results = [FunctionResult(c.call_id, "Error: not run; the run's step limit was reached.",
                                          is_error=True) for c in calls]
                tool_msg = _tool_message(calls, results)
                working.append(tool_msg)
                state.new_messages.append(tool_msg)
                produced = [*produced, tool_msg]
                calls = []
            if persists:
                saved = await ctx.persist(produced)
                if self.want_events and saved:
                    yield StepPersisted(step, saved)
            if not calls:
                if final:
                    state.stop_reason = "max_steps" if step > limits.max_steps else "tool_errors"
                return
            if self.want_events:
                for c in calls:
                    yield ToolCallStarted(c)
            if len(calls) == 1:
                results = [await _execute(tools, calls[0])]
            else:
                results = list(await asyncio.gather(*(_execute(tools, c) for c in calls)))
            tool_msg = _tool_message(calls, results)
            working.append(tool_msg)
            state.new_messages.append(tool_msg)
            if self.want_events:
                for c, r in zip(calls, results, strict=True):
                    yield ToolCallFinished(c, r)
            if persists:
                saved = await ctx.persist([tool_msg])
                if self.want_events and saved:
                    yield StepPersisted(step, saved)
            error_steps = error_steps + 1 if all(r.is_error for r in results) else 0

    def _check(self, request: ModelRequest) -> None:
        """Refuse to send a broken request (see `contextpipe.invariants`)."""
        check_messages(request.messages, latest_input=self.ctx.input[-1] if self.ctx.input else None)

    async def _terminal(self, request: ModelRequest) -> ModelResponse:
        self._check(request)
        return await self.model.complete(request)

    async def _stream_through(self, call: CallModel, request: ModelRequest) -> AsyncIterator[
            TextDelta | ReasoningDelta | ModelResponse]:
        """Run a middleware chain whose innermost call streams, forwarding deltas as they arrive."""
        queue: asyncio.Queue[object] = asyncio.Queue()

        async def streaming_terminal(req: ModelRequest) -> ModelResponse:
            self._check(req)
            final: ModelResponse | None = None
            async for event in self.model.stream(req):
                if isinstance(event, ResponseComplete):
                    final = event.response
                else:
                    queue.put_nowait(event)
            if final is None:
                raise ModelResponseError(f"model {self.model.name!r} ended its stream without a response")
            return final

        chain = _chain(self.ctx.middleware, streaming_terminal)
        task = asyncio.ensure_future(chain(request))
        task.add_done_callback(lambda _: queue.put_nowait(_DONE))
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                assert isinstance(item, TextDelta | ReasoningDelta)
                yield item
            yield task.result()
        finally:
            if not task.done():
                task.cancel()

    async def _repair(self) -> AsyncIterator[RunEvent]:
        """Answer the calls a previous, interrupted run left without results (see module docstring)."""
        ctx = self.ctx
        history_index = next((i for i in range(len(ctx.segments) - 1, -1, -1)
                              if ctx.segments[i].source.kind == "history"), None)
        if history_index is None:
            return
        pending = unanswered_calls(ctx.segments[history_index].messages)
        if not pending:
            return
        results: list[FunctionResult] = []
        for c in pending:
            tool = ctx.tools.get(c.name)
            if tool is not None and tool.idempotent:
                if self.want_events:
                    yield ToolCallStarted(c)
                result = await _execute(ctx.tools, c)
                if self.want_events:
                    yield ToolCallFinished(c, result)
            else:
                result = _interrupted(c)
            results.append(result)
        tool_msg = _tool_message(pending, results)
        ctx.segments.insert(history_index + 1, Segment(Source("tool", "repair"), [tool_msg]))
        self.state.new_messages.append(tool_msg)
        if ctx.persists:
            saved = await ctx.persist([tool_msg], with_request=False)
            if self.want_events and saved:
                yield StepPersisted(0, saved)
