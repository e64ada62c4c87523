"""Undo on an append-only log: rewind markers, the view they leave, and forks.

Nothing is deleted or rewritten. `rewind` appends a *marker* (a system message with id
``rewind-<n>``, the n-th rewind of the session) saying "the messages after sequence ``to`` are
rewound": the session's *view* — what history providers load, what the model sees, what its memory
recalls — leaves out the log from ``to + 1`` up to the marker itself. The rewound messages stay
stored; `read_log` returns them marked. A later rewind may go back again (its range takes in the
earlier marker and what it left out, so ranges are nested or apart and simply compose), and new
messages follow the last marker.

A rewind point inside a tool exchange (an assistant message's calls and their results) moves back to
before the exchange: the view never ends in a call without its results.

A session's rewinds are counted in its state (``REWINDS_KEY``), so a session never rewound costs a
load nothing. The markers are found through each store's message-id index (``rewind-1``,
``rewind-2``, ... until one is missing): a session with n such ids
in a row (markers, or a client's message that took such an id and is passed over) n + 1 lookups and
n one-message reads — never a scan of the log.

A `fork` copies the view up to a sequence into a new session (its own log, independent afterwards);
see `fork` for why it copies and what that costs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .errors import UsageError
from .exchanges import is_late_result, unanswered_calls
from .messages import Message, TextPart
from .session import REWINDS_KEY, Session

if TYPE_CHECKING:
    from .stores.base import Lease, SessionStore

__all__ = ["MARKER_KEY", "LogEntry", "Rewound", "copy_pages", "fork", "is_marker", "last_user_seq", "leased",
           "read_log", "rewind", "rewound_ids", "rewound_ranges", "view_messages", "view_tail"]

MARKER_KEY: Final = "contextpipe.rewind"
"""Metadata key of a rewind marker: ``{"to": seq}``, the last sequence kept."""

_PAGE: Final = 1000
"""Messages read per page when walking the view or copying a fork."""
_WINDOW: Final = 64
"""View messages read before a rewind point to find the tool exchange it may fall in."""


def is_marker(message: Message) -> bool:
    """Tell whether `message` is a rewind marker (it is never part of a view)."""
    return MARKER_KEY in message.metadata


@dataclass(frozen=True, slots=True)
class Rewound:
    """The sequences a session's view leaves out: inclusive ranges, sorted, apart."""

    ranges: tuple[tuple[int, int], ...] = ()
    markers: int = 0
    """How many ids ``rewind-1``, ``rewind-2``, ... the log holds, in a row (the next marker is
    ``rewind-<markers + 1>``); a message of a client's that took one of these ids is not a marker."""

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and any(lo <= seq <= hi for lo, hi in self.ranges)

    def hidden_between(self, after: int, before: int) -> int:
        """Return how many sequences s with ``after < s < before`` are left out."""
        return sum(max(0, min(hi, before - 1) - max(lo, after + 1) + 1) for lo, hi in self.ranges)


def _merged(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


async def rewound_ranges(store: SessionStore, tenant: str, session_id: str,
                         state: Mapping[str, object] | None = None) -> Rewound:
    """Return what the session's rewind markers leave out (one index lookup when there are none).

    Given the session's `state`, as a run holds it: a session never rewound (no ``REWINDS_KEY``) costs
    no lookup at all.
    """
    if state is not None and not state.get(REWINDS_KEY):
        return Rewound()
    ranges: list[tuple[int, int]] = []
    n = 0
    while (seq := await store.message_seq(tenant, session_id, f"rewind-{n + 1}")) is not None:
        page = await store.load(tenant, session_id, after=seq - 1, before=seq + 1)
        if page.messages and is_marker(page.messages[0]):  # a client's message may carry such an id: passed over
            ranges.append((int(page.messages[0].metadata[MARKER_KEY]["to"]) + 1, seq))
        n += 1
    return Rewound(_merged(ranges), n)


async def view_messages(store: SessionStore, tenant: str, session_id: str, *, rewound: Rewound | None = None,
                        before: int | None = None, after: int = 0,
                        limit: int | None = None) -> list[tuple[int, Message]]:
    """Return the newest `limit` view messages (all when None) with ``after < seq < before``, and their sequences.

    Rewound ranges are stepped over without being read.
    """
    rewound = rewound if rewound is not None else await rewound_ranges(store, tenant, session_id)
    found: list[list[tuple[int, Message]]] = []
    count = 0
    end = before
    while limit is None or count < limit:
        for lo, hi in reversed(rewound.ranges):  # step over a rewound range the walk stands in
            if end is not None and lo < end <= hi + 1:
                end = lo
        size = _PAGE if limit is None else min(_PAGE, limit - count)
        page = await store.load(tenant, session_id, limit=size, before=end, after=after)
        kept = [(s, m) for s, m in enumerate(page.messages, page.first_seq) if s not in rewound]
        if limit is not None:
            kept = kept[max(0, len(kept) - (limit - count)):]
        found.append(kept)
        count += len(kept)
        if page.first_seq <= after + 1 or not page.messages:
            break
        end = page.first_seq
    return [entry for part in reversed(found) for entry in part]


async def view_tail(store: SessionStore, tenant: str, session_id: str, rewound: Rewound, floor: int,
                    count: Callable[[list[Message]], list[int]], bound: int | None, limit: int | None,
                    first_page: int) -> list[tuple[int, Message]]:
    """Return the newest view messages after `floor` whose `count` fits `bound`, at most `limit`, oldest first.

    Read backward page by page (the first `first_page` messages, each further page twice the one before).
    """
    kept: list[tuple[int, Message]] = []
    total, before, size, full = 0, None, first_page, False
    while not full:
        want = size if limit is None else min(size, limit - len(kept))
        page = await view_messages(store, tenant, session_id, rewound=rewound, before=before, after=floor, limit=want)
        counts = count([m for _, m in page])
        for entry, tokens in zip(reversed(page), reversed(counts), strict=True):
            if bound is not None and total + tokens > bound:
                full = True
                break
            kept.append(entry)
            total += tokens
        full = full or len(page) < want or (limit is not None and len(kept) >= limit)
        before, size = (page[0][0] if page else before), 2 * size
    kept.reverse()
    return kept


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One message of the raw log, as `read_log` returns it."""

    seq: int
    message: Message
    rewound: bool
    """True when a rewind left it out of the view (markers count as rewound)."""


async def read_log(store: SessionStore, tenant: str, session_id: str, *, limit: int | None = None) -> list[LogEntry]:
    """Return the newest `limit` messages of the raw log (all when None), each marked rewound or not."""
    rewound = await rewound_ranges(store, tenant, session_id)
    page = await store.load(tenant, session_id, limit=limit)
    return [LogEntry(s, m, s in rewound) for s, m in enumerate(page.messages, page.first_seq)]


async def _snapped(store: SessionStore, tenant: str, session_id: str, rewound: Rewound, to: int) -> int:
    """Return `to`, or the sequence before the tool exchange it falls in."""
    window = await view_messages(store, tenant, session_id, rewound=rewound, before=to + 1, limit=_WINDOW)
    messages = [m for _, m in window]
    while window and unanswered_calls(messages):
        i = max(i for i, m in enumerate(messages) if m.role == "assistant")
        to = window[i][0] - 1
        window, messages = window[:i], messages[:i]
    return to


async def rewind(store: SessionStore, tenant: str, session_id: str, to: int, lease: Lease) -> int:
    """Append a marker leaving the view's messages after `to` out (under `lease`); return the point kept.

    The point moves back to before a tool exchange it falls in; ``to=0`` rewinds everything (a session
    not stored yet has nothing to rewind: no marker is written). Raises
    `UsageError` when `to` is past the end of the log or itself rewound.
    """
    if type(to) is not int or to < 0:
        raise UsageError(f"to must be a log sequence of 0 or more (0 rewinds everything), got {to!r}")
    rewound = await rewound_ranges(store, tenant, session_id)
    last = (await store.load(tenant, session_id, limit=1)).last_seq
    if to > last:
        raise UsageError(f"cannot rewind {tenant}/{session_id} to sequence {to}: its log ends at {last}")
    if to in rewound:
        raise UsageError(f"sequence {to} of {tenant}/{session_id} is already rewound; rewind to a sequence in "
                         "the view (Agent.history lists them)")
    to = await _snapped(store, tenant, session_id, rewound, to) if to else 0
    # Counted in the session's state first: a crash before the marker leaves a count and no rewind (a lookup
    # more), never a marker that loads skip looking for.
    session = await store.get_session(tenant, session_id)
    if session is None:
        return 0  # no session, no log: nothing to leave out
    session.state[REWINDS_KEY] = rewound.markers + 1
    await store.save_session(session, lease=lease)
    marker = Message("system", (TextPart(f"[rewound: messages after sequence {to} are left out]"),),
                     id=f"rewind-{rewound.markers + 1}", metadata={MARKER_KEY: {"to": to}})
    await store.append(tenant, session_id, [marker], lease=lease)
    return to


async def fork(store: SessionStore, tenant: str, session_id: str, at: int, new_id: str, lease: Lease) -> int:
    """Copy the view of `session_id` up to sequence `at` into the empty session `new_id` (under its `lease`).

    Returns how many messages were copied. The fork keeps the messages' ids (its own log, so a later
    rewind or run of either session leaves the other as it was), the session's state and its artifacts
    (`contextpipe.artifacts`: the handles copied tool results name read the same there). It copies
    rather than shares: every store's log is numbered 1, 2, 3 ... per session, and the run, its
    replay of retried input and compaction's checkpoints all count on that; a shared prefix would
    need a second numbering in all of them. So the copy is cheap instead: the store copies the stored
    rows on its side (`SessionStore.copy_view`), without decoding them. The cost is measured in
    ``bench/results/rewind.json``.
    """
    if (await store.load(tenant, new_id, limit=1)).messages:
        raise UsageError(f"cannot fork into {tenant}/{new_id}: it has messages already; name a new session")
    source = await store.get_session(tenant, session_id)
    if source is None:
        raise UsageError(f"cannot fork {tenant}/{session_id}: there is no such session")
    rewound = await rewound_ranges(store, tenant, session_id)
    if at in rewound:
        raise UsageError(f"sequence {at} of {tenant}/{session_id} is rewound; fork at a sequence in the view")
    at = await _snapped(store, tenant, session_id, rewound, at) if at > 0 else 0
    # The state first: a crash before the copy leaves a fork with state and no messages, which a retry takes.
    target = await store.get_session(tenant, new_id) or Session(new_id, tenant)  # saved under the lease
    target.state.update(source.state)
    target.state.pop(REWINDS_KEY, None)  # the copied view holds no marker
    await store.save_session(target, lease=lease)
    # The store copies the rows on its side where it can: a 1,000,000-message fork on SQLite in 10.5 s instead
    # of 52.4 s page by page, 10,000 in 54 ms instead of 160 (bench/results/rewind*.json); `copy_pages`, the
    # plain copy, is the reference it is tested against (and what Redis uses).
    copied = await store.copy_view(tenant, session_id, new_id, upto=at, skip=rewound.ranges, lease=lease)
    if copied is None:
        copied = await copy_pages(store, tenant, session_id, new_id, at, rewound, lease)
    from .stores._artifacts_sql import copy_artifacts  # here: a store without artifacts never loads them

    await copy_artifacts(store, tenant, session_id, new_id, lease)  # the handles the copied messages name
    return copied


async def copy_pages(store: SessionStore, tenant: str, session_id: str, new_id: str, at: int, rewound: Rewound,
                     lease: Lease) -> int:
    """Copy the view of `session_id` up to `at` into `new_id` page by page (decoded, appended again); return the count.

    The plain copy, for a store whose `SessionStore.copy_view` offers none, and the reference the stores' copies
    are tested against.
    """
    copied, after = 0, 0
    while after < at:
        page = await store.load(tenant, session_id, after=after, before=min(at, after + _PAGE) + 1)
        batch = [m for s, m in enumerate(page.messages, page.first_seq) if s not in rewound]
        if batch:
            await store.append(tenant, new_id, batch, lease=lease)
        copied += len(batch)
        if not page.messages:
            break
        after = page.last_seq
    return copied


@contextlib.asynccontextmanager
async def leased(store: SessionStore, tenant: str, session_id: str, wait: float) -> AsyncIterator[Lease]:
    """Hold the session's lease as a run does (`SessionBusy` when a run holds it past `wait` seconds)."""
    lease = await store.acquire_lease(tenant, session_id, "rewind-" + os.urandom(8).hex(), wait=wait)
    try:
        yield lease
    finally:
        await store.release_lease(lease)


async def last_user_seq(store: SessionStore, tenant: str, session_id: str, *, before: int | None = None) -> int:
    """Return the sequence of the view's last user message (before `before`); `UsageError` if there is none."""
    rewound = await rewound_ranges(store, tenant, session_id)
    while True:
        window = await view_messages(store, tenant, session_id, rewound=rewound, before=before, limit=_PAGE)
        for seq, message in reversed(window):
            if message.role == "user" and not is_late_result(message):
                return seq
        if len(window) < _PAGE:
            raise UsageError(f"{tenant}/{session_id} has no user message to answer again")
        before = window[0][0]


async def rewound_ids(store: SessionStore, tenant: str, session_id: str, *, limit: int = 10_000,
                      state: Mapping[str, object] | None = None) -> list[str]:
    """Return the ids of the session's rewound messages, the newest `limit` of them (for recall to leave out).

    `state` as for `rewound_ranges`: a session never rewound costs no lookup.
    """
    rewound = await rewound_ranges(store, tenant, session_id, state)
    ids: list[str] = []
    for lo, hi in reversed(rewound.ranges):
        page = await store.load(tenant, session_id, after=lo - 1, before=hi + 1, limit=limit - len(ids))
        ids += [m.id for m in page.messages if not is_marker(m)]
        if len(ids) >= limit:
            break
    return ids
