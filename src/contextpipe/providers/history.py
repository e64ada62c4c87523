"""`History`: the built-in history provider over any `SessionStore`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..exchanges import drop_leading_orphans
from ..messages import Message, Source
from ..rewind import Rewound, is_marker, rewound_ranges, view_tail
from ..tokens import EstimateTokenizer, TokenCounter
from .base import HistoryProvider, LoadedHistory

if TYPE_CHECKING:
    from ..config import HistoryPolicy
    from ..pipeline import RunContext
    from ..session import Session, SessionKey
    from ..stores.base import Checkpoint, Lease, SessionStore
    from ..tokens import Tokenizer

__all__ = ["DEFAULT_MAX_TOKENS", "History"]

DEFAULT_MAX_TOKENS = 1_000_000
"""`History`'s default bound: the newest messages within a million tokens, the largest context window
a model offers today, so the bound leaves out only what no model could have been sent anyway."""

_FIRST_PAGE = 256
"""Messages read by a bounded load's first page; each further page (older) is twice the one before."""


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

    `max_tokens` bounds how much of the log is loaded per run: the newest messages whose tokens fit
    (counted by the run's token counter), read backward page by page, never the whole log. The
    default, `DEFAULT_MAX_TOKENS`, is as large as the largest context window; a `Compaction` after
    this provider that keeps at most a token budget (`TokenBudget`) lowers it for its runs to twice
    that budget. `max_messages` bounds the number of messages too. A tool exchange cut by a bound is
    dropped whole rather than sent half, and what a bound leaves out is noted in the run's traces
    (a ``history_bound`` change). ``max_tokens=None`` (and ``max_messages=None``) loads the whole log.

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
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        cache_messages: int = 200_000,
    ) -> None:
        super().__init__(source_id, policy=policy)
        for name, value in (("max_messages", max_messages), ("max_tokens", max_tokens)):
            if value is not None and (type(value) is not int or value < 1):
                raise UsageError(f"{name} must be a whole number of at least 1, or None to load the whole log; "
                                 f"got {value!r}")
        self.store: SessionStore = store
        """Where the messages live."""
        self.max_messages = max_messages
        self.max_tokens = max_tokens
        """The most tokens of messages a run loads (None: no bound)."""
        if cache_messages < 0:
            raise UsageError(f"cache_messages must be 0 (no cache) or more, got {cache_messages}")
        self.cache_messages = cache_messages
        self._tails: OrderedDict[tuple[str, str], _Tail] = OrderedDict()
        self._cached = 0

    async def load(self, session: Session) -> Sequence[Message]:
        """Return what the model should see of the session's log.

        That is the latest summary checkpoint (if compaction wrote one) followed by the newest messages
        after it within the bounds (tokens counted by an estimate here; a run counts with its own
        counter); never a scan of the whole log unless the bounds are None.
        """
        view = await self.load_view(session)
        return view.messages if view.summary is None else [view.summary, *view.messages]

    async def load_view(self, session: Session, *, lease_token: int | None = None) -> LoadedHistory:
        """Load the checkpoint summary and the newest messages after it, with their log positions.

        Given the fencing token of a run's lease, the tail kept from the session's previous run is
        brought up to date instead of reading the log again (see the class docstring).
        """
        return await self._load_view(session, lease_token, TokenCounter(EstimateTokenizer()), self.max_tokens)

    async def before_run(self, ctx: RunContext) -> None:
        """Load the session's newest messages within the bounds into the context, noting what is left out."""
        if not self.policy.load_messages or ctx.session is None:
            return
        bound, bounded_by = self._run_bound(ctx)
        if type(self).load_view is not History.load_view:
            # A subclass that loads its own way is called as every history provider is (it bounds by `max_tokens`).
            view = await self.load_view(ctx.session, lease_token=ctx.lease_token)
            bounded_by = f"History(max_tokens={self.max_tokens})"
        else:
            # The run's session, brought up to date under its lease: its state says whether it was ever rewound.
            view = await self._load_view(ctx.session, ctx.lease_token, ctx.tokens, bound, ctx.session.state)
        self.provide(ctx, view, bounded_by)

    def _run_bound(self, ctx: RunContext) -> tuple[int | None, str]:
        """Return the run's token bound and what sets it: `max_tokens`, or a later provider's budget when lower."""
        bound = self.max_tokens
        messages = "" if self.max_messages is None else f", max_messages={self.max_messages}"
        bounded_by = f"History(max_tokens={bound}{messages})"
        if bound is None:
            return None, bounded_by
        providers: Sequence[object] = getattr(ctx.agent, "providers", ())
        later = providers[next((i + 1 for i, p in enumerate(providers) if p is self), len(providers)):]
        for provider in later:
            keeps = getattr(provider, "history_tokens", None)
            if isinstance(keeps, int) and 2 * keeps < bound:
                # Twice the budget: room for a counter of another tokenizer than the run's.
                bound, bounded_by = 2 * keeps, f"twice the {keeps:,}-token budget of {provider!r}, after {bounded_by}"
        return bound, bounded_by

    async def _load_view(self, session: Session, lease_token: int | None, counter: TokenCounter,
                         bound: int | None, state: Mapping[str, object] | None = None) -> LoadedHistory:
        """Load the view within `bound`.

        `state`, the state of a run's up-to-date session, spares a session never rewound the look for rewind
        markers (None, as for a `Session` object a caller holds: always look).
        """
        caching = lease_token is not None and self.cache_messages > 0
        tail = None
        if caching:
            assert lease_token is not None
            tail = await self._cached_tail(session, lease_token, counter, bound)
        if tail is None:
            rewound = await rewound_ranges(self.store, session.tenant, session.id, state)
            if rewound.ranges:  # read around the rewound ranges, and keep nothing (`_cached_tail` reads on)
                return await self._read_view(session, counter, bound, rewound)
            tail = await self._read_tail(session, counter, bound)
        if caching:
            assert lease_token is not None
            self._keep(session, lease_token, tail)
        messages: Sequence[Message] = tail.messages
        first_seq, checkpoint = tail.first_seq, tail.checkpoint
        if checkpoint is not None or tail.has_more:
            kept = drop_leading_orphans(tail.messages)
            first_seq += len(messages) - len(kept)
            messages = kept
        if messages is tail.messages and caching:
            messages = tuple(messages)  # the kept list is never handed out (and the run keeps this copy as it is)
        floor = checkpoint.seq if checkpoint is not None else 0
        return LoadedHistory(messages, first_seq, checkpoint.summary if checkpoint is not None else None,
                             left_out=first_seq - floor - 1)

    async def _read_tail(self, session: Session, counter: TokenCounter, bound: int | None) -> _Tail:
        """Read the newest messages after the checkpoint from the store: backward page by page when bounded."""
        limit = self.max_messages
        if bound is None:
            checkpoint, page = await self.store.load_context(session.tenant, session.id, limit=limit)
            # Kept untagged: a session run only once pays no copies; the first reuse tags it once.
            return _Tail(0, checkpoint, page.messages, page.first_seq, page.has_more, tagged=False)
        size = _FIRST_PAGE if limit is None else min(_FIRST_PAGE, limit)
        checkpoint, page = await self.store.load_context(session.tenant, session.id, limit=size)
        floor = checkpoint.seq if checkpoint is not None else 0
        pages, counts = [page.messages], [counter.messages(page.messages)]
        total, read = sum(counts[0]), len(page.messages)
        while page.first_seq > floor + 1 and total <= bound and (limit is None or read < limit):
            size = 2 * size if limit is None else min(2 * size, limit - read)
            page = await self.store.load(session.tenant, session.id, limit=size, before=page.first_seq, after=floor)
            pages.append(page.messages)
            counts.append(counter.messages(page.messages))
            total, read = total + sum(counts[-1]), read + len(page.messages)
        messages = pages[0] if len(pages) == 1 else [m for p in reversed(pages) for m in p]
        tail = _Tail(0, checkpoint, messages, page.first_seq, page.first_seq > floor + 1, tagged=False,
                     counts=[c for p in reversed(counts) for c in p], total=total, bound=bound,
                     tokenizer=counter.tokenizer)
        tail.fit(bound)
        return tail

    async def _read_view(self, session: Session, counter: TokenCounter, bound: int | None,
                         rewound: Rewound) -> LoadedHistory:
        """Read the newest view messages after the checkpoint within the bounds, stepping over rewound ranges.

        A checkpoint at a rewound sequence summarises messages the view leaves out: it is not used
        (the view is read from the start, within the bounds). Log positions are reported only when
        the messages read are contiguous in the log (so compaction saves checkpoints only then).
        """
        checkpoint = await self.store.latest_checkpoint(session.tenant, session.id)
        if checkpoint is not None and checkpoint.seq in rewound:
            checkpoint = None
        floor = checkpoint.seq if checkpoint is not None else 0
        kept = await view_tail(self.store, session.tenant, session.id, rewound, floor, counter.messages, bound,
                               self.max_messages, _FIRST_PAGE)
        first = kept[0][0] if kept else floor + 1
        left_out = first - floor - 1 - rewound.hidden_between(floor, first)
        messages = [m for _, m in kept]
        if checkpoint is not None or left_out:
            messages = drop_leading_orphans(messages)
            kept = kept[len(kept) - len(messages):]
        contiguous = bool(kept) and kept[-1][0] - kept[0][0] == len(kept) - 1
        return LoadedHistory(messages, kept[0][0] if contiguous else None,
                             checkpoint.summary if checkpoint is not None else None, left_out=left_out)

    async def save_checkpoint(self, session: Session, checkpoint: Checkpoint, *, lease: Lease | None = None) -> bool:
        """Keep `checkpoint` in the store, so later runs load the summary plus the newer messages."""
        await self.store.save_checkpoint(session.tenant, session.id, checkpoint, lease=lease)
        return True

    async def _cached_tail(self, session: Session, token: int, counter: TokenCounter,
                           bound: int | None) -> _Tail | None:
        """Return the tail kept from the session's previous run, brought up to date (None: read it again)."""
        key = (session.tenant, session.id)
        tail = self._tails.pop(key, None)
        if tail is None:
            return None
        self._cached -= len(tail.messages)
        if token != tail.token + 1 or not tail.covers(bound, counter.tokenizer):
            return None  # another run (here or in another process) held the session in between, or it is too short
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
        new = page.messages[1:]
        if any(is_marker(m) for m in new):
            return None  # rewound since: the view is read again around the rewound ranges
        kept = _Tail(token, checkpoint, self._tagged(tail), tail.first_seq, False, counts=tail.counts,
                     total=tail.total, bound=bound, tokenizer=tail.tokenizer)
        kept.extend(self._tag(new) if new else [], counter)
        kept.cut(floor, self.max_messages, bound)
        return kept


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
    """True when older messages (after the checkpoint) were left out by a bound."""
    tagged: bool = True
    """True when `messages` carry this provider's history source (done on the tail's first reuse)."""
    counts: list[int] | None = None
    """Each message's raw tokens by `tokenizer`, when the tail was cut to a token bound."""
    total: int = 0
    """The sum of `counts`."""
    bound: int | None = None
    """The token bound the tail was cut to (None: no token bound)."""
    tokenizer: Tokenizer | None = None

    def covers(self, bound: int | None, tokenizer: Tokenizer) -> bool:
        """Tell whether this tail holds the newest messages within `bound` (counted by `tokenizer`)."""
        if bound is None or self.bound is None:
            return bound is None and (self.bound is None or not self.has_more)
        return tokenizer is self.tokenizer and (bound <= self.bound or not self.has_more)

    def extend(self, messages: list[Message], counter: TokenCounter) -> None:
        """Append the messages stored since, counted when the tail keeps counts."""
        if not messages:
            return
        self.messages += messages
        if self.counts is not None:
            added = counter.messages(messages)
            self.counts += added
            self.total += sum(added)

    def drop(self, count: int) -> None:
        """Drop the `count` oldest messages."""
        if self.counts is not None:
            self.total -= sum(self.counts[:count])
            del self.counts[:count]
        del self.messages[:count]
        self.first_seq += count
        self.has_more = self.has_more or count > 0

    def cut(self, floor: int, max_messages: int | None, bound: int | None) -> None:
        """Keep what follows the checkpoint at `floor`, within the bounds."""
        if floor >= self.first_seq:  # a newer checkpoint now stands for the oldest kept messages
            self.drop(floor + 1 - self.first_seq)
        if max_messages is not None and len(self.messages) > max_messages:
            self.drop(len(self.messages) - max_messages)
        self.fit(bound)
        self.has_more = self.first_seq > floor + 1

    def fit(self, bound: int | None) -> None:
        """Drop the oldest messages until the rest fit `bound` tokens (the newest that fit are kept)."""
        if bound is None or self.counts is None or self.total <= bound:
            return
        counts, total, cut = self.counts, self.total, 0
        while total > bound:
            total -= counts[cut]
            cut += 1
        self.drop(cut)
