"""`Agent`: the public face of contextpipe (`run`, `stream`, `session`).

A run, in order: ``async with StepWriter.open(...)`` (the writer takes the session's lease and owns
it until the run is over), let a run's own `BeforeInput` settle the input, look for an earlier run of
the same input (a retry: its result is given back, or it is resumed; `_run.replay`), call the
providers' `before_run` (`_run.hooks`), drive the `StepLoop` (`_run.loop`), save the run, call
`after_run` in reverse and save the session's state. Everything the run records goes into one `RunJournal`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from ._agent_state import check_providers, provider_state_keys, stored_calibration
from ._run.approvals import ApprovalGate, agent_policy, pending_in
from ._run.calls import CallContexts
from ._run.hooks import run_after, run_before, run_before_input
from ._run.loop import StepLoop
from ._run.output import OutputCheck, OutputLoop, output_check, with_output
from ._run.repair import keep_input
from ._run.replay import EarlierRun, final_text, find_earlier, log_store, replayed
from ._run.threads import raise_swallowed_cancellation
from ._run.way_out import WayOutExpired
from ._run.writer import StepWriter
from ._stream import ADMITTED, Admitted, AgentStream
from .config import DEFAULT_DURABILITY, Durability, RunLimits
from .errors import AfterRunError, OutputValidationError, UsageError
from .events import RunDone, RunResult, StreamEvent
from .messages import Message, as_messages
from .models.base import ChatModel, ModelSettings
from .pipeline import RunContext, RunOutcome
from .providers.base import ContextProvider, HistoryProvider
from .queue import QueuedMessage, When, drain, enqueue, key_of
from .session import (
    DEFAULT_TENANT,
    Session,
    validate_session_id,
    validate_tenant,
)
from .stores.base import SessionStore
from .stores.memory import MemoryStore
from .telemetry import InstrumentedModel, Spans, Telemetry, instrument_tool_calls
from .tokens import CALIBRATION_KEY, TokenCache, TokenCounter, Tokenizer, tokenizer_for_model
from .trace import RunJournal

if TYPE_CHECKING:
    from .approvals import AgentApprovalPolicy, Decision, PendingApproval
    from .erasure import ForgetReport
    from .tools import Tool

__all__ = ["DEFAULT_HISTORY_ID", "Agent", "AgentStream", "RunDone", "RunResult", "StreamEvent"]

_T = TypeVar("_T")
_Input = str | Message | Sequence[Message] | None

DEFAULT_HISTORY_ID = "default-history"
"""The source_id of the history an agent given no history provider keeps its sessions' messages with."""


class Agent:
    """An LLM agent: a model, instructions, tools, and the context providers that shape each run.

    >>> import asyncio
    >>> from contextpipe import Agent, tool
    >>> from contextpipe.testing import ScriptedModel, tool_call
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
    in-memory store. An agent given no `HistoryProvider` still remembers each session's conversation:
    it adds ``History(store, source_id="default-history")`` as its first provider, so the messages
    are kept in the agent's store with the session (in memory when no store was given, lost when the
    process ends) and every run on the same session id sees them. ``default_history=False`` keeps
    nothing: each run sees only its own input. Each `PromptTrace` names the history in use
    (`PromptTrace.history`).

    Providers see the running agent as ``ctx.agent`` (an `AgentInfo`: `name`, `instructions`,
    `tools`, `model`), so one provider serving several agents can tell them apart.

    `needs_approval` is the agent's approval policy, for tools you did not write (an MCP server's):
    tool names (``fnmatch`` patterns, ``["git_*"]``) whose calls wait for a person's decision, or a
    function of the call's `ToolContext` and arguments deciding per call (`contextpipe.approvals`);
    a tool's own ``@tool(needs_approval=...)`` counts as well.

    `durability` (a `Durability`) says how runs save: ``per_step`` (after every
    model call and tool result; the default) or ``per_run`` (once when the run succeeds; the
    answer to calls the log left open, such as calls a person decided, as soon as it exists), and
    whether each run's traces are stored with its session.

    A run on a session holds the session's lease, ``durability.lease_ttl`` seconds (15 by default)
    renewed in the background every ``lease_ttl / 3`` (``durability.heartbeat``) for as long as the
    run lives, through model calls and tools of any length. If the lease is lost anyway (the
    session was deleted, or a paused process let it expire and another worker took over), the run
    stops at once with `LeaseLost`: in-flight tools are cancelled and nothing more is written. A
    killed worker's session is free for another worker after at most `lease_ttl` seconds.
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
        durability: Durability = DEFAULT_DURABILITY,
        telemetry: Telemetry | None = None,
        name: str | None = None,
        default_history: bool = True,
        needs_approval: AgentApprovalPolicy | None = None,
    ) -> None:
        self.model = model
        """The chat model every call goes to."""
        self.instructions = instructions
        """System instructions, first in every request."""
        self.name = name
        """Optional agent name."""
        self.telemetry = telemetry or Telemetry()
        """OpenTelemetry settings (spans only when a tracer provider is configured)."""
        self.settings: ModelSettings = settings or ModelSettings()
        """Default model settings; `run(settings=...)` overrides them per run."""
        self.limits = limits or RunLimits()
        """Bounds of the tool loop."""
        self.durability = durability
        """How runs save, hold their session's lease and keep it alive."""
        self.needs_approval = needs_approval
        """The agent's approval policy: which calls, beyond those tools ask for, wait for a person's decision."""
        self._approval_check = agent_policy(needs_approval)
        self.tools: dict[str, Tool] = {}
        """The agent's own tools by name."""
        if tools:
            from .tools import as_tool  # here: an agent without tools never loads the @tool machinery (or pydantic)
        for item in tools:
            t = as_tool(item)
            if t.name in self.tools:
                raise UsageError(f"two tools are named {t.name!r}; tool names must be unique")
            self.tools[t.name] = t
        self.providers: tuple[ContextProvider, ...] = tuple(providers)
        """Context providers, in the order they run (the default history first, when the agent added it)."""
        self.history_providers: tuple[HistoryProvider, ...] = tuple(
            p for p in self.providers if isinstance(p, HistoryProvider)
        )
        if store is None:
            store = next((p.store for p in self.history_providers if isinstance(p.store, SessionStore)), None)
        self.store: SessionStore = store if store is not None else MemoryStore()
        """Where sessions (state, version, lease) are kept."""
        added: HistoryProvider | None = None
        if default_history and not self.history_providers:
            from .providers.history import History  # here: an agent given its own history never loads it

            added = History(self.store, source_id=DEFAULT_HISTORY_ID)
            self.providers = (added, *self.providers)
            self.history_providers = (added,)
        self._state_owners = check_providers(self.providers, added)
        """Session state keys a tool's state may not use, and what each holds."""
        self._tokenizer: Tokenizer | None = None
        self._token_cache = TokenCache()

    # --- sessions -----------------------------------------------------------------------------------

    async def session(self, session_id: str, *, tenant: str = DEFAULT_TENANT, ttl: float | None = None) -> Session:
        """Return the session `session_id` from the agent's store, creating it if it does not exist."""
        validate_session_id(session_id)
        validate_tenant(tenant)
        return await self.store.load_or_create(tenant, session_id, ttl=ttl)

    async def create_session(self, *, tenant: str = DEFAULT_TENANT, ttl: float | None = None) -> Session:
        """Create and store a new session with a random id."""
        import uuid  # here, not at the top: importing the agent need not load it

        return await self.session(f"s-{uuid.uuid4().hex}", tenant=tenant, ttl=ttl)

    async def history(self, session: Session, *, limit: int | None = None) -> list[Message]:
        """Return the session's view (the last `limit` messages when given): its log minus what was rewound."""
        from .rewind import view_messages  # lazily, as every undo helper below

        return [m for _, m in await view_messages(self.store, session.tenant, session.id, limit=limit)]

    async def rewind(self, session_id: str, *, to: int, tenant: str = DEFAULT_TENANT, lease_wait: float = 0.0) -> int:
        """Leave messages after `to` out of the view, under the lease (`SessionBusy` past `lease_wait`)."""
        from .rewind import leased, rewind

        async with leased(self.store, tenant, session_id, lease_wait) as lease:
            return await rewind(self.store, tenant, session_id, to, lease)

    async def regenerate(self, session_id: str, *, tenant: str = DEFAULT_TENANT, **run: Any) -> RunResult[Any]:
        """Rewind the session's last reply (to its last user message) and run again; `run` goes to `run`."""
        from .rewind import last_user_seq

        await self.rewind(session_id, to=await last_user_seq(self.store, tenant, session_id), tenant=tenant)
        session = await self.session(session_id, tenant=tenant)
        return cast("RunResult[Any]", await self.run(None, session=session, **run))

    async def edit(self, session_id: str, seq: int, text: str, *, tenant: str = DEFAULT_TENANT,
                   **run: Any) -> RunResult[Any]:
        """Rewind to before the user message at `seq` and run with `text` in its place."""
        from .rewind import last_user_seq

        if await last_user_seq(self.store, tenant, session_id, before=seq + 1) != seq:
            raise UsageError(f"sequence {seq} of {tenant}/{session_id} is no user message in the view; edit one")
        await self.rewind(session_id, to=seq - 1, tenant=tenant)
        session = await self.session(session_id, tenant=tenant)
        return cast("RunResult[Any]", await self.run(text, session=session, **run))

    async def fork(self, session_id: str, *, at: int, new_id: str, tenant: str = DEFAULT_TENANT) -> Session:
        """Start session `new_id` with the view of `session_id` up to `at` (copied, its artifacts too; see `fork`)."""
        from ._fork import copy_provider_artifacts
        from .rewind import fork, leased

        validate_session_id(new_id)
        async with leased(self.store, tenant, new_id, 0.0) as lease:
            await fork(self.store, tenant, session_id, at, new_id, lease)
        await copy_provider_artifacts(self.store, self.providers, tenant, session_id, new_id)  # in their own stores
        return await self.session(new_id, tenant=tenant)

    async def enqueue(self, session: Session | str, message: str | Message, *, when: When = "asap",
                      tenant: str = DEFAULT_TENANT) -> QueuedMessage:
        """Queue a user message for a session, running or not: stored at once, without its lease (`contextpipe.queue`).

        ``when="asap"``: the run holding the session gets it before its next model call (or the next run, before
        its input); ``"next"``: a run of its own, by `drain_queue`. The session is created if it does not exist.
        """
        return await enqueue(self.store, key_of(session, tenant), message, when)

    async def drain_queue(self, session: Session | str, *, tenant: str = DEFAULT_TENANT,
                          lease_wait: float = 0.0) -> list[RunResult]:
        """Run the session's ``next`` messages, each as a run of its own, in order; return their results.

        Each waits up to `lease_wait` seconds for the run in progress and first delivers the ``asap`` messages
        queued; a run that stops for approval ends the drain (the rest stay queued).
        """
        return await drain(self, key_of(session, tenant), lease_wait)

    async def forget_user(self, tenant: str, user_id: str, *, wait: float = 0.0) -> ForgetReport:
        """Remove everything kept of `user_id` in `tenant` (a GDPR erasure); return what went.

        The user's sessions (``session.state["user_id"]``) go from the agent's store and its history
        providers' stores, with their logs, summaries and traces; so do the user's memories and facts
        in its `SemanticMemory` and `FactMemory` providers. If a run holds one of the sessions longer
        than `wait` seconds, `SessionBusy` names it and nothing is removed. Safe to call again: a
        retry removes what is left (`contextpipe.erasure`).

        >>> import asyncio
        >>> from contextpipe.testing import ScriptedModel
        >>> agent = Agent(model=ScriptedModel(["Hello!"]))
        >>> async def main():
        ...     session = await agent.session("alice-1")
        ...     session.state["user_id"] = "alice"
        ...     await agent.run("Hi", session=session)
        ...     return await agent.forget_user("default", "alice")
        >>> report = asyncio.run(main()); (report.session_ids, report.messages)
        (('alice-1',), 2)
        """
        from .erasure import forget_user, session_stores  # here: importing the agent need not load it

        stores = session_stores(self.store, self.providers)
        return await forget_user(tenant, user_id, run_store=self.store, stores=stores, providers=self.providers,
                                 wait=wait)

    async def pending_approvals(self, session: Session) -> list[PendingApproval]:
        """Return the tool calls of `session` awaiting a person's decision (an empty list when none does).

        They are the calls a run without input would stop on (`RunResult.pending_approvals`), read
        from the session's log and its stored state without taking the session's lease, running a
        provider or calling the model: for a front end that shows what waits. Decide them with
        ``agent.run(None, session=session, approvals={p.call_id: p.approve() or p.reject("why")})``.
        """
        loader = self._loader()
        stored = await self.store.get_session(session.tenant, session.id)
        if loader is None or stored is None:
            return []
        return pending_in((await loader.load_view(stored)).messages, stored)

    # --- runs ---------------------------------------------------------------------------------------

    @overload
    async def run(self, input: _Input, *, session: Session | None = ..., settings: ModelSettings | None = ...,
                  lease_wait: float = ..., deps: Any = ..., approvals: Mapping[str, Decision] | None = ...,
                  providers: Sequence[ContextProvider] = ..., tools: Sequence[Tool | Callable[..., Any]] = ...,
                  output_type: None = None, output_retries: int = ...) -> RunResult[str]: ...
    @overload
    async def run(self, input: _Input, *, session: Session | None = ..., settings: ModelSettings | None = ...,
                  lease_wait: float = ..., deps: Any = ..., approvals: Mapping[str, Decision] | None = ...,
                  providers: Sequence[ContextProvider] = ..., tools: Sequence[Tool | Callable[..., Any]] = ...,
                  output_type: type[_T], output_retries: int = ...) -> RunResult[_T]: ...

    async def run(
        self,
        input: _Input,
        *,
        session: Session | None = None,
        settings: ModelSettings | None = None,
        lease_wait: float = 0.0,
        deps: Any = None,
        approvals: Mapping[str, Decision] | None = None,
        providers: Sequence[ContextProvider] = (),
        tools: Sequence[Tool | Callable[..., Any]] = (),
        output_type: type[Any] | None = None,
        output_retries: int = 2,
    ) -> RunResult[Any]:
        """Run the agent on `input` (None resumes the session without new input) and return the result.

        `deps` are the application's dependencies for this run (a database pool, the signed-in
        user's client): every tool that takes a `ToolContext` gets them as ``ctx.deps``. They are
        kept for the run only, never stored.

        `approvals` decides tool calls awaiting approval in the session (``{call_id: approve() or
        reject("why")}``, from `RunResult.pending_approvals`): approved calls run, rejected ones are
        answered with the reason, before the model is called again. A run on a session whose calls
        still await a decision stops again with ``stop_reason="approval_required"`` (without input),
        or raises `ApprovalError` (with input: decide first). See `contextpipe.approvals`.

        With a session, the run holds its lease: a concurrent run on the same session raises
        `SessionBusy`, or waits up to `lease_wait` seconds for it. A message the session answered
        before (the same id: a client's retry) is not run again: its earlier result comes back from
        the log, marked `RunResult.replayed`; one whose run was interrupted resumes that run; the
        same id with other content raises `InputConflict`.

        `providers` shape this run only, after the agent's own (a server's per-request context): each
        needs a source_id of its own, and may be neither a history provider nor declare state keys.

        `tools` are offered in this run only, beside the agent's (a name the agent's tools use is a
        `UsageError`): a front end's tools (`contextpipe.ClientTool`), which the caller runs (the run stops
        with ``stop_reason="client_tool_calls"``), or any tool.

        `output_type` (a pydantic model, a dataclass, a TypedDict, ``list[int]``, ...) makes the answer
        structured: the model is asked for its JSON schema (the vendor's native structured output), and
        `RunResult.output` is the answer validated into it. An answer that does not match is sent back
        with the errors, at most `output_retries` times, every attempt saved; then `OutputValidationError`
        (see ``docs/guides/structured-output.md``).
        """
        check, settings = output_check(output_type, output_retries, settings)
        result: RunResult[Any] | None = None
        async for event in self._events(input, session, settings, lease_wait, deps, approvals, providers,
                                        stream=False, want_events=False, tools=tools, output=check):
            if isinstance(event, RunDone):
                result = event.result
        assert result is not None
        return result

    @overload
    def stream(self, input: _Input, *, session: Session | None = ..., settings: ModelSettings | None = ...,
               lease_wait: float = ..., deps: Any = ..., approvals: Mapping[str, Decision] | None = ...,
               providers: Sequence[ContextProvider] = ..., tools: Sequence[Tool | Callable[..., Any]] = ...,
               output_type: None = None, output_retries: int = ...) -> AgentStream[str]: ...
    @overload
    def stream(self, input: _Input, *, session: Session | None = ..., settings: ModelSettings | None = ...,
               lease_wait: float = ..., deps: Any = ..., approvals: Mapping[str, Decision] | None = ...,
               providers: Sequence[ContextProvider] = ..., tools: Sequence[Tool | Callable[..., Any]] = ...,
               output_type: type[_T], output_retries: int = ...) -> AgentStream[_T]: ...

    def stream(
        self,
        input: _Input,
        *,
        session: Session | None = None,
        settings: ModelSettings | None = None,
        lease_wait: float = 0.0,
        deps: Any = None,
        approvals: Mapping[str, Decision] | None = None,
        providers: Sequence[ContextProvider] = (),
        tools: Sequence[Tool | Callable[..., Any]] = (),
        output_type: type[Any] | None = None,
        output_retries: int = 2,
    ) -> AgentStream[Any]:
        """Run the agent, streaming events: text deltas, tool calls, persisted steps, then `RunDone`.

        Persistence, `deps`, `approvals`, `providers` and `tools` are the same as for `run`; a run that stops for
        approval (or a client tool's result) sends `ApprovalRequired` before `RunDone`. Use ``async with
        agent.stream(...) as events`` when you may stop iterating early, so the run is closed (providers told,
        lease released) at once. ``await events.start()`` returns once the run holds the session's lease and
        its input and approvals were accepted, raising the error that keeps it from starting otherwise
        (`AgentStream.start`). With `output_type`, the text of every attempt streams as it comes, and the
        result (``RunDone``, `AgentStream.result`) has the validated `RunResult.output`.
        """
        check, settings = output_check(output_type, output_retries, settings)
        return AgentStream(self._events(input, session, settings, lease_wait, deps, approvals, providers,
                                        stream=True, want_events=True, tools=tools, output=check))

    def run_sync(self, input: _Input, **kwargs: Any) -> RunResult[Any]:
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
        deps: Any,
        approvals: Mapping[str, Decision] | None,
        run_providers: Sequence[ContextProvider],
        *,
        stream: bool,
        want_events: bool,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        output: OutputCheck | None = None,
    ) -> AsyncIterator[StreamEvent | Admitted]:
        input_messages = [] if input is None else as_messages(input)
        if not input_messages and session is None:
            raise UsageError("nothing to run: pass input, or a session to resume")
        run_tools = _run_tools(self.tools, tools)
        providers = self._with_run_providers(run_providers)
        spans = Spans(self.telemetry, self.name)
        traced = spans.tracer is not None
        if traced:
            spans.start_run(session.id if session is not None else None, self.model)
        run_error: BaseException | None = None
        try:
            async with StepWriter.open(self.store, session, history_providers=self.history_providers,
                                       durability=self.durability, lease_wait=lease_wait) as writer:
                input_messages = await run_before_input(providers, writer, input_messages)  # e.g. AG-UI's rewinds
                earlier, input_messages = await self._earlier(session, input, input_messages)
                gate = ApprovalGate(self._approval_check, session, writer)
                await gate.decide(approvals, self._loader())
                yield ADMITTED  # the run is admitted (`AgentStream.start`): errors from here on are the run's
                if (replay := replayed(earlier, session)) is not None:
                    yield RunDone(with_output(replay, output))
                    return
                ctx = self._context(session, input_messages, settings, writer, run_tools)
                contexts = CallContexts(session, self, deps, self._state_owners, writer.outbox_problem())
                loop = self._loop(ctx, writer, spans, gate, contexts, stream, want_events, output)
                error: BaseException | None = None
                try:
                    await run_before(providers, ctx, spans, writer.guard)
                    async with aclosing(loop.events()) as events:  # a stream closed early closes the loop here
                        async for event in events:
                            yield event
                    await writer.save_run(ctx, loop.state.new_messages)
                    gate.keep_held()  # per run: late results that came while calls wait, held once those are saved
                except BaseException as exc:
                    error = exc
                    await writer.keep_open_answers(ctx, loop.state.new_messages, loop.open_at_start, exc)  # per run
                    await keep_input(writer, ctx, exc)
                    raise
                finally:
                    failures = await self._finish(providers, ctx, loop, writer, spans, error)
                raise_swallowed_cancellation()  # a driver swallowed a cancellation on the way out: the caller gets it
                result = self._result(ctx, loop, session, earlier, output, failures)
                if failures:
                    raise AfterRunError(failures, result)
                if spans.root is not None:
                    spans.root.set_attribute("gen_ai.usage.input_tokens", result.usage.input_tokens)
                    spans.root.set_attribute("gen_ai.usage.output_tokens", result.usage.output_tokens)
                yield RunDone(result)
            raise_swallowed_cancellation()  # ... or as the lease was given back
        except BaseException as exc:
            run_error = exc
            raise
        finally:
            Spans.end(spans.root, run_error if not isinstance(run_error, GeneratorExit) else None)

    def _loop(self, ctx: RunContext, writer: StepWriter, spans: Spans, gate: ApprovalGate, contexts: CallContexts,
              stream: bool, want_events: bool, output: OutputCheck | None) -> StepLoop:
        """Return the step loop of a run (one that checks its answers, given an output type)."""
        traced = spans.tracer is not None
        kwargs: dict[str, Any] = {} if output is None else {"output": output}
        return (StepLoop if output is None else OutputLoop)(
            ctx, InstrumentedModel(self.model, spans) if traced else self.model, self.limits, writer, stream=stream,
            want_events=want_events, contexts=contexts, approvals=gate,
            instrument_tools=(lambda ex: instrument_tool_calls(ex, spans)) if traced else None, **kwargs)

    def _with_run_providers(self, extra: Sequence[ContextProvider]) -> Sequence[ContextProvider]:
        """Return the agent's providers, then `extra` (one run's own, see `run`), refusing those that cannot be."""
        taken = {p.source_id for p in self.providers}
        for p in extra:
            if not isinstance(p, ContextProvider) or isinstance(p, HistoryProvider):
                raise UsageError(f"a run's own providers must be context providers, not history providers: got {p!r}; "
                                 "give the agent a history provider instead")
            if p.source_id in taken:
                raise UsageError(f"a run's provider {p!r} uses source_id {p.source_id!r}, which another provider of "
                                 "the run uses; give it a source_id of its own")
            if provider_state_keys(p):
                raise UsageError(f"a run's provider {p!r} declares session state keys; only the agent's providers "
                                 "may (their keys are checked when the agent is built): give the agent the provider")
            taken.add(p.source_id)
        return (*self.providers, *extra) if extra else self.providers

    def _context(self, session: Session | None, input_messages: list[Message], settings: ModelSettings | None,
                 writer: StepWriter, run_tools: dict[str, Tool] | None = None) -> RunContext:
        return RunContext(
            agent=self, session=session, input=input_messages, instructions=self.instructions, tools=self.tools,
            settings=self.settings | settings if settings else self.settings, model_name=self.model.name,
            tokens=self.token_counter(session), journal=RunJournal(history=self._history_id(session)),
            checkpoints=writer.save_checkpoint,
            lease=(writer.store, writer.lease) if writer.lease is not None else None, run_tools=run_tools,
        )

    def _history_id(self, session: Session | None) -> str | None:
        """Return the source_id of the history a run on `session` loads (None without a session or a loader)."""
        loader = self._loader()
        return loader.source_id if session is not None and loader is not None else None

    def _loader(self) -> HistoryProvider | None:
        """Return the history provider that loads the sessions' messages, if one does."""
        return next((p for p in self.history_providers if p.policy.load_messages), None)

    async def _earlier(self, session: Session | None, input: str | Message | Sequence[Message] | None,
                       input_messages: list[Message]) -> tuple[EarlierRun | None, list[Message]]:
        """Return the run of `session` that had this input already (a retry; see `_run.replay`), and the input to run.

        That is no input when the earlier run is resumed (its input is in the log). Text becomes a
        message with an id made just now: only messages given with their ids may be retries.
        """
        store = log_store(self.history_providers)
        if store is None or session is None or not input_messages or isinstance(input, str):
            return None, input_messages
        earlier = await find_earlier(store, session, input_messages)
        return earlier, input_messages if earlier is None else []

    def _result(self, ctx: RunContext, loop: StepLoop, session: Session | None, earlier: EarlierRun | None,
                output: OutputCheck | None, failures: list[tuple[str, BaseException]]) -> RunResult[Any]:
        """Return the run's result; raise `OutputValidationError` (with `failures` as notes) for an invalid answer."""
        state = loop.state
        messages, given = state.new_messages, ctx.input
        if earlier is not None:  # a resumed run: the interrupted run's input and messages come first
            messages, given = [*earlier.messages, *messages], earlier.input
        result: RunResult[Any] = RunResult(
            text=final_text(messages), messages=messages, input=given,
            usage=state.usage, traces=ctx.journal.traces, stop_reason=state.stop_reason, steps=state.steps,
            session=session, pending_approvals=list(loop.approvals.pending),
        )
        try:
            return with_output(result, output)
        except OutputValidationError as exc:
            for source_id, failure in failures:
                exc.add_note(f"also failed after the run: {source_id!r}: {type(failure).__name__}: {failure}")
            raise

    async def _finish(
        self, providers: Sequence[ContextProvider], ctx: RunContext, loop: StepLoop, writer: StepWriter, spans: Spans,
        error: BaseException | None,
    ) -> list[tuple[str, BaseException]]:
        """Call `after_run` on the started providers and save the session state.

        On a failed run, later failures are attached to the run's error as notes (the run's error
        is what the caller sees); on success they are returned.
        """
        outcome = RunOutcome(ctx, None if error is not None else loop.state.new_messages, error)
        try:  # on a cancelled run's way out, both are bounded (`_run.way_out`)
            failures = await writer.leaving(run_after(providers, ctx, outcome, spans), error)
        except WayOutExpired as exc:
            failures = [("after_run", exc)]
        traces = [t.to_dict(compact_runs=True) for t in ctx.journal.traces] if self.durability.store_traces else ()
        calibration = ctx.tokens.calibration if ctx.tokens.calibrated else None
        try:
            await writer.leaving(writer.save_session(traces, calibration=calibration), error)
        except Exception as exc:
            if error is None:
                raise
            failures.append(("session state", exc))
        if error is not None:
            for source_id, failure in failures:
                error.add_note(f"also failed after the run: {source_id!r}: {type(failure).__name__}: {failure}")
            return []
        return failures

    def token_counter(self, session: Session | None = None) -> TokenCounter:
        """Return a token counter for a run on `session`.

        It has the model's tokenizer, the agent's cache and the session's calibration; a run's
        traces and its compaction both count with it.
        """
        if self._tokenizer is None:
            self._tokenizer = tokenizer_for_model(self.model.name)
        calibration = stored_calibration(session) if session is not None and CALIBRATION_KEY in session.state else None
        # Each session counts into its own bounded part of the cache: a busy one cannot evict the others'.
        scope = (session.tenant, session.id) if session is not None else None
        return TokenCounter(self._tokenizer, calibration=calibration, cache=self._token_cache.scope(scope),
                            cache_size=self._token_cache.max_per_session)


def _run_tools(agent_tools: dict[str, Tool], tools: Sequence[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Return a run's own tools by name (``agent.run(..., tools=)``; `contextpipe.client_tools.own_tools`)."""
    if not tools:
        return {}
    from .client_tools import own_tools  # here: a run given no tools of its own never loads the tools machinery

    return own_tools(agent_tools, tools)
