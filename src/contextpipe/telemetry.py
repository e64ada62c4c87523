"""OpenTelemetry spans for runs, provider hooks, model calls and tool calls (GenAI semantic conventions).

Spans are made only when a tracer provider is configured: passed as
``Agent(telemetry=Telemetry(tracer_provider=...))``, or set globally with
``opentelemetry.trace.set_tracer_provider``. Otherwise nothing is imported and nothing is done, so
telemetry costs nothing when it is not used. Message content (prompts, answers, tool arguments and
results) is recorded only with ``capture_content=True``.

Span names and attributes follow the OpenTelemetry GenAI conventions: ``invoke_agent {name}`` for a
run, ``chat {model}`` for a model call, ``execute_tool {tool}`` for a tool call, with
``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``,
``gen_ai.usage.output_tokens``, ``gen_ai.response.finish_reasons``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``gen_ai.conversation.id``, ``gen_ai.provider.name`` (``openai``,
``anthropic``, ...), ``server.address`` / ``server.port``, ``gen_ai.response.id``, and ``error.type``
on failure; captured content uses the conventions' message schema. The mapping lives in
``_semconv``. Provider hooks are ``contextpipe.before_run {source_id}`` and
``contextpipe.after_run {source_id}``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .messages import FunctionCall, FunctionResult
from .models.base import ChatModel, ModelRequest, ModelResponse, ModelStreamEvent, ResponseComplete

__all__ = ["InstrumentedModel", "Spans", "Telemetry", "instrument_tool_calls"]

ExecuteTool = Callable[[FunctionCall], Awaitable[FunctionResult]]
"""Runs one tool call and returns its result (never raises for a tool's own failure)."""


@dataclass(frozen=True)
class Telemetry:
    """How an agent reports to OpenTelemetry."""

    tracer_provider: Any = None
    """A tracer provider to use; None uses the global one when one has been set."""
    capture_content: bool = False
    """Record message content and tool arguments / results on spans (off by default: it may be private)."""


def _global_provider() -> Any:
    """Return the globally set tracer provider, without importing OpenTelemetry if the application did not."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or getattr(trace, "_TRACER_PROVIDER", None) is None:
        return None
    return trace.get_tracer_provider()


class Spans:
    """The spans of one run; every method is a no-op when `tracer` is None."""

    def __init__(self, telemetry: Telemetry, agent_name: str | None) -> None:
        provider = telemetry.tracer_provider or _global_provider()
        self.tracer = provider.get_tracer("contextpipe") if provider is not None else None
        self.capture = telemetry.capture_content
        self.agent_name = agent_name or "agent"
        self.root: Any = None

    def _context(self, parent: Any) -> Any:
        from opentelemetry import trace

        return trace.set_span_in_context(parent) if parent is not None else None

    def start(self, name: str, attributes: dict[str, Any], *, parent: Any = None, kind: str = "INTERNAL") -> Any:
        """Start a span (child of `parent`, else of the run's root span); None when inactive."""
        if self.tracer is None:
            return None
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span(name, context=self._context(parent if parent is not None else self.root),
                                      kind=getattr(SpanKind, kind), attributes=attributes)

    def start_run(self, session_id: str | None, model: ChatModel) -> None:
        """Start the run's root ``invoke_agent`` span."""
        from . import _semconv  # here: an agent without telemetry never loads the conventions' mapping

        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": self.agent_name,
                                      "gen_ai.request.model": model.name, **_semconv.agent_attributes(model)}
        if session_id is not None:
            attributes["gen_ai.conversation.id"] = session_id
        self.root = self.start(f"invoke_agent {self.agent_name}", attributes)

    @staticmethod
    def end(span: Any, error: BaseException | None = None, **attributes: Any) -> None:
        """Set `attributes` (None values left out), record `error` if any, and end `span` (None: no-op)."""
        if span is None:
            return
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            from . import _semconv

            span.set_attribute("error.type", _semconv.error_type(error))
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        span.end()

    @contextmanager
    def current(self, span: Any) -> Iterator[None]:
        """Make `span` the current span around code that does not yield (so libraries nest under it)."""
        if span is None:
            yield
            return
        from opentelemetry import context, trace

        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    def content(self, messages: Any) -> str:
        """Return `messages` as the JSON text recorded on spans when content capture is on."""
        from . import _semconv

        return _semconv.input_messages(messages)


# --- attributes (the GenAI semantic conventions live in these functions) ------------------------------


def chat_request_attributes(model: ChatModel, request: ModelRequest, spans: Spans) -> dict[str, Any]:
    """Attributes of a ``chat`` span when the request is sent."""
    from . import _semconv

    return _semconv.chat_request_attributes(model, model.name, request.settings, request.messages,
                                            request.instructions, spans.capture)


def chat_response_attributes(response: ModelResponse, spans: Spans) -> dict[str, Any]:
    """Attributes of a ``chat`` span when the response is complete (None values are left out)."""
    from . import _semconv

    return _semconv.chat_response_attributes(response, spans.capture)


def tool_call_attributes(call: FunctionCall, spans: Spans) -> dict[str, Any]:
    """Attributes of an ``execute_tool`` span when the call starts."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                                  "gen_ai.tool.call.id": call.call_id, "gen_ai.tool.type": "function"}
    if spans.capture:
        attributes["gen_ai.tool.call.arguments"] = call.arguments
    return attributes


def tool_result_attributes(result: FunctionResult, spans: Spans) -> dict[str, Any]:
    """Attributes of an ``execute_tool`` span when the call has finished."""
    attributes: dict[str, Any] = {}
    if spans.capture:
        attributes["gen_ai.tool.call.result"] = result.result
    if result.is_error:
        attributes["error.type"] = "tool_error"
    return attributes


# --- wrappers ------------------------------------------------------------------------------------------


class InstrumentedModel:
    """A `ChatModel` that records each call as a ``chat {model}`` span, then calls `model`."""

    def __init__(self, model: ChatModel, spans: Spans) -> None:
        self.model = model
        """The wrapped model."""
        self.spans = spans
        """The run's spans."""

    @property
    def name(self) -> str:
        """The wrapped model's name."""
        return self.model.name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Call the model inside a ``chat`` span."""
        span = self.spans.start(f"chat {self.model.name}", chat_request_attributes(self.model, request, self.spans),
                                kind="CLIENT")
        try:
            with self.spans.current(span):
                response = await self.model.complete(request)
        except BaseException as exc:
            Spans.end(span, exc)
            raise
        Spans.end(span, None, **chat_response_attributes(response, self.spans))
        return response

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Stream from the model inside a ``chat`` span."""
        span = self.spans.start(f"chat {self.model.name}", chat_request_attributes(self.model, request, self.spans),
                                kind="CLIENT")
        error: BaseException | None = None
        complete: ModelResponse | None = None
        try:
            async for event in self.model.stream(request):
                if isinstance(event, ResponseComplete):
                    complete = event.response
                yield event
        except BaseException as exc:
            error = exc
            raise
        finally:
            Spans.end(span, error, **(chat_response_attributes(complete, self.spans) if complete else {}))


def instrument_tool_calls(execute: ExecuteTool, spans: Spans) -> ExecuteTool:
    """Wrap a tool executor so each call is an ``execute_tool {name}`` span."""

    async def instrumented(call: FunctionCall) -> FunctionResult:
        span = spans.start(f"execute_tool {call.name}", tool_call_attributes(call, spans))
        try:
            with spans.current(span):
                result = await execute(call)
        except BaseException as exc:
            Spans.end(span, exc)
            raise
        attributes = tool_result_attributes(result, spans)
        if result.is_error:
            _set_error_status(span, result.result)
        Spans.end(span, None, **attributes)
        return result

    return instrumented


def _set_error_status(span: Any, message: str) -> None:
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, message[:200]))


def hook_span(spans: Spans, source_id: str, kind: str, hook: str) -> Any:
    """Start the span of one provider hook (None when telemetry is off)."""
    if spans.tracer is None:
        return None
    return spans.start(f"contextpipe.{hook} {source_id}", {
        "contextpipe.provider.source_id": source_id, "contextpipe.provider.kind": kind})
