"""One run's context: what providers contribute, where each piece came from, and the provider hooks.

`RunContext` is what a provider's `before_run` writes into and `after_run` reads. Messages are kept
as *segments*, each a list of messages plus the `Source` they came from, so a 10,000-message
history is attributed in O(1) instead of by copying every message.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import UsageError
from .messages import Message, Source
from .models.base import ModelMiddleware, ModelSettings
from .telemetry import Spans, Telemetry
from .tools import Tool, as_tool
from .trace import ProviderTiming

if TYPE_CHECKING:
    from collections.abc import Callable

    from .providers.base import ContextProvider, HistoryProvider
    from .session import Session
    from .stores.base import Lease, SessionStore

__all__ = ["RunContext", "RunOutcome", "Segment"]


@dataclass(slots=True)
class Segment:
    """Consecutive request messages that share one source."""

    source: Source
    """Where these messages came from."""
    messages: Sequence[Message]
    """The messages, oldest first."""
    first_seq: int | None = None
    """For history read from a store: the log sequence of ``messages[0]`` (the rest follow on)."""


class RunOutcome:
    """What `after_run` is told about the finished run."""

    __slots__ = ("_ctx", "_request", "error", "response_messages")

    def __init__(self, ctx: RunContext, response_messages: Sequence[Message] | None,
                 error: BaseException | None) -> None:
        self._ctx = ctx
        self._request: list[Message] | None = None
        self.response_messages = response_messages
        """Messages the run produced (model output and tool results); None when the run failed."""
        self.error = error
        """Why the run failed; None when it succeeded."""

    @property
    def request_messages(self) -> list[Message]:
        """The messages the run started from: context (history included) then the caller's input.

        Built on first access, so providers that never look at it cost nothing per history message.
        """
        if self._request is None:
            self._request = self._ctx.messages
        return self._request


class RunContext:
    """The shared workspace of one run.

    Providers call the ``add_*`` methods and `replace_messages` from `before_run`; contributions are
    attributed to the provider being called. `messages`, `instructions` and `tools` show what has
    been contributed so far.
    """

    def __init__(
        self,
        *,
        agent: Any,
        session: Session | None,
        input: Sequence[Message],
        instructions: str | None,
        tools: dict[str, Tool],
        settings: ModelSettings,
        per_step_persistence: bool,
        history_providers: Sequence[HistoryProvider],
        store: SessionStore | None = None,
        lease: Lease | None = None,
        spans: Spans | None = None,
    ) -> None:
        self.agent = agent
        """The agent running."""
        self.session = session
        """The session, or None for a run without one."""
        self.input: list[Message] = [m.with_source(_INPUT) for m in input]
        """The caller's messages, tagged ``input``; always sent last and never dropped."""
        self.settings: ModelSettings = settings
        """Model settings for this run (providers may change them)."""
        self.per_step_persistence = per_step_persistence
        """True when history is saved after every model call and tool result."""
        self.lease = lease
        """The run's lease on its session (fences every write), if the session is in a store."""
        self.store = store
        """The store holding the session, if any."""
        self.spans: Spans = spans if spans is not None else Spans(Telemetry(), None)
        """The run's OpenTelemetry spans (inactive unless a tracer provider is configured)."""
        self.scratch: dict[str, Any] = {}
        """Free space for providers to pass data from `before_run` to `after_run` within this run."""
        self.timings: list[ProviderTiming] = []
        """How long each provider hook took."""
        self.started = 0
        """How many providers' `before_run` has been called (they, and only they, get `after_run`)."""
        self.segments: list[Segment] = []
        """Messages contributed so far (history and context), in order, each with its source."""
        self._agent_instructions = instructions
        self._instructions: list[tuple[str, str]] = []
        self._tools: dict[str, Tool] = dict(tools)
        self._tool_sources: dict[str, str] = dict.fromkeys(tools, "agent")
        self._middleware: list[ModelMiddleware] = []
        self._current: ContextProvider | None = None
        self._history_providers = history_providers
        self._persisted_request = False
        self._compaction: list[Any] = []
        self._lease_renew_at = (time.time() + lease.ttl / 2) if lease is not None else 0.0

    # --- contributions (from before_run) ------------------------------------------------------------

    def _source_id(self) -> str:
        if self._current is None:
            raise UsageError("RunContext contributions must be made from a provider's before_run")
        return self._current.source_id

    def add_instructions(self, text: str) -> None:
        """Append instructions; they follow the agent's, in provider order, separated by blank lines."""
        if text:
            self._instructions.append((self._source_id(), text))

    def add_messages(self, messages: Iterable[Message]) -> None:
        """Append context messages (tagged with this provider's source; the originals are untouched)."""
        source = Source("context", self._source_id())
        tagged = [m.with_source(source) for m in messages]
        if tagged:
            self.segments.append(Segment(source, tagged))

    def add_history(self, messages: Sequence[Message], *, first_seq: int | None = None) -> None:
        """Append messages loaded from history (attributed as one segment, not copied).

        `first_seq` is the store sequence of the first message, when the messages are a contiguous
        run of the session's log (compaction uses it to write summary checkpoints).
        """
        if messages:
            self.segments.append(Segment(Source("history", self._source_id()), messages, first_seq))

    def replace_messages(self, messages: Iterable[Message]) -> None:
        """Drop every message contributed so far (history included) and put `messages` in its place.

        Messages taken from what was there keep their source; new ones are attributed to this
        provider. The caller's input is kept and still goes last. Later providers append after these.
        """
        origin = {id(m): seg.source for seg in self.segments for m in seg.messages}
        own = Source("context", self._source_id())
        new_segments: list[Segment] = []
        for message in messages:
            source = origin.get(id(message))
            if source is None:
                source = own
                message = message.with_source(own)
            if new_segments and new_segments[-1].source == source:
                segment_messages = new_segments[-1].messages
                assert isinstance(segment_messages, list)
                segment_messages.append(message)
            else:
                new_segments.append(Segment(source, [message]))
        self.segments = new_segments

    def add_tools(self, tools: Iterable[Tool | Callable[..., Any]]) -> None:
        """Offer more tools for this run; a name already taken is an error, never an override."""
        source_id = self._source_id()
        for item in tools:
            t = as_tool(item)
            if t.name in self._tools:
                raise UsageError(
                    f"context provider {source_id!r} adds tool {t.name!r}, but "
                    f"{self._tool_sources[t.name]!r} already provides a tool of that name; rename one"
                )
            self._tools[t.name] = t
            self._tool_sources[t.name] = source_id

    def add_middleware(self, middleware: ModelMiddleware) -> None:
        """Wrap every model call of this run; the first provider's middleware is outermost."""
        self._source_id()
        self._middleware.append(middleware)

    # --- views --------------------------------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """Context messages so far followed by the caller's input (a new list)."""
        out: list[Message] = []
        for segment in self.segments:
            out.extend(segment.messages)
        out.extend(self.input)
        return out

    @property
    def instructions(self) -> str | None:
        """The agent's instructions, then each provider's, joined by blank lines (None when empty)."""
        parts = [self._agent_instructions] if self._agent_instructions else []
        parts.extend(text for _, text in self._instructions)
        return "\n\n".join(parts) if parts else None

    @property
    def instruction_sources(self) -> list[tuple[str, str]]:
        """``(source_id, text)`` pairs of the instructions, the agent's (source ``agent``) first."""
        head = [("agent", self._agent_instructions)] if self._agent_instructions else []
        return head + list(self._instructions)

    @property
    def tool_sources(self) -> dict[str, str]:
        """Which provider (or ``agent``) offered each tool, by tool name."""
        return self._tool_sources

    @property
    def tools(self) -> dict[str, Tool]:
        """Tools available in this run by name: the agent's plus those providers added."""
        return self._tools

    def tool_source(self, name: str) -> str | None:
        """Which provider (or ``agent``) offered tool `name`."""
        return self._tool_sources.get(name)

    @property
    def middleware(self) -> list[ModelMiddleware]:
        """Model middleware added by providers, outermost first."""
        return self._middleware

    def tagged_request_messages(self) -> list[Message]:
        """Return the request messages, each a copy tagged with its source (for custom filters)."""
        out: list[Message] = []
        for segment in self.segments:
            out.extend(m.with_source(segment.source) for m in segment.messages)
        out.extend(self.input)
        return out

    def source_of(self, index: int) -> Source:
        """Source of the request message at position `index` of `messages`."""
        if index < 0:
            raise IndexError(index)
        for segment in self.segments:
            if index < len(segment.messages):
                return segment.source
            index -= len(segment.messages)
        if index < len(self.input):
            return _INPUT
        raise IndexError(index)

    # --- compaction decisions (for the trace) -------------------------------------------------------

    def record_compaction(self, decisions: Iterable[Any]) -> None:
        """Note compaction decisions; they go into the trace of the next (or current) model call."""
        self._compaction.extend(decisions)

    def take_compaction_decisions(self) -> list[Any]:
        """Return and clear the decisions noted since the last model call."""
        taken, self._compaction = self._compaction, []
        return taken

    # --- persistence (used by the loop) -------------------------------------------------------------

    def lease_for(self, provider: HistoryProvider) -> Lease | None:
        """Return the lease that fences `provider`'s writes.

        That is the run's lease when the provider writes to the store holding it, and None for
        providers writing elsewhere (an audit log in another store).
        """
        return self.lease if getattr(provider, "store", None) is self.store else None

    @property
    def persists(self) -> bool:
        """True when some history provider stores this run's messages."""
        return self.session is not None and any(p.stores_anything for p in self._history_providers)

    async def persist(self, response: Sequence[Message], *, with_request: bool = True) -> list[Message]:
        """Save a step to every storing history provider.

        Each gets `response`, preceded on the first such call by the request messages it stores
        (unless `with_request` is False). Returns the messages handed to the first storing provider
        (for the `StepPersisted` event).
        """
        session = self.session
        if session is None:
            return []
        if self.lease is not None and self.store is not None and time.time() >= self._lease_renew_at:
            self.lease = await self.store.renew_lease(self.lease)
            self._lease_renew_at = time.time() + self.lease.ttl / 2
        first = with_request and not self._persisted_request
        self._persisted_request = self._persisted_request or with_request
        saved: list[Message] | None = None
        for provider in self._history_providers:
            if not provider.stores_anything:
                continue
            batch = provider.select_request(self) if first else []
            batch.extend(provider.select_response(response))
            if batch:
                await provider.save(session, batch, lease=self.lease_for(provider))
            if saved is None:
                saved = batch
        return saved or []


_INPUT = Source("input")


async def run_before(providers: Sequence[ContextProvider], ctx: RunContext) -> None:
    """Call `before_run` on each provider in order.

    A provider that raises stops the sequence (the run fails); `ctx.started` counts it, so it
    still gets its `after_run`.
    """
    spans = ctx.spans if ctx.spans.tracer is not None else None
    for provider in providers:
        ctx.started += 1
        ctx._current = provider
        span = _hook_span(spans, provider, "before_run")
        t0 = time.perf_counter()
        try:
            await provider.before_run(ctx)
        except BaseException as exc:
            Spans.end(span, exc)
            span = None
            raise
        finally:
            ctx._current = None
            ctx.timings.append(ProviderTiming(provider.source_id, "before_run", time.perf_counter() - t0))
            Spans.end(span)


async def run_after(
    providers: Sequence[ContextProvider], ctx: RunContext, outcome: RunOutcome
) -> list[tuple[str, BaseException]]:
    """Call `after_run` on `providers` in reverse order; every one is called, failures are collected."""
    errors: list[tuple[str, BaseException]] = []
    spans = ctx.spans if ctx.spans.tracer is not None else None
    for provider in reversed(providers):
        span = _hook_span(spans, provider, "after_run")
        t0 = time.perf_counter()
        failure: BaseException | None = None
        try:
            await provider.after_run(ctx, outcome)
        except Exception as exc:
            errors.append((provider.source_id, exc))
            failure = exc
        finally:
            ctx.timings.append(ProviderTiming(provider.source_id, "after_run", time.perf_counter() - t0))
            Spans.end(span, failure)
    return errors


def _hook_span(spans: Spans | None, provider: ContextProvider, hook: str) -> Any:
    if spans is None:
        return None
    return spans.start(f"contextpipe.{hook} {provider.source_id}", {
        "contextpipe.provider.source_id": provider.source_id, "contextpipe.provider.kind": provider.kind})
