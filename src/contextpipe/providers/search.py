"""`TextSearch`: retrieval-augmented generation over any async search function (the seeds' TextSearchProvider).

Also the home of search as a tool, for every provider that offers one (`TextSearch`, `SemanticMemory`):
`check_mode` checks a provider's ``mode`` and `search_tool` makes the tool the model searches with.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..budget import RankedItems, ranked_message
from ..errors import UsageError
from ..messages import Message
from ..tools import Tool, ToolOutcome
from ..vectors.base import Embedder, VectorStore, Where, check_embedder, embed_query
from .base import ContextProvider, MessageFilter

if TYPE_CHECKING:
    from ..pipeline import RunContext

__all__ = ["SearchResult", "TextSearch"]

ToolMode = Literal["before_run", "tool", "both"]
"""When a search provider searches: before every run (with the input), when the model calls its tool, or both."""


@dataclass(frozen=True)
class SearchResult:
    """One retrieved passage and where it comes from (for the citation)."""

    text: str
    source: str
    """The source's name (a file, a page title)."""
    link: str | None = None
    score: float | None = None


SearchFunction = Callable[[str], Awaitable[Sequence[SearchResult]]]


def check_mode(provider: str, mode: str, input_filter: MessageFilter | None,
               modes: Sequence[ToolMode] = ("before_run", "tool", "both")) -> None:
    """Refuse a `mode` not in `modes`, and an `input_filter` in ``tool`` mode (the model writes the query)."""
    if mode not in modes:
        raise UsageError(f"mode must be {' or '.join(repr(m) for m in modes)}, got {mode!r}")
    if mode == "tool" and input_filter is not None:
        others = " or ".join(repr(m) for m in modes if m != "tool")
        raise UsageError(f"{provider}(mode='tool') takes no input_filter: the model writes the query; "
                         f"use mode={others} to search with the filtered request messages")


def search_tool(name: str, description: str, search: Callable[[str, dict[str, Any]], Awaitable[str | ToolOutcome]],
                *, options: dict[str, Any] | None = None) -> Tool:
    """Return the tool a model searches with: a required, non-empty ``query`` and the optional `options`.

    `options` are more JSON-schema properties (filters); `search` gets the query and all the
    arguments, and checks the options itself. The tool is idempotent: a search changes nothing.
    """
    async def run(args: dict[str, Any]) -> str | ToolOutcome:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return ToolOutcome("Error: 'query' must be a non-empty string.", is_error=True)
        return await search(query, args)

    return Tool.from_schema(name, description, {
        "type": "object", "properties": {"query": {"type": "string", "description": "What to look for."},
                                         **(options or {})},
        "required": ["query"], "additionalProperties": False}, run, idempotent=True)


def format_results(results: Sequence[SearchResult]) -> str:
    """Format the results for citation: ``[1] text (source: name, link)``."""
    return "\n\n".join(_cited(n, r) for n, r in enumerate(results, 1))


def _cited(n: int, result: SearchResult) -> str:
    where = result.source + (f", {result.link}" if result.link else "")
    return f"[{n}] {result.text}\n(source: {where})"


class TextSearch(RankedItems, ContextProvider):
    """Searches with `search` and gives the model the results, with citations.

    ``mode="before_run"`` searches with the new input (plus the last `recent_messages` messages)
    before every run and adds the results as one context message; ``mode="tool"`` instead offers a
    search tool the model calls when it needs to. `from_vector_store` adapts a `VectorStore` of
    documents (see `contextpipe.vectors.ingest_folder`).

    `input_filter` chooses the request messages the query is built from (default: the caller's
    input only, as in the seeds); it is refused in ``tool`` mode, where the model writes the query.
    There are no store filters: a search provider stores nothing.
    """

    kind = "search"
    budget_share = "search"
    """The share of a `contextpipe.budget.ContextBudget` the search results draw from."""

    def __init__(
        self,
        search: SearchFunction,
        *,
        mode: Literal["before_run", "tool"] = "before_run",
        recent_messages: int = 0,
        tool_name: str = "search_documents",
        tool_description: str = "Search the documents for passages about a query; cite results as [n].",
        source_id: str = "search",
        input_filter: MessageFilter | None = None,
    ) -> None:
        super().__init__(source_id, input_filter=input_filter)
        check_mode("TextSearch", mode, input_filter, ("before_run", "tool"))
        self.search = search
        self.mode = mode
        self.recent_messages = recent_messages
        self.tool_name = tool_name
        self.tool_description = tool_description

    @classmethod
    def from_vector_store(cls, vectors: VectorStore, embedder: Embedder, *, collection: str = "documents",
                          k: int = 4, where: Where | None = None, min_score: float | None = None,
                          search: Literal["hybrid", "vector", "keywords"] = "hybrid", **options: Any) -> TextSearch:
        """Search a collection of document chunks (metadata ``source`` and optional ``link``).

        `search`: ``"hybrid"`` (the store's keyword index and vectors, fused; the default),
        ``"vector"`` or ``"keywords"``; `min_score` applies to the vector similarity. The first vector
        or hybrid search refuses (`UsageError`) a collection that another model than `embedder`
        embedded (`check_embedder`).
        """
        if search not in ("hybrid", "vector", "keywords"):
            raise UsageError(f"search must be 'hybrid', 'vector' or 'keywords', got {search!r}")
        mode = search
        checked = False  # whether the collection's vectors are known to be the embedder's

        async def search_fn(query: str) -> list[SearchResult]:
            nonlocal checked
            if not checked and mode != "keywords":
                await check_embedder(vectors, collection, embedder)
                checked = True
            vector = None if mode == "keywords" else embed_query(embedder, query)  # keywords search meanwhile
            hits = await vectors.search(collection, vector, k=k, where=where, min_score=min_score,
                                        text=None if mode == "vector" else query)
            return [SearchResult(h.text, str(h.metadata.get("source", h.id)), h.metadata.get("link"), h.score)
                    for h in hits]

        return cls(search_fn, **options)

    async def before_run(self, ctx: RunContext) -> None:
        """Search and add the results (``before_run`` mode), or offer the search tool (``tool`` mode).

        The query is what `input_filter` gives, after the last `recent_messages` context messages.
        """
        if self.mode == "tool":
            ctx.add_tools([self._tool()])
            ctx.add_instructions(f"Use {self.tool_name} to look things up in the documents, and cite the "
                                 "results you use as [n] with their source.")
            return
        given = self.given_messages(ctx)
        recent: list[Message] = []
        if self.recent_messages:
            ids = {m.id for m in given}
            context = ctx.messages[:len(ctx.messages) - len(ctx.input)]
            recent = [m for m in context[-self.recent_messages:] if m.id not in ids]
        query = "\n".join(m.text for m in [*recent, *given] if m.text)
        if not query.strip():
            return
        results = await self.search(query)
        if results:  # (ranked: a budget drops the lowest-scored chunks first, the kept keep their numbers)
            ctx.add_messages([ranked_message(
                "Search results (cite them as [n] with their source when you use them):\n\n",
                [(_cited(n, r), r.score) for n, r in enumerate(results, 1)], separator="\n\n",
                metadata={"search": True})])

    def _tool(self) -> Tool:
        async def run(query: str, args: dict[str, Any]) -> str:
            results = await self.search(query)
            return format_results(results) if results else "No results."

        return search_tool(self.tool_name, self.tool_description, run)
