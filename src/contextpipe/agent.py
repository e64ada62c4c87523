"""`Agent`: the public face of contextpipe (`run`, `stream`, `session`)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeAlias

from .errors import ProviderError, StoreError, UsageError
from .loop import RunEvent, RunLimits, StepLoop, StopReason
from .messages import Message, as_messages
from .models.base import ChatModel, ModelSettings, ReasoningDelta, TextDelta, Usage
from .pipeline import RunContext, RunOutcome, run_after, run_before
from .providers.base import ContextProvider, HistoryProvider
from .session import DEFAULT_TENANT, Session, validate_session_id, validate_tenant
from .stores.base import DEFAULT_LEASE_TTL, Lease, SessionStore
from .stores.memory import MemoryStore
from .telemetry import Spans, Telemetry
from .tokens import TokenCounter, tokenizer_for_model
from .tools import Tool, as_tool
from .trace import PromptTrace

__all__ = ["Agent", "AgentStream", "RunDone", "RunResult", "StreamEvent"]

Persistence: TypeAlias = Literal["per_step", "per_run"]


@dataclass(slots=True)
class RunResult:
    """What a run produced."""

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
    """``completed``, or why the tool loop was cut short (``max_steps``, ``tool_errors``)."""
    steps: int
    """Model calls made."""
    session: Session | None = None
    """The session the run used, with its updated state and version."""


@dataclass(frozen=True, slots=True)
class RunDone:
    """The last event of a stream: the run's result."""

    result: RunResult
    kind: Literal["run_done"] = "run_done"


StreamEvent: TypeAlias = "TextDelta | ReasoningDelta | RunEvent | RunDone"
"""Events `Agent.stream` yields; the last is always `RunDone`."""


class Agent:
    """An LLM agent: a model, instructions, tools, and the context providers that shape each run.

    >>> import asyncio
    >>> from contextpipe import Agent, tool
    >>> from contextpipe.models import ScriptedModel, tool_call
    >>> from contextpipe.providers import History
    >>> from contextpipe.stores import MemoryStore
    >>> @tool
    ... def lookup_location_code(city: str) -> str:
    ...     '''Return the location code for a city name.'''
    ...     return "SZ"
    >>> model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "Suzhou is SZ."])
    >>> agent = Agent(model, tools=[lookup_location_code], providers=[History(MemoryStore())])
    >>> async def main():
    ...     session = await agent.session("alice-chat")
    ...     result = await agent.run("Code for Suzhou?", session=session)
    ...     return result.text, len(await agent.history(session))
    >>> asyncio.run(main())
    ('Suzhou is SZ.', 4)

    Sessions live in `store`: given, or the store of the agent's `History` provider, or a private
    in-memory store. `persistence` is ``per_step`` (save after every model call and tool result; the
    default) or ``per_run`` (save once when the run succeeds).
    """

    def __init__(
        self,
        model: ChatModel,
        *,
        instructions: str | None = None,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        providers: Sequence[ContextProvider] = (),
        settings: ModelSettings | None = None,
        store: SessionStore | None = None,
        limits: RunLimits | None = None,
        persistence: Persistence = "per_step",
        lease_ttl: float = DEFAULT_LEASE_TTL,
        telemetry: Telemetry | None = None,
        store_traces: bool = False,
        name: str | None = None,
    ) -> None:
        self.model = model
        """The chat model every call goes to."""
        self.instructions = instructions
        """System instructions, first in every request."""
        self.name = name
        """Optional agent name."""
        self.telemetry = telemetry or Telemetry()
        """OpenTelemetry settings (spans only when a tracer provider is configured)."""
        self.store_traces = store_traces
        """Store each run's prompt traces with its session (for ``contextpipe inspect``)."""
        self.settings: ModelSettings = settings or ModelSettings()
        """Default model settings; `run(settings=...)` overrides them per run."""
        self.limits = limits or RunLimits()
        """Bounds of the tool loop."""
        if persistence not in ("per_step", "per_run"):
            raise UsageError(f"persistence must be 'per_step' or 'per_run', got {persistence!r}")
        self.persistence: Persistence = persistence
        self.lease_ttl = lease_ttl
        self.tools: dict[str, Tool] = {}
        """The agent's own tools by name."""
        for item in tools:
            t = as_tool(item)
            if t.name in self.tools:
                raise UsageError(f"two tools are named {t.name!r}; tool names must be unique")
            self.tools[t.name] = t
        self.providers: tuple[ContextProvider, ...] = tuple(providers)
        """Context providers, in the order they run."""
        self._check_providers()
        self.history_providers: tuple[HistoryProvider, ...] = tuple(
            p for p in self.providers if isinstance(p, HistoryProvider)
        )
        if store is None:
            store = next((getattr(p, "store", None) for p in self.history_providers
                          if isinstance(getattr(p, "store", None), SessionStore)), None)
        self.store: SessionStore = store if store is not None else MemoryStore()
        """Where sessions (state, version, lease) are kept."""
        self._counter: TokenCounter | None = None

    def _check_providers(self) -> None:
        seen_ids: dict[str, ContextProvider] = {}
        seen_keys: dict[str, ContextProvider] = {}
        loaders = []
        for p in self.providers:
            if not isinstance(p, ContextProvider):
                raise UsageError(f"providers must be ContextProvider instances, got {p!r}")
            if p.source_id in seen_ids:
                raise UsageError(
                    f"two context providers use source_id {p.source_id!r} ({seen_ids[p.source_id]!r} and {p!r}); "
                    "give each a unique source_id"
                )
            seen_ids[p.source_id] = p
            for key in p.state_keys:
                if key in seen_keys:
                    raise UsageError(
                        f"context providers {seen_keys[key]!r} and {p!r} both use session state key {key!r}; "
                        "give each its own key"
                    )
                seen_keys[key] = p
            if isinstance(p, HistoryProvider) and p.load_messages:
                loaders.append(p)
        if len(loaders) > 1:
            names = ", ".join(repr(p) for p in loaders)
            raise UsageError(
                f"only one history provider may load messages, but {names} all do; set load_messages=False "
                "on the others (for audit logs: load_messages=False, store_context_messages=True)"
            )

    # --- sessions -----------------------------------------------------------------------------------

    async def session(self, session_id: str, *, tenant: str = DEFAULT_TENANT, ttl: float | None = None) -> Session:
        """Return the session `session_id` from the agent's store, creating it if it does not exist."""
        validate_session_id(session_id)
        validate_tenant(tenant)
        return await self.store.load_or_create(tenant, session_id, ttl=ttl)

    async def create_session(self, *, tenant: str = DEFAULT_TENANT, ttl: float | None = None) -> Session:
        """Create and store a new session with a random id."""
        return await self.session(f"s-{uuid.uuid4().hex}", tenant=tenant, ttl=ttl)

    async def history(self, session: Session, *, limit: int | None = None) -> list[Message]:
        """Return the session's stored messages (the last `limit` when given) from the agent's store."""
        return (await self.store.load(session.tenant, session.id, limit=limit)).messages

    # --- runs ---------------------------------------------------------------------------------------

    async def run(
        self,
        input: str | Message | Sequence[Message] | None,
        *,
        session: Session | None = None,
        settings: ModelSettings | None = None,
        lease_wait: float = 0.0,
    ) -> RunResult:
        """Run the agent on `input` (None resumes the session without new input) and return the result.

        With a session, the run holds its lease: a concurrent run on the same session raises
        `SessionBusy`, or waits up to `lease_wait` seconds for it.
        """
        result: RunResult | None = None
        async for event in self._events(input, session, settings, lease_wait, stream=False, want_events=False):
            if isinstance(event, RunDone):
                result = event.result
        assert result is not None
        return result

    def stream(
        self,
        input: str | Message | Sequence[Message] | None,
        *,
        session: Session | None = None,
        settings: ModelSettings | None = None,
        lease_wait: float = 0.0,
    ) -> AgentStream:
        """Run the agent, streaming events: text deltas, tool calls, persisted steps, then `RunDone`.

        Persistence is the same as `run`. Use ``async with agent.stream(...) as events`` when you may
        stop iterating early, so the run is closed (providers told, lease released) at once.
        """
        return AgentStream(self._events(input, session, settings, lease_wait, stream=True, want_events=True))

    def run_sync(self, input: str | Message | Sequence[Message] | None, **kwargs: Any) -> RunResult:
        """Blocking `run`, for scripts; refuses to run inside an already running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run(input, **kwargs))
        raise UsageError("run_sync() cannot be called from a running event loop; use 'await agent.run(...)'")

    async def _events(
        self,
        input: str | Message | Sequence[Message] | None,
        session: Session | None,
        settings: ModelSettings | None,
        lease_wait: float,
        *,
        stream: bool,
        want_events: bool,
    ) -> AsyncIterator[StreamEvent]:
        input_messages = [] if input is None else as_messages(input)
        if not input_messages and session is None:
            raise UsageError("nothing to run: pass input, or a session to resume")
        lease: Lease | None = None
        ctx: RunContext | None = None
        store = self.store
        spans = Spans(self.telemetry, self.name)
        if spans.tracer is not None:
            spans.start_run(session.id if session is not None else None, self.model)
        run_error: BaseException | None = None
        try:
            if session is not None:
                lease = await store.acquire_lease(session.tenant, session.id, os.urandom(8).hex(),
                                                  ttl=self.lease_ttl, wait=lease_wait)
                await self._refresh(session)
            ctx = RunContext(
                agent=self, session=session, input=input_messages, instructions=self.instructions,
                tools=self.tools, settings=self.settings | settings if settings else self.settings,
                per_step_persistence=self.persistence == "per_step", history_providers=self.history_providers,
                store=store if session is not None else None, lease=lease, spans=spans,
            )
            loop = StepLoop(ctx, self.model, self.limits, stream=stream, want_events=want_events,
                            counter=self._trace_counter)
            error: BaseException | None = None
            try:
                await run_before(self.providers, ctx)
                async for event in loop.events():
                    yield event
            except BaseException as exc:
                error = exc
                raise
            finally:
                failures = await self._finish(ctx, loop, error)
            state = loop.state
            last = next((m for m in reversed(state.new_messages) if m.role == "assistant"), None)
            result = RunResult(
                text=last.text if last is not None else "", messages=state.new_messages, input=ctx.input,
                usage=state.usage, traces=state.traces, stop_reason=state.stop_reason, steps=state.steps,
                session=session,
            )
            if failures:
                raise ProviderError(failures, result)
            if spans.root is not None:
                spans.root.set_attribute("gen_ai.usage.input_tokens", result.usage.input_tokens)
                spans.root.set_attribute("gen_ai.usage.output_tokens", result.usage.output_tokens)
            yield RunDone(result)
        except BaseException as exc:
            run_error = exc
            raise
        finally:
            if lease is not None:
                await store.release_lease(ctx.lease if ctx is not None and ctx.lease is not None else lease)
            Spans.end(spans.root, run_error if not isinstance(run_error, GeneratorExit) else None)

    async def _finish(
        self, ctx: RunContext, loop: StepLoop, error: BaseException | None
    ) -> list[tuple[str, BaseException]]:
        """Call `after_run` on the started providers and save the session state.

        On a failed run, later failures are attached to the run's error as notes (the run's error
        is what the caller sees); on success they are returned.
        """
        state = loop.state
        outcome = RunOutcome(ctx, None if error is not None else state.new_messages, error)
        before_after = len(ctx.timings)
        failures = await run_after(self.providers[:ctx.started], ctx, outcome)
        if state.traces:
            last = state.traces[-1]
            last.provider_timings = (*last.provider_timings, *ctx.timings[before_after:])
        if ctx.session is not None:
            session = ctx.session
            try:
                await self.store.save_session(session, lease=ctx.lease)
                if self.store_traces and state.traces:
                    await self.store.append_traces(session.tenant, session.id,
                                                   [t.to_dict(compact_runs=True) for t in state.traces],
                                                   lease=ctx.lease)
            except Exception as exc:
                if error is None:
                    raise
                failures.append(("session state", exc))
        if error is not None:
            for source_id, failure in failures:
                error.add_note(f"also failed after the run: {source_id!r}: {type(failure).__name__}: {failure}")
            return []
        return failures

    def _trace_counter(self) -> TokenCounter:
        """Return the token counter behind traces (created on first use, its cache kept by the agent)."""
        if self._counter is None:
            self._counter = TokenCounter(tokenizer_for_model(self.model.name))
        return self._counter

    async def _refresh(self, session: Session) -> None:
        """Bring a stale `Session` object up to date with the store (another worker may have run)."""
        stored = await self.store.get_session(session.tenant, session.id)
        if stored is None and session.version > 0:
            raise StoreError(
                f"session {session.id!r} (tenant {session.tenant!r}) no longer exists: it was deleted or it "
                "expired; start a new one with agent.session(...)",
                backend=self.store.backend, tenant=session.tenant, session_id=session.id,
            )
        if stored is not None and stored.version != session.version:
            session.state = stored.state
            session.version = stored.version


@dataclass
class AgentStream:
    """The events of one streamed run; iterate it, or use it as an async context manager."""

    _events: AsyncIterator[StreamEvent]
    result: RunResult | None = field(default=None)
    """The run's result, once the stream has finished."""

    def __aiter__(self) -> AgentStream:
        return self

    async def __anext__(self) -> StreamEvent:
        event = await self._events.__anext__()
        if isinstance(event, RunDone):
            self.result = event.result
        return event

    async def __aenter__(self) -> AgentStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the run now (if still going): providers get `after_run`, the lease is released."""
        closer = getattr(self._events, "aclose", None)
        if closer is not None:
            await closer()
