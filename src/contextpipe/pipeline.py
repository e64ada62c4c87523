"""The provider-facing context of one run: what providers read and contribute, and where it came from.

`RunContext` is what a provider's `before_run` writes into and `after_run` reads, with the agent
that is running (`RunContext.agent`, an `AgentInfo`: its name, instructions, tools and model, so one
provider serving several agents can tell them apart); it holds nothing else (no store, lease,
spans or timings: saving is `_run.writer.StepWriter`'s, the hooks and their timings are
`_run.hooks`', and the record of the run is `trace.RunJournal`).

Messages are kept as *segments*, each a list of messages plus the `Source` they came from, so a
10,000-message history is attributed in O(1) instead of by copying every message. What providers
read (`RunContext.messages`, `RunOutcome.request_messages`) and what the model is sent show each
message with the source it has *in this run*: loaded history as ``history``, provider messages as
``context``, the caller's input as ``input``. The tagged copies are made lazily, once per segment,
and only if someone reads them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload

from .errors import UsageError
from .exchanges import ValidatedChunks
from .messages import INPUT, Message, Source
from .models.base import ModelMiddleware, ModelSettings
from .trace import ContextChange, RunJournal

if TYPE_CHECKING:
    from .compaction import CompactionDecision
    from .models.base import ChatModel
    from .session import Session
    from .stores.base import Lease, SessionStore
    from .tokens import TokenCounter
    from .tools import Tool, ToolMiddleware

__all__ = ["AgentInfo", "CheckpointSink", "MessageView", "RunContext", "RunOutcome", "Segment"]

CheckpointSink = Callable[[int, Message], Awaitable[bool]]
"""Saves a summary standing for the session's log up to a sequence; True when it was saved."""


class AgentInfo(Protocol):
    """What a provider sees of the agent that is running (`RunContext.agent`, `RunOutcome.agent`).

    `contextpipe.Agent` is one; the protocol lets the pipeline name it without importing the agent.
    """

    @property
    def name(self) -> str | None:
        """The agent's name, if it was given one."""

    @property
    def instructions(self) -> str | None:
        """The agent's own system instructions (before any provider's)."""

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's own tools by name (before any provider's)."""

    @property
    def model(self) -> ChatModel:
        """The chat model the agent calls."""


@dataclass(slots=True)
class Segment:
    """Consecutive request messages that share one source."""

    source: Source
    """Where these messages came from."""
    messages: Sequence[Message]
    """The messages, oldest first, as they were contributed (not tagged)."""
    first_seq: int | None = None
    """For history read from a store: the log sequence of ``messages[0]`` (the rest follow on)."""
    _tagged: list[Message] | None = field(default=None, repr=False)
    _checked: bool = field(default=False, repr=False)
    # True when `messages` is a tuple whose tool exchanges were checked complete (see `MessageView.chunks`).

    @property
    def tagged(self) -> list[Message]:
        """The messages tagged with `source` (copies made on first access, then kept)."""
        if self._tagged is None:
            source = self.source
            self._tagged = [m.with_source(source) for m in self.messages]
        return self._tagged


class MessageView(Sequence[Message], ValidatedChunks):
    """A read-only sequence of segments' messages, each tagged with its source in this run.

    Creating a view costs O(segments); a segment's tagged copies are made when first read.
    """

    __slots__ = ("_checked", "_len", "_parts")

    def __init__(self, segments: Sequence[Segment], tail: Sequence[Message] = (), *, checked_tail: int = 0) -> None:
        """`checked_tail` leading messages of `tail` were validated complete before (see `validated_chunks`)."""
        self._len = len(tail)
        for s in segments:
            self._len += len(s.messages)
        if checked_tail:
            self._parts: list[Segment | Sequence[Message]] = [*segments, tail[:checked_tail], tail[checked_tail:]]
            self._checked = len(segments)
        else:
            self._parts = [*segments, tail]
            self._checked = -1

    def __len__(self) -> int:
        return self._len

    def _items(self, part: Segment | Sequence[Message]) -> Sequence[Message]:
        return part.tagged if isinstance(part, Segment) else part

    def __iter__(self) -> Iterator[Message]:
        for part in self._parts:
            yield from self._items(part)

    def validated_chunks(self) -> Iterator[tuple[Sequence[Message], bool]]:
        """Iterate the untagged messages part by part, each with whether its tool exchanges are known complete.

        A part is known complete when the run checked it once and it cannot change since (an
        immutable segment whose calls are all answered within it, or the run's own messages up to
        the end of a request that passed its check): the request check skips it.
        """
        for index, part in enumerate(self._parts):
            if isinstance(part, Segment):
                yield part.messages, part._checked
            else:
                yield part, index == self._checked

    def has_id(self, message_id: str) -> bool:
        """Return True when a message with this id is in the view.

        The contributed segments are searched first, newest first (where a run's input is), then the
        messages the run added after them.
        """
        parts = self._parts
        for part in reversed(parts):
            if isinstance(part, Segment):
                for m in reversed(part.messages):
                    if m.id == message_id:
                        return True
        return any(m.id == message_id for part in parts if not isinstance(part, Segment) for m in part)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        for part in self._parts:
            items = self._items(part)
            if index < len(items):
                return items[index]
            index -= len(items)
        raise IndexError(index)  # pragma: no cover - the bounds were checked above

    def __repr__(self) -> str:
        return f"MessageView({self._len} messages)"


class RunOutcome:
    """What `after_run` is told about the finished run."""

    __slots__ = ("_ctx", "error", "response_messages")

    def __init__(self, ctx: RunContext, response_messages: Sequence[Message] | None,
                 error: BaseException | None) -> None:
        self._ctx = ctx
        self.response_messages = response_messages
        """Messages the run produced (model output and tool results); None when the run failed."""
        self.error = error
        """Why the run failed; None when it succeeded."""

    @property
    def agent(self) -> AgentInfo:
        """The agent that ran (the same as ``ctx.agent``)."""
        return self._ctx.agent

    @property
    def request_messages(self) -> Sequence[Message]:
        """The messages the run started from, tagged as in this run: context (history included), then input."""
        return self._ctx.messages


class _Contributing:
    """The block inside which a provider's contributions are attributed to it (`RunContext.contributing`)."""

    __slots__ = ("_ctx", "_previous", "_source_id")

    def __init__(self, ctx: RunContext, source_id: str) -> None:
        self._ctx = ctx
        self._source_id = source_id
        self._previous: str | None = None

    def __enter__(self) -> None:
        self._previous, self._ctx._current = self._ctx._current, self._source_id

    def __exit__(self, *exc_info: object) -> None:
        self._ctx._current = self._previous  # (a budget's block inside its own: the budget's again)


class RunContext:
    """The shared workspace of one run, as context providers see it.

    Providers call the ``add_*`` and ``replace_*`` methods from `before_run`; contributions are
    attributed to the provider being called. `messages`, `instructions` and `tools` show what has
    been contributed so far.
    """

    def __init__(
        self,
        *,
        agent: AgentInfo,
        session: Session | None,
        input: Sequence[Message],
        instructions: str | None,
        tools: dict[str, Tool],
        settings: ModelSettings,
        model_name: str,
        tokens: TokenCounter,
        journal: RunJournal | None = None,
        checkpoints: CheckpointSink | None = None,
        lease_token: int | None = None,
        run_tools: Mapping[str, Tool] | None = None,
        lease: tuple[SessionStore, Lease] | None = None,
    ) -> None:
        self.agent = agent
        """The agent that is running (its name, instructions, tools and model)."""
        self.session = session
        """The session, or None for a run without one."""
        self.input: list[Message] = [m.with_source(INPUT) for m in input]
        """The caller's messages, tagged ``input``; always sent last and never dropped."""
        self.settings: ModelSettings = settings
        """Model settings for this run (providers may change them)."""
        self.model_name = model_name
        """Name of the model this run calls."""
        self.tokens = tokens
        """The run's token counter (the agent's tokenizer, cache and the session's calibration).

        Traces count with it too, so what a provider budgets with is what the trace shows."""
        self.journal = journal if journal is not None else RunJournal()
        """The record of this run (traces, provider timings, compaction decisions, context changes)."""
        self.segments: list[Segment] = []
        """Messages contributed so far (history and context), in order, each with its source."""
        self._instructions: list[tuple[str, str]] = [("agent", instructions)] if instructions else []
        self._tools: dict[str, Tool] = {**tools, **(run_tools or {})}  # a run's own tools (``run``): names checked
        self._tool_sources: dict[str, str] = dict.fromkeys(tools, "agent") | dict.fromkeys(run_tools or (), "run")
        self._middleware: list[ModelMiddleware] = []
        self._tool_middleware: list[tuple[str, ToolMiddleware]] = []
        self._current: str | None = None
        self._checkpoints = checkpoints
        self._lease = lease
        self.lease_token = lease[1].token if lease is not None else lease_token
        """The fencing token of the run's lease on its session (None without a session). A history
        provider can tell from it that no other run held the session since its own previous run."""

    def lease_for(self, store: SessionStore) -> Lease | None:
        """Return the run's lease on its session when `store` holds it (the agent's store), else None.

        A provider writing to the session in `store` passes it, so a run that lost its lease (the session
        taken over, erased or expired meanwhile) writes nothing there: the write raises `LeaseLost`.
        """
        return self._lease[1] if self._lease is not None and self._lease[0] is store else None

    def contributing(self, source_id: str) -> _Contributing:
        """Attribute contributions made inside the ``with`` block to provider `source_id` (used by the run)."""
        return _Contributing(self, source_id)

    def _source_id(self) -> str:
        if self._current is None:
            raise UsageError("RunContext contributions must be made from a provider's before_run")
        return self._current

    # --- instructions -------------------------------------------------------------------------------

    def add_instructions(self, text: str, *, at: int | None = None) -> None:
        """Append instructions; they follow the agent's, in provider order, separated by blank lines.

        `at` puts them at that index of `instruction_sources` instead (a provider that took its
        place earlier in the run and contributes later, as `ToolSearch` under a budget).
        """
        if text:
            self._instructions.insert(len(self._instructions) if at is None else at, (self._source_id(), text))

    def replace_instructions(self, text: str | None) -> None:
        """Drop every instruction contributed so far (the agent's included) and use `text` instead.

        None or empty removes them all. The trace records what was replaced and by whom.
        """
        source_id = self._source_id()
        dropped = [sid for sid, _ in self._instructions]
        self._instructions = [(source_id, text)] if text else []
        if dropped:
            self.journal.changes.append(ContextChange(source_id, "replaced_instructions", tuple(dropped)))

    def replace_own_instructions(self, texts: Iterable[str]) -> None:
        """Put `texts` in place of the instructions this provider added so far; others' stay.

        No texts removes them; a provider that added none yet has `texts` added after the others'.
        """
        source_id, placed, kept = self._source_id(), False, []
        new = [(source_id, t) for t in texts if t]
        for sid, text in self._instructions:
            if sid != source_id:
                kept.append((sid, text))
            elif not placed:
                kept.extend(new)
                placed = True
        self._instructions = kept if placed else [*kept, *new]

    # --- messages -----------------------------------------------------------------------------------

    def add_messages(self, messages: Iterable[Message]) -> None:
        """Append context messages (tagged with this provider's source; the originals are untouched)."""
        source = Source("context", self._source_id())
        tagged = [m.with_source(source) for m in messages]
        if tagged:
            self.segments.append(Segment(source, tagged, _tagged=tagged))

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
        origin = {m.id: seg.source for seg in self.segments for m in seg.messages}
        own = Source("context", self._source_id())
        new_segments: list[Segment] = []
        for message in messages:
            source = origin.get(message.id, own)
            tagged = message.with_source(source)
            last = new_segments[-1] if new_segments else None
            if last is not None and last.source == source:
                assert last._tagged is not None
                last._tagged.append(tagged)
            else:
                items = [tagged]
                new_segments.append(Segment(source, items, _tagged=items))
        self.segments = new_segments

    # --- tools and middleware -----------------------------------------------------------------------

    def add_tools(self, tools: Iterable[Tool | Callable[..., Any]]) -> None:
        """Offer more tools for this run; a name already taken is an error, never an override."""
        from .tools import as_tool  # here: a run given no tools never loads the @tool machinery

        source_id = self._source_id()
        for item in tools:
            t = as_tool(item)
            if t.name in self._tools:
                raise UsageError(
                    f"context provider {source_id!r} adds tool {t.name!r}, but "
                    f"{self._tool_sources[t.name]!r} already provides a tool of that name; rename one "
                    "(or remove it first with ctx.remove_tools)"
                )
            self._tools[t.name] = t
            self._tool_sources[t.name] = source_id

    def remove_tools(self, names: Iterable[str]) -> None:
        """Withdraw tools added before this provider (the agent's or other providers'), by name.

        An unknown name is an error. The trace records which tools were removed, from whom, by whom.
        """
        source_id = self._source_id()
        wanted = list(names)
        unknown = [n for n in wanted if n not in self._tools]
        if unknown:
            raise UsageError(f"context provider {source_id!r} removes tools {unknown!r}, which this run does "
                             f"not offer (it offers {sorted(self._tools)!r})")
        removed = tuple(f"{n} ({self._tool_sources.pop(n)})" for n in wanted if self._tools.pop(n, None))
        if removed:
            self.journal.changes.append(ContextChange(source_id, "removed_tools", removed))

    def replace_tools(self, tools: Iterable[Tool | Callable[..., Any]]) -> None:
        """Withdraw every tool offered so far and offer `tools` instead (attributed to this provider)."""
        self.remove_tools(list(self._tools))
        self.add_tools(tools)

    def add_middleware(self, middleware: ModelMiddleware) -> None:
        """Wrap every model call of this run; the first provider's middleware is outermost."""
        self._source_id()
        self._middleware.append(middleware)

    def add_tool_middleware(self, middleware: ToolMiddleware) -> None:
        """Wrap every tool call of this run; the first provider's middleware is outermost.

        A `ToolMiddleware` sees each call (tool name, call id, arguments) and may change the
        arguments, answer the call without running the tool, or replace or post-process the
        result; what it returns is what the model sees and the session stores. Each call's trace
        entry (`PromptTrace.tool_calls`) records which middleware saw it and what each did.
        """
        self._tool_middleware.append((self._source_id(), middleware))

    # --- views --------------------------------------------------------------------------------------

    @property
    def messages(self) -> MessageView:
        """Context messages so far, then the caller's input, each tagged with its source in this run.

        A view: O(1) to take; iterate it or index it (``list(ctx.messages)`` for a list).
        """
        return MessageView(self.segments, self.input)

    @property
    def instructions(self) -> str | None:
        """The agent's instructions, then each provider's, joined by blank lines (None when empty)."""
        return "\n\n".join(text for _, text in self._instructions) if self._instructions else None

    @property
    def instruction_sources(self) -> list[tuple[str, str]]:
        """``(source_id, text)`` pairs of the instructions, the agent's (source ``agent``) first."""
        return list(self._instructions)

    @property
    def tool_sources(self) -> dict[str, str]:
        """Which provider (or ``agent``) offered each tool, by tool name."""
        return self._tool_sources

    @property
    def tools(self) -> dict[str, Tool]:
        """Tools available in this run by name: the agent's plus those providers added."""
        return self._tools

    @property
    def middleware(self) -> list[ModelMiddleware]:
        """Model middleware added by providers, outermost first."""
        return self._middleware

    @property
    def tool_middleware(self) -> list[tuple[str, ToolMiddleware]]:
        """``(source_id, middleware)`` pairs of the tool middleware providers added, outermost first."""
        return self._tool_middleware

    # --- compaction ---------------------------------------------------------------------------------

    def record_compaction(self, decisions: Iterable[CompactionDecision]) -> None:
        """Note compaction decisions; they go into the trace of the next (or current) model call."""
        self.journal.compaction.extend(decisions)

    async def save_checkpoint(self, seq: int, summary: Message) -> bool:
        """Save `summary` as standing for the session's log up to sequence `seq` (compaction does this).

        The history provider that loaded the messages stores it, fenced by the run's lease; returns
        False when there is no session or that provider keeps no checkpoints.
        """
        if self._checkpoints is None or self.session is None:
            return False
        return await self._checkpoints(seq, summary)
