r"""The `SessionStore` contract every backend implements.

A store holds, per tenant and session:

- an append-only message log numbered 1, 2, 3, ... with no gaps (appends of a batch are atomic and
  idempotent by message id: a retried append never duplicates, and the messages it does store take
  the next sequences), so a page is named by its first sequence and each sequence from 1 to the
  last names one message (readers such as the server's forward paging count on it);
- the session record (state and version; saves compare-and-swap on the version);
- a lease with a fencing token, so runs on one session never interleave and a run whose lease was
  taken over cannot write any more;
- summary checkpoints: a summary message covering the log up to a sequence, so later loads read the
  latest checkpoint plus the messages after it;
- prompt traces, when the agent is asked to store them, for inspecting runs later;
- an outbox (SQLite, PostgreSQL, memory: `keeps_outbox`): the entries tool calls added through
  ``ctx.outbox``, written with the message carrying them in the same atomic append
  (`contextpipe.outbox`), listed by `outbox` until `mark_delivered`.

A session is named by a `SessionKey` (tenant and id); the public methods take ``tenant, session_id``
and validate them into a key first. Every failure is a `ContextPipeError`: driver and network
errors become `StoreError` naming the backend (and, for servers, the server that failed).

The contract's ceremony is done once, here: each public method validates its arguments (keys,
limits, batches, cursors), translates driver errors and runs the deletion hooks, around one
protected method on a `SessionKey` (`_get`, `_save`, `_append`, `_load`, ...) that a backend
implements (the checks and the translation themselves are in `_checks`). Adding a method means a
public template here and one protected method per backend.

Text is stored as Unicode. Any Python string can be stored, including lone surrogates such as
``"\\ud800"`` (which UTF-8 cannot encode): they are written as JSON escapes and come back unchanged.
The one documented replacement: two surrogate code points that form a valid pair
(``"\\ud83d\\ude00"``) come back as the single character they encode (``"\\U0001f600"``), as JSON
decoding does everywhere.

Loads are bounded: `load` returns the tail (the last `limit` messages, or a page before a sequence,
or everything after a checkpoint) without reading the whole session. Sessions may carry a TTL:
every write pushes the expiry forward, an expired session reads as absent, a session never expires
while a run holds its lease (each renewal moves the expiry with the lease), and deleting a session
removes its messages, state, lease and checkpoints together.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

from ..config import DEFAULT_LEASE_TTL
from ..errors import SessionBusy, StoreError, UsageError
from ..messages import Message
from ..outbox import OutboxEntry
from ..session import Session, SessionKey, validate_tenant
from ..session import user_id as user_id_of
from ._checks import (
    check_bounds,
    check_limit,
    decode_cursor,
    duplicate_in_batch,
    encode_cursor,
    kept_ranges,
    key_and_limit,
    key_of,
    to_store_error,
)
from ._records import Checkpoint, Erased, Lease, MessagePage, SessionInfo, SessionListing

__all__ = [
    "Checkpoint", "Erased", "Lease", "MessagePage", "OutboxEntry", "SessionDeletedHook", "SessionInfo", "SessionKey",
    "SessionListing", "SessionStore",
]

SessionDeletedHook = Callable[[SessionKey], Awaitable[None]]
"""An ``async`` callback told the key of each session a store deleted (see `on_session_deleted`)."""


class SessionStore(abc.ABC):
    """A durable (or in-memory) log of sessions; see the module docstring for the contract.

    A backend implements the protected methods (``_get``, ``_save``, ...), each on a validated
    `SessionKey`; the public ones around them are the same for every backend.
    """

    backend: str = "abstract"
    """Short backend name used in errors (``memory``, ``sqlite``, ...)."""
    driver: str = ""
    """Top-level package of the database driver, whose exceptions surface as `StoreError`."""
    answer_timeout: float | None = None
    """How long the store waits for its server to answer a command (None: no server)."""
    keeps_outbox: bool = False
    """True when appends keep the outbox entries messages carry, for `outbox` and `mark_delivered`."""
    _lease_polling: bool = False
    """True: `acquire_lease` waiters poll on their own, in no order (the reference for `_lease_line`). 50 runs
    queued on one session are served in order, 90x (SQLite) and 7.5x (PostgreSQL) faster in line than polling
    (bench/results/lease-line.json)."""

    @property
    def server(self) -> str:
        """What errors name as the place that failed: ``host:port`` of a server, a file's path."""
        return self.backend

    def _store_error(self, exc: Exception) -> StoreError:
        """Return the `StoreError` standing for a driver or network error `exc` (`to_store_error`).

        Any other exception (contextpipe's own, a programming error) is raised again as it is. The
        public methods raise what it returns, so every backend's errors are translated here, once.
        """
        error = to_store_error(exc, backend=self.backend, server=self.server, driver=self.driver,
                               timeout=self.answer_timeout)
        if error is None:
            raise exc  # unchanged (not chained to itself)
        return error

    # --- session records -------------------------------------------------------------------------

    async def get_session(self, tenant: str, session_id: str) -> Session | None:
        """Return the stored session, or None if there is none (or it expired).

        A session exists once it has saved state or messages; taking its lease alone does not
        create it.
        """
        try:
            return await self._get(key_of(tenant, session_id))
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def load_or_create(self, tenant: str, session_id: str, *, ttl: float | None = None) -> Session:
        """Return the stored session, creating and storing an empty one if there is none."""
        existing = await self.get_session(tenant, session_id)
        if existing is not None:
            return existing
        session = Session(session_id, tenant, ttl=ttl)
        try:
            await self.save_session(session)
        except StoreError:  # another process created it first (ConcurrentUpdate), or the write failed
            raced = await self.get_session(tenant, session_id)
            if raced is None:
                raise
            return raced
        return session

    async def save_session(self, session: Session, *, lease: Lease | None = None) -> None:
        """Store `session`'s state if the stored version still equals ``session.version``.

        On success ``session.version`` is incremented. Raises `ConcurrentUpdate` when the stored
        version differs, `LeaseLost` when `lease` is stale and `SessionBusy` when another run holds
        the lease and none is given.
        """
        try:
            session.version = await self._save(session.key, session, lease)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def delete_session(self, tenant: str, session_id: str) -> bool:
        """Delete the session and everything stored for it; return whether it existed.

        The `on_session_deleted` hooks run after the session is gone.
        """
        return await self.erase_session(tenant, session_id) is not None

    async def erase_session(self, tenant: str, session_id: str) -> Erased | None:
        """Delete the session like `delete_session`; return what went (None: there was no session).

        It is the one deletion the append-only log allows (retention, a user's erasure): the rows go,
        not a marker. A lease some run holds goes with them (that run's next write gets `LeaseLost`).
        """
        key = key_of(tenant, session_id)
        try:
            erased = await self._delete(key)
        except Exception as exc:
            raise self._store_error(exc) from exc
        if erased is not None:
            await self._notify_deleted([key])
        return erased

    async def user_sessions(self, tenant: str, user_id: str) -> list[str]:
        """Return the ids of the tenant's sessions that belong to `user_id` (``session.state["user_id"]``).

        It reads every session of the tenant (a page of the listing, then each record): meant for
        rare whole-user operations such as `Agent.forget_user`, not for a request path.
        """
        found, cursor = [], None
        while True:
            page = await self.list_sessions(tenant, limit=500, cursor=cursor)
            for info in page.sessions:
                session = await self.get_session(tenant, info.session_id)
                if session is not None and user_id_of(session) == user_id:
                    found.append(info.session_id)
            if (cursor := page.next_cursor) is None:
                return found

    def on_session_deleted(self, hook: SessionDeletedHook) -> Callable[[], None]:
        """Call `hook` with the key of every session this store deletes; return a function that unregisters it.

        Hooks run after `delete_session` deleted a session, and for an expired session when the store
        removes it (`purge_expired` on every backend; the embedded and SQL stores also remove an expired
        session when they meet it). Other stores keeping per-session data (a vector store's memories)
        use it to delete theirs, so the cascade is the same on every backend. Every hook is called; if
        any fails, a `StoreError` says which after all have run (from `delete_session` and
        `purge_expired`; when a write met the expired session, the failure is logged to the
        ``contextpipe.stores`` logger instead, since the write itself has been done).

        >>> import asyncio
        >>> from contextpipe.stores import MemoryStore
        >>> store, gone = MemoryStore(), []
        >>> async def note(key: SessionKey) -> None:
        ...     gone.append(key.id)
        >>> unregister = store.on_session_deleted(note)
        >>> async def demo() -> None:
        ...     await store.append("default", "chat-1", [Message.user("hi")])
        ...     await store.delete_session("default", "chat-1")
        >>> asyncio.run(demo()); gone
        ['chat-1']
        """
        hooks = self._hooks()
        hooks.append(hook)

        def unregister() -> None:
            if hook in hooks:
                hooks.remove(hook)

        return unregister

    def _hooks(self) -> list[SessionDeletedHook]:
        hooks: list[SessionDeletedHook] | None = self.__dict__.get("_session_deleted_hooks")
        if hooks is None:
            hooks = self.__dict__["_session_deleted_hooks"] = []
        return hooks

    async def _notify_deleted(self, keys: Sequence[SessionKey]) -> None:
        """Run the `on_session_deleted` hooks for `keys` (every hook, then one error if any failed)."""
        failures: list[tuple[SessionKey, BaseException]] = []
        for key in keys:
            for hook in list(self._hooks()):
                try:
                    await hook(key)
                except Exception as exc:  # every hook runs; the failures are reported together below
                    failures.append((key, exc))
        if failures:
            key, first = failures[0]
            raise StoreError(
                f"{self.backend} store: {key} was deleted, but {len(failures)} on_session_deleted hook call(s) "
                f"failed, the first with {type(first).__name__}: {first}",
                backend=self.backend, tenant=key.tenant, session_id=key.id,
            ) from first

    async def _notify_restarted(self, keys: Sequence[SessionKey]) -> None:
        """Run the hooks for sessions already deleted by an operation that goes on (or fails); a failure is logged.

        Used for expired sessions a write met and started afresh (the write has been done, so a hook's
        failure must not read as the write's), and for those a purge removed before it failed.
        """
        try:
            await self._notify_deleted(keys)
        except StoreError:
            logging.getLogger("contextpipe.stores").exception(
                "%s store: deletion hooks failed for expired sessions started afresh", self.backend)

    async def list_sessions(self, tenant: str, *, limit: int = 50, cursor: str | None = None) -> SessionListing:
        """List the tenant's sessions, most recently updated first, `limit` per page."""
        validate_tenant(tenant)
        check_limit(limit)
        try:
            found = await self._list(tenant, limit, decode_cursor(cursor) if cursor is not None else (float("inf"), ""))
        except Exception as exc:
            raise self._store_error(exc) from exc
        page = found[:limit]
        next_cursor = encode_cursor(page[-1].updated_at, page[-1].session_id) if len(found) > limit else None
        return SessionListing(page, next_cursor)

    async def purge_expired(self) -> int:
        """Delete every session whose TTL has passed (all tenants); return how many were deleted."""
        try:
            gone = await self._purge()
        except Exception as exc:
            raise self._store_error(exc) from exc
        await self._notify_deleted(gone)
        return len(gone)

    # --- message log -----------------------------------------------------------------------------

    async def append(
        self,
        tenant: str,
        session_id: str,
        messages: Sequence[Message],
        *,
        lease: Lease | None = None,
        durable: bool = True,
    ) -> int:
        """Append `messages` atomically and return the sequence of the last one.

        Messages whose id is already in the log are skipped, so a retried append never duplicates.

        With ``durable=False`` the store may acknowledge the append before it would survive a power
        loss or OS crash (it still survives the process being killed); a later durable write makes it,
        and everything written before it, durable. Use it for writes a crash would repair anyway.
        Stores whose every write is equally durable (servers, memory) ignore it.
        """
        key = key_of(tenant, session_id)
        if len({m.id for m in messages}) != len(messages):
            raise duplicate_in_batch(key)
        try:
            return await self._append(key, messages, lease, durable)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def load(
        self,
        tenant: str,
        session_id: str,
        *,
        limit: int | None = None,
        before: int | None = None,
        after: int | None = None,
    ) -> MessagePage:
        """Return the newest `limit` messages (all when None) with `after` < sequence < `before`.

        Raises `CorruptRecord` naming the session and sequence of any message that cannot be read,
        and `UsageError` for a bound that is not an int of at least 0 (a negative one, a bool, a float).
        """
        key = key_and_limit(tenant, session_id, limit)
        check_bounds(before, after)
        try:
            return await self._load(key, limit, before, after)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def message_seq(self, tenant: str, session_id: str, message_id: str) -> int | None:
        """Return the sequence of message `message_id` in the log, or None: one lookup in the ids' index."""
        try:
            return await self._message_seq(key_of(tenant, session_id), message_id)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def copy_view(self, tenant: str, source: str, target: str, *, upto: int,
                        skip: Sequence[tuple[int, int]] = (), lease: Lease | None = None) -> int | None:
        """Copy the messages 1 to `upto` of `source`, but those in the `skip` ranges, to the empty log of `target`.

        The store copies the stored rows as they are, without decoding them; the copies are numbered
        1, 2, 3 ... and keep their ids, and the write is fenced by `lease` (on `target`) as an append is.
        Returns how many were copied, or None when the store offers no such copy or declines this one,
        copying nothing (SQLite and PostgreSQL decline when a row does not read as JSON there: a
        damaged one, or one holding NaN or Infinity, which the codec writes but SQL's JSON does not):
        `contextpipe.rewind.fork` then copies page by page (`copy_pages`, the reference each store's
        copy is tested against).
        `skip` holds inclusive ``(first, last)`` ranges.
        """
        source_key, target_key = key_of(tenant, source), key_of(tenant, target)
        kept = kept_ranges(upto, skip)
        try:
            return await self._copy_view(source_key, target_key, kept, lease)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def load_context(
        self, tenant: str, session_id: str, *, limit: int | None = None
    ) -> tuple[Checkpoint | None, MessagePage]:
        """Return what a run starts from: the latest checkpoint and the messages after it.

        At most the newest `limit` messages after the checkpoint are returned. Backends may do
        this in one round trip.
        """
        key = key_and_limit(tenant, session_id, limit)
        try:
            return await self._load_context(key, limit)
        except Exception as exc:
            raise self._store_error(exc) from exc

    # --- checkpoints -----------------------------------------------------------------------------

    async def save_checkpoint(
        self, tenant: str, session_id: str, checkpoint: Checkpoint, *, lease: Lease | None = None
    ) -> None:
        """Store a summary checkpoint; its `seq` must not be past the end of the log."""
        try:
            await self._save_checkpoint(key_of(tenant, session_id), checkpoint, lease)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def latest_checkpoint(self, tenant: str, session_id: str) -> Checkpoint | None:
        """Return the checkpoint with the highest sequence, or None."""
        try:
            return await self._latest_checkpoint(key_of(tenant, session_id))
        except Exception as exc:
            raise self._store_error(exc) from exc

    # --- leases ----------------------------------------------------------------------------------

    async def try_acquire_lease(self, tenant: str, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the session's lease if it is free or expired; None if another run holds it."""
        try:
            return await self._try_acquire_lease(key_of(tenant, session_id), owner, ttl)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def renew_lease(self, lease: Lease) -> Lease:
        """Extend `lease`, and its session's expiry with it, by its ttl.

        Raises `LeaseLost` if the lease was taken over or its session is gone (deleted, or expired after
        the lease lapsed); the error says which.
        """
        try:
            return await self._renew_lease(lease)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up (a no-op if it was already taken over)."""
        try:
            await self._release_lease(lease)
        except Exception as exc:
            raise self._store_error(exc) from exc
        if (line := self.__dict__.get("_lease_line")) is not None:
            line.released(lease.key)  # the next run of this process in line asks at once

    async def acquire_lease(
        self, tenant: str, session_id: str, owner: str, *, ttl: float = DEFAULT_LEASE_TTL, wait: float = 0.0
    ) -> Lease:
        """Take the session's lease, waiting up to `wait` seconds; raises `SessionBusy` if it stays held.

        Runs of this process waiting on one session get it first come, first served (`_lease_line`); runs of
        other processes compete with them through the store. ``wait=0`` never goes ahead of a waiting run.
        """
        if wait <= 0 and "_lease_line" not in self.__dict__:  # nobody has waited here: one try, no import
            if (lease := await self.try_acquire_lease(tenant, session_id, owner, ttl)) is None:
                raise SessionBusy.held(self.backend, key_of(tenant, session_id))
            return lease
        from ._lease_line import acquire  # lazily: a run that never waits does not load it

        return await acquire(self, key_of(tenant, session_id), owner, ttl, wait)

    # --- traces ----------------------------------------------------------------------------------

    async def append_traces(
        self, tenant: str, session_id: str, traces: Sequence[dict[str, Any]], *, lease: Lease | None = None
    ) -> None:
        """Store prompt traces (``PromptTrace.to_dict`` output) with the session, after the earlier ones."""
        try:
            await self._append_traces(key_of(tenant, session_id), traces, lease)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def load_traces(self, tenant: str, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Return the session's stored traces, oldest first (the newest `limit` when given)."""
        key = key_and_limit(tenant, session_id, limit)
        try:
            return await self._load_traces(key, limit)
        except Exception as exc:
            raise self._store_error(exc) from exc

    # --- outbox ----------------------------------------------------------------------------------

    async def outbox(self, tenant: str, *, topic: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        """Return the tenant's outbox entries not yet marked delivered (of `topic` only, when given), oldest first.

        At most `limit` of them, in the order they were committed. Raises `UsageError` on a store
        that keeps no outbox (`keeps_outbox`).
        """
        validate_tenant(tenant)
        check_limit(limit)
        self._check_outbox()
        try:
            return await self._outbox(tenant, topic, limit)
        except Exception as exc:
            raise self._store_error(exc) from exc

    async def mark_delivered(self, tenant: str, keys: Sequence[str]) -> int:
        """Mark the tenant's outbox entries `keys` delivered (`outbox` no longer lists them); return how many were new.

        Keys that are unknown or marked already are skipped (marking again is safe).
        """
        validate_tenant(tenant)
        self._check_outbox()
        try:
            return await self._mark_delivered(tenant, list(keys)) if keys else 0
        except Exception as exc:
            raise self._store_error(exc) from exc

    def _check_outbox(self) -> None:
        if not self.keeps_outbox:
            raise UsageError(f"the {self.backend} store keeps no outbox; keep sessions whose tools write through "
                             "ctx.outbox in SQLiteStore, PostgresStore or MemoryStore")

    async def _outbox(self, tenant: str, topic: str | None, limit: int) -> list[OutboxEntry]:
        """Return the pending entries (`outbox`); stores that keep an outbox implement it."""
        raise NotImplementedError

    async def _mark_delivered(self, tenant: str, keys: list[str]) -> int:
        """Mark entries delivered (`mark_delivered`); stores that keep an outbox implement it."""
        raise NotImplementedError

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op for stores that own nothing
        """Release connections and other resources the store owns."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- what each backend implements, on a validated key (the public methods above call them) --------

    @abc.abstractmethod
    async def _get(self, key: SessionKey) -> Session | None:
        """Return the stored session (`get_session`)."""

    @abc.abstractmethod
    async def _save(self, key: SessionKey, session: Session, lease: Lease | None) -> int:
        """Store the session's state (`save_session`); return its new version."""

    @abc.abstractmethod
    async def _delete(self, key: SessionKey) -> Erased | None:
        """Delete the session (`erase_session`, which runs the hooks); return what went, None if nothing did."""

    @abc.abstractmethod
    async def _list(self, tenant: str, limit: int, after: tuple[float, str]) -> list[SessionInfo]:
        """Return the tenant's sessions after `after` (updated_at, id), in order: `limit` and one more if any."""

    @abc.abstractmethod
    async def _purge(self) -> list[SessionKey]:
        """Delete the expired sessions (`purge_expired`, which runs the hooks); return their keys."""

    @abc.abstractmethod
    async def _append(self, key: SessionKey, messages: Sequence[Message], lease: Lease | None, durable: bool) -> int:
        """Append a batch without repeated ids (`append`); return the last sequence."""

    @abc.abstractmethod
    async def _load(self, key: SessionKey, limit: int | None, before: int | None, after: int | None) -> MessagePage:
        """Return a page of the log (`load`)."""

    @abc.abstractmethod
    async def _message_seq(self, key: SessionKey, message_id: str) -> int | None:
        """Return the sequence of the message with this id, None if none (`message_seq`)."""

    async def _copy_view(self, source: SessionKey, target: SessionKey, kept: list[tuple[int, int]],
                         lease: Lease | None) -> int | None:
        """Copy the `kept` ranges of `source`'s log to `target`'s (`copy_view`); None: not offered, by default."""
        return None

    async def _load_context(self, key: SessionKey, limit: int | None) -> tuple[Checkpoint | None, MessagePage]:
        """Return the latest checkpoint and the messages after it (`load_context`): by default two calls."""
        checkpoint = await self._latest_checkpoint(key)
        return checkpoint, await self._load(key, limit, None, checkpoint.seq if checkpoint else None)

    @abc.abstractmethod
    async def _save_checkpoint(self, key: SessionKey, checkpoint: Checkpoint, lease: Lease | None) -> None:
        """Store a checkpoint (`save_checkpoint`)."""

    @abc.abstractmethod
    async def _latest_checkpoint(self, key: SessionKey) -> Checkpoint | None:
        """Return the checkpoint with the highest sequence (`latest_checkpoint`)."""

    @abc.abstractmethod
    async def _try_acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        """Take the lease if free (`try_acquire_lease`)."""

    @abc.abstractmethod
    async def _renew_lease(self, lease: Lease) -> Lease:
        """Extend the lease (`renew_lease`)."""

    @abc.abstractmethod
    async def _release_lease(self, lease: Lease) -> None:
        """Give the lease up (`release_lease`)."""

    @abc.abstractmethod
    async def _append_traces(self, key: SessionKey, traces: Sequence[dict[str, Any]], lease: Lease | None) -> None:
        """Store traces after the earlier ones (`append_traces`)."""

    @abc.abstractmethod
    async def _load_traces(self, key: SessionKey, limit: int | None) -> list[dict[str, Any]]:
        """Return the session's traces, oldest first (`load_traces`)."""
