"""The way out of a cancelled run: what it still does gets the lease's TTL in all, whatever a driver does.

A cancelled run still saves what it has (its input, results that exist, what its tool threads
produced), calls the providers' `after_run`, saves the session's state and gives its lease back.
Each of those calls may reach a driver, and a driver may swallow a cancellation and go on waiting
(redis-py 8.1.0 does, now and then). So on the way out each call runs in a task of its own, and the
run waits for it only while its `WayOut` has time: one budget, the lease's TTL, started by the first
call and shared by all that follow. A call still waiting when the budget is spent is cancelled and
abandoned (`WayOutExpired`), and the run goes on out (a call that does not wait, having nothing to
do, still ends). The heartbeat renews nothing from the start
of the way out (`StepWriter.over`), so by then the lease has expired anyway: nothing an abandoned
call could still write is accepted, and the session is free for the next run.

While a run's sync tool threads hold it open (`contextpipe._run.threads`) the way out has not begun:
the run keeps its lease, renewed, until they have finished; the way out begins after, with saving
what they produced. A cancellation repeated during the way out does not cut it short (the run
ends with `CancelledError` all the same); only the budget does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["WayOut", "WayOutExpired"]

T = TypeVar("T")


class WayOutExpired(TimeoutError):
    """A call on a cancelled run's way out was abandoned: the way out's time (the lease's TTL) was spent."""

    def __init__(self, ttl: float) -> None:
        super().__init__(
            f"abandoned after {ttl:g} s (the lease's TTL) on the way out of a cancelled run: the store (or a "
            "provider) did not answer in that time (what it was asked may have been done all the same); the "
            "lease is renewed no more, so the session is free for the next run within that time; if it "
            "happens often, check the store server's health")


class WayOut:
    """What is left of a cancelled run's way out: `ttl` seconds from its first call, waited with `sleep`."""

    __slots__ = ("_sleep", "_timer", "ttl")

    def __init__(self, ttl: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.ttl = ttl
        """Seconds the whole way out may take (the lease's TTL)."""
        self._sleep = sleep  # the heartbeat's (a test drives it)
        self._timer: asyncio.Future[None] | None = None

    @property
    def started(self) -> bool:
        """True once the way out has begun (its first call)."""
        return self._timer is not None

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable` in a task of its own while time is left; raise `WayOutExpired` if it runs out first."""
        call = asyncio.ensure_future(awaitable)
        if not await self.wait(call):
            raise WayOutExpired(self.ttl)
        return call.result()

    async def wait(self, call: asyncio.Future[Any]) -> bool:
        """Wait for `call` while time is left; return whether it is done (if not, it is cancelled and abandoned)."""
        if self._timer is None:
            self._timer = asyncio.ensure_future(self._sleep(self.ttl))
            self._timer.add_done_callback(_retrieve)
        timer = self._timer
        while not call.done():
            try:
                if timer.done():  # the time is spent, but a call that need not wait (nothing to do) still ends
                    await asyncio.sleep(0)
                    break
                await asyncio.wait([call, timer], return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                continue  # the run ends with CancelledError anyway: only the budget cuts its way out short
        if call.done():
            return True
        call.cancel()  # a driver may ignore this too: the call is left behind either way
        call.add_done_callback(_retrieve)
        return False

    def close(self) -> None:
        """Stop the way out's timer (the run is over)."""
        if self._timer is not None:
            self._timer.cancel()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Take an abandoned call's outcome, so asyncio reports no exception that was never retrieved."""
    if not future.cancelled():
        future.exception()
