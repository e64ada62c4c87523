"""`StepWriter`: everything a run saves, fenced by the one lease the run holds.

The agent acquires the lease and creates the writer; the loop hands it each step; the agent alone
releases the lease at the end. The writer saves:

- per step (the default): the request messages each storing history provider keeps, with the first
  model output; then every model output and every tool result as soon as it exists;
- per run: everything once, when the run has succeeded;
- summary checkpoints (for compaction), the session's state and, when asked, the run's traces.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .stores.base import Checkpoint

if TYPE_CHECKING:
    from .messages import Message
    from .pipeline import RunContext
    from .providers.base import HistoryProvider
    from .session import Session
    from .stores.base import Lease, SessionStore

__all__ = ["StepWriter"]


class StepWriter:
    """Saves one run's messages, checkpoints and session state, fenced by the run's lease."""

    def __init__(self, *, store: SessionStore, session: Session | None, lease: Lease | None,
                 history_providers: Sequence[HistoryProvider], per_step: bool) -> None:
        self.store = store
        """The store holding the session (and the lease)."""
        self.session = session
        """The session, or None for a run without one."""
        self.lease = lease
        """The run's current lease (renewals replace it), None without a session."""
        self.per_step = per_step
        """True when each step is saved as it happens; False saves once at the end."""
        self._providers = [p for p in history_providers if p.stores_anything]
        self._loader = next((p for p in history_providers if p.load_messages), None)
        self._request_saved = False
        self._lease_renew_at = (time.time() + lease.ttl / 2) if lease is not None else 0.0

    @property
    def stores_messages(self) -> bool:
        """True when some history provider stores this run's messages."""
        return self.session is not None and bool(self._providers)

    def lease_for(self, provider: HistoryProvider) -> Lease | None:
        """Return the lease that fences `provider`'s writes.

        That is the run's lease when the provider writes to the store holding it, and None for
        providers writing elsewhere (an audit log in another store).
        """
        return self.lease if getattr(provider, "store", None) is self.store else None

    async def save_step(self, ctx: RunContext, response: Sequence[Message], *,
                        with_request: bool = True) -> list[Message]:
        """Save a step now (per-step mode only) and return what the first storing provider was given.

        Each storing provider gets `response`, preceded on the first such call by the request
        messages it stores (unless `with_request` is False).
        """
        if not self.per_step or not self.stores_messages:
            return []
        await self._renew_if_due()
        first = with_request and not self._request_saved
        self._request_saved = self._request_saved or with_request
        return await self._save(ctx, response, with_request=first)

    async def save_run(self, ctx: RunContext, response: Sequence[Message]) -> None:
        """Save a whole successful run at once (per-run mode only)."""
        if self.per_step or not self.stores_messages:
            return
        await self._save(ctx, response, with_request=True)

    async def _save(self, ctx: RunContext, response: Sequence[Message], *, with_request: bool) -> list[Message]:
        session = self.session
        assert session is not None
        saved: list[Message] | None = None
        for provider in self._providers:
            batch = provider.select_request(ctx) if with_request else []
            batch.extend(provider.select_response(response))
            if batch:
                await provider.save(session, batch, lease=self.lease_for(provider))
            if saved is None:
                saved = batch
        return saved or []

    async def _renew_if_due(self) -> None:
        if self.lease is not None and time.time() >= self._lease_renew_at:
            self.lease = await self.store.renew_lease(self.lease)
            self._lease_renew_at = time.time() + self.lease.ttl / 2

    async def save_checkpoint(self, seq: int, summary: Message) -> bool:
        """Have the history provider that loaded the messages keep `summary` as standing for the log up to `seq`."""
        if self.session is None or self._loader is None:
            return False
        checkpoint = Checkpoint(seq, summary, time.time())
        return await self._loader.save_checkpoint(self.session, checkpoint, lease=self.lease_for(self._loader))

    async def save_session(self, traces: Sequence[dict[str, Any]] = ()) -> None:
        """Save the session's state (compare-and-swap) and, when given, the run's traces."""
        session = self.session
        if session is None:
            return
        await self.store.save_session(session, lease=self.lease)
        if traces:
            await self.store.append_traces(session.tenant, session.id, list(traces), lease=self.lease)

    async def release(self) -> None:
        """Give the session's lease back (the run is over)."""
        if self.lease is not None:
            lease, self.lease = self.lease, None
            await self.store.release_lease(lease)
