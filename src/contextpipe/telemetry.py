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
``gen_ai.tool.call.id``, ``gen_ai.conversation.id``, and ``error.type`` on failure. Provider hooks
are ``contextpipe.before_run {source_id}`` and ``contextpipe.after_run {source_id}``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import _semconv

__all__ = ["Telemetry"]


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

    @property
    def active(self) -> bool:
        return self.tracer is not None

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

    def start_run(self, session_id: str | None, model: Any) -> None:
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": self.agent_name,
                                      "gen_ai.request.model": model.name, **_semconv.agent_attributes(model)}
        if session_id is not None:
            attributes["gen_ai.conversation.id"] = session_id
        self.root = self.start(f"invoke_agent {self.agent_name}", attributes)

    @staticmethod
    def end(span: Any, error: BaseException | None = None, **attributes: Any) -> None:
        if span is None:
            return
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(key, value)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

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
        return _semconv.input_messages(messages)
