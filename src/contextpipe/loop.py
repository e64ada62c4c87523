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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from . import _semconv
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
from .telemetry import Spans
from .trace import PromptTrace

if TYPE_CHECKING:
    from .tokens import TokenCounter
    from .tools import Tool

__all__ = [
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


RunEvent: TypeAlias = "TextDelta | ReasoningDelta | ToolCallStarted | ToolCallFinished | StepPersisted"


@dataclass(slots=True)
class LoopState:
    """What the loop produced; read by the agent to build the result."""

    new_messages: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    traces: list[PromptTrace] = field(default_factory=list)
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


async def _execute(tools: dict[str, Tool], call: FunctionCall, spans: Spans | None = None) -> FunctionResult:
    tool = tools.get(call.name)
    span = None
    if spans is not None and spans.tracer is not None:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                      "gen_ai.tool.call.id": call.call_id, "gen_ai.tool.type": "function"}
        if spans.capture:
            attributes["gen_ai.tool.call.arguments"] = call.arguments
        span = spans.start(f"execute_tool {call.name}", attributes)
    if tool is None:
        names = ", ".join(sorted(tools)) or "none"
        result = FunctionResult(
            call.call_id, f"Error: there is no tool named {call.name!r}. Available tools: {names}.", is_error=True
        )
    else:
        if span is not None and spans is not None:
            with spans.current(span):
                outcome = await tool.invoke(call.arguments)
        else:
            outcome = await tool.invoke(call.arguments)
        result = FunctionResult(call.call_id, outcome.result, outcome.is_error)
    if span is not None:
        if spans is not None and spans.capture:
            span.set_attribute("gen_ai.tool.call.result", result.result)
        if result.is_error:
            span.set_attribute("error.type", "tool_error")
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, result.result[:200]))
        span.end()
    return result


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
                 want_events: bool, counter: Callable[[], TokenCounter] | None = None) -> None:
        self.ctx = ctx
        self.model = model
        self.limits = limits
        self.stream = stream
        self.want_events = want_events
        self.state = LoopState()
        self._model_source = Source("model", model.name)
        self._counter = counter
        self._sent: ModelRequest | None = None

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
        segments = list(ctx.segments)
        instruction_sources = ctx.instruction_sources
        spans = ctx.spans if ctx.spans.tracer is not None else None
        persists = ctx.persists and ctx.per_step_persistence
        error_steps = 0
        step = 0
        while True:
            step += 1
            final = step > limits.max_steps or error_steps >= limits.max_consecutive_tool_errors
            # Each request gets its own snapshot: middleware and models may keep the request.
            request = ModelRequest(tuple(working), instructions, () if final else specs, ctx.settings)
            started = time.perf_counter()
            chat_span = self._start_chat_span(request) if spans is not None else None
            try:
                response = None
                async for item in self._call(call, request, chat_span):
                    if isinstance(item, ModelResponse):
                        response = item
                    else:
                        yield item
            except BaseException as exc:
                Spans.end(chat_span, exc)
                raise
            assert response is not None
            self._end_chat_span(chat_span, response)
            latency = time.perf_counter() - started
            state.steps = step
            if response.usage is not None:
                state.usage = state.usage + response.usage
            state.traces.append(PromptTrace(
                step, self.model.name, response.usage, latency, response.finish_reason,
                tuple(ctx.take_compaction_decisions()), tuple(ctx.timings) if step == 1 else (),
                _request=self._sent or request, _segments=segments, _instruction_sources=instruction_sources,
                _tool_sources=ctx.tool_sources, _counter=self._counter))
            self._sent = None
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
                results = [await _execute(tools, calls[0], spans)]
            else:
                results = list(await asyncio.gather(*(_execute(tools, c, spans) for c in calls)))
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

    async def _call(self, call: CallModel | None, request: ModelRequest, span: Any) -> AsyncIterator[
            TextDelta | ReasoningDelta | ModelResponse]:
        """Make one model call (through the middleware chain, if any); yield deltas, then the response."""
        if call is not None:
            if self.stream:
                async for item in self._stream_through(call, request):
                    yield item
            elif span is not None:
                with self.ctx.spans.current(span):
                    yield await call(request)
            else:
                yield await call(request)
        elif self.stream:
            self._check(request)
            response = None
            async for model_event in self.model.stream(request):
                if isinstance(model_event, ResponseComplete):
                    response = model_event.response
                else:
                    yield model_event
            if response is None:
                raise ModelResponseError(f"model {self.model.name!r} ended its stream without a response")
            yield response
        else:
            self._check(request)
            if span is not None:
                with self.ctx.spans.current(span):
                    yield await self.model.complete(request)
            else:
                yield await self.model.complete(request)

    def _start_chat_span(self, request: ModelRequest) -> Any:
        spans = self.ctx.spans
        attributes = _semconv.chat_request_attributes(self.model, self.model.name, request.settings, request.messages,
                                                      request.instructions, spans.capture)
        return spans.start(f"chat {self.model.name}", attributes, kind="CLIENT")

    def _end_chat_span(self, span: Any, response: ModelResponse) -> None:
        if span is not None:
            Spans.end(span, None, **_semconv.chat_response_attributes(response, self.ctx.spans.capture))

    def _check(self, request: ModelRequest) -> None:
        """Refuse to send a broken request (see `contextpipe.invariants`); remember what was sent."""
        self._sent = request
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
                result = await _execute(ctx.tools, c, ctx.spans)
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
