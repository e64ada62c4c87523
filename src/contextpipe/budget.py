"""`ContextBudget`: one token budget for the request, split across the sources that fill it.

Tool definitions, recalled memories, search results and history all compete for the same context
window. A `ContextBudget` among an agent's providers measures, after every other provider's
`before_run` (the agent's and the run's own: it always runs last), what each source contributed
(with the run's token counter, the numbers the trace shows) and has each source trim itself to its
share by its own rule, before the first request is built:

- ``memory`` (`SemanticMemory`, `FactMemory`) and ``search`` (`TextSearch`) drop their lowest-scored
  items (the least relevant facts);
- ``history`` is compacted: the oldest groups go first, a tool call never leaves its results, a
  system message stays (the `Compaction` provider is the rule when it is among the providers, its
  summaries counted as history; else the budget drops the oldest groups itself);
- ``tools``: the definitions are deferred behind `ToolSearch`'s ``search_tools`` and catalogue
  when they need more than the tools' own share (no spare share flows to them: the decision, and
  so the prompt's cached prefix, does not change with what the other sources ask run to run).

Shares are fractions (0 to 1, adding up to at most 1) of the *room*: ``total - reserve`` less what
the budget may not trim (the system instructions, the caller's input, the reply priming, and what
non-participating providers added). A share a source does not use, and the part no share names,
flows to the sources that want more, in `priorities` order. So when what may not be trimmed fits,
the request never exceeds ``total - reserve`` (save the least a source cannot give up: a history's
system messages and calls awaiting an approval, ``search_tools`` and its catalogue; that much is
taken from the others: the spare share of the sources after it, then the sources fitted before it,
save the tools). When it is still over, the run goes on with every source trimmed to what it may
not drop, and the first call's trace says so (an ``over_budget`` change): the caller's input and
the instructions are never cut to make room.
What the run itself adds after the providers, before its first call, is not budgeted: the answers
to a resumed run's approved calls, late tool results held for it, and repairs of the log's view.

A provider takes part by implementing `BudgetParticipant`; the budget knows nothing of its items.

>>> ContextBudget(8_000, reserve=1_000, shares={"history": 0.5, "memory": 0.2}).priorities
('history', 'memory')
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from ._compaction_decision import CompactionDecision
from ._run.hooks import AfterProviders
from .errors import UsageError
from .exchanges import open_groups
from .messages import Message
from .pipeline import Segment
from .providers.base import ContextProvider
from .tokens import REPLY_PRIMING
from .trace import BudgetShare, ContextChange

if TYPE_CHECKING:
    from .exchanges import Group
    from .pipeline import RunContext

__all__ = ["SOURCES", "BudgetParticipant", "ContextBudget", "RankedItems", "contributed_tokens", "fit_history",
           "fit_listed", "fit_ranked", "ranked_message"]

SOURCES: Final = ("tools", "memory", "search", "history")
"""The sources a budget can share between."""

RANKED_KEY: Final = "budget_items"
"""Message metadata that marks a message as ranked items (`ranked_message`): how to cut it into them."""


@runtime_checkable
class BudgetParticipant(Protocol):
    """A provider whose contribution a `ContextBudget` can trim: it measures and trims its own."""

    source_id: str
    budget_share: str
    """Which share it draws from (one of `SOURCES`)."""

    def budget_tokens(self, ctx: RunContext) -> int:
        """Return the tokens of this provider's contribution to the request, counted with ``ctx.tokens``."""
        ...

    async def fit_budget(self, ctx: RunContext, allowance: int) -> None:
        """Trim this provider's contribution to at most `allowance` tokens, keeping the best of it."""
        ...


class RankedItems:
    """A `BudgetParticipant` whose contribution is `ranked_message` items: it drops the lowest-scored first.

    For a provider class: set ``budget_share``; what it counts is everything it added (messages
    and instructions), and only the ranked items are trimmed.
    """

    source_id: str
    budget_share: str

    def budget_tokens(self, ctx: RunContext) -> int:
        """Return the tokens of what this provider added to the run (its ranked messages, its instructions)."""
        return contributed_tokens(ctx, [self.source_id])

    async def fit_budget(self, ctx: RunContext, allowance: int) -> None:
        """Drop the lowest-scored items (the last ones, when they have no scores) to fit `allowance` tokens."""
        await fit_ranked(ctx, self.source_id, allowance)


class ContextBudget(ContextProvider, AfterProviders):
    """Splits ``total - reserve`` tokens of each request between tools, memory, search and history.

    `shares` maps a source to its fraction of the room (see the module docstring); a source not
    named is not trimmed (it counts against the total). `priorities` orders who gets the unused
    share first (default: the order of `shares`). Wherever it is among the providers, it runs after
    all of them, the agent's and the run's own (``Agent.run(providers=...)``), and budgets those.
    """

    kind = "budget"

    def __init__(self, total: int, *, reserve: int = 0, shares: Mapping[str, float],
                 priorities: Sequence[str] | None = None, source_id: str = "budget") -> None:
        super().__init__(source_id)
        _check(total, reserve, shares, priorities or ())
        self.total = total
        """The most tokens a request may take, the reply's reserve included."""
        self.reserve = reserve
        """Tokens kept free for the model's reply."""
        self.shares = dict(shares)
        """Each source's fraction of the room."""
        given = list(dict.fromkeys(priorities or ()))
        self.priorities: tuple[str, ...] = (*given, *(s for s in shares if s not in given))
        """Who takes unused share first, first first."""

    async def after_providers(self, ctx: RunContext, providers: Sequence[ContextProvider]) -> None:
        """Measure every source `providers` fill, then have each trim itself to its share (plus what flows to it)."""
        participants = self._participants(providers)
        owners = {p.source_id for group in participants.values() for p in group}
        asked = {s: sum(p.budget_tokens(ctx) for p in participants.get(s, ())) for s in self.shares}
        fixed = _fixed_tokens(ctx, owners, history="history" in participants, tools="tools" in participants)
        limit = self.total - self.reserve
        room = max(0, limit - fixed)
        base = {s: math.floor(self.shares[s] * room) for s in self.shares}
        pool = room - sum(base.values()) + sum(max(0, base[s] - asked[s]) for s in self.shares)
        got, stuck = await self._fit(ctx, participants, asked, base, pool, fixed)
        if stuck and fixed + sum(got.values()) > limit:  # what one could not give up, from those fitted before it
            await _take_back(ctx, participants, self.priorities, got, fixed, fixed + sum(got.values()) - limit)
        if fixed + sum(got.values()) > limit:
            ctx.journal.changes.append(ContextChange(self.source_id, "over_budget", (
                _over_budget(fixed + sum(got.values()), limit, fixed, {s: got[s] for s in stuck}),)))
        ctx.journal.budget = [BudgetShare(s, base[s], asked[s], got[s]) for s in self.shares]

    async def _fit(self, ctx: RunContext, participants: Mapping[str, Sequence[BudgetParticipant]],
                   asked: Mapping[str, int], base: Mapping[str, int], pool: int,
                   fixed: int) -> tuple[dict[str, int], dict[str, int]]:
        """Have each source fit its share plus what flows to it; return what each got, and those that could not."""
        got: dict[str, int] = {}
        stuck: dict[str, int] = {}  # the sources that could not go down to what they were allowed
        request = fixed + sum(asked.values())  # the request's tokens as the sources trim it, one after another
        for source in sorted(self.priorities, key=lambda s: s != "tools"):  # the tools first: see below
            allowed = min(asked[source], base[source])
            decided = len(ctx.journal.compaction)
            if asked[source] > allowed:
                # The tools take no extra: whether they are deferred then depends on their share alone, not
                # on what the other sources ask this run, so the prompt's first block stays the same run to run
                # (and what their catalogue takes over their share is known before the others are trimmed).
                extra = 0 if source == "tools" else min(pool, asked[source] - allowed)  # (< 0: others took more)
                allowed, pool = max(0, allowed + extra), pool - extra
                await _split(ctx, participants[source], allowed)
            got[source] = sum(p.budget_tokens(ctx) for p in participants.get(source, ()))
            _as_request_tokens(ctx, decided, request, request - asked[source] + got[source])
            request += got[source] - asked[source]
            if got[source] > allowed:
                stuck[source] = got[source]
            pool += allowed - got[source]  # what it left flows on; what it could not give up is taken from the rest
        return got, stuck

    def _participants(self, providers: Sequence[ContextProvider]) -> dict[str, list[BudgetParticipant]]:
        found: dict[str, list[BudgetParticipant]] = {}
        for provider in providers:
            if isinstance(provider, BudgetParticipant) and provider.budget_share in self.shares:
                found.setdefault(provider.budget_share, []).append(provider)
        if "history" in self.shares and "history" not in found:
            found["history"] = [_OldestFirst(self.source_id)]
        return found


async def _split(ctx: RunContext, group: Sequence[BudgetParticipant], allowed: int) -> None:
    """Have the providers of one share fit `allowed` between them, each in proportion to its ask.

    What one leaves of its part (an item does not fit exactly) goes to the ones after it; what one
    could not give up of its part (its instructions) is then taken back from the ones before it, in order.
    """
    asks = [p.budget_tokens(ctx) for p in group]
    left = allowed
    for i, participant in enumerate(group):
        rest = sum(asks[i:])
        part = max(0, left) * asks[i] // rest if rest else 0
        if asks[i] > part:
            with ctx.contributing(participant.source_id):
                await participant.fit_budget(ctx, part)
        left -= participant.budget_tokens(ctx)
    moved = True
    while left < 0 and moved:  # over: refit the others with less, until it fits or none can go lower
        moved = False
        for participant in group:
            if left >= 0:
                break
            own = participant.budget_tokens(ctx)
            if own > 0:
                with ctx.contributing(participant.source_id):
                    await participant.fit_budget(ctx, max(0, own + left))
                now = participant.budget_tokens(ctx)
                moved, left = moved or now < own, left + own - now


async def _take_back(ctx: RunContext, participants: Mapping[str, Sequence[BudgetParticipant]],
                     order: Sequence[str], got: dict[str, int], fixed: int,
                     excess: int) -> None:
    """Trim the sources fitted before one that could not go lower by its `excess`, first in `order` first.

    Not the tools: whether they are deferred stays decided by their own share (the prompt cache).
    """
    for source in order:
        if excess <= 0:
            return
        if source == "tools" or not got.get(source):  # (a stuck source may still have a participant to trim)
            continue
        decided, request = len(ctx.journal.compaction), fixed + sum(got.values())
        await _split(ctx, participants[source], max(0, got[source] - excess))
        now = sum(p.budget_tokens(ctx) for p in participants[source])
        _as_request_tokens(ctx, decided, request, request - got[source] + now)
        excess, got[source] = excess - (got[source] - now), now


def _over_budget(request: int, limit: int, fixed: int, stuck: Mapping[str, int]) -> str:
    """Say why the request is over `limit`: what may not be trimmed alone, or the sources that could not go lower."""
    head = f"the request takes {request} tokens, over the {limit} the budget allows: "
    if fixed > limit:
        return head + (f"what it may not trim (instructions, input, other providers) alone takes {fixed}, and every "
                       "source is trimmed to what it may not drop")
    return head + ", ".join(f"{s} could not go below {n} tokens" for s, n in stuck.items()) + (
        " (what it may not drop: a history's system messages or pending calls, search_tools and its catalogue)")


def _as_request_tokens(ctx: RunContext, decided: int, before: int, after: int) -> None:
    """Make the decisions a source's rule recorded from `decided` on give the request's tokens, as documented."""
    journal = ctx.journal
    journal.compaction[decided:] = [replace(d, tokens_before=before, tokens_after=after)
                                    for d in journal.compaction[decided:]]


def _check(total: int, reserve: int, shares: Mapping[str, float], priorities: Sequence[str]) -> None:
    """Refuse a budget that cannot be what its caller meant, saying what to change."""
    if isinstance(priorities, str):
        raise UsageError(f"ContextBudget priorities is a list of sources, got the string {priorities!r}: "
                         f"write priorities=[{priorities!r}]")
    if not shares:
        raise UsageError("ContextBudget needs at least one share, e.g. shares={'history': 0.5}: with none it "
                         "would trim nothing")
    if total <= 0 or reserve < 0:
        raise UsageError(f"ContextBudget needs total > 0 and reserve >= 0, got total={total}, reserve={reserve}")
    if total <= reserve:
        raise UsageError(f"ContextBudget total ({total}) must be larger than reserve ({reserve}), which is kept "
                         "for the model's reply: raise total (the model's context window) or lower the reserve")
    unknown = [name for name in [*shares, *priorities] if name not in SOURCES]
    if unknown:
        raise UsageError(f"ContextBudget knows no source {unknown[0]!r}: shares and priorities take "
                         f"{', '.join(repr(s) for s in SOURCES)}")
    _check_fractions(shares, priorities)


def _check_fractions(shares: Mapping[str, float], priorities: Sequence[str]) -> None:
    stray = [name for name in priorities if name not in shares]
    if stray:
        raise UsageError(f"ContextBudget priority {stray[0]!r} has no share: add it to shares (0 gives it only "
                         "what others leave) or leave it out of priorities")
    bad = {n: v for n, v in shares.items()
           if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1}
    if bad:
        raise UsageError(f"ContextBudget shares are fractions from 0 to 1 of the room, got {bad!r}")
    if sum(shares.values()) > 1 + 1e-9:
        raise UsageError(f"ContextBudget shares add up to {sum(shares.values()):g}, over 1: they are fractions "
                         "of one room, so lower some (what no share takes flows to the sources by priority)")


def _fixed_tokens(ctx: RunContext, owners: set[str], *, history: bool, tools: bool) -> int:
    """Tokens of the request that no participant owns: the budget counts them but cannot trim them."""
    counter = ctx.tokens
    total = REPLY_PRIMING + sum(counter.scale(counter.text(text)) for sid, text in ctx.instruction_sources
                                if sid not in owners)
    for segment in ctx.segments:
        if segment.source.source_id not in owners and not (history and segment.source.kind == "history"):
            total += sum(counter.message(m) for m in segment.messages)
    total += sum(counter.message(m) for m in ctx.input)
    if not tools:
        total += sum(counter.scale(counter.tools([t.spec])) for t in ctx.tools.values())
    return total


def contributed_tokens(ctx: RunContext, source_ids: Iterable[str], *, history: bool = False) -> int:
    """Return the tokens of the messages and instructions the providers `source_ids` added (and the loaded history).

    Counted with the run's calibrated counter, as the trace counts them: what a participant's
    `BudgetParticipant.budget_tokens` returns for what it added to the run.
    """
    ids = set(source_ids)
    counter = ctx.tokens
    total = sum(counter.scale(counter.text(text)) for sid, text in ctx.instruction_sources if sid in ids)
    for segment in ctx.segments:
        if segment.source.source_id in ids or (history and segment.source.kind == "history"):
            total += sum(counter.message(m) for m in segment.messages)
    return total


def _replace_in(ctx: RunContext, keep: set[str], owned: Iterable[Segment]) -> None:
    """Keep only the messages of `owned` segments whose ids are in `keep` (a kept suffix keeps its log position)."""
    mine = {id(s) for s in owned}
    segments = []
    for segment in ctx.segments:
        if id(segment) not in mine:
            segments.append(segment)
            continue
        kept = [m for m in segment.messages if m.id in keep]
        if not kept:
            continue
        dropped = len(segment.messages) - len(kept)
        first = segment.first_seq
        suffix = first is not None and [m.id for m in segment.messages[dropped:]] == [m.id for m in kept]
        first = first + dropped if first is not None and suffix else None
        tagged = [m for m in segment._tagged if m.id in keep] if segment._tagged is not None else None
        segments.append(Segment(segment.source, kept, first, _tagged=tagged))
    ctx.segments = segments


# --- the rules the built-in participants use ------------------------------------------------------------


def ranked_message(head: str, items: Sequence[tuple[str, float | None]], *, separator: str = "\n",
                   metadata: Mapping[str, Any] | None = None) -> Message:
    """Return a user message ``head + separator.join(texts)`` whose items a budget can drop, lowest score first.

    An item with no score ranks by its place (earlier is better). The metadata records only where
    each item ends and its score, so a trimmed message is cut from the text itself.
    """
    spans = [[len(text), score if score is not None else -float(i)] for i, (text, score) in enumerate(items)]
    text = head + separator.join(t for t, _ in items)
    return Message.user(text, metadata={**(metadata or {}), RANKED_KEY: {"head": len(head), "sep": separator,
                                                                         "items": spans}})


def _items(message: Message) -> tuple[str, str, list[tuple[str, float]]] | None:
    info = message.metadata.get(RANKED_KEY)
    if not isinstance(info, Mapping):
        return None
    text, at, sep = message.text, int(info["head"]), str(info["sep"])
    head, items = text[:at], []
    for length, score in info["items"]:
        items.append((text[at:at + int(length)], float(score)))
        at += int(length) + len(sep)
    return head, sep, items


async def fit_ranked(ctx: RunContext, source_id: str, allowance: int) -> None:
    """Trim the ranked messages (`ranked_message`) provider `source_id` added to `allowance` tokens.

    The lowest-scored items go first; a message left with no item goes; what else the provider
    added (its other messages, its instructions) stays and is counted against `allowance`.
    """
    counter = ctx.tokens
    owned = [s for s in ctx.segments if s.source.source_id == source_id]
    ranked = sum(counter.message(m) for s in owned for m in s.messages if RANKED_KEY in m.metadata)
    left = allowance - (contributed_tokens(ctx, [source_id]) - ranked)
    replaced: dict[str, Message | None] = {}
    for message in (m for s in owned for m in s.tagged if RANKED_KEY in m.metadata):
        new = _trimmed(message, left, ctx)
        left -= counter.message(new) if new is not None else 0
        if new is not message:
            replaced[message.id] = new
    if replaced:
        _swap(owned, replaced)


def _swap(segments: Iterable[Segment], replaced: Mapping[str, Message | None]) -> None:
    """Put each replaced message's replacement in its place in `segments` (None: remove it)."""
    for segment in segments:
        tagged = [r for m in segment.tagged if (r := replaced.get(m.id, m)) is not None]
        segment.messages, segment._tagged = tagged, tagged


def _trimmed(message: Message, allowance: int, ctx: RunContext) -> Message | None:
    """Return `message` with its lowest-scored items dropped until it fits `allowance` (None: nothing fits)."""
    count = ctx.tokens.message
    parsed = _items(message)
    if parsed is None or count(message) <= allowance:
        return message  # (a message whose metadata is not ours stays as it is)
    head, sep, items = parsed
    metadata = {k: v for k, v in message.metadata.items() if k != RANKED_KEY}
    order = sorted(range(len(items)), key=lambda i: -items[i][1])
    while len(order) > 1:
        order.pop()  # the lowest-scored item
        new = ranked_message(head, [items[i] for i in sorted(order)], separator=sep, metadata=metadata)
        new = new.with_source(message.source) if message.source is not None else new
        if count(new) <= allowance:
            return new
    return None


def fit_listed(ctx: RunContext, source_id: str, allowance: int, separator: str = "\n- ") -> None:
    """Trim the instructions provider `source_id` added to `allowance` tokens, dropping their last items first.

    Each block is a head, then items best first, each after `separator`; a block left with no item goes.
    The blocks are cut at `separator`: an item containing it is cut there too (`FactMemory` lists
    each fact on a line after a dash; a fact with a line starting so in it loses its end first).
    """
    count, left, kept = ctx.tokens, allowance, []
    for block in (text for sid, text in ctx.instruction_sources if sid == source_id):
        items = block.split(separator)
        while len(items) > 1 and count.scale(count.text(separator.join(items))) > left:
            items.pop()
        if len(items) > 1 and (tokens := count.scale(count.text(text := separator.join(items)))) <= left:
            kept.append(text)
            left -= tokens
    ctx.replace_own_instructions(kept)


async def fit_history(ctx: RunContext, allowance: int, source_ids: Iterable[str] = (), *,
                      strategy: str = "budget") -> None:
    """Drop the oldest groups of the loaded history (and of `source_ids`' messages) until they fit `allowance`.

    A tool call stays with its results (groups are dropped whole), system messages and calls still
    without a result (awaiting an approval) stay, and on a run with no new input (a resume) the
    newest group stays. The decision goes on the first call's trace.
    """
    from .compaction import group_messages  # here: a run with nothing to compact never loads the strategies

    ids = set(source_ids)
    counter = ctx.tokens
    owned = [s for s in ctx.segments if s.source.kind == "history" or s.source.source_id in ids]
    messages = [m for s in owned for m in s.messages]
    counts = [counter.message(m) for m in messages]
    total = sum(counts)
    if total <= allowance:
        return
    dropped, left = _oldest_groups(group_messages(messages, counts), messages, total - allowance,
                                   keep_newest=not ctx.input)
    drop = set(dropped)
    _replace_in(ctx, {m.id for m in messages if m.id not in drop}, owned)
    ctx.record_compaction([CompactionDecision(strategy, "dropped", tuple(dropped),
                                              f"the history's {total} tokens are over its share of the budget "
                                              f"({allowance})", total, left)])  # (the budget makes these the
    # request's tokens, as the trace documents them: it knows the rest of the request)


def _oldest_groups(groups: Sequence[Group], messages: Sequence[Message], excess: int, *,
                   keep_newest: bool) -> tuple[list[str], int]:
    """Return the ids of the oldest groups whose tokens cover `excess`, and the tokens left.

    A system group, and an exchange with calls still to answer (an approval pending), are never dropped.
    """
    pinned = {id(g) for g in groups if g.kind == "system"} | open_groups(groups, messages)  # calls to answer
    if keep_newest and groups:
        pinned.add(id(groups[-1]))
    dropped: list[str] = []
    left = sum(g.tokens for g in groups)
    for group in groups:
        if excess <= 0:
            break
        if id(group) not in pinned:
            dropped.extend(m.id for m in messages[group.start:group.end])
            left, excess = left - group.tokens, excess - group.tokens
    return dropped, left


class _OldestFirst:
    """The history's rule when no `Compaction` provider is there: drop the oldest groups."""

    budget_share = "history"

    def __init__(self, source_id: str) -> None:
        self.source_id = source_id

    def budget_tokens(self, ctx: RunContext) -> int:
        return contributed_tokens(ctx, (), history=True)

    async def fit_budget(self, ctx: RunContext, allowance: int) -> None:
        await fit_history(ctx, allowance)
