"""`History`: the built-in history provider over any `SessionStore`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..exchanges import drop_leading_orphans
from ..messages import Message
from .base import HistoryProvider, LoadedHistory, MessageFilter, accepts_keyword

if TYPE_CHECKING:
    from ..session import Session
    from ..stores.base import Checkpoint, Lease, SessionStore

__all__ = ["History"]


class History(HistoryProvider):
    """Loads and stores a session's messages in `store`.

    >>> from contextpipe.stores import MemoryStore
    >>> store = MemoryStore()
    >>> primary = History(store)
    >>> audit = History(MemoryStore(), source_id="audit", load_messages=False, store_context_messages=True)

    `max_messages` bounds how much of the log is loaded per run (the newest messages; a tool
    exchange cut by the bound is dropped whole rather than sent half). None loads the whole log.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        source_id: str = "history",
        max_messages: int | None = None,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_outputs: bool = True,
        store_context_messages: bool = False,
        provide_filter: MessageFilter | None = None,
        store_request_filter: MessageFilter | None = None,
        store_response_filter: MessageFilter | None = None,
    ) -> None:
        super().__init__(
            source_id, load_messages=load_messages, store_inputs=store_inputs, store_outputs=store_outputs,
            store_context_messages=store_context_messages, provide_filter=provide_filter,
            store_request_filter=store_request_filter, store_response_filter=store_response_filter,
        )
        if max_messages is not None and max_messages < 1:
            raise UsageError(f"max_messages must be at least 1 (or None for all), got {max_messages}")
        self.store = store
        """Where the messages live."""
        self.max_messages = max_messages

    async def load(self, session: Session) -> Sequence[Message]:
        """Return what the model should see of the session's log.

        That is the latest summary checkpoint (if compaction wrote one) followed by the messages
        after it, the newest `max_messages` of them when bounded; never a scan of the whole log
        when a checkpoint exists.
        """
        view = await self.load_view(session)
        return view.messages if view.summary is None else [view.summary, *view.messages]

    async def load_view(self, session: Session) -> LoadedHistory:
        """Load the checkpoint summary and the log after it, with the log positions (for compaction)."""
        checkpoint, page = await self.store.load_context(session.tenant, session.id, limit=self.max_messages)
        messages, first_seq = page.messages, page.first_seq
        if checkpoint is not None or page.has_more:
            kept = drop_leading_orphans(messages)
            first_seq += len(messages) - len(kept)
            messages = kept
        return LoadedHistory(messages, first_seq, checkpoint.summary if checkpoint is not None else None)

    async def save_checkpoint(self, session: Session, checkpoint: Checkpoint, *, lease: Lease | None = None) -> bool:
        """Keep `checkpoint` in the store, so later runs load the summary plus the newer messages."""
        await self.store.save_checkpoint(session.tenant, session.id, checkpoint, lease=lease)
        return True

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        """Append `messages` to the session's log (idempotent by message id).

        With ``durable=False`` the store may acknowledge before the write survives a power loss
        (the run's next durable write makes it durable); stores without that option ignore it.
        """
        if not durable and accepts_keyword(self.store.append, "durable"):
            append: Any = self.store.append  # stores gained the option later than this call site
            await append(session.tenant, session.id, messages, lease=lease, durable=False)
            return
        await self.store.append(session.tenant, session.id, messages, lease=lease)
