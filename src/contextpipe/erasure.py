"""Forgetting a user everywhere (`Agent.forget_user`): the one deletion the append-only log allows.

A user's data is spread over the agent's stores: the sessions whose state names the user
(``session.state["user_id"]``, `contextpipe.session.set_user_id`) with their logs, summary
checkpoints, traces and artifacts in every session store the agent writes to, and the records its
`SemanticMemory` and `FactMemory` providers keep in their vector stores (by user, and by session).
`forget_user` removes them all and says what it removed in a `ForgetReport`.

Order, so a failure part way never goes unsaid and a retry finishes the job: the user's sessions are
found, their leases taken (a session a run holds is refused with `SessionBusy` naming it, before
anything is removed), then the memories and facts are deleted, then the sessions. A retry finds
only what is left; what a first attempt removed is not counted again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ContextPipeError, SessionBusy, StoreError, UsageError, shorten
from .providers.base import ContextProvider, HistoryProvider
from .session import SessionKey, validate_tenant
from .stores.base import Lease, SessionStore

__all__ = ["ForgetReport", "forget_user"]


@dataclass(frozen=True, slots=True)
class ForgetReport:
    """What `Agent.forget_user` removed: how many of each kind, and the ids of the sessions."""

    tenant: str
    """The tenant the user was forgotten in."""
    user_id: str
    """The user forgotten."""
    session_ids: tuple[str, ...]
    """The sessions removed (sorted)."""
    messages: int
    """Entries of their logs, over every session store of the agent."""
    summaries: int
    """Their summary checkpoints (compaction)."""
    traces: int
    """Their stored prompt traces."""
    memories: int
    """Records of `SemanticMemory` providers (the user's, and those of the user's sessions)."""
    facts: int
    """Versions of facts of `FactMemory` providers."""
    artifacts: int = 0
    """Artifacts kept beside their logs (`contextpipe.artifacts`), over every session store of the agent."""

    @property
    def sessions(self) -> int:
        """How many sessions were removed."""
        return len(self.session_ids)


async def forget_user(tenant: str, user_id: str, *, run_store: SessionStore, stores: Sequence[SessionStore],
                      providers: Sequence[ContextProvider], wait: float = 0.0) -> ForgetReport:
    """Remove `user_id`'s sessions from `stores` and memories from `providers` (see the module docstring).

    `run_store` is where runs take their leases (the agent's store). Raises `UsageError` for an empty
    or non-string user id, `SessionBusy` (having removed nothing) when a run holds one of the user's
    sessions for longer than `wait` seconds, and `StoreError` saying how far it got when a store fails.
    """
    validate_tenant(tenant)
    if not isinstance(user_id, str) or not user_id:
        raise UsageError(f"forget_user needs the user's id, a non-empty string, got {shorten(user_id)}")
    found: dict[str, None] = {}
    for store in stores:
        await store.purge_expired()  # an expired session still holds its rows until it is purged
        found.update(dict.fromkeys(await store.user_sessions(tenant, user_id)))
    ids = sorted(found)
    leases = await _lease_all(run_store, tenant, ids, wait)
    erased: set[str] = set()
    counts = [0, 0, 0, 0]
    try:
        memories, facts = await _forget_memories(providers, tenant, user_id, ids)
        for store in stores:
            for sid in ids:
                gone = await store.erase_session(tenant, sid)
                if gone is not None:
                    erased.add(sid)
                    counts = [counts[0] + gone.messages, counts[1] + gone.summaries, counts[2] + gone.traces,
                              counts[3] + gone.artifacts]
    except ContextPipeError as exc:
        await _release(run_store, [lease for lease in leases if lease.session_id not in erased])
        raise StoreError(f"forget_user({tenant!r}, {user_id!r}) stopped part way ({len(erased)} of {len(ids)} "
                         f"session(s) removed): {exc}; call it again to finish (it removes only what is left)",
                         tenant=tenant) from exc
    _forget_cached(providers, tenant, ids)
    return ForgetReport(tenant, user_id, tuple(sorted(erased)), counts[0], counts[1], counts[2], memories, facts,
                        counts[3])


async def _lease_all(store: SessionStore, tenant: str, ids: list[str], wait: float) -> list[Lease]:
    """Take the lease of every session in `ids`; if a run holds any, give the others back and raise `SessionBusy`."""
    owner = f"forget-user-{os.urandom(6).hex()}"
    leases, busy = [], []
    for sid in ids:
        try:
            leases.append(await store.acquire_lease(tenant, sid, owner, wait=wait))
        except SessionBusy:
            busy.append(sid)
    if busy:
        await _release(store, leases)
        names = ", ".join(repr(b) for b in busy)
        raise SessionBusy(f"forget_user: {len(busy)} session(s) of the user are held by a running run: {names}; "
                          "nothing was removed. Call it again once they finish, or pass wait=<seconds>",
                          backend=store.backend, tenant=tenant, session_id=busy[0])
    return leases


async def _release(store: SessionStore, leases: Sequence[Lease]) -> None:
    for lease in leases:
        await store.release_lease(lease)


async def _forget_memories(providers: Sequence[ContextProvider], tenant: str, user_id: str,
                           ids: list[str]) -> tuple[int, int]:
    """Delete what the memory providers keep of the user; return (memories, facts) removed."""
    memories = facts = 0
    for provider in providers:
        if provider.kind != "memory":
            continue
        from .providers.facts import FactMemory  # here: an agent without memory providers loads neither
        from .providers.memory import SemanticMemory

        if isinstance(provider, FactMemory):
            facts += await provider.forget_user(tenant, user_id, ids)
        elif isinstance(provider, SemanticMemory):
            memories += await provider.forget_user(tenant, user_id, ids)
    return memories, facts


def session_stores(run_store: SessionStore, providers: Sequence[ContextProvider]) -> list[SessionStore]:
    """Return the session stores an agent writes a user's data to (`Agent.forget_user` erases it in each).

    They are the agent's own (`run_store`), those of its history providers and those its `Artifacts`
    providers keep artifacts in, each once, in that order.
    """
    from .providers.artifacts import Artifacts  # here: an agent without artifacts never loads them

    kept = [p.store for p in providers
            if isinstance(p, HistoryProvider | Artifacts) and isinstance(p.store, SessionStore)]
    return list(dict.fromkeys([run_store, *kept]))


def _forget_cached(providers: Sequence[ContextProvider], tenant: str, ids: list[str]) -> None:
    """Drop the copies of the sessions' messages that history providers keep in this process."""
    from .providers.history import History

    for provider in providers:
        if isinstance(provider, History):
            provider.forget_cached([SessionKey(tenant, sid) for sid in ids])
