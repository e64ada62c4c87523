"""`ToolSearch`: a run with more tools than a threshold offers a search instead of every definition.

An MCP server with hundreds of tools would put every definition into every model call. With
`ToolSearch` among the providers (after those that add tools), a run offered more than `threshold`
tools gives the model one tool, ``search_tools``, and a short catalogue in its instructions (names
and one-line summaries, bounded in tokens). Each search ranks the run's tools by keyword match over
name, description and parameter names (BM25, offline and deterministic) and returns the best
`max_results`; from the next model call on, those tools are offered with their full definitions,
and they stay offered for the rest of the run, the most recently found `threshold` of them.

What is offered is derived from the request's messages, that is the session's log: the results of
``search_tools`` calls, and the tools the model called. A resumed run (after a crash, or
``agent.run(None)``) offers the tools its stored log found, not what a process remembered.

A model may call a tool it was not offered but that exists (a name from the catalogue): the call
runs, validated against the tool's schema as any other, and the tool is offered from then on.
At or below the threshold the provider adds nothing: no tool, no instructions, no middleware.

Each call's trace says tool search was active (a ``tool_search`` change: how many tools were
offered out of how many, and which were found) and lists the tools that call was offered.

>>> ToolSearch(threshold=30, max_results=8).source_id
'tool-search'
>>> [name for name, _ in rank(_index([ToolSpec("github_create_issue", "Open an issue.", {}),
...                                    ToolSpec("calendar_list_events", "List events.", {})]), "new issue", 5)]
['github_create_issue']
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

from .._tool_spec import ToolSpec
from ..errors import UsageError
from ..messages import Message
from ..trace import ContextChange
from .base import ContextProvider

if TYPE_CHECKING:
    from ..models.base import CallModel, ModelRequest, ModelResponse
    from ..pipeline import RunContext
    from ..tools import Tool

__all__ = ["SEARCH_TOOL", "ToolSearch", "found_tools", "rank"]

SEARCH_TOOL: Final = "search_tools"
"""The name of the tool the model searches with."""

_WORD: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _words(text: str) -> list[str]:
    """Lower-case words of `text`, split at ``_``, ``-``, ``.``, spaces and camelCase; a plural ``s`` dropped."""
    out = []
    for w in _WORD.findall(text):
        w = w.lower()
        out.append(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


@dataclass(frozen=True, slots=True)
class _Index:
    """The words of each tool (its name counted twice), for BM25."""

    names: tuple[str, ...]
    words: tuple[Counter[str], ...]
    lengths: tuple[int, ...]
    df: Counter[str]


def _index(specs: Iterable[ToolSpec]) -> _Index:
    names, words = [], []
    for spec in specs:
        props = spec.parameters.get("properties", {}) if isinstance(spec.parameters, dict) else {}
        tokens = _words(spec.name) * 2 + _words(spec.description) + [w for p in props for w in _words(str(p))]
        names.append(spec.name)
        words.append(Counter(tokens))
    df: Counter[str] = Counter(w for c in words for w in c)
    return _Index(tuple(names), tuple(words), tuple(sum(c.values()) for c in words), df)


def rank(index: _Index, query: str, limit: int) -> list[tuple[str, float]]:
    """Return the best `limit` tools for `query` by BM25 (k1 1.2, b 0.75), best first; ties by name; no zero scores."""
    terms = set(_words(query))
    n = len(index.names)
    if not terms or not n:
        return []
    average = sum(index.lengths) / n or 1.0
    scored = []
    for name, counts, length in zip(index.names, index.words, index.lengths, strict=True):
        score = 0.0
        for term in terms:
            if tf := counts.get(term, 0):
                idf = math.log(1 + (n - index.df[term] + 0.5) / (index.df[term] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / average))
        if score > 0:
            scored.append((name, score))
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored[:limit]


def found_tools(messages: Iterable[Message], known: Mapping[str, object], seen: set[str],
                found: dict[str, None]) -> None:
    """Add to `found` (oldest first) the tools `messages` show found: named by a search's result, or called.

    `seen` holds the call ids already read (each call counts once, where it first appears); names
    not in `known` (the run's tools) are left out.
    """
    searches: set[str] = set()
    for message in messages:
        for call in message.function_calls:
            if call.call_id in seen:
                continue
            if call.name == SEARCH_TOOL:
                searches.add(call.call_id)
                continue
            seen.add(call.call_id)
            if call.name in known:
                found.pop(call.name, None)
                found[call.name] = None
        for result in message.function_results:
            if result.call_id in searches and result.call_id not in seen:
                seen.add(result.call_id)
                for name in reversed(_result_names(result.result)):  # the best hit is the latest found
                    if name in known:
                        found.pop(name, None)
                        found[name] = None


def _result_names(text: str) -> list[str]:
    """Return the tool names a ``search_tools`` result lists (none for an error or text in another form)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, list):
        return []
    return [t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]


def _summary(description: str, width: int = 80) -> str:
    """Return the first line or sentence of a description, at most `width` characters."""
    line = description.strip().split("\n", 1)[0]
    line = re.split(r"(?<=[.!?])\s", line, maxsplit=1)[0]
    return line if len(line) <= width else line[:width - 1].rstrip() + "…"


@dataclass(slots=True)
class _Offer:
    """One run's tool search: what its log found so far, and the middleware that offers it."""

    search: ToolSearch
    ctx: RunContext
    seen: set[str] = field(default_factory=set)
    found: dict[str, None] = field(default_factory=dict)
    index: _Index | None = None
    active: bool = False
    """Whether it picks the tools offered (the run defers them); until then the calls pass through."""
    spec_tokens: dict[str, int] = field(default_factory=dict)
    """Each tool definition's tokens, counted once per run (a budget asks several times)."""
    place: int | None = None
    """Where among the run's instructions the catalogue goes: where they ended when `ToolSearch` ran."""

    def search_tools(self, query: str) -> str:
        """Search the tools you can use by keywords; the tools found are offered to you from your next step on.

        Args:
            query: What you want to do, in a few words (for example "create github issue").
        """
        tools = {n: t for n, t in self.ctx.tools.items() if n != SEARCH_TOOL}
        if self.index is None or len(self.index.names) != len(tools):
            self.index = _index(t.spec for t in tools.values())
        hits = rank(self.index, query, self.search.max_results)
        if not hits:
            return json.dumps({"tools": [], "note": "No tool matched; try other words (see the catalogue)."})
        return json.dumps({"tools": [{"name": n, "description": _summary(tools[n].description, 200)}
                                     for n, _ in hits],
                           "note": "These tools are offered to you from your next step on."}, ensure_ascii=False)

    async def __call__(self, request: ModelRequest, call_next: CallModel) -> ModelResponse:
        if not self.active or not request.tools:  # not deferred, or a call at a limit: the tools were withdrawn
            return await call_next(request)
        specs = {s.name: s for s in request.tools}
        found_tools(request.messages, specs, self.seen, self.found)
        keep = list(self.found)[-self.search.threshold:]
        offered = {SEARCH_TOOL, *keep}
        tools = [s for s in request.tools if s.name in offered]  # in the run's own order: a stable prefix
        self.ctx.journal.changes.append(ContextChange(
            self.search.source_id, "tool_search", (f"offered {len(tools)} of {len(request.tools)} tools",
                                                   *(f"found {n}" for n in keep))))
        return await call_next(replace(request, tools=tools))


class ToolSearch(ContextProvider):
    """Offers a ``search_tools`` tool and a catalogue instead of every tool, above `threshold` tools.

    `max_results` tools are returned per search (at most `threshold`); `catalogue_tokens` bounds the
    catalogue added to the instructions (names with one-line summaries, as many as fit, counted with
    the run's token counter). Put it after the providers that add tools (`McpTools`): the count and
    the catalogue are of the tools offered when it runs.
    """

    kind = "tools"

    def __init__(self, threshold: int = 30, max_results: int = 8, *, catalogue_tokens: int = 2_000,
                 source_id: str = "tool-search") -> None:
        super().__init__(source_id)
        if threshold < 1 or not 1 <= max_results <= threshold:
            raise UsageError(f"ToolSearch needs threshold >= 1 and 1 <= max_results <= threshold, got "
                             f"threshold={threshold}, max_results={max_results}")
        if catalogue_tokens < 0:
            raise UsageError(f"ToolSearch needs catalogue_tokens >= 0, got {catalogue_tokens}")
        self.threshold = threshold
        """Above this many tools in a run, the model searches for them."""
        self.max_results = max_results
        """Tools a search returns at most."""
        self.catalogue_tokens = catalogue_tokens
        """Tokens the catalogue in the instructions may take at most (0: no catalogue)."""

    async def before_run(self, ctx: RunContext) -> None:
        """Add the middleware that picks the tools offered; above the threshold, ``search_tools`` and the catalogue.

        The middleware is added on every run, at this provider's place among the others' (a
        `contextpipe.budget.ContextBudget` may defer the tools later): it passes the calls
        through untouched until the tools are deferred.
        """
        offer = _Offer(self, ctx, place=len(ctx.instruction_sources))
        ctx.add_middleware(offer)
        if len(ctx.tools) > self.threshold:
            self._defer(ctx, offer)

    def _defer(self, ctx: RunContext, offer: _Offer) -> None:
        from ..tools import Tool  # here: a run at or below the threshold loads nothing more

        counter = ctx.tokens

        def count(text: str | None) -> int:  # calibrated, as the trace and a budget count
            return counter.scale(counter.text(text))

        catalogue = self.catalogue(ctx.tools, count)
        ctx.add_tools([Tool(offer.search_tools, name=SEARCH_TOOL, idempotent=True, run_in_thread=False)])
        ctx.add_instructions(catalogue, at=offer.place)  # at its place, whoever defers: a stable prefix
        offer.active = True

    budget_share = "tools"
    """With a `contextpipe.budget.ContextBudget`, this provider is the tools' rule: it defers the definitions."""

    def budget_tokens(self, ctx: RunContext) -> int:
        """Tokens of the tool definitions the first call is offered (with the catalogue, once deferred)."""
        from ..budget import contributed_tokens

        tools, counter, offer = ctx.tools, ctx.tokens, self._offer(ctx)
        if offer.active:
            found: dict[str, None] = {}
            found_tools((m for s in ctx.segments for m in s.messages), tools, set(), found)  # (untagged: no copies)
            tools = {n: tools[n] for n in [SEARCH_TOOL, *list(found)[-self.threshold:]]}
        counts = offer.spec_tokens
        for name in tools.keys() - counts.keys():
            counts[name] = counter.scale(counter.tools([tools[name].spec]))
        return contributed_tokens(ctx, [self.source_id]) + sum(counts[n] for n in tools)

    async def fit_budget(self, ctx: RunContext, allowance: int) -> None:
        """Defer the definitions behind ``search_tools`` when they need more than `allowance` tokens.

        The catalogue is the one `catalogue_tokens` bounds, whatever the allowance: the same in every
        run, so the prompt's prefix stays the same (the budget decides against the tools' own share).
        """
        offer = self._offer(ctx)
        if not offer.active and self.budget_tokens(ctx) > allowance:
            self._defer(ctx, offer)

    def _offer(self, ctx: RunContext) -> _Offer:
        """Return this run's `_Offer`, the middleware its `before_run` added."""
        return next(m for m in ctx.middleware if isinstance(m, _Offer) and m.search is self)

    def catalogue(self, tools: Mapping[str, Tool], count: Callable[[str | None], int]) -> str:
        """Return the instructions that tell the model to search, with a catalogue of the tools that fits.

        ``name: summary`` lines when all of them fit in `catalogue_tokens`; otherwise the names alone,
        as many as fit (with how many more there are), so the model knows what to search for.
        """
        head = (f"You have {len(tools)} tools; their definitions are not shown until you find them. Call "
                f"{SEARCH_TOOL} with a few words of what you need: the tools it returns can be called from your "
                "next step on.")
        budget = self.catalogue_tokens - count(head)
        lines = [f"- {n}: {_summary(t.description)}" if t.description else f"- {n}" for n, t in tools.items()]
        full = _fitting(lines, "\n", budget, count)
        if len(full) == len(lines):
            return f"{head}\nTools:\n" + "\n".join(full)
        names = _fitting(list(tools), ", ", budget - 20, count)  # 20: room for the line saying how many more
        if not names:
            return head
        rest = f" (and {len(tools) - len(names)} more: search to find them)" if len(names) < len(tools) else ""
        return f"{head}\nTool names: " + ", ".join(names) + rest


def _fitting(items: list[str], separator: str, budget: int, count: Callable[[str | None], int]) -> list[str]:
    """Return the leading `items` whose text, joined by `separator`, fits in `budget` tokens (counted per piece)."""
    cost, joint = 0, count(separator)
    for taken, item in enumerate(items):
        cost += count(item) + (joint if taken else 0)
        if cost > budget:
            return items[:taken]
    return items

