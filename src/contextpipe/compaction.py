"""Compaction: what of a long conversation is sent to the model, without losing or splitting anything.

Compaction never deletes or changes stored messages: it computes the *view* sent to the model. It
works on groups, never on loose messages:

- ``system``: a system message (always kept);
- ``summary``: a summary compaction wrote earlier (not a user turn; summarised again when older);
- ``user``: a user turn;
- ``assistant``: assistant text, and any other plain message that is not the user's (a tool's
  late result, `contextpipe.exchanges.late_result`);
- ``tool_exchange``: an assistant message with function calls plus every result for those calls
  (and anything between them), so a call is never separated from its result.

The group holding the latest user message, the newest group and any tool exchange with a call
still to answer (awaiting an approval) are pinned: the latest input is never dropped, a request is
never empty and a pending call reaches its approval. Strategies, each run only when its trigger fires:

- `SlidingWindow`: the newest messages or user turns;
- `TokenBudget`: drop the oldest groups until the request fits ``max_input_tokens - output_reserve``;
- `ClearToolResults`: replace large results of older tool exchanges with a short placeholder;
- `Summarize`: replace older groups with a summary written by a `ChatModel`; if the model fails,
  those groups are dropped instead (the run goes on);
- `CompactionPipeline`: several strategies in order.

Every change is recorded as a `CompactionDecision` (what, why, tokens before and after). Token
counts are cached per message (`TokenCounter`), and each strategy is linear in the messages.

>>> from contextpipe.tokens import EstimateTokenizer, TokenCounter
>>> import asyncio
>>> history = [Message.user("x" * 400), Message.assistant("y" * 400), Message.user("latest question")]
>>> result = asyncio.run(compact(history, TokenBudget(150), TokenCounter(EstimateTokenizer())))
>>> [m.text[:6] for m in result.messages]
['yyyyyy', 'latest']
>>> result.decisions[0].action, result.decisions[0].reason
('dropped', 'over the token budget (216 > 150)')
"""

from __future__ import annotations

import abc
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ._compaction_decision import CompactionDecision
from ._media import describe, media_tokens
from ._preview import preview
from ._tool_spec import ToolSpec
from .errors import ModelResponseError, UsageError
from .exchanges import Group, GroupKind, open_groups
from .exchanges import group_messages as _group
from .messages import FunctionResult, Message, Part
from .models.base import ChatModel, ModelRequest
from .tokens import REPLY_PRIMING, TokenCounter, Tokenizer

__all__ = [
    "ClearToolResults",
    "CompactionDecision",
    "CompactionPipeline",
    "CompactionResult",
    "CompactionStrategy",
    "CompactionView",
    "EmptySummary",
    "Group",
    "GroupKind",
    "SUMMARY_KEY",
    "SlidingWindow",
    "Summarize",
    "TokenBudget",
    "Trigger",
    "compact",
    "group_messages",
    "is_summary",
    "summary_message",
]

_ID: Final = operator.attrgetter("id")



SUMMARY_KEY: Final = "summary"
"""Metadata key marking a summary message written by compaction (``metadata={"summary": True}``)."""


def is_summary(message: Message) -> bool:
    """Tell whether `message` is a summary that compaction wrote (it stands for older messages)."""
    return bool(message.metadata.get(SUMMARY_KEY))


def summary_message(text: str) -> Message:
    """Return a summary message standing for older messages, marked so compaction recognises it."""
    return Message.user(f"[Summary of the earlier conversation]\n{text}", metadata={SUMMARY_KEY: True})


def group_messages(messages: Sequence[Message], counts: Sequence[int] | None = None) -> list[Group]:
    """Split `messages` into groups (see the module docstring and `contextpipe.exchanges`)."""
    return _group(messages, counts, is_summary=is_summary)


@dataclass(frozen=True, slots=True)
class Trigger:
    """When a strategy runs: when any given measure of the request exceeds its limit.

    No limits at all means always.
    """

    tokens: int | None = None
    messages: int | None = None
    turns: int | None = None

    def fires(self, view: CompactionView) -> bool:
        """Whether the strategy should run on `view`."""
        if self.tokens is None and self.messages is None and self.turns is None:
            return True
        return ((self.tokens is not None and view.total() > self.tokens)
                or (self.messages is not None and len(view.messages) > self.messages)
                or (self.turns is not None and view.turns() > self.turns))


class CompactionView:
    """The working state of one compaction: messages, their token counts, groups, pins and decisions.

    Custom strategies read `messages`, `groups` and `pinned` (ids of `Group` objects that must stay),
    and change the view with `drop`, `keep_groups` or `set` (recording a `CompactionDecision`).
    """

    def __init__(self, messages: list[Message], counter: TokenCounter, fixed: int) -> None:
        self.counter = counter
        self.fixed = fixed
        self.decisions: list[CompactionDecision] = []
        self.summarised: list[str] = []
        self.set(messages)

    def set(self, messages: list[Message]) -> None:
        """Make `messages` the view (counted, grouped and pinned again)."""
        self.messages = messages
        self.counts = self.counter.messages(messages)
        self.groups = group_messages(messages, self.counts)
        self._raw_total = sum(self.counts)
        last_user = next((g for g in reversed(self.groups) if g.kind == "user"), None)
        self.pinned = {id(g) for g in self.groups if g.kind == "system"} | open_groups(self.groups, messages)
        if last_user is not None:
            self.pinned.add(id(last_user))
        if self.groups:
            self.pinned.add(id(self.groups[-1]))

    def total(self) -> int:
        """Calibrated tokens of the whole request: instructions, tools, messages, reply priming."""
        return self.counter.scale(self.fixed + self._raw_total + REPLY_PRIMING)

    def turns(self) -> int:
        """Return the number of user turns in the view."""
        return sum(1 for g in self.groups if g.kind == "user")

    def keep_groups(self, keep: list[Group]) -> None:
        """Keep only the messages of `keep` (no decision recorded: use `drop` for that).

        Whole groups keep their boundaries, so the view is sliced, not counted or grouped again.
        """
        messages, counts = self.messages, self.counts
        new_messages: list[Message] = []
        new_counts: list[int] = []
        for g in keep:
            size = g.end - g.start
            new_messages += messages[g.start:g.end]
            new_counts += counts[g.start:g.end]
            g.start = len(new_messages) - size
            g.end = len(new_messages)
        self.messages, self.counts, self.groups = new_messages, new_counts, keep
        self._raw_total = sum(new_counts)

    def ids(self, groups: Sequence[Group]) -> tuple[str, ...]:
        """Return the ids of the messages of `groups`."""
        messages = self.messages
        ids: list[str] = []
        for g in groups:
            ids += map(_ID, messages[g.start:g.end])
        return tuple(ids)

    def drop(self, strategy: str, dropped: list[Group], reason: str) -> None:
        """Remove the messages of `dropped` from the view and record why."""
        if not dropped:
            return
        before = self.total()
        gone = {id(g) for g in dropped}
        ids = self.ids(dropped)
        self.keep_groups([g for g in self.groups if id(g) not in gone])
        self.decisions.append(CompactionDecision(strategy, "dropped", ids, reason, before, self.total()))


class CompactionStrategy(abc.ABC):
    """A way to make the view smaller; `trigger` says when it runs (None: always)."""

    name: str = "strategy"
    trigger: Trigger | None = None

    @property
    def kept_tokens(self) -> int | None:
        """The most tokens of messages a view keeps after this strategy, or None when it cannot say.

        A `History` before the `Compaction` loads no more than twice this of the log (`TokenBudget`
        says its budget; a strategy that may need older messages, `Summarize`, says None).
        """
        return None

    async def run(self, view: CompactionView) -> None:
        """Apply the strategy if its trigger fires."""
        if self.trigger is None or self.trigger.fires(view):
            await self.apply(view)

    @abc.abstractmethod
    async def apply(self, view: CompactionView) -> None:
        """Change `view` (through its helpers, which record decisions)."""


class SlidingWindow(CompactionStrategy):
    """Keep the newest `max_messages` messages and/or the newest `max_turns` user turns (by group)."""

    name = "sliding_window"

    def __init__(self, *, max_messages: int | None = None, max_turns: int | None = None,
                 trigger: Trigger | None = None) -> None:
        if max_messages is None and max_turns is None:
            raise UsageError("SlidingWindow needs max_messages=... or max_turns=...")
        self.max_messages = max_messages
        self.max_turns = max_turns
        self.trigger = trigger

    async def apply(self, view: CompactionView) -> None:
        """Drop the oldest unpinned groups beyond the window."""
        if self.max_turns is not None:
            user_groups = [g for g in view.groups if g.kind == "user"]
            if len(user_groups) > self.max_turns:
                cut = user_groups[-self.max_turns].start if self.max_turns > 0 else len(view.messages)
                old = [g for g in view.groups if g.start < cut and id(g) not in view.pinned]
                view.drop(self.name, old, f"older than the last {self.max_turns} turns")
        if self.max_messages is not None and len(view.messages) > self.max_messages:
            excess = len(view.messages) - self.max_messages
            dropped: list[Group] = []
            for g in view.groups:
                if excess <= 0:
                    break
                if id(g) in view.pinned:
                    continue
                dropped.append(g)
                excess -= g.end - g.start
            view.drop(self.name, dropped, f"more than {self.max_messages} messages")


class TokenBudget(CompactionStrategy):
    """Drop the oldest groups until the request fits ``max_input_tokens - output_reserve``.

    If pinned groups alone do not fit, they are kept and an ``over_budget`` decision is recorded.
    """

    name = "token_budget"

    def __init__(self, max_input_tokens: int, *, output_reserve: int = 0, trigger: Trigger | None = None) -> None:
        if max_input_tokens <= output_reserve:
            raise UsageError("max_input_tokens must be larger than output_reserve")
        self.budget = max_input_tokens - output_reserve
        self.trigger = trigger

    @property
    def kept_tokens(self) -> int | None:
        """The budget, when the strategy always runs (a trigger may let larger views through)."""
        return self.budget if self.trigger is None else None

    async def apply(self, view: CompactionView) -> None:
        """Drop the oldest unpinned groups until the request fits."""
        total = view.total()
        if total <= self.budget:
            return
        ratio = 1.0 if view.counter.tokenizer.exact else view.counter.calibration.ratio
        budget_raw = int(self.budget / ratio)  # compare raw counts: no scaling per group
        while view.counter.scale(budget_raw) > self.budget:
            budget_raw -= 1
        excess_raw = view.fixed + view._raw_total + REPLY_PRIMING
        pinned = view.pinned
        dropped: list[Group] = []
        for g in view.groups:
            if excess_raw <= budget_raw:
                break
            if id(g) in pinned:
                continue
            dropped.append(g)
            excess_raw -= g.tokens
        view.drop(self.name, dropped, f"over the token budget ({total} > {self.budget})")
        if view.total() > self.budget:
            view.decisions.append(CompactionDecision(
                self.name, "over_budget", (), f"the pinned messages alone need {view.total()} tokens, over the "
                f"budget of {self.budget}: the latest input and the newest step are never dropped",
                view.total(), view.total()))


class ClearToolResults(CompactionStrategy):
    """Replace large results of older tool exchanges with a placeholder saying what was removed.

    The newest `keep_last` exchanges keep their results; results under `min_tokens` stay too.
    """

    name = "clear_tool_results"

    def __init__(self, *, keep_last: int = 2, min_tokens: int = 100, trigger: Trigger | None = None) -> None:
        self.keep_last = keep_last
        self.min_tokens = min_tokens
        self.trigger = trigger

    async def apply(self, view: CompactionView) -> None:
        """Replace large results of all but the newest exchanges with placeholders."""
        exchanges = [g for g in view.groups if g.kind == "tool_exchange"]
        old = exchanges[:-self.keep_last] if self.keep_last > 0 else exchanges
        if not old:
            return
        before = view.total()
        messages = list(view.messages)
        cleared: list[str] = []
        for g in old:
            names = {p.call_id: p.name for i in range(g.start, g.end) for p in messages[i].function_calls}
            for i in range(g.start, g.end):
                m = messages[i]
                new = self._cleared(m, names, view.counter.tokenizer) if m.role == "tool" else None
                if new is not None:
                    messages[i] = new
                    cleared.append(m.id)
        if cleared:
            view.set(messages)
            view.decisions.append(CompactionDecision(
                self.name, "cleared", tuple(cleared),
                f"tool results of {len(old)} older exchange(s) larger than {self.min_tokens} tokens",
                before, view.total()))


    def _cleared(self, message: Message, names: dict[str, str], tokenizer: Tokenizer) -> Message | None:
        """Return `message` with its large results replaced by placeholders, or None if none is large."""
        parts: list[Part] = []
        changed = False
        for p in message.parts:
            if type(p) is FunctionResult and not p.result.startswith("[cleared"):
                size = tokenizer.count_text(p.result) + sum(media_tokens(m) for m in p.parts)
                if size >= self.min_tokens:
                    media = f" with {', '.join(describe(m) for m in p.parts)}" if p.parts else ""
                    p = FunctionResult(p.call_id, f"[cleared to save context: {size} tokens of "
                                       f"{names.get(p.call_id, 'tool')} output{media}; call the tool again if "
                                       "you need it]", p.is_error)
                    changed = True
            parts.append(p)
        if not changed:
            return None
        return Message(message.role, tuple(parts), author_name=message.author_name, created_at=message.created_at,
                       metadata={**message.metadata, "compacted_from": message.id}, source=message.source)


DEFAULT_SUMMARY_PROMPT = (
    "You compress the earlier part of a conversation between a user and an assistant that uses tools. "
    "Write a concise summary that keeps every fact, decision, name, number, preference and open "
    "question needed to continue the conversation. Include what tools were called and what they "
    "returned when it matters. Do not add anything that is not in the conversation."
)


class EmptySummary(ModelResponseError):
    """`Summarize`'s model answered without any text; the old messages are dropped instead of summarised."""


class Summarize(CompactionStrategy):
    """Replace groups older than the last `keep_last_turns` turns with a summary written by `model`.

    The summariser is sent at most `max_input_tokens` per call. When the old part is larger, the
    newest ``max_chunks * max_input_tokens`` of it are summarised in chunks, oldest first, each call
    rolling the summary so far forward; anything older is dropped (recorded as such), and the summary
    stands for all of it. An earlier summary is always part of the input, so it is rolled forward,
    never lost. If the model fails, the old groups are dropped instead and the run goes on.

    With `Compaction`, the summary is saved as a checkpoint covering the oldest part of the stored log,
    so later runs start from it; give a `trigger` so the summariser is called only when enough new
    material has gathered (without one it runs whenever there are more than `keep_last_turns` turns).
    """

    name = "summarize"

    def __init__(self, model: ChatModel, *, prompt: str = DEFAULT_SUMMARY_PROMPT, keep_last_turns: int = 2,
                 max_input_tokens: int = 8_000, max_summary_tokens: int = 600, max_chunks: int = 1,
                 trigger: Trigger | None = None) -> None:
        if max_chunks < 1:
            raise UsageError(f"max_chunks must be at least 1, got {max_chunks}")
        self.model = model
        self.prompt = prompt
        self.keep_last_turns = keep_last_turns
        self.max_input_tokens = max_input_tokens
        self.max_summary_tokens = max_summary_tokens
        self.max_chunks = max_chunks
        self.trigger = trigger

    async def apply(self, view: CompactionView) -> None:
        """Summarise the groups older than the kept turns (drop them if the model fails)."""
        old = self._old_groups(view)
        if not old:
            return
        chosen, too_old = self._within_cap(old)
        old_ids = view.ids(old)
        chosen_messages = [view.messages[i] for g in chosen for i in range(g.start, g.end)]
        before = view.total()
        try:
            text = await self._summarise_chunks(chosen, chosen_messages)
        except Exception as exc:
            view.drop(self.name, old, f"the summary failed ({type(exc).__name__}: {exc}); "
                                      "dropped instead of summarised so the run can go on")
            return
        view.drop(self.name, too_old, f"beyond the summariser's input cap of {self.max_input_tokens} tokens"
                                      + (f" x {self.max_chunks} chunks" if self.max_chunks > 1 else ""))
        summarised = _replace_with_summary(view, {m.id for m in chosen_messages}, summary_message(text))
        # The summary stands for everything before it, including what was too old to be sent.
        view.summarised.extend(old_ids)
        view.decisions.append(CompactionDecision(
            self.name, "summarised", tuple(summarised), f"older than the last {self.keep_last_turns} turns",
            before, view.total()))

    def _old_groups(self, view: CompactionView) -> list[Group]:
        """Return the groups older than the kept turns that may be summarised (not pinned, not system)."""
        users = [g for g in view.groups if g.kind == "user"]
        if len(users) <= self.keep_last_turns:
            return []
        cut = users[-self.keep_last_turns].start if self.keep_last_turns > 0 else len(view.messages)
        return [g for g in view.groups if g.end <= cut and id(g) not in view.pinned and g.kind != "system"]

    def _within_cap(self, old: list[Group]) -> tuple[list[Group], list[Group]]:
        """Split `old` into what is summarised and what is too old to send (beyond the chunks' cap).

        Earlier summaries always go in; then the newest other old groups within the cap.
        """
        budget = self.max_input_tokens * self.max_chunks - sum(g.tokens for g in old if g.kind == "summary")
        taken: set[int] = {id(g) for g in old if g.kind == "summary"}
        picked = 0
        for g in reversed(old):
            if g.kind == "summary":
                continue
            if g.tokens > budget and picked:
                break
            taken.add(id(g))
            budget -= g.tokens
            picked += 1
        return [g for g in old if id(g) in taken], [g for g in old if id(g) not in taken]

    async def _summarise_chunks(self, groups: list[Group], messages: list[Message]) -> str:
        """Summarise `messages` (the messages of `groups`) in chunks of at most the input cap, oldest first."""
        chunks: list[list[Message]] = [[]]
        size = 0
        offset = 0
        for g in groups:
            count = g.end - g.start
            if chunks[-1] and size + g.tokens > self.max_input_tokens:
                chunks.append([])
                size = 0
            chunks[-1] += messages[offset:offset + count]
            size += g.tokens
            offset += count
        text = ""
        for chunk in chunks:
            if text:
                chunk = [Message.user(f"[Summary of the earlier conversation]\n{text}"), *chunk]
            text = await self._summarise(chunk)
        return text

    async def _summarise(self, messages: list[Message]) -> str:
        lines = [f"{m.role}: {text}" for m in messages if (text := preview(m, width=None, one_line=False))]
        request = ModelRequest([Message.user("\n".join(lines))], self.prompt, (),
                               {"max_output_tokens": self.max_summary_tokens})
        response = await self.model.complete(request)
        text = response.text.strip()
        if not text:
            raise EmptySummary(f"the summariser model {self.model.name!r} returned no text for {len(messages)} "
                               "message(s); give Summarize a model that answers its prompt (or a larger "
                               "max_summary_tokens when it spends them on reasoning)")
        return text


def _replace_with_summary(view: CompactionView, ids: set[str], summary: Message) -> list[str]:
    """Put `summary` where the first of the messages `ids` was, drop the rest; return their ids."""
    keep: list[Message] = []
    summarised: list[str] = []
    for m in view.messages:
        if m.id in ids:
            if not summarised:
                keep.append(summary)
            summarised.append(m.id)
        else:
            keep.append(m)
    view.set(keep)
    return summarised


class CompactionPipeline(CompactionStrategy):
    """Run several strategies in order (each with its own trigger)."""

    name = "pipeline"

    def __init__(self, strategies: Sequence[CompactionStrategy], *, trigger: Trigger | None = None) -> None:
        self.strategies = list(strategies)
        self.trigger = trigger

    @property
    def kept_tokens(self) -> int | None:
        """The smallest bound of the strategies, when every one of them says one (and the pipeline always runs)."""
        kept = [s.kept_tokens for s in self.strategies]
        bounds = [k for k in kept if k is not None]
        return min(bounds) if bounds and len(bounds) == len(kept) and self.trigger is None else None

    async def apply(self, view: CompactionView) -> None:
        """Run each strategy in turn."""
        for strategy in self.strategies:
            await strategy.run(view)


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """The compacted view and how it came about."""

    messages: list[Message]
    decisions: list[CompactionDecision]
    tokens_before: int
    tokens_after: int
    summarised: list[str]
    """Ids of the messages a summary now stands for, oldest first."""
    seconds: float

    @property
    def changed(self) -> bool:
        """True when the view differs from the input."""
        return bool(self.decisions) and any(d.action != "over_budget" for d in self.decisions)


async def compact(
    messages: Sequence[Message],
    strategy: CompactionStrategy,
    counter: TokenCounter,
    *,
    instructions: str | None = None,
    tools: Sequence[ToolSpec] = (),
) -> CompactionResult:
    """Compact `messages` (with `instructions` and `tools` counted toward the request) by `strategy`."""
    started = time.perf_counter()
    fixed = counter.text(instructions) + counter.tools(tools)
    view = CompactionView(list(messages), counter, fixed)
    before = view.total()
    orphans = [g for g in view.groups if g.kind == "orphan"]
    view.drop("grouping", orphans, "tool results without their call cannot be sent")
    await strategy.run(view)
    return CompactionResult(view.messages, view.decisions, before, view.total(), view.summarised,
                            time.perf_counter() - started)

