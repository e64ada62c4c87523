"""`History`: the built-in history provider over any `SessionStore`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..exchanges import drop_leading_orphans
from ..messages import Message, Source
from .base import HistoryProvider, LoadedHistory

if TYPE_CHECKING:
    from ..config import HistoryPolicy
    from ..session import Session, SessionKey
    from ..stores.base import Checkpoint, Lease, SessionStore

__all__ = ["History"]


class History(HistoryProvider):
    """Loads and stores a session's messages in `store`.

    >>> from contextpipe.stores import MemoryStore
    >>> store = MemoryStore()
    >>> primary = History(store)
    >>> from contextpipe import HistoryPolicy
    >>> audit = History(MemoryStore(), source_id="audit",
    ...                 policy=HistoryPolicy(load_messages=False, store_context_messages=True))

    `policy` says what is loaded and stored (`HistoryPolicy`; by default the history is loaded,
    and the caller's input and the model's and tools' messages are stored).

    `max_messages` bounds how much of the log is loaded per run (the newest messages; a tool
    exchange cut by the bound is dropped whole rather than sent half). None loads the whole log.

    A session run again by the same process is not decoded again: the messages loaded by its last
    run are kept (at most `cache_messages` over all sessions, least recently run dropped first) and
    only the messages appended since are read. The kept copy is used only when the run's lease token
    directly follows the one of the run that loaded it (no other worker held the session in between)
    and the store still has the last kept message at its sequence; otherwise the log is read again.
    ``cache_messages=0`` turns this off.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        policy: HistoryPolicy | None = None,
        source_id: str = "history",
        max_messages: int | None = None,
        cache_messages: int = 200_000,
    ) -> None:
        super().__init__(source_id, policy=policy)
        if max_messages is not None and max_messages < 1:
            raise UsageError(f"max_messages must be at least 1 (or None for all), got {max_messages}")
        self.store: SessionStore = store
        """Where the messages live."""
        self.max_messages = max_messages
        if cache_messages < 0:
            raise UsageError(f"cache_messages must be 0 (no cache) or more, got {cache_messages}")
        self.cache_messages = cache_messages
        self._tails: OrderedDict[tuple[str, str], _Tail] = OrderedDict()
        self._cached = 0

    async def load(self, session: Session) -> Sequence[Message]:
        """Return what the model should see of the session's log.

        That is the latest summary checkpoint (if compaction wrote one) followed by the messages
        after it, the newest `max_messages` of them when bounded; never a scan of the whole log
        when a checkpoint exists.
        """
        view = await self.load_view(session)
        return view.messages if view.summary is None else [view.summary, *view.messages]

    async def load_view(self, session: Session, *, lease_token: int | None = None) -> LoadedHistory:
        """Load the checkpoint summary and the log after it, with the log positions (for compaction).

        Given the fencing token of a run's lease, the tail kept from the session's previous run is
        brought up to date instead of reading the whole log again (see the class docstring).
        """
        tail = None
        if lease_token is not None and self.cache_messages:
            tail = await self._cached_tail(session, lease_token)
        if tail is None:
            checkpoint, page = await self.store.load_context(session.tenant, session.id, limit=self.max_messages)
            # Kept untagged: a session run only once pays no copies; the first reuse tags it once.
            tail = _Tail(0, checkpoint, page.messages, page.first_seq, page.has_more, tagged=False)
        if lease_token is not None and self.cache_messages:
            self._keep(session, lease_token, tail)
        messages: Sequence[Message] = tail.messages
        first_seq, checkpoint = tail.first_seq, tail.checkpoint
        if checkpoint is not None or tail.has_more:
            kept = drop_leading_orphans(tail.messages)
            first_seq += len(messages) - len(kept)
            messages = kept
        if messages is tail.messages and lease_token is not None and self.cache_messages:
            messages = tuple(messages)  # the kept list is never handed out (and the run keeps this copy as it is)
        return LoadedHistory(messages, first_seq, checkpoint.summary if checkpoint is not None else None)

    async def save_checkpoint(self, session: Session, checkpoint: Checkpoint, *, lease: Lease | None = None) -> bool:
        """Keep `checkpoint` in the store, so later runs load the summary plus the newer messages."""
        await self.store.save_checkpoint(session.tenant, session.id, checkpoint, lease=lease)
        return True

    async def _cached_tail(self, session: Session, token: int) -> _Tail | None:
        """Return the tail kept from the session's previous run, brought up to date (None: read it all)."""
        key = (session.tenant, session.id)
        tail = self._tails.pop(key, None)
        if tail is None:
            return None
        self._cached -= len(tail.messages)
        if token != tail.token + 1:
            return None  # another run (here or in another process) held the session in between
        checkpoint = await self.store.latest_checkpoint(session.tenant, session.id)
        old_floor = tail.checkpoint.seq if tail.checkpoint is not None else 0
        floor = checkpoint.seq if checkpoint is not None else 0
        last = tail.first_seq + len(tail.messages) - 1
        if floor < old_floor or floor > last or not tail.messages:
            return None
        # Read from the last kept message on: the same id at the same sequence shows the log is the one
        # that was kept (not a session deleted and created again), and the rest is what was appended.
        page = await self.store.load(session.tenant, session.id, after=last - 1)
        if not page.messages or page.first_seq != last or page.messages[0].id != tail.messages[-1].id:
            return None
        messages = self._tagged(tail)
        if len(page.messages) > 1:
            messages += self._tag(page.messages[1:])
        first_seq = tail.first_seq
        if floor >= first_seq:  # a newer checkpoint now stands for the oldest kept messages
            del messages[:floor + 1 - first_seq]
            first_seq = floor + 1
        if self.max_messages is not None and len(messages) > self.max_messages:
            cut = len(messages) - self.max_messages
            del messages[:cut]
            first_seq += cut
        return _Tail(token, checkpoint, messages, first_seq, first_seq > floor + 1)

    def _tagged(self, tail: _Tail) -> list[Message]:
        """Return the kept messages tagged as this provider's history (tagged once, on the tail's first reuse)."""
        return tail.messages if tail.tagged else self._tag(tail.messages)

    def _tag(self, messages: list[Message]) -> list[Message]:
        """Tag kept messages as this provider's history once, so later runs need no tagged copies."""
        source = Source("history", self.source_id)
        return [m.with_source(source) for m in messages]

    def forget_cached(self, keys: Sequence[SessionKey]) -> None:
        """Drop the messages kept in this process for the sessions `keys` (`Agent.forget_user`)."""
        for key in keys:
            tail = self._tails.pop((key.tenant, key.id), None)
            if tail is not None:
                self._cached -= len(tail.messages)

    def _keep(self, session: Session, token: int, tail: _Tail) -> None:
        size = len(tail.messages)
        if size > self.cache_messages:
            return
        tail.token = token
        self._tails[(session.tenant, session.id)] = tail
        self._cached += size
        while self._cached > self.cache_messages:
            _, dropped = self._tails.popitem(last=False)
            self._cached -= len(dropped.messages)

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        """Append `messages` to the session's log (idempotent by message id).

        With ``durable=False`` the store may acknowledge before the write survives a power loss
        (the run's next durable write makes it durable).
        """
        await self.store.append(session.tenant, session.id, messages, lease=lease, durable=durable)


@dataclass(slots=True)
class _Tail:
    """The part of a session's log a run loaded: messages after `checkpoint`, from `first_seq` on."""

    token: int
    """Lease token of the run that loaded it (or last brought it up to date)."""
    checkpoint: Checkpoint | None
    messages: list[Message]
    first_seq: int
    has_more: bool
    """True when older messages (after the checkpoint) were left out by `max_messages`."""
    tagged: bool = True
    """True when `messages` carry this provider's history source (done on the tail's first reuse)."""
