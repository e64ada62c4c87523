"""`FactMemory`: durable facts and preferences about a user, extracted by a model after each turn.

It plays the role of the seeds' Mem0Provider / FoundryMemoryProvider, on contextpipe's own stores.
Every fact keeps its history: an update ends the version it replaces and starts a new one (nothing
is deleted), each version knows when it was true and the messages it came from (`Fact`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeGuard

from ..budget import contributed_tokens, fit_listed
from ..exchanges import is_late_result
from ..messages import Message
from ..models.base import ChatModel, ModelRequest
from ..session import ProviderState, Session, user_id
from ..vectors.base import (
    EMBEDDER_KEY,
    Embedder,
    SearchHit,
    VectorRecord,
    VectorStore,
    Where,
    check_embedder,
    delete_user,
    embed_query,
)
from ._fact_records import Fact, seconds, user_facts
from .base import ContextProvider, MessageFilter

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome
    from ._facts_state import _Pending, _Turn

__all__ = ["DEFAULT_EXTRACTION_PROMPT", "Fact", "FactMemory"]

logger = logging.getLogger("contextpipe.facts")

DEFAULT_EXTRACTION_PROMPT = """You maintain a list of durable facts about a user: preferences, personal details,
plans, constraints. You are given the facts already known (with ids) and new conversation turns. Reply with JSON only:
{"add": ["new fact", ...], "update": [{"id": "...", "text": "corrected fact"}], "delete": ["id", ...]}
- Add only facts that will still matter in later conversations; write each as a short sentence about the user.
- If a turn contradicts a known fact, update that fact to the latest information (or delete it).
- Never add a fact that is already known. Reply {"add": [], "update": [], "delete": []} when nothing changes."""


class FactMemory(ContextProvider):
    """Extracts facts with `model` after each successful run and recalls the relevant ones before each run.

    Facts are stored per user (``session.state["user_id"]`` unless `user` says otherwise) in
    `vectors`; before a run the `k` facts most relevant to the input that are true now are added to
    the instructions. Extraction merges with what is known: new facts are added, contradicted ones
    updated or ended, duplicates skipped. An update ends the version it replaces and starts a new
    one, nothing is deleted: each version (`Fact`) records when it became true and when it stopped
    (on `clock`, seconds since the epoch), and the ids of the messages it came from; `recall` finds
    what was true at any time (``as_of=``), `history` every version.

    A turn waits in the session's state until its extraction has written its facts, so no turn is
    lost: if extraction fails, the session's next run (in any process) extracts it again with its
    own turn. With `background=True` extraction does not delay the run's result; call `drain()` to
    wait for it.

    The seeds' three message filters choose what it reads: `input_filter` the request messages the
    facts are looked up with (default: the caller's input only), `store_request_filter` and
    `store_response_filter` the turn's messages it extracts facts from (default: the caller's
    input, and every response message; of both, the user's and the assistant's messages with text).
    """

    kind = "memory"
    budget_share = "memory"
    """The share of a `contextpipe.budget.ContextBudget` the facts draw from."""

    def __init__(
        self,
        model: ChatModel,
        vectors: VectorStore,
        embedder: Embedder,
        *,
        collection: str = "facts",
        k: int = 10,
        background: bool = False,
        prompt: str = DEFAULT_EXTRACTION_PROMPT,
        user: Callable[[Session | None], str | None] = user_id,
        clock: Callable[[], float] = time.time,
        source_id: str = "facts",
        input_filter: MessageFilter | None = None,
        store_request_filter: MessageFilter | None = None,
        store_response_filter: MessageFilter | None = None,
    ) -> None:
        super().__init__(source_id, input_filter=input_filter, store_request_filter=store_request_filter,
                         store_response_filter=store_response_filter)
        self.model = model
        self.vectors = vectors
        self.embedder = embedder
        self.collection = collection
        self.k = k
        self.background = background
        self.prompt = prompt
        self.user = user
        self.clock = clock
        """When a turn is taken, and so when the facts learned from it became true (seconds since the epoch)."""
        from ._facts_state import _Pending  # pydantic is loaded once a FactMemory is made

        self.pending = ProviderState(f"{source_id}.pending", _Pending)  # its key is checked by the agent
        self._running: dict[str, asyncio.Task[None]] = {}  # background extractions, by batch
        self._extracted: set[str] = set()  # batches extracted here whose turns a session still holds
        self._writing: dict[tuple[Any, ...], tuple[asyncio.Lock, int]] = {}  # per user: a lock, and who holds or waits
        self._checked = False  # whether the collection's vectors are known to be the embedder's

    def _scope(self, session: Session | None) -> dict[str, Any] | None:
        user = self.user(session)
        if session is None or user is None:
            return None
        return {"tenant": session.tenant, "user_id": user}

    async def recall(self, session: Session, query: str | None = None, *, k: int | None = None,
                     as_of: float | datetime | None = None) -> list[Fact]:
        """Return the user's facts true now (or at `as_of`), the most relevant to `query` first."""
        where = self._scope(session)
        if where is None:
            return []
        hits = await self._search(where, query, k or self.k, None if as_of is None else seconds(as_of))
        return [Fact.from_hit(h) for h in hits]

    async def facts(self, session: Session, query: str | None = None, *, k: int | None = None,
                    as_of: float | datetime | None = None) -> list[tuple[str, str]]:
        """Return ``(id, text)`` of the user's facts true now (or at `as_of`), the most relevant to `query` first."""
        return [(f.id, f.text) for f in await self.recall(session, query, k=k, as_of=as_of)]

    async def history(self, session: Session, fact_id: str | None = None) -> list[list[Fact]]:
        """Return every version of each of the user's facts, oldest first (with `fact_id`, of that fact only).

        `fact_id` may be the id of any of the fact's versions. Needs a vector store that lists its
        records (`VectorStore.records`; the built-in ones do).
        """
        where = self._scope(session)
        if where is None:
            return []
        found = await user_facts(self.vectors, self.collection, where)
        return found if fact_id is None else [h for h in found if any(f.id == fact_id for f in h)]

    async def _search(self, where: Where, query: str | None, k: int, when: float | None) -> list[SearchHit]:
        """Return the records of the facts in `where` true now (`when` None) or at `when`, nearest to `query` first."""
        if not self._checked:
            await check_embedder(self.vectors, self.collection, self.embedder)
            self._checked = True
        if when is None:
            vector = await embed_query(self.embedder, query or "facts about the user")
            return await self.vectors.search(self.collection, vector, k=k, where={**where, "valid_to": None})
        # A time in the past: the versions true then are found among all of the user's versions.
        versions = await self.vectors.count(self.collection, where=where)
        if not versions:
            return []
        vector = await embed_query(self.embedder, query or "facts about the user")
        hits = await self.vectors.search(self.collection, vector, k=versions, where=where)
        return [h for h in hits if Fact.from_hit(h).true_at(when)][:k]

    async def before_run(self, ctx: RunContext) -> None:
        """Add the facts true now relevant to what `input_filter` gives (the new input) to the instructions."""
        session = ctx.session
        if session is None or self._scope(session) is None:
            return
        query = " ".join(m.text for m in self.given_messages(ctx) if m.text) or None
        known = await self.facts(session, query)
        if known:
            ctx.add_instructions("Known facts about the user (may be outdated):\n"
                                 + "\n".join(f"- {text}" for _, text in known))

    def budget_tokens(self, ctx: RunContext) -> int:
        """Tokens of the facts this provider added to the instructions."""
        return contributed_tokens(ctx, [self.source_id])

    async def fit_budget(self, ctx: RunContext, allowance: int) -> None:
        """Drop the least relevant facts (they are listed most relevant first) until they fit `allowance` tokens."""
        fit_listed(ctx, self.source_id, allowance)

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Extract facts from the turn's messages that pass the store filters, with the session's waiting turns."""
        session = ctx.session
        where = self._scope(session)
        if outcome.error is not None or session is None or where is None:
            return
        pending = self.pending.get(session)
        await self._forget_extracted(pending, where)
        self._take_turn(pending, outcome)
        batch = [t for t in pending.turns if t.batch not in self._running]  # (not those still being extracted)
        if not batch:
            return
        name = f"batch_{os.urandom(8).hex()}"
        for turn in batch:
            turn.batch = name  # saved with the session: a later run sees whether this extraction wrote its facts
        if self.background:
            self._running[name] = asyncio.create_task(self._extract_in_background(session.id, where, name, batch))
        elif await self._extract_or_log(session.id, where, name, batch):
            pending.turns = [t for t in pending.turns if t.batch != name]

    def _take_turn(self, pending: _Pending, outcome: RunOutcome) -> None:
        """Add the run's user and assistant messages with text (of those the store filters keep) as a waiting turn."""
        from ._facts_state import _Turn

        learned = [m for m in self.messages_to_learn(outcome)  # a late result is a tool's output: not learned
                   if m.role in ("user", "assistant") and m.text and not is_late_result(m)]
        if learned:
            pending.turns.append(_Turn(id=f"turn_{os.urandom(8).hex()}", at=self.clock(),
                                       text="\n".join(f"{m.role}: {m.text}" for m in learned),
                                       sources=[m.id for m in learned]))

    async def drain(self) -> None:
        """Wait for background extractions to finish."""
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)

    async def forget_user(self, tenant: str, user_id: str, session_ids: Sequence[str] = ()) -> int:
        """Delete every version of `user_id`'s facts (and any learned in `session_ids`); return how many went.

        Background extractions are waited for first, so none writes a fact afterwards (`Agent.forget_user`).
        """
        await self.drain()
        return await delete_user(self.vectors, self.collection, tenant, user_id, session_ids)

    async def _forget_extracted(self, pending: _Pending, where: Where) -> None:
        """Drop the waiting turns whose extraction (here, or in another process) has written their facts."""
        batches = {t.batch for t in pending.turns if t.batch is not None and t.batch not in self._running}
        done = {b for b in batches if b in self._extracted
                or await self.vectors.count(self.collection, where={**where, "batch": b})}
        if done:
            self._extracted -= done
            pending.turns = [t for t in pending.turns if t.batch not in done]

    async def _extract_in_background(self, session_id: str, where: Where, name: str, batch: list[_Turn]) -> None:
        try:
            if await self._extract_or_log(session_id, where, name, batch):
                self._extracted.add(name)
        finally:
            del self._running[name]

    async def _extract_or_log(self, session_id: str, where: Where, name: str, batch: list[_Turn]) -> bool:
        """Extract `batch`; return whether it was done (a failure is logged, and its turns wait in the session)."""
        try:
            await self._extract(session_id, where, name, batch)
        except Exception:
            logger.warning("%s: extracting facts from %d turn(s) of session %r failed; they wait in the session "
                           "for its next run", self.source_id, len(batch), session_id, exc_info=True)
            return False
        return True

    async def _extract(self, session_id: str, where: Where, name: str, batch: Sequence[_Turn]) -> None:
        """Extract `batch` once the user's extraction before it here is done, so it is shown what that one wrote.

        (Two at once would each end the version true now and start a successor of their own: two versions true.)
        """
        key = tuple(sorted(where.items()))
        lock, users = self._writing.get(key, (asyncio.Lock(), 0))
        self._writing[key] = (lock, users + 1)
        try:
            async with lock:
                await self._extract_now(session_id, where, name, batch)
        finally:
            lock, users = self._writing.pop(key)
            if users > 1:
                self._writing[key] = (lock, users - 1)

    async def _extract_now(self, session_id: str, where: Where, name: str, batch: Sequence[_Turn]) -> None:
        """Ask the model what `batch` changes in the facts true now, and write the versions that ends and starts."""
        turns = [t.text for t in batch]
        known = await self._search(where, "\n".join(turns), 30, None)
        request = ModelRequest([Message.user(
            "Known facts:\n" + ("\n".join(f"[{h.id}] {h.text}" for h in known) or "(none)")
            + "\n\nNew turns:\n" + "\n\n".join(turns))], self.prompt, (), {"response_format": {"type": "json_object"}})
        response = await self.model.complete(request)
        ended, updates, adds = _changes(_parse(response.text), [(h.id, h.text) for h in known])
        if ended or adds:
            await self._write(session_id, where, name, batch, [h for h in known if h.id in ended], updates, adds)

    async def _write(self, session_id: str, where: Where, name: str, batch: Sequence[_Turn], ending: list[SearchHit],
                     updates: dict[str, str], adds: list[str]) -> None:
        now = self.clock()
        when = max((t.at for t in batch if t.at is not None), default=now)  # when its latest turn was taken
        common = {**where, "session_id": session_id, "updated_at": now, EMBEDDER_KEY: self.embedder.name,
                  "sources": list(dict.fromkeys(s for t in batch for s in t.sources)), "batch": name}
        records = _versions(ending, updates, when, common)
        records += [(fid, text, {**common, "valid_from": when, "lineage": fid})
                    for fid, text in ((_new_id(), text) for text in adds)]
        vectors = await self.embedder.embed([text for _, text, _ in records])
        # One upsert: the versions an update ends and the ones it starts are written together.
        await self.vectors.upsert(self.collection, [VectorRecord(fid, v, text, meta) for (fid, text, meta), v
                                                    in zip(records, vectors, strict=True)])


_Version = tuple[str, str, dict[str, Any]]
"""A fact's version to write: its id, text and metadata."""


def _versions(ending: list[SearchHit], updates: dict[str, str], when: float, common: dict[str, Any]) -> list[_Version]:
    """End the versions of `ending` at `when`, each updated one with a successor from then: the records to write."""
    records: list[_Version] = []
    for hit in ending:
        old = Fact.from_hit(hit)
        at = max(when, old.valid_from or when)  # (never before it began: a late retry of an older turn)
        # (it names the extraction that ended it: one that only ends facts is seen to have written them too)
        closed = {**hit.metadata, "valid_to": at, "ended_by": common["sources"], "updated_at": common["updated_at"],
                  "batch": common["batch"]}
        if hit.id in updates:
            closed["replaced_by"] = new_id = _new_id()
            records.append((new_id, updates[hit.id], {**common, "valid_from": at, "lineage": old.lineage,
                                                      "replaces": hit.id}))
        records.append((hit.id, hit.text, closed))
    return records


def _new_id() -> str:
    return f"fact_{os.urandom(8).hex()}"


def _changes(changes: dict[str, Any], known: list[tuple[str, str]]) -> tuple[set[str], dict[str, str], list[str]]:
    """Keep the model's updates and deletes of known facts, and its adds of facts not known yet.

    Return the ids of the facts that end (updated or deleted), the new text of those updated (an
    update that changes nothing is no update) and the facts to add.
    """
    texts = dict(known)
    seen = {_norm(text) for text in texts.values()}
    updates: dict[str, str] = {}
    for u in _items(changes, "update"):
        fid, text = (u.get("id"), u.get("text")) if isinstance(u, dict) else (None, None)
        if isinstance(fid, str) and fid in texts and fid not in updates and _changed(text, texts[fid]):
            updates[fid] = text.strip()
            seen.add(_norm(text))
    ended = {fid for fid in _items(changes, "delete") if isinstance(fid, str) and fid in texts} | set(updates)
    adds = []
    for text in _items(changes, "add"):
        if isinstance(text, str) and text.strip() and _norm(text) not in seen:
            seen.add(_norm(text))
            adds.append(text.strip())
    return ended, updates, adds


def _changed(text: Any, old: str) -> TypeGuard[str]:
    """Whether `text` is a fact's new text (a non-empty string that says something else than `old`)."""
    return isinstance(text, str) and bool(text.strip()) and _norm(text) != _norm(old)


def _items(changes: dict[str, Any], key: str) -> list[Any]:
    value = changes.get(key)
    return value if isinstance(value, list) else []


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def _parse(text: str) -> dict[str, Any]:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError(f"the extraction model did not answer with JSON: {text[:200]!r}")
    data = json.loads(text[start:end + 1])
    if not isinstance(data, dict):
        raise ValueError("the extraction model's JSON is not an object")
    return data
