"""`SemanticMemory`: recall of earlier conversations by meaning (the seeds' ChatHistoryMemoryProvider)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ..errors import UsageError
from ..messages import Message
from ..session import Session, user_id
from ..vectors.base import Embedder, VectorRecord, VectorStore
from .base import ContextProvider

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome

__all__ = ["SemanticMemory"]

Scope = Literal["tenant", "user", "agent", "session"]


def _user_from_state(session: Session | None) -> str | None:
    return user_id(session)


class SemanticMemory(ContextProvider):
    """Stores each turn's messages as vectors and recalls the most relevant ones in later runs.

    After a successful run the turn's messages (by default user and assistant text) are embedded
    and stored with their scope: tenant, user, agent and session. Before a run the new input (and,
    with `query_messages`, the last few context messages) is searched among the memories in
    `scope` — by default ``user``, so recall works across all of a user's sessions — and the best
    `k` matches not already in the context are added as one message that says where each came
    from. The user is ``session.state["user_id"]`` unless `user` says otherwise.

    With `SQLiteStore.vectors()`, deleting or expiring a session also deletes its memories.
    """

    kind = "memory"

    def __init__(
        self,
        vectors: VectorStore,
        embedder: Embedder,
        *,
        collection: str = "memory",
        scope: Scope = "user",
        k: int = 5,
        min_score: float | None = 0.2,
        roles: Sequence[str] = ("user", "assistant"),
        query_messages: int = 0,
        agent_name: str | None = None,
        user: Callable[[Session | None], str | None] = _user_from_state,
        source_id: str = "memory",
    ) -> None:
        super().__init__(source_id)
        if scope not in ("tenant", "user", "agent", "session"):
            raise UsageError(f"scope must be 'tenant', 'user', 'agent' or 'session', got {scope!r}")
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

    async def before_run(self, ctx: RunContext) -> None:
        """Search the memories with the new input and add the best matches as one context message."""
        where = self._where(ctx.session)
        if where is None:
            return
        context = ctx.messages[:len(ctx.messages) - len(ctx.input)]
        recent = [m.text for m in context[-self.query_messages:] if m.text] if self.query_messages else []
        query = "\n".join([*recent, *(m.text for m in ctx.input if m.text)])
        if not query.strip():
            return
        [vector] = await self.embedder.embed([query])
        hits = await self.vectors.search(self.collection, vector, k=self.k + 20, where=where, min_score=self.min_score)
        visible = {m.id for m in ctx.messages}
        lines = []
        for hit in hits:
            if hit.id in visible:
                continue
            meta = hit.metadata
            when = datetime.fromtimestamp(float(meta.get("created_at", 0)), tz=UTC).strftime("%Y-%m-%d %H:%M")
            lines.append(f"- [session {meta.get('session_id')}, {when} UTC] {meta.get('role')}: {hit.text}")
            if len(lines) == self.k:
                break
        if lines:
            ctx.add_messages([Message.user("Relevant memories from earlier conversations (may be outdated):\n"
                                           + "\n".join(lines), metadata={"memory": True})])

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Store the turn's messages (only when the run succeeded)."""
        session = ctx.session
        if outcome.error is not None or session is None:
            return
        messages = [m for m in [*ctx.input, *(outcome.response_messages or ())]
                    if m.role in self.roles and m.text.strip()]
        if not messages:
            return
        vectors = await self.embedder.embed([m.text for m in messages])
        user = self.user(session)
        records = [VectorRecord(m.id, v, m.text, {
            "tenant": session.tenant, "session_id": session.id, "user_id": user, "agent": self.agent_name,
            "role": m.role, "created_at": m.created_at or time.time()}) for m, v in zip(messages, vectors, strict=True)]
        await self.vectors.upsert(self.collection, records)

    async def forget_session(self, tenant: str, session_id: str) -> int:
        """Delete the memories recorded for one session (for vector stores that do not cascade)."""
        return await self.vectors.delete(self.collection, where={"tenant": tenant, "session_id": session_id})
