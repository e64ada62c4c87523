"""`PromptTrace`: where every token of every prompt came from, one record per model call.

A trace lists the instructions split by source, every message with its source (input, history,
context, model, tool), provider id, message id and token count, every tool with the provider that
offered it, what compaction did, how long each provider hook took, and the model's reported usage
and latency. Token counts per source add up to the request total.

Building a trace costs almost nothing during the run: it keeps references to the request, and the
per-message detail is computed (with cached token counts) the first time it is read.

>>> import asyncio
>>> from contextpipe import Agent
>>> from contextpipe.testing import ScriptedModel
>>> result = asyncio.run(Agent(ScriptedModel(["Hi!"]), instructions="Be kind.").run("Hello"))
>>> trace = result.traces[0]
>>> [(m.role, m.source_kind) for m in trace.messages]
[('user', 'input')]
>>> trace.total_tokens == sum(trace.tokens_by_source().values())
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeAlias

from ._compaction_decision import CompactionDecision
from ._preview import preview
from ._prompt_cache import MIN_CACHEABLE_TOKENS, CacheCheck, Prefix, Segment, compare, digest, tool_digest
from .messages import INPUT
from .models.base import ModelRequest, Usage
from .tokens import REPLY_PRIMING, TokenCounter

__all__ = [
    "MIN_CACHEABLE_TOKENS",
    "ApprovalAction",
    "BudgetShare",
    "CacheCheck",
    "ContextChange",
    "PromptTrace",
    "ProviderTiming",
    "RunJournal",
    "ToolMiddlewareAction",
    "TracedInstruction",
    "TracedMessage",
    "TracedTool",
    "TracedToolCall",
    "TracedToolMiddleware",
    "preview",
]


@dataclass(frozen=True, slots=True)
class ProviderTiming:
    """How long one provider hook took."""

    source_id: str
    """The provider."""
    hook: Literal["before_run", "after_run"]
    """Which hook."""
    seconds: float
    """Wall time of the hook."""


@dataclass(frozen=True, slots=True)
class ContextChange:
    """A provider took away what earlier ones contributed (instructions or tools), or the run fixed its view."""

    source_id: str
    """The provider that made the change (``repair`` for the run's own repairs)."""
    action: Literal["replaced_instructions", "removed_tools", "repaired_log", "normalised_output",
                    "adapted_request", "history_bound", "validated_output", "invalid_output", "tool_search",
                    "cache_collapsed", "over_budget"]
    """What it did."""
    items: tuple[str, ...]
    """What was affected: the sources of replaced instructions, ``tool (source)`` of removed tools,
    or one note per repair, or per adaptation a model client made to fit its API (`ModelResponse.notes`),
    or (``history_bound``) how many older messages a history provider's bound left out, and which bound,
    or how the call's answer matched the run's output type (``output``: which attempt validated), or
    (``tool_search``, `contextpipe.providers.ToolSearch`) how many of the run's tools the call was offered
    and which were found by a search, or (``cache_collapsed``, source ``prompt-cache``) what broke the
    prompt cache and the tokens lost (`CacheCheck`), or (``over_budget``, `contextpipe.budget.ContextBudget`)
    that the request is over the budget, and why (what it may not trim, or the sources that could not go lower)."""


@dataclass(frozen=True, slots=True)
class BudgetShare:
    """What one source of a `contextpipe.budget.ContextBudget` was given of the request, before the first call."""

    source: str
    """The share's name: ``tools``, ``memory``, ``search`` or ``history``."""
    share: int
    """Tokens its share of the budget came to (before what other sources left unused flowed to it)."""
    asked: int
    """Tokens its providers contributed, before the budget trimmed them."""
    got: int
    """Tokens it has in the request, after trimming by its providers' own rules."""


ToolMiddlewareAction: TypeAlias = Literal["changed_arguments", "blocked", "changed_result", "raised"]
"""What a tool middleware did to a call: passed it on with other arguments, answered it without
calling on (the tool did not run), returned another outcome than the one it got back, or raised."""

ApprovalAction: TypeAlias = Literal["approved", "allowed", "rejected", "answered"]
"""How a call that needed approval was decided: ``approved`` by a person, ``allowed`` because its
tool is always allowed in the session, ``rejected`` (not run; the model got the reason), or
``answered``: a client tool's call the client ran (`contextpipe.ClientTool`), its result given back."""


@dataclass(frozen=True, slots=True)
class TracedToolMiddleware:
    """What one provider's tool middleware did to one call."""

    source_id: str
    """The provider that added the middleware."""
    actions: tuple[ToolMiddlewareAction, ...]
    """What it did, in the order above; empty when it passed the call and its outcome on unchanged."""


@dataclass(frozen=True, slots=True)
class TracedToolCall:
    """One tool call the run made, and the tool middleware it went through."""

    step: int
    """The model call that asked for it (0: a call an interrupted run left open, run again on resume)."""
    call_id: str
    """The call's id."""
    name: str
    """The tool called."""
    is_error: bool
    """Whether the result the model got is an error."""
    middleware: tuple[TracedToolMiddleware, ...] = ()
    """Every middleware that saw the call, outermost first (one that an outer one blocked never saw it)."""
    approval: ApprovalAction | None = None
    """How a person's approval decided the call; None when it needed none (`contextpipe.approvals`)."""

    @property
    def resumed(self) -> bool:
        """True for a call an interrupted run left without a result, run again by this one (not a decided one)."""
        return self.step == 0 and self.approval is None

    @property
    def blocked(self) -> bool:
        """True when a middleware answered the call and the tool did not run."""
        return any("blocked" in m.actions for m in self.middleware)


@dataclass(slots=True)
class RunJournal:
    """The typed record of one run that hooks, the loop and the context write and traces read.

    Nothing is patched afterwards: a trace asks the journal for its provider timings when read.
    """

    traces: list[PromptTrace] = field(default_factory=list)
    """One per model call, in order."""
    timings: list[ProviderTiming] = field(default_factory=list)
    """Every provider hook that ran, in order."""
    compaction: list[CompactionDecision] = field(default_factory=list)
    """Compaction decisions not yet attached to a model call."""
    changes: list[ContextChange] = field(default_factory=list)
    """Instructions and tools that providers replaced or removed, and repairs of the log's view."""
    tool_calls: list[TracedToolCall] = field(default_factory=list)
    """Every tool call the run made, in the order they finished (`record_tool_call` adds them)."""
    started: int = 0
    """How many providers' `before_run` was called (they, and only they, get `after_run`)."""
    history: str | None = None
    """The source_id of the history provider that loads the session's messages; None when none does."""
    budget: list[BudgetShare] = field(default_factory=list)
    """Each source's share, ask and take of a `contextpipe.budget.ContextBudget` (empty without one)."""
    _changes_taken: int = 0
    _calls_by_step: dict[int, list[TracedToolCall]] = field(default_factory=dict)

    def take_changes(self) -> tuple[ContextChange, ...]:
        """Return the changes noted since the last call (they stay in `changes`)."""
        taken = tuple(self.changes[self._changes_taken:])
        self._changes_taken = len(self.changes)
        return taken

    def take_compaction(self) -> tuple[CompactionDecision, ...]:
        """Return and clear the decisions noted since the last model call."""
        taken, self.compaction = tuple(self.compaction), []
        return taken

    def timings_for(self, trace: PromptTrace) -> tuple[ProviderTiming, ...]:
        """Hooks shown on `trace`: ``before_run`` ones on the first call, ``after_run`` on the last."""
        first = trace.step == 1
        last = bool(self.traces) and self.traces[-1] is trace
        return tuple(t for t in self.timings if (first and t.hook == "before_run") or (last and t.hook == "after_run"))

    def record_tool_call(self, call: TracedToolCall) -> None:
        """Note a tool call that finished, under the model call that asked for it."""
        self.tool_calls.append(call)
        self._calls_by_step.setdefault(call.step, []).append(call)

    def tool_calls_for(self, trace: PromptTrace) -> tuple[TracedToolCall, ...]:
        """Return the calls shown on `trace`: those its model call asked for (on the first, also those of a resume)."""
        # Looked up by step, not filtered from `tool_calls`: reading every trace of a 2,000-step run
        # once took 230 ms that way (quadratic), and every `to_dict` and `table` reads them.
        by_step = self._calls_by_step
        if trace.step == 1:
            return (*by_step.get(0, ()), *by_step.get(1, ()))
        return tuple(by_step.get(trace.step, ()))


@dataclass(frozen=True, slots=True)
class TracedInstruction:
    """One block of the system instructions."""

    source_id: str
    """``agent`` or the provider that added it."""
    tokens: int
    text: str


@dataclass(frozen=True, slots=True)
class TracedMessage:
    """One message of the request."""

    index: int
    message_id: str
    role: str
    source_kind: str
    """``input``, ``history``, ``context``, ``model`` or ``tool``."""
    source_id: str | None
    tokens: int
    preview: str


@dataclass(frozen=True, slots=True)
class TracedTool:
    """One tool offered to the model."""

    name: str
    source_id: str
    """``agent`` or the provider that added it."""
    tokens: int
    digest: str = ""
    """A digest of the definition as sent (name, description, schema): what prompt-cache checks compare."""


_UNTAGGED = INPUT  # a message a middleware made up without a source counts as input, as in the filters


def _usage_dict(usage: Usage | None) -> dict[str, int] | None:
    """Input and output tokens, plus the cache and reasoning counts the provider reported (when not zero)."""
    if usage is None:
        return None
    return {k: v for k, v in asdict(usage).items() if v or k in ("input_tokens", "output_tokens")}


def _cache_text(usage: Usage | None) -> str:
    """`` (cache 1200 read / 80 written)`` when the provider reported prompt-cache use, else nothing."""
    if usage is None or not (usage.cache_read_tokens or usage.cache_write_tokens):
        return ""
    return f" (cache {usage.cache_read_tokens} read / {usage.cache_write_tokens} written)"


def _cache_dict(check: CacheCheck | None) -> dict[str, Any] | None:
    return check.to_dict() if check is not None else None


def _budget_dict(budget: Sequence[BudgetShare]) -> dict[str, Any]:
    """``{"budget": [...]}`` for a call a `contextpipe.budget.ContextBudget` split, else nothing (as before)."""
    return {"budget": [asdict(b) for b in budget]} if budget else {}


def _middleware_lines(calls: Sequence[TracedToolCall]) -> list[str]:
    """Return a line per tool call that an approval decided or middleware saw (each middleware, outermost first)."""
    lines = []
    for call in calls:
        if call.approval is not None:
            lines.append(f"  tool call {call.name} ({call.call_id}): {call.approval}")
        if call.middleware:
            done = "; ".join(f"{m.source_id} {', '.join(a.replace('_', ' ') for a in m.actions) or 'passed'}"
                             for m in call.middleware)
            lines.append(f"  tool call {call.name} ({call.call_id}): {done}")
    return lines


@dataclass
class PromptTrace:
    """The provenance record of one model call (see the module docstring)."""

    step: int
    """Model call number within the run, from 1."""
    model: str
    """The model called."""
    usage: Usage | None
    """Tokens the model reported."""
    latency_s: float
    """Wall time of the call, middleware included."""
    finish_reason: str | None
    """Why the model stopped."""
    compaction: tuple[CompactionDecision, ...] = ()
    """Compaction decisions made for this call."""
    changes: tuple[ContextChange, ...] = ()
    """What changed the context before this call or this call's output: instructions and tools providers
    replaced or removed, repairs of the stored log's view, normalised model output, and what the model
    client adapted to fit its API (``adapted_request``)."""
    _request: ModelRequest | None = field(default=None, repr=False)
    _instruction_sources: Sequence[tuple[str, str]] = field(default=(), repr=False)
    _tool_sources: dict[str, str] = field(default_factory=dict, repr=False)
    _counter: TokenCounter | None = field(default=None, repr=False)
    _ratio: float = field(default=1.0, repr=False)
    _journal: RunJournal | None = field(default=None, repr=False)
    _detail: tuple[list[TracedInstruction], list[TracedMessage], list[TracedTool]] | None = field(
        default=None, repr=False)
    _previous: PromptTrace | Prefix | None = field(default=None, repr=False)
    _prefix: Prefix | None = field(default=None, repr=False)
    _cache: CacheCheck | None = field(default=None, repr=False)

    @property
    def cache(self) -> CacheCheck | None:
        """How much of this call's prompt prefix matched the previous call's (computed when first read).

        Compared with the run's previous call, or on a run's first call with the last call of the
        session's previous run when the model reported cache use then; None when there is nothing to compare.
        """
        prev = self._previous
        if self._cache is None and prev is not None:
            if isinstance(prev, PromptTrace):
                self._cache = compare(prev.cache_prefix(), self.cache_prefix(), "previous_call")
            else:
                self._cache = compare(prev, self.cache_prefix(), "previous_run")
        return self._cache

    def cache_prefix(self) -> Prefix:
        """Return the call's prompt in cache order (tools, instructions, messages), as `CacheCheck` compares it."""
        if self._prefix is None:
            instructions, messages, tools = self._compute()
            usage = self.usage
            self._prefix = Prefix(
                [(t.name, t.digest, t.tokens) for t in tools],
                [(i.source_id, digest(i.text), i.tokens) for i in instructions],
                [Segment(1, m.message_id, m.message_id, m.tokens) for m in messages],
                usage.cache_read_tokens + usage.cache_write_tokens if usage is not None else 0,
                [(d.strategy, d.action, frozenset(d.message_ids)) for d in self.compaction
                 if d.action != "over_budget"])
        return self._prefix

    @property
    def provider_timings(self) -> tuple[ProviderTiming, ...]:
        """Provider hooks around this call (``before_run`` on the first call, ``after_run`` on the last)."""
        return self._journal.timings_for(self) if self._journal is not None else ()

    @property
    def budget(self) -> tuple[BudgetShare, ...]:
        """A `contextpipe.budget.ContextBudget`'s split of the request, on the run's first call (else empty)."""
        return tuple(self._journal.budget) if self._journal is not None and self.step == 1 else ()

    @property
    def history(self) -> str | None:
        """Which history the run used: the source_id of the provider loading the session's messages.

        ``default-history`` is the one an agent given no history provider adds itself; None means
        nothing loads history (a run without a session, or ``Agent(default_history=False)``).
        """
        return self._journal.history if self._journal is not None else None

    @property
    def tool_calls(self) -> tuple[TracedToolCall, ...]:
        """The tool calls this model call asked for, in the order they finished, with the middleware they went through.

        The first call's trace also has the calls an interrupted run left open that this run ran again (step 0).
        """
        return self._journal.tool_calls_for(self) if self._journal is not None else ()

    @property
    def notes(self) -> tuple[str, ...]:
        """What the model client adapted to fit its API (left-out reasoning, thinking turned off, ...)."""
        return tuple(note for c in self.changes if c.action == "adapted_request" for note in c.items)

    @property
    def tokenizer(self) -> str:
        """The tokenizer behind the counts (an encoding name, or ``estimate``)."""
        return self._counter.tokenizer.name if self._counter is not None else "none"

    def _compute(self) -> tuple[list[TracedInstruction], list[TracedMessage], list[TracedTool]]:
        if self._detail is not None:
            return self._detail
        request = self._request
        if request is None or self._counter is None:
            self._detail = ([], [], [])
            return self._detail
        counter = self._counter
        ratio, text = self._ratio, counter.text

        def scale(raw: int) -> int:
            # The calibration as it was when the call was made: the numbers compaction budgeted with.
            return raw if counter.tokenizer.exact or ratio == 1.0 else math.ceil(raw * ratio)

        instructions = [TracedInstruction(sid, scale(text(block)), block) for sid, block in self._instruction_sources]
        messages = []
        for i, m in enumerate(request.messages):
            source = m.source or _UNTAGGED
            messages.append(TracedMessage(i, m.id, m.role, source.kind, source.source_id, scale(counter.raw_message(m)),
                                          preview(m)))
        tools = [TracedTool(spec.name, self._tool_sources.get(spec.name, "agent"), scale(counter.tools([spec])),
                            tool_digest(spec.name, spec.description, spec.parameters)) for spec in request.tools]
        self._detail = (instructions, messages, tools)
        return self._detail

    @property
    def instructions(self) -> list[TracedInstruction]:
        """The system instructions, block by block, with their source."""
        return self._compute()[0]

    @property
    def messages(self) -> list[TracedMessage]:
        """Every message sent, in order, with its source and token count."""
        return self._compute()[1]

    @property
    def tools(self) -> list[TracedTool]:
        """Every tool offered, with the provider that offered it."""
        return self._compute()[2]

    @property
    def total_tokens(self) -> int:
        """Our count of the whole request: instructions, messages, tools and the reply priming."""
        return sum(self.tokens_by_source().values())

    def tokens_by_source(self) -> dict[str, int]:
        """Tokens per source (``instructions:agent``, ``history:history``, ``tool:lookup``, ...).

        The values add up to `total_tokens`; ``format`` is the chat format's fixed reply priming.
        """
        totals: dict[str, int] = {}
        for block in self.instructions:
            key = f"instructions:{block.source_id}"
            totals[key] = totals.get(key, 0) + block.tokens
        for m in self.messages:
            key = f"{m.source_kind}:{m.source_id}" if m.source_id else m.source_kind
            totals[key] = totals.get(key, 0) + m.tokens
        for t in self.tools:
            key = f"tools:{t.source_id}"
            totals[key] = totals.get(key, 0) + t.tokens
        if self._request is not None:
            totals["format"] = REPLY_PRIMING
        return totals

    def table(self) -> str:
        """Return a readable, plain-text account of this call."""
        lines = [f"call {self.step} to {self.model}: {self.total_tokens} tokens by {self.tokenizer} count"
                 + (f", model reported {self.usage.input_tokens} in / {self.usage.output_tokens} out"
                    if self.usage else "")
                 + _cache_text(self.usage)
                 + f", {self.latency_s * 1000:.1f} ms" + (f", finished: {self.finish_reason}" if self.finish_reason
                                                          else "")]
        lines.append("  tokens by source:")
        for key, tokens in sorted(self.tokens_by_source().items(), key=lambda kv: -kv[1]):
            lines.append(f"    {key:<32} {tokens:>8}")
        lines.append("  messages:")
        for m in self.messages:
            src = f"{m.source_kind}:{m.source_id}" if m.source_id else m.source_kind
            lines.append(f"    {m.index:>4} {m.role:<9} {src:<24} {m.tokens:>6}  {m.preview}")
        if self.tools:
            lines.append("  tools: " + ", ".join(f"{t.name} ({t.source_id}, {t.tokens})" for t in self.tools))
        for d in self.compaction:
            lines.append(f"  compaction: {d.strategy} {d.action} {len(d.message_ids)} message(s): {d.reason} "
                         f"({d.tokens_before} -> {d.tokens_after} tokens)")
        for b in self.budget:
            lines.append(f"  budget {b.source}: share {b.share}, asked {b.asked}, got {b.got}")
        for c in self.changes:
            lines.append(f"  {c.source_id} {c.action.replace('_', ' ')}: {', '.join(c.items)}")
        lines.extend(_middleware_lines(self.tool_calls))
        for t in self.provider_timings:
            lines.append(f"  provider {t.source_id}.{t.hook}: {t.seconds * 1000:.2f} ms")
        if self.cache is not None:
            lines.append(f"  prompt cache: {self.cache.text()}")
        lines.append(f"  history: {self.history or 'none'}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self, *, compact_runs: bool = False) -> dict[str, Any]:
        """Return a JSON-ready form of the trace.

        With `compact_runs`, consecutive history messages are folded into one entry (first and last
        message id, count, tokens): that is how traces are stored with a session, where the log
        itself holds the messages.
        """
        messages: list[dict[str, Any]] = []
        for m in self.messages:
            entry = asdict(m)
            if compact_runs and m.source_kind == "history" and messages and messages[-1].get("run") \
                    and messages[-1]["source_id"] == m.source_id:
                run = messages[-1]
                run["last_message_id"], run["count"] = m.message_id, run["count"] + 1
                run["tokens"] += m.tokens
                continue
            if compact_runs and m.source_kind == "history":
                entry = {"run": True, "index": m.index, "source_kind": "history", "source_id": m.source_id,
                         "message_id": m.message_id, "last_message_id": m.message_id, "count": 1,
                         "tokens": m.tokens, "role": m.role, "preview": m.preview}
            messages.append(entry)
        return {
            "step": self.step, "model": self.model, "tokenizer": self.tokenizer,
            "usage": _usage_dict(self.usage), "latency_s": self.latency_s,
            "finish_reason": self.finish_reason, "total_tokens": self.total_tokens,
            "tokens_by_source": self.tokens_by_source(),
            "instructions": [asdict(i) for i in self.instructions], "messages": messages,
            "tools": [asdict(t) for t in self.tools],
            "compaction": [asdict(d) for d in self.compaction],
            "changes": [asdict(c) for c in self.changes],
            "tool_calls": [asdict(c) for c in self.tool_calls],
            "provider_timings": [asdict(t) for t in self.provider_timings],
            "history": self.history,
            "cache": _cache_dict(self.cache),
            **_budget_dict(self.budget),
        }

    def to_json(self, **kwargs: Any) -> str:
        """`to_dict` as JSON text."""
        return json.dumps(self.to_dict(**kwargs), ensure_ascii=False)
