"""`SemanticMemory`: recall of earlier conversations (the seeds' ChatHistoryMemoryProvider).

Who said what, and when: each stored turn keeps its author's name, its session and its time, and the
name is part of what is searched and of the line the model is shown. Recall is hybrid by default —
the store's keyword index and its vectors, fused — and each turn is keyword-indexed together with the
two turns before it and the two after it, and shown with its neighbours, so an answer that only makes
sense with its question is found and read whole.

It recalls before every run, or (``mode="tool"``) offers the model a ``search_memory`` tool to
search with a query of its own, a time range and a speaker, or both.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..budget import RankedItems, ranked_message
from ..errors import UsageError
from ..exchanges import is_late_result
from ..messages import INPUT, Message, Source
from ..session import REWINDS_KEY, USER_NAME_KEY, Session, user_id
from ..tools import Tool, ToolOutcome
from ..vectors.base import (
    EMBEDDER_KEY,
    Embedder,
    SearchHit,
    VectorRecord,
    VectorStore,
    check_embedder,
    delete_user,
    embed_queries,
    embed_query,
    keyword_terms,
)
from .base import ContextProvider, MessageFilter, external_input
from .search import ToolMode, check_mode, search_tool

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome

__all__ = ["SemanticMemory"]

Scope = Literal["tenant", "user", "agent", "session"]
SearchMode = Literal["hybrid", "vector", "keywords"]

_CONTEXT_CHARS = 600  # how much of the neighbouring turn a memory keeps
_NAME_RE = re.compile(r"(?<![.?!:]\s)(?<!^)\b[A-Z][\w-]+(?:\s+[A-Z][\w-]+)*(?:'s)?", re.UNICODE)


def without_names(query: str) -> str:
    """`query` without its capitalised names (a sentence's first word stays).

    >>> without_names("What did Maya make in the pottery class with Rosa's help?")
    'What did make in the pottery class with help?'
    """
    return " ".join(_NAME_RE.sub(" ", query).split())


_ASCII_WORD = re.compile(r"[^\s]*[A-Za-z0-9][^\s]*")  # (a run of punctuation alone is no word)


def words_in(text: str) -> float:
    """Count the words of `text`; in scripts written without spaces (Chinese, Japanese, Thai …) two characters make one.

    >>> words_in("Forty-three! You'll roll home.")
    4
    >>> words_in("我昨天去了大阪看我哥哥")
    5.5
    >>> words_in("Well — fine. ...")
    2
    """
    if text.isascii():
        return len(_ASCII_WORD.findall(text))
    count: float = 0
    for word in text.split():
        unspaced = sum(1 for char in word if _unspaced(char))
        count += unspaced / 2 if unspaced * 2 > len(word) else any(char.isalnum() for char in word)
    return count


def _unspaced(char: str) -> bool:
    """Whether `char` is of a script whose words are not separated by spaces."""
    point = ord(char)
    return (0x0E00 <= point <= 0x0EFF or 0x1000 <= point <= 0x109F or 0x1780 <= point <= 0x17FF  # Thai, Lao, Myanmar,
            or 0x3040 <= point <= 0x30FF or 0x3400 <= point <= 0x4DBF or 0x4E00 <= point <= 0x9FFF  # Khmer; kana; CJK
            or 0xF900 <= point <= 0xFAFF or 0xFF66 <= point <= 0xFF9F or 0x20000 <= point <= 0x3134F)


async def _rewound_ids(ctx: RunContext) -> list[str]:
    """Return the ids of the run's session's rewound messages (in the run's store), for recall to leave out."""
    store = getattr(ctx.agent, "store", None)
    if ctx.session is None or store is None or not ctx.session.state.get(REWINDS_KEY):
        return []  # never rewound: nothing to look up
    from ..rewind import rewound_ids

    return await rewound_ids(store, ctx.session.tenant, ctx.session.id, state=ctx.session.state)


def _user_from_state(session: Session | None) -> str | None:
    return user_id(session)


def _user_name_from_state(session: Session | None) -> str | None:
    if session is None:
        return None
    value = session.state.get(USER_NAME_KEY)
    return str(value) if value is not None else None


_RECENT_LINES = 256
"""Lines whose vectors a `SemanticMemory` keeps for the turns it indexes again (a few per session at a time)."""


def _clip(text: str, limit: int = _CONTEXT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


class SemanticMemory(RankedItems, ContextProvider):
    """Stores each turn's messages and recalls the most relevant ones in later runs.

    After a successful run the turn's messages (by default user and assistant text) are stored with
    their author, session, time and scope (tenant, user, agent). The author is the message's
    `author_name`, else ``session.state["user_name"]`` for the user's messages (`user_name` says
    otherwise) and `agent_name` for the assistant's, else the role. Each memory is embedded as
    ``"<author>: <text>"`` and keyword-indexed together with the `window` turns before it and the
    `window_after` turns after it (a turn is indexed again when its reply arrives in the next run).

    Before a run the new input (and, with `query_messages`, the last few context messages) is
    searched among the memories in `scope` — by default ``user``, so recall works across all of a
    user's sessions — with `search` = ``"hybrid"`` (keywords and vectors fused, the default),
    ``"vector"`` or ``"keywords"``. The best `k` matches not already in the context are added as one
    message; each line says when and in which session it was said, by whom, what came just before and
    the reply.
    The user is ``session.state["user_id"]`` unless `user` says otherwise. With `names_lookup` (the
    default), a query naming people or places is also embedded without the names, and the vector side
    searches with the mean of the two vectors (every memory carries its author's name, so a name can
    otherwise outweigh what is asked about; the keyword side searches the question as asked). Better
    recall (docs/recall.md) for a few milliseconds more per recall: both are embedded in one batch.

    Turns that say little ("Wow, Maya!", "How did it go?") share their neighbours' keywords, and often
    a name, so they crowd out the turns that hold answers. With `short_turn_words` (default 5) the
    store's first `candidates` matches are ranked again, each score times ``words / (words +
    short_turn_words)``: a five-word turn counts half, a twenty-word one 0.8; 0 turns this off. Better
    recall on every conversation measured (docs/recall.md). Of a short statement and a long reply about the
    same thing, the reply now tends to come first; its line shows the statement as what came just
    before.

    Each memory also records which model embedded it (`EMBEDDER_KEY`, the embedder's name): a
    collection holding another model's vectors is refused (`UsageError`) on first use, before
    anything is searched or stored, as the two models' similarities mean nothing to each other.

    The three message filters of the seeds choose what it reads and stores: `input_filter` the
    request messages the query is built from (default: the caller's input only), and
    `store_request_filter` and `store_response_filter` the turn's messages it stores (default: the
    caller's input, and every response message; of both, only those in `roles` with text are
    stored). A `store_request_filter` that leaves out the messages a user marked private keeps
    them out of memory for good; an `input_filter` that adds loaded history searches with the
    conversation so far.

    `mode` says when it recalls: ``"before_run"`` (the default) as above; ``"tool"`` instead offers
    the model a tool (`tool_name`, ``search_memory``) that searches the same memories with a query
    the model writes, optionally within a time range and by one speaker, each result with its
    message id and date; ``"both"`` does both. The tool searches everything stored in `scope`,
    turns that compaction has since summarised out of the context too: a turn is stored when its
    run ends, whatever later runs send the model. `input_filter` is refused in ``"tool"`` mode,
    where the model writes the query (in ``"both"`` it chooses what the before-run search uses).

    With `SQLiteStore.vectors()`, deleting or expiring a session also deletes its memories.
    """

    kind = "memory"
    budget_share = "memory"
    """The share of a `contextpipe.budget.ContextBudget` the recalled memories draw from."""

    def __init__(
        self,
        vectors: VectorStore,
        embedder: Embedder,
        *,
        collection: str = "memory",
        scope: Scope = "user",
        k: int = 5,
        min_score: float | None = None,
        roles: Sequence[str] = ("user", "assistant"),
        query_messages: int = 0,
        agent_name: str | None = None,
        user: Callable[[Session | None], str | None] = _user_from_state,
        user_name: Callable[[Session | None], str | None] = _user_name_from_state,
        search: SearchMode = "hybrid",
        window: int = 2,
        window_after: int = 2,
        names_lookup: bool = True,
        short_turn_words: float = 5,
        mode: ToolMode = "before_run",
        tool_name: str = "search_memory",
        source_id: str = "memory",
        input_filter: MessageFilter | None = None,
        store_request_filter: MessageFilter | None = None,
        store_response_filter: MessageFilter | None = None,
    ) -> None:
        super().__init__(source_id, input_filter=input_filter, store_request_filter=store_request_filter,
                         store_response_filter=store_response_filter)
        if scope not in ("tenant", "user", "agent", "session"):
            raise UsageError(f"scope must be 'tenant', 'user', 'agent' or 'session', got {scope!r}")
        if search not in ("hybrid", "vector", "keywords"):
            raise UsageError(f"search must be 'hybrid', 'vector' or 'keywords', got {search!r}")
        if window < 0 or window_after < 0:
            raise UsageError(f"window and window_after must be 0 or more turns, got {window}, {window_after}")
        if not 0 <= short_turn_words < math.inf:
            raise UsageError(f"short_turn_words must be 0 (off) or a number of words, got {short_turn_words}")
        check_mode("SemanticMemory", mode, input_filter)
        self.vectors = vectors
        self.embedder = embedder
        self.collection = collection
        self.scope = scope
        self.k = k
        self.min_score = min_score
        self.roles = tuple(roles)
        self.query_messages = query_messages
        self.agent_name = agent_name
        self.user = user
        self.user_name = user_name
        self.search_mode: SearchMode = search
        self.window = window
        self.window_after = window_after
        self.names_lookup = names_lookup
        self.short_turn_words = short_turn_words
        self.mode: ToolMode = mode
        self.tool_name = tool_name
        self._recent: OrderedDict[str, list[float]] = OrderedDict()  # line -> vector, newest last
        self._checked = False  # whether the collection's vectors are known to be the embedder's

    def _where(self, session: Session | None) -> dict[str, Any] | None:
        if session is None:
            return None
        where: dict[str, Any] = {"tenant": session.tenant}
        if self.scope == "user":
            user = self.user(session)
            if user is None:
                where["session_id"] = session.id  # no user known: this session only
            else:
                where["user_id"] = user
        elif self.scope == "agent":
            where["agent"] = self.agent_name
        elif self.scope == "session":
            where["session_id"] = session.id
        return where

    def author(self, message: Message, session: Session | None) -> str:
        """Return the name a memory of `message` is stored and shown under."""
        if message.author_name:
            return message.author_name
        name = None
        if is_late_result(message):
            return "tool"
        if message.role == "user":
            name = self.user_name(session)
        elif message.role == "assistant":
            name = self.agent_name
        return name or message.role

    async def recall(self, query: str, session: Session | None, *, k: int | None = None,
                     exclude: Sequence[str] = (), since: datetime | None = None, until: datetime | None = None,
                     speaker: str | None = None) -> list[SearchHit]:
        """Return the memories in `session`'s scope that best match `query` (ids in `exclude` left out).

        Each hit's `score` is the store's (cosine, keyword or fused score) times the short-turn weight
        (`weighted`); `vector_score` and `keyword_score` keep each side's own. `min_score` applies to
        the vector side's cosine, before the weight (keyword matches are not held to it). `exclude`
        is left out before anything is ranked, so it changes nothing about the other memories.

        `since` (inclusive) and `until` (exclusive) keep the memories said in that time (a naive
        datetime is UTC); `speaker` those whose author or role it is (case ignored). They are the
        `k` best of the memories that pass, however far down the whole ranking those are (in a
        ``"hybrid"`` search, of the two rankings fused as deep as that takes; a fusion's order
        depends a little on its depth, as fused scores are each ranking's scores normalised).
        """
        where = self._where(session)
        if where is None or not query.strip():
            return []
        await self._check_embedder()
        want = self.k if k is None else k
        keep = _kept(since, until, speaker)
        # With short turns ranked down, the first `candidates` matches are ranked again, whatever `k`,
        # so that a smaller `k` gives the first of the same memories.
        ranked = max(want, self.vectors.candidates) if self.short_turn_words or keep else want
        # The query is embedded while the store's keyword side searches (hybrid); a task, as a filtered
        # search may ask the store again with it.
        vector = None if self.search_mode == "keywords" else asyncio.ensure_future(self._query_vector(query))
        try:
            hits = await self._ranking(query, vector, where, ranked, want, keep, exclude)
        finally:
            if vector is not None and not vector.done():
                vector.cancel()
        if self.short_turn_words:
            hits = sorted((replace(h, score=self.weighted(h.score, h.text)) for h in hits), key=lambda h: -h.score)
        return hits[:want]

    async def _ranking(self, query: str, vector: Awaitable[list[float]] | None, where: dict[str, Any], ranked: int,
                       want: int, keep: Callable[[Mapping[str, Any]], bool] | None,
                       exclude: Sequence[str]) -> list[SearchHit]:
        """Return the store's first `ranked` matches; with `keep`, those that pass, at least `want` if there are.

        The store filters by equality only: a time range and a speaker (a name or a role) are applied
        to its ranking, asked again four times as deep until `want` memories pass or none is left to
        rank, so that no memory that passes is missed for ranking low.
        """
        text = None if self.search_mode == "vector" else query
        while True:
            hits = await self.vectors.search(self.collection, vector, k=ranked, where=where, min_score=self.min_score,
                                             text=text, exclude=exclude)
            if keep is None:
                return hits
            passed = [h for h in hits if keep(h.metadata)]
            if len(passed) >= want or len(hits) < ranked:
                return passed
            ranked *= 4

    def weighted(self, score: float, text: str) -> float:
        """Return the `score` of a memory of `text` times ``words / (words + short_turn_words)``.

        A negative score (a cosine) is divided by it instead, so that a shorter turn still ranks lower.
        """
        if not self.short_turn_words:
            return score
        words = words_in(text)
        weight = words / (words + self.short_turn_words)
        return score * weight if score >= 0 else score / max(weight, 1e-9)

    async def _query_vector(self, query: str) -> list[float]:
        """Embed the query (with `names_lookup`, it and the name-free query: the mean of the two)."""
        queries = self._queries(query)
        if len(queries) == 1:
            return await embed_query(self.embedder, query)
        both = np.asarray(await embed_queries(self.embedder, queries), dtype=np.float64)
        both /= np.maximum(np.linalg.norm(both, axis=1, keepdims=True), 1e-12)
        mean = both.mean(axis=0)
        return [float(v) for v in mean / max(float(np.linalg.norm(mean)), 1e-12)]

    def _queries(self, query: str) -> list[str]:
        """Return the query and (`names_lookup`) the query without its names, when that still asks something."""
        if self.names_lookup and (plain := without_names(query)) != query and keyword_terms(plain):
            return [query, plain]
        return [query]

    @staticmethod
    def format(hit: SearchHit, *, with_id: bool = False) -> str:
        """One memory as the model is shown it: when, which session (and message), who, and the turn before it."""
        meta = hit.metadata
        when = datetime.fromtimestamp(float(meta.get("created_at", 0)), tz=UTC).strftime("%Y-%m-%d %H:%M")
        author = meta.get("author") or meta.get("role")
        message = f", message {hit.id}" if with_id else ""
        line = f"- [{when} UTC, session {meta.get('session_id')}{message}] {author}: {hit.text}"
        before = meta.get("before")
        if before:
            line += f"\n  (just before, {before})"
        after = meta.get("after")
        if after:
            line += f"\n  (reply, {after})"
        return line

    async def before_run(self, ctx: RunContext) -> None:
        """Search the memories with what `input_filter` gives and add the best matches as one context message.

        The last `query_messages` context messages, when asked for, go into the query before it. In
        ``tool`` and ``both`` modes, offer the search tool (to a run with a session: it has the scope).
        """
        rewound = await _rewound_ids(ctx)  # a rewound turn is not recalled in its session
        if self.mode != "before_run" and ctx.session is not None:
            ctx.add_tools([self._tool(ctx.session, rewound)])
            ctx.add_instructions(f"Use {self.tool_name} to search earlier conversations, turns no longer in "
                                 "this one included, by what was said, when and by whom; each result gives "
                                 "its date and message id.")
        if self.mode == "tool":
            return
        given = self.given_messages(ctx)
        recent: list[str] = []
        if self.query_messages:
            ids = {m.id for m in given}
            context = ctx.messages[:len(ctx.messages) - len(ctx.input)]
            recent = [m.text for m in context[-self.query_messages:] if m.text and m.id not in ids]
        query = "\n".join([*recent, *(m.text for m in given if m.text)])
        hits = await self.recall(query, ctx.session, exclude=[*(m.id for m in ctx.messages), *rewound])
        if hits:  # (ranked: a budget drops the lowest-scored memories first)
            ctx.add_messages([ranked_message("Relevant memories from earlier conversations (may be outdated):\n",
                                             [(self.format(h), h.score) for h in hits], metadata={"memory": True})])

    def _tool(self, session: Session, rewound: Sequence[str] = ()) -> Tool:
        """Return the search tool of one run: the memories in `session`'s scope."""
        async def run(query: str, args: dict[str, Any]) -> str | ToolOutcome:
            speaker = args.get("speaker")
            try:
                since, until = _moment(args.get("start"), "start"), _moment(args.get("end"), "end")
                if speaker is not None and not isinstance(speaker, str):
                    raise ValueError(f"'speaker' must be a name or a role, got {speaker!r}")
            except ValueError as exc:
                return ToolOutcome(f"Error: {exc}", is_error=True)
            if since is not None and until is not None and until <= since:
                return ToolOutcome(f"Error: 'end' ({args['end']}) must come after 'start' ({args['start']}).",
                                   is_error=True)
            hits = await self.recall(query, session, since=since, until=until, speaker=speaker or None,
                                     exclude=rewound)
            if not hits:
                return "No memories match."
            return "\n".join(self.format(h, with_id=True) for h in hits)

        return search_tool(self.tool_name, "Search the memories of earlier conversations: what was said, when, "
                           "by whom. Best matches first.", run, options=_TOOL_OPTIONS)

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Store the turn's messages that pass the store filters (only when the run succeeded)."""
        session = ctx.session
        if outcome.error is not None or session is None:
            return
        request, response = self._messages_to_store(outcome)
        stored = {m.id for m in request}
        context = ctx.messages[:len(ctx.messages) - len(ctx.input)]
        earlier = [m for m in context if _role(m) in self.roles and m.text.strip() and not m.metadata.get("memory")
                   and (m.source is None or m.source.kind in ("history", "input", "model")) and m.id not in stored]
        reach = self.window + self.window_after
        before = self._kept_earlier(earlier[-reach:]) if reach else ()
        await self.remember([*request, *response], session, before=before)

    def _kept_earlier(self, earlier: Sequence[Message]) -> list[Message]:
        """Return the earlier turns the store filters let through when they were a run's own messages.

        A turn a filter kept out of memory comes back as loaded history in the session's next runs;
        `remember` indexes the turns just before the new ones again and puts their text in the new
        ones' windows, so the filters are asked again, each turn tagged as it was in its own run (the
        user's as the caller's input, the others as model output).
        """
        if self.store_request_filter is None and self.store_response_filter is None:
            return list(earlier)
        asked = [m.with_source(INPUT) for m in earlier if _role(m) == "user"]
        answered: Sequence[Message] = [m.with_source(Source("model")) for m in earlier if _role(m) != "user"]
        if self.store_response_filter is not None:
            answered = self.store_response_filter(answered)
        kept = {m.id for m in (self.store_request_filter or external_input)(asked)} | {m.id for m in answered}
        return [m for m in earlier if m.id in kept]

    async def remember(self, messages: Sequence[Message], session: Session, *,
                       before: Sequence[Message] = ()) -> int:
        """Store `messages` (those in `roles` with text) as memories of `session`; return how many.

        `before` are the turns that came just before the first one (for the context windows; the
        last `window_after` of them are indexed again with the new turns after them). Use it to import
        earlier conversations; `after_run` calls it for every successful run.
        """
        turns = [m for m in messages if _role(m) in self.roles and m.text.strip()]
        if not turns:
            return 0
        await self._check_embedder()
        named = [(m, self.author(m, session)) for m in [*before, *turns]]
        lines = [f"{name}: {m.text.strip()}" for m, name in named]
        first = len(before)
        user = self.user(session)
        # The new turns, and the turns before them whose keyword window now reaches into them.
        indexed = [*range(max(0, first - self.window_after), first), *range(first, len(lines))]
        vectors = await self._embed_lines([lines[at] for at in indexed])
        records = []
        for at, vector in zip(indexed, vectors, strict=True):
            m = named[at][0]
            window = lines[max(0, at - self.window):at]
            after = lines[at + 1:at + 1 + self.window_after]
            meta: dict[str, Any] = {
                "tenant": session.tenant, "session_id": session.id, "user_id": user, "agent": self.agent_name,
                "role": _role(m), "author": named[at][1], "created_at": m.created_at or time.time(),
                EMBEDDER_KEY: self.embedder.name}
            if window:
                meta["before"] = _clip(window[-1])
            if after:
                meta["after"] = _clip(after[0])
            records.append(VectorRecord(m.id, vector, m.text, meta, keywords="\n".join([*window, lines[at], *after])))
        await self.vectors.upsert(self.collection, records)
        return len(turns)

    async def _check_embedder(self) -> None:
        """Refuse (once it passed, no more checks) a collection whose vectors another model made."""
        if not self._checked:
            await check_embedder(self.vectors, self.collection, self.embedder)
            self._checked = True

    async def _embed_lines(self, lines: list[str]) -> list[list[float]]:
        """Embed `lines`, reusing the vectors of lines embedded lately.

        A turn is indexed again as the turns after it arrive (its keyword window grows, its text does
        not): its vector is taken from the last `_RECENT_LINES` lines embedded instead of being
        computed again. A line not found there is embedded (in one batch with the other new ones).
        """
        recent = self._recent
        known = {line: recent[line] for line in lines if line in recent}
        missing = list(dict.fromkeys(line for line in lines if line not in known))
        if missing:
            known.update(zip(missing, await self.embedder.embed(missing), strict=True))
        for line in lines:  # the newest last; the oldest beyond the bound are dropped
            recent[line] = known[line]
            recent.move_to_end(line)
        while len(recent) > _RECENT_LINES:
            recent.popitem(last=False)
        return [known[line] for line in lines]

    async def forget_user(self, tenant: str, user_id: str, session_ids: Sequence[str] = ()) -> int:
        """Delete the memories of `user_id` and of its sessions `session_ids`; return how many went.

        Used by `Agent.forget_user`. The embeddings kept in this process for reuse are dropped too.
        """
        self._recent.clear()
        return await delete_user(self.vectors, self.collection, tenant, user_id, session_ids)

    async def forget_session(self, tenant: str, session_id: str) -> int:
        """Delete the memories recorded for one session (for vector stores that do not cascade)."""
        return await self.vectors.delete(self.collection, where={"tenant": tenant, "session_id": session_id})


_TOOL_OPTIONS: dict[str, Any] = {
    "start": {"type": "string", "description": "Only what was said from this date or time on (ISO 8601, UTC "
              "unless it gives an offset): 2025-06-02 or 2025-06-02T09:00."},
    "end": {"type": "string", "description": "Only what was said before this date or time; a date alone "
            "includes that day."},
    "speaker": {"type": "string", "description": "Only what this speaker said: a name as results show it, or "
                "a role (user, assistant)."},
}


def _moment(value: object, name: str) -> datetime | None:
    """Parse the tool's `start` or `end` (ISO 8601; naive is UTC; an `end` date alone means the next midnight).

    The last day there is (9999-12-31) as an `end` date has no next midnight: the range has no end.
    """
    if value is None or value == "":
        return None
    text = value.strip() if isinstance(value, str) else ""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"'{name}' must be a date or time in ISO 8601 (2025-06-02 or 2025-06-02T09:00), "
                             f"got {value!r}") from None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
    if name != "end":
        return moment
    return moment + timedelta(days=1) if day < date.max else None  # an end date alone: all of that day


def _kept(since: datetime | None, until: datetime | None,
          speaker: str | None) -> Callable[[Mapping[str, Any]], bool] | None:
    """Return whether a memory's metadata passes the time range and speaker (None: no filter)."""
    if since is None and until is None and speaker is None:
        return None
    start = since.replace(tzinfo=since.tzinfo or UTC).timestamp() if since is not None else -math.inf
    end = until.replace(tzinfo=until.tzinfo or UTC).timestamp() if until is not None else math.inf
    who = speaker.casefold() if speaker is not None else None

    def keep(meta: Mapping[str, Any]) -> bool:
        when = float(meta.get("created_at", 0))
        return start <= when < end and (who is None or who in (str(meta.get("author", "")).casefold(),
                                                               str(meta.get("role", "")).casefold()))

    return keep


def _role(message: Message) -> str:
    """Return the role `roles` selects by: a tool's late result has the ``user`` role but is the tool's words."""
    return "tool" if is_late_result(message) else message.role
