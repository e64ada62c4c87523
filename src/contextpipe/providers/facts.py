"""`FactMemory`: durable facts and preferences about a user, extracted by a model after each turn.

It plays the role of the seeds' Mem0Provider / FoundryMemoryProvider, on contextpipe's own stores.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..messages import Message
from ..models.base import ChatModel, ModelRequest
from ..session import ProviderState, Session, user_id
from ..vectors.base import EMBEDDER_KEY, Embedder, VectorRecord, VectorStore, check_embedder, embed_query
from .base import ContextProvider, MessageFilter

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome

__all__ = ["FactMemory"]

DEFAULT_EXTRACTION_PROMPT = """You maintain a list of durable facts about a user: preferences, personal details,
plans, constraints. You are given the facts already known (with ids) and new conversation turns. Reply with JSON only:
{"add": ["new fact", ...], "update": [{"id": "...", "text": "corrected fact"}], "delete": ["id", ...]}
- Add only facts that will still matter in later conversations; write each as a short sentence about the user.
- If a turn contradicts a known fact, update that fact to the latest information (or delete it).
- Never add a fact that is already known. Reply {"add": [], "update": [], "delete": []} when nothing changes."""


class FactMemory(ContextProvider):
    """Extracts facts with `model` after each successful run and recalls the relevant ones before each run.

    Facts are stored per user (``session.state["user_id"]`` unless `user` says otherwise) in
    `vectors`; before a run the `k` facts most relevant to the input are added to the
    instructions. Extraction merges with what is known: new facts are added, contradicted ones
    updated or deleted, duplicates skipped. If extraction fails the turn is kept in session state
    and extracted with the next run, so no turn is lost. With `background=True` extraction does not
    delay the run's result; call `drain()` to wait for it.

    The seeds' three message filters choose what it reads: `input_filter` the request messages the
    facts are looked up with (default: the caller's input only), `store_request_filter` and
    `store_response_filter` the turn's messages it extracts facts from (default: the caller's
    input, and every response message; of both, the user's and the assistant's messages with text).
    """

    kind = "memory"

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
        from ._facts_state import _Pending  # pydantic is loaded once a FactMemory is made

        self.pending = ProviderState(f"{source_id}.pending", _Pending)
        self._tasks: set[asyncio.Task[None]] = set()
        self._retry: dict[tuple[str, str], list[str]] = {}
        self._checked = False  # whether the collection's vectors are known to be the embedder's

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The session state key of turns waiting for extraction."""
        return (self.pending.key,)

    def _scope(self, session: Session | None) -> dict[str, Any] | None:
        user = self.user(session)
        if session is None or user is None:
            return None
        return {"tenant": session.tenant, "user_id": user}

    async def facts(self, session: Session, query: str | None = None, *, k: int | None = None) -> list[tuple[str, str]]:
        """Return ``(id, text)`` of the user's facts, the most relevant to `query` first."""
        where = self._scope(session)
        if where is None:
            return []
        if not self._checked:
            await check_embedder(self.vectors, self.collection, self.embedder)
            self._checked = True
        vector = await embed_query(self.embedder, query or "facts about the user")
        hits = await self.vectors.search(self.collection, vector, k=k or self.k, where=where)
        return [(h.id, h.text) for h in hits]

    async def before_run(self, ctx: RunContext) -> None:
        """Add the facts relevant to what `input_filter` gives (the new input) to the instructions."""
        session = ctx.session
        if session is None or self._scope(session) is None:
            return
        retry = self._retry.pop((session.tenant, str(self.user(session))), [])
        if retry:
            self.pending.get(session).turns.extend(retry)
        query = " ".join(m.text for m in self.given_messages(ctx) if m.text) or None
        known = await self.facts(session, query)
        if known:
            ctx.add_instructions("Known facts about the user (may be outdated):\n"
                                 + "\n".join(f"- {text}" for _, text in known))

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Extract facts from the turn's messages that pass the store filters (and from turns that failed before)."""
        session = ctx.session
        if outcome.error is not None or session is None or self._scope(session) is None:
            return
        learned = self.messages_to_learn(outcome)
        turn = "\n".join(f"{m.role}: {m.text}" for m in learned if m.role in ("user", "assistant") and m.text)
        pending = self.pending.get(session)
        turns = [*pending.turns, turn] if turn else list(pending.turns)
        if not turns:
            return
        pending.turns = []
        if self.background:
            task = asyncio.create_task(self._extract_or_keep(session, turns, background=True))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            await self._extract_or_keep(session, turns, background=False)

    async def drain(self) -> None:
        """Wait for background extractions to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _extract_or_keep(self, session: Session, turns: list[str], *, background: bool) -> None:
        try:
            await self._extract(session, turns)
        except Exception:
            if background:
                self._retry.setdefault((session.tenant, str(self.user(session))), []).extend(turns)
            else:
                self.pending.get(session).turns = turns  # saved with the session; retried next run

    async def _extract(self, session: Session, turns: list[str]) -> None:
        where = self._scope(session)
        assert where is not None
        known = await self.facts(session, "\n".join(turns), k=30)
        request = ModelRequest([Message.user(
            "Known facts:\n" + ("\n".join(f"[{fid}] {text}" for fid, text in known) or "(none)")
            + "\n\nNew turns:\n" + "\n\n".join(turns))], self.prompt, (), {"response_format": {"type": "json_object"}})
        response = await self.model.complete(request)
        deletes, updates, adds = _changes(_parse(response.text), known)
        if deletes:
            await self.vectors.delete(self.collection, ids=deletes)
        records = [(fid, text) for fid, text in updates] + [(f"fact_{os.urandom(8).hex()}", t) for t in adds]
        if records:
            vectors = await self.embedder.embed([text for _, text in records])
            await self.vectors.upsert(self.collection, [
                VectorRecord(fid, v, text, {**where, "session_id": session.id, "updated_at": time.time(),
                                         EMBEDDER_KEY: self.embedder.name})
                for (fid, text), v in zip(records, vectors, strict=True)])


def _changes(changes: dict[str, Any], known: list[tuple[str, str]]) -> tuple[
        list[str], list[tuple[str, str]], list[str]]:
    """Keep the model's deletes and updates of known facts, and its adds of facts not known yet."""
    known_ids = {fid for fid, _ in known}
    known_texts = {_norm(text) for _, text in known}
    deletes = [fid for fid in changes.get("delete", []) if fid in known_ids]
    updates = [(u["id"], u["text"]) for u in changes.get("update", [])
               if isinstance(u, dict) and u.get("id") in known_ids and isinstance(u.get("text"), str)]
    adds = []
    for text in changes.get("add", []):
        if isinstance(text, str) and text.strip() and _norm(text) not in known_texts:
            known_texts.add(_norm(text))
            adds.append(text.strip())
    return deletes, updates, adds


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
