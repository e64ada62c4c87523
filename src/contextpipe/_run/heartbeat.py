"""The lease heartbeat: renews a run's lease in the background for as long as the run lives.

A run's lease is renewed every ``lease.ttl / 3`` seconds (by default), whatever the run is doing:
a slow model call, a long tool, a provider hook. If a renewal fails with `LeaseLost` (another
worker took the session over, or it was deleted), the heartbeat tells its owner (the step writer,
`LeaseHolder.lease_lost`), which stops the run.

The heartbeat is bound to the run: it renews nothing once `LeaseHolder.over` says the run is over
(its task is done, or it is on its way out, `contextpipe._run.way_out`), nor while its task is
being cancelled (`LeaseHolder.paused`; it goes on beating, since `asyncio.timeout` inside a
driver's call cancels the task and then withdraws the cancellation, and the run goes on), and it
ends after `stop` whatever a renewal in progress does. `stop` waits for that renewal (so it cannot
land after the lease is given back) but no longer than the lease's TTL: a driver that swallows the
cancellation of a renewal cannot keep a run from ending, nor keep renewing its lease.

Two ways to wait for the first renewal, chosen by `Heartbeat.shared_timer`:

- the plain one (``shared_timer=False``): the run starts its own task at once, and the task
  renews every interval, waiting with `Heartbeat.sleep`;
- the fast path (``shared_timer=True``, the default): the run joins `_FirstRenewals`, one timer
  per event loop for every run waiting for its first renewal, and starts the same task only when
  that renewal is due. A run shorter than one interval (almost every run) starts no task and
  arms no timer of its own. Both renew the same leases at the same times
  (`tests/test_heartbeat.py` checks it on a virtual clock).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from typing import TYPE_CHECKING, Protocol

from ..errors import LeaseLost

if TYPE_CHECKING:
    from ..config import Heartbeat
    from ..stores.base import Lease, SessionStore
    from .way_out import WayOut

__all__ = ["LeaseHeartbeat", "LeaseHolder"]


class LeaseHolder(Protocol):
    """What a heartbeat keeps alive: the holder of a run's lease (the step writer)."""

    store: SessionStore
    lease: Lease | None
    """The current lease; the heartbeat replaces it with each renewal, and stops once it is None."""

    def lease_lost(self, error: LeaseLost) -> None:
        """Take note that a renewal failed: the run no longer holds the session."""

    def over(self) -> bool:
        """Return True once the run is over for its lease (done, or on its way out): renew no more."""

    def paused(self) -> bool:
        """Return True while the run is being cancelled and nothing holds it open: skip the renewal that is due."""


class LeaseHeartbeat:
    """One run's heartbeat: `start` it once the run holds its lease, `stop` it when the run is over."""

    __slots__ = ("_beat", "_holder", "_stopped", "_task", "_waiting")

    def __init__(self, holder: LeaseHolder, heartbeat: Heartbeat) -> None:
        self._holder = holder
        self._beat = heartbeat
        self._task: asyncio.Task[None] | None = None
        self._waiting: _FirstRenewals | None = None  # holds this heartbeat until its first renewal is due
        self._stopped = False

    def interval(self) -> float:
        """Seconds until the next renewal."""
        lease = self._holder.lease
        assert lease is not None
        return self._beat.interval if self._beat.interval is not None else lease.ttl / 3

    def start(self) -> None:
        """Start renewing: from the event loop's shared timer, or from a task of the run's own."""
        # The seam: both branches renew at the same times (tests/test_heartbeat.py). The shared timer
        # makes a run that ends before its first renewal (almost all of them) start no task and arm
        # no timer: 20,000 short runs at once on one event loop (MemoryStore, a one-call model) take
        # 505 µs each with it against 914 µs with a heartbeat task per run, 1,000 at once 415 against
        # 698 µs (bench/heartbeat_bench.py, best of 5, on a shared 2-core machine).
        if self._beat.shared_timer:
            self._waiting = _FirstRenewals.of(asyncio.get_running_loop())
            self._waiting.add(self, self.interval())
        else:
            self._task = asyncio.ensure_future(self._renew())

    def first_renewal_due(self) -> None:
        """Renew now (the run outlived one interval), then keep renewing in the background."""
        self._waiting = None
        if self._holder.lease is not None and not self._holder.over():
            self._task = asyncio.ensure_future(self._renew(waited=not self._holder.paused()))

    async def _renew(self, *, waited: bool = False) -> None:
        """Renew the lease until the run is over or a renewal fails (then tell the holder)."""
        holder = self._holder
        while not self._stopped:
            if not waited:
                await self._beat.sleep(self.interval())
            waited = False
            lease = holder.lease
            if lease is None or self._stopped or holder.over():
                return
            if holder.paused():  # a cancellation withdrawn (`asyncio.timeout` in a driver) lets the next beat renew
                continue
            try:
                renewed = await holder.store.renew_lease(lease)
            except LeaseLost as exc:
                if not self._stopped:
                    holder.lease_lost(exc)
                return
            except Exception:
                continue
            if holder.lease is lease and not self._stopped:
                holder.lease = renewed

    async def stop(self, way_out: WayOut | None = None) -> None:
        """Stop renewing (the run is over); wait for a renewal in progress, but not past the lease's TTL.

        On a cancelled run's way out the wait takes its time from `way_out` instead.
        """
        self._stopped = True
        if self._waiting is not None:
            self._waiting.discard(self)
            self._waiting = None
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        if way_out is not None:
            await way_out.wait(task)
            return
        await asyncio.sleep(0)  # a heartbeat asleep ends here (no timer to arm for the common case)
        if task.done():
            return
        lease = self._holder.lease
        timer = asyncio.ensure_future(self._beat.sleep(lease.ttl if lease is not None else 0.0))
        try:
            await asyncio.wait([task, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()


class _Due(Protocol):
    def first_renewal_due(self) -> None: ...


class _FirstRenewals:
    """The runs of one event loop waiting for their lease's first renewal, all on one timer.

    A run is over long before its first renewal is due (a third of the lease's TTL) almost
    always: registering it costs a dict entry instead of a timer of its own, and the timer is armed
    again only when a run is due before the one it is armed for. When the timer fires, every run
    that is due starts its heartbeat (`LeaseHeartbeat.first_renewal_due`), and the timer is armed
    for the next one. The runs wait in a heap by due time, so a firing touches only the runs that
    are due (and entries of runs already over, dropped as they come to the top): many long runs at
    once cost O(log n) each, not a scan of all of them per firing.
    """

    __slots__ = ("_at", "_due", "_loop", "_order", "_queue", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: dict[_Due, float] = {}
        self._queue: list[tuple[float, int, _Due]] = []  # (due, order, run); over runs' entries stay
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

    def add(self, run: _Due, delay: float) -> None:
        """Call ``run.first_renewal_due()`` in `delay` seconds (unless it is discarded first)."""
        when = self._loop.time() + delay
        self._due[run] = when
        heapq.heappush(self._queue, (when, next(self._order), run))
        if when < self._at:
            self._arm(when)

    def discard(self, run: _Due) -> None:
        """Forget `run` (it is over)."""
        self._due.pop(run, None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = self._loop.call_at(when, self._fire), when

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        now = self._loop.time() + _EARLY
        queue, due = self._queue, self._due
        while queue:
            when, _, run = queue[0]
            if due.get(run) != when:  # the run is over (or waits under a newer entry)
                heapq.heappop(queue)
            elif when <= now:
                heapq.heappop(queue)
                del due[run]
                run.first_renewal_due()
            else:
                self._arm(when)
                break


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _FirstRenewals] = weakref.WeakKeyDictionary()

_EARLY = 0.001
"""Seconds a first renewal may start early (the event loop runs a timer up to its clock resolution early)."""
