"""`StepWriter`: everything a run saves, fenced by the one lease the run holds.

The agent acquires the lease and creates the writer; the loop hands it each step; the agent alone
releases the lease at the end. The writer saves:

- per step (the default): the request messages each storing history provider keeps, with the first
  model output; then every model output and every tool result as soon as it exists; a run
  interrupted before its first model output was saved (a cancelled task, Ctrl-C) still saves the
  request messages, so the caller's input is never lost;
- per run: everything once, when the run has succeeded;
- summary checkpoints (for compaction), the session's state and, when asked, the run's traces.

While the run lives, a background *heartbeat* renews the lease every ``lease.ttl / 3`` seconds (by
default; until the first renewal a run only waits on one timer shared by the event loop's runs,
so a run shorter than that starts no task and arms no timer of its own), whatever the
run is doing: a slow model call, a long tool, a provider hook. If a renewal
fails with `LeaseLost` (another worker took the session over, or it was deleted), the writer
refuses every further write and `guard` stops whatever the run is awaiting at once (in-flight
tools are cancelled) with that error.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import LeaseLost
from .providers.base import accepts_keyword
from .stores.base import Checkpoint

if TYPE_CHECKING:
    from .messages import Message
    from .pipeline import RunContext
    from .providers.base import HistoryProvider
    from .session import Session
    from .stores.base import Lease, SessionStore

__all__ = ["Heartbeat", "StepWriter"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """How a run keeps its session's lease alive in the background.

    The lease is renewed every `interval` seconds (None: a third of the lease's TTL), waiting with
    `sleep`; tests pass a `sleep` that waits for an explicit signal instead of the clock.
    """

    interval: float | None = None
    """Seconds between renewals; None renews every ``ttl / 3``, well inside the TTL."""
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)
    """Waits between renewals (``asyncio.sleep`` unless a test drives the beats itself)."""


class StepWriter:
    """Saves one run's messages, checkpoints and session state, fenced by the run's lease."""

    def __init__(self, *, store: SessionStore, session: Session | None, lease: Lease | None,
                 history_providers: Sequence[HistoryProvider], per_step: bool,
                 heartbeat: Heartbeat | None = None) -> None:
        self.store = store
        """The store holding the session (and the lease)."""
        self.session = session
        """The session, or None for a run without one."""
        self.lease = lease
        """The run's current lease (renewals replace it), None without a session."""
        self.per_step = per_step
        """True when each step is saved as it happens; False saves once at the end."""
        self._providers: list[HistoryProvider] = []
        self._loader: HistoryProvider | None = None
        for p in history_providers:
            if p.stores_anything:
                self._providers.append(p)
            if self._loader is None and p.load_messages:
                self._loader = p
        self._request_saved = False  # the request messages were handed to a save
        self._request_stored = False  # ... and that save returned
        self.lost: LeaseLost | None = None
        """Set when a renewal failed: the run no longer holds the session and must stop."""
        self._inside: asyncio.Task[Any] | None = None  # the task awaiting inside `guard`, if any
        self._stopped = False  # the heartbeat cancelled that task
        self._beating: asyncio.Task[None] | None = None
        self._waiting: _FirstRenewals | None = None  # holds this writer until its first renewal is due
        if lease is not None:
            beat = heartbeat or Heartbeat()
            if beat.sleep is asyncio.sleep:  # no task until the first renewal is due: a short run starts none
                self._waiting = _FirstRenewals.of(asyncio.get_running_loop())
                self._waiting.add(self, beat)
            else:
                self._beating = asyncio.ensure_future(self._beat(beat))

    # --- the lease ----------------------------------------------------------------------------------

    def _interval(self, heartbeat: Heartbeat) -> float:
        assert self.lease is not None
        return heartbeat.interval if heartbeat.interval is not None else self.lease.ttl / 3

    def _start(self, heartbeat: Heartbeat) -> None:
        """Renew now (the run outlived one renewal interval), then keep renewing in the background."""
        self._waiting = None
        if self.lease is not None:
            self._beating = asyncio.ensure_future(self._beat(heartbeat, waited=True))

    async def _beat(self, heartbeat: Heartbeat, *, waited: bool = False) -> None:
        """Renew the lease until the run ends or a renewal fails (then stop the run)."""
        while self.lease is not None:
            if not waited:
                await heartbeat.sleep(self._interval(heartbeat))
            waited = False
            lease = self.lease
            if lease is None:
                return
            try:
                renewed = await self.store.renew_lease(lease)
            except LeaseLost as exc:
                exc.add_note("the run was stopped: another run took this session over (or it was deleted) "
                             "while this one was still working; nothing more was saved")
                self.lost = exc
                if self._inside is not None:
                    self._stopped = True
                    self._inside.cancel()
                return
            except Exception:
                continue
            if self.lease is lease:
                self.lease = renewed

    def check(self) -> None:
        """Raise the `LeaseLost` that stopped the run, if the lease was lost."""
        if self.lost is not None:
            raise self.lost

    async def guard(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable`, but stop it at once (and raise `LeaseLost`) if the lease is lost meanwhile."""
        if self.lost is not None:
            raise self.lost
        if self.lease is None or self._inside is not None:
            return await awaitable
        task = asyncio.current_task()
        if task is None:
            return await awaitable
        self._inside = task
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._stopped:  # the heartbeat cancelled it: the lease is gone, not the caller's doing
                self._stopped = False
                task.uncancel()
                raise self.lost from None  # type: ignore[misc]
            raise
        finally:
            self._inside = None

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
                        with_request: bool = True, durable: bool = True) -> list[Message]:
        """Save a step now (per-step mode only) and return what the first storing provider was given.

        Each storing provider gets `response`, preceded on the first such call by the request
        messages it stores (unless `with_request` is False). ``durable=False`` is for writes a crash
        would repair anyway (the result of an idempotent tool: a resumed run runs it again); the
        next model output is saved durably, which makes them durable too.
        """
        if not self.per_step or not self.stores_messages:
            return []
        first = with_request and not self._request_saved
        self._request_saved = self._request_saved or with_request
        saved = await self._save(ctx, response, with_request=first, durable=durable)
        self._request_stored = self._request_stored or first
        return saved

    async def save_input(self, ctx: RunContext) -> None:
        """Keep the request messages of a run stopped before they were saved (per-step mode only).

        A run interrupted (a cancelled task, Ctrl-C) before its first model answer was saved would
        otherwise lose the caller's input, which is saved with that answer. Appending is idempotent
        by message id, so the input is stored once even if an interrupted save did land.
        """
        if self._request_stored or not self.per_step or not self.stores_messages:
            return
        self._request_saved = True
        await self._save(ctx, [], with_request=True)
        self._request_stored = True

    async def save_run(self, ctx: RunContext, response: Sequence[Message]) -> None:
        """Save a whole successful run at once (per-run mode only)."""
        if self.per_step or not self.stores_messages:
            return
        await self._save(ctx, response, with_request=True)

    async def _save(self, ctx: RunContext, response: Sequence[Message], *, with_request: bool,
                    durable: bool = True) -> list[Message]:
        session = self.session
        assert session is not None
        if self.lost is not None:
            raise self.lost
        saved: list[Message] | None = None
        for provider in self._providers:
            batch = provider.select_request(ctx) if with_request else []
            batch.extend(provider.select_response(response))
            if batch and not durable and not with_request and accepts_keyword(provider.save, "durable"):
                await provider.save(session, batch, lease=self.lease_for(provider), durable=False)  # type: ignore[call-arg]
            elif batch:
                await provider.save(session, batch, lease=self.lease_for(provider))
            if saved is None:
                saved = batch
        return saved or []

    async def save_checkpoint(self, seq: int, summary: Message) -> bool:
        """Have the history provider that loaded the messages keep `summary` as standing for the log up to `seq`."""
        if self.session is None or self._loader is None:
            return False
        self.check()
        checkpoint = Checkpoint(seq, summary, time.time())
        return await self._loader.save_checkpoint(self.session, checkpoint, lease=self.lease_for(self._loader))

    async def save_session(self, traces: Sequence[dict[str, Any]] = ()) -> None:
        """Save the session's state (compare-and-swap) and, when given, the run's traces."""
        session = self.session
        if session is None:
            return
        self.check()
        await self.store.save_session(session, lease=self.lease)
        if traces:
            await self.store.append_traces(session.tenant, session.id, list(traces), lease=self.lease)

    async def release(self) -> None:
        """Stop the heartbeat and give the session's lease back (the run is over)."""
        if self._waiting is not None:
            self._waiting.discard(self)
            self._waiting = None
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
            self._beating = None
        if self.lease is not None:
            lease, self.lease = self.lease, None
            if self.lost is None:
                await self.store.release_lease(lease)


class _FirstRenewals:
    """The runs of one event loop waiting for their lease's first renewal, all on one timer.

    A run is over long before its first renewal is due (a third of the lease's TTL) almost
    always: registering it costs a dict entry instead of a timer of its own, and the timer is armed
    again only when a run is due before the one it is armed for. When the timer fires, every run
    that is due starts its heartbeat (`StepWriter._start`), and the timer is armed for the next one.
    The runs wait in a heap by due time, so a firing touches only the runs that are due (and entries
    of runs already over, dropped as they come to the top): many long runs at once cost
    O(log n) each, not a scan of all of them per firing.
    """

    __slots__ = ("_at", "_due", "_loop", "_order", "_queue", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: dict[StepWriter, tuple[float, Heartbeat]] = {}
        self._queue: list[tuple[float, int, StepWriter]] = []  # (due, order, writer); over runs' entries stay
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _FirstRenewals:
        """Return the waiting runs of `loop`."""
        renewals = _BY_LOOP.get(loop)
        if renewals is None:
            renewals = _BY_LOOP[loop] = cls(loop)
        return renewals

    def add(self, writer: StepWriter, heartbeat: Heartbeat) -> None:
        """Start `writer`'s heartbeat when its first renewal is due (unless it is discarded first)."""
        when = self._loop.time() + writer._interval(heartbeat)
        self._due[writer] = (when, heartbeat)
        heapq.heappush(self._queue, (when, next(self._order), writer))
        if when < self._at:
            self._arm(when)

    def discard(self, writer: StepWriter) -> None:
        """Forget `writer` (its run is over)."""
        self._due.pop(writer, None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = self._loop.call_at(when, self._fire), when

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        now = self._loop.time() + _EARLY
        queue, due = self._queue, self._due
        while queue:
            when, _, writer = queue[0]
            waiting = due.get(writer)
            if waiting is None or waiting[0] != when:  # the run is over (or waits under a newer entry)
                heapq.heappop(queue)
            elif when <= now:
                heapq.heappop(queue)
                del due[writer]
                writer._start(waiting[1])
            else:
                self._arm(when)
                break


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _FirstRenewals] = weakref.WeakKeyDictionary()

_EARLY = 0.001
"""Seconds a first renewal may start early (the event loop runs a timer up to its clock resolution early)."""
