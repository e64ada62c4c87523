"""The waiting line for a busy session's lease: runs of this process waiting on one session take it in turn.

`SessionStore.acquire_lease` with ``wait`` > 0 queues its caller here, in a line per store, per event
loop and per session. Only the head of a line asks the store, with a doubling delay (5 ms up to
100 ms) and at once when a run of this process gives the lease back (`Line.released`); the waiters
behind it ask nothing until their turn. A waiter that leaves the line (served, cancelled, out of
time, failed) passes the turn to the next, so a line is never stranded. A try without waiting
(``wait=0``) never goes ahead of a line: while one waits here, it gets `SessionBusy`.

The line is per process (and per event loop): runs of other processes and workers are not in it,
and compete with its head through the store as before. ``store._lease_polling = True`` restores
that plain reference, every waiter polling the store on its own (`poll`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Protocol, TypeVar

from ..errors import SessionBusy
from ..session import SessionKey

__all__ = ["Line", "acquire", "poll"]

FIRST_DELAY, MAX_DELAY = 0.005, 0.1
"""The head's delays between two asks: the first, doubling up to the last (the plain path's too)."""

L = TypeVar("L")
L_co = TypeVar("L_co", covariant=True)


class _Store(Protocol[L_co]):
    """What the line needs of a `SessionStore` (which it cannot import: the store imports it)."""

    backend: str
    _lease_polling: bool

    async def try_acquire_lease(self, tenant: str, session_id: str, owner: str, ttl: float) -> L_co | None: ...


async def acquire(store: _Store[L], key: SessionKey, owner: str, ttl: float, wait: float) -> L:
    """Take `key`'s lease for `owner`, in line behind the waiters of this process, within `wait` seconds."""
    if store._lease_polling:
        return await poll(store, key, owner, ttl, wait)
    line: Line | None = vars(store).get("_lease_line")
    if line is None:
        line = vars(store)["_lease_line"] = Line()
    return await line.acquire(store, key, owner, ttl, wait)


async def poll(store: _Store[L], key: SessionKey, owner: str, ttl: float, wait: float) -> L:
    """Ask the store (the plain reference) until it grants the lease or `wait` runs out, in no order."""
    deadline = time.monotonic() + wait
    delay = FIRST_DELAY
    while True:
        lease = await store.try_acquire_lease(key.tenant, key.id, owner, ttl)
        if lease is not None:
            return lease
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SessionBusy.held(store.backend, key)
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, MAX_DELAY)


class _Waiter:
    """One run in line: `wake` is set when it should look again; `ask`: whether, at the head, to ask the store now."""

    __slots__ = ("ask", "wake")

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.ask = True


class Line:
    """A store's waiting lines, one per event loop and session, each oldest first (kept only while not empty)."""

    def __init__(self) -> None:
        self._lines: dict[tuple[asyncio.AbstractEventLoop, SessionKey], deque[_Waiter]] = {}

    def waiting(self, key: SessionKey) -> int:
        """How many runs of this event loop wait in `key`'s line."""
        return len(self._lines.get((asyncio.get_running_loop(), key), ()))

    def released(self, key: SessionKey) -> None:
        """Tell `key`'s line that a run of this process gave the lease back: its head asks the store at once."""
        line = self._lines.get((asyncio.get_running_loop(), key))
        if line:
            _wake(line[0], ask=True)

    async def acquire(self, store: _Store[L], key: SessionKey, owner: str, ttl: float, wait: float) -> L:
        """Join `key`'s line and wait for the turn and the lease (`acquire`)."""
        where = (asyncio.get_running_loop(), key)
        line = self._lines.get(where)
        if wait <= 0:  # one try, and only if nobody here waits for the lease already
            lease = None if line else await store.try_acquire_lease(key.tenant, key.id, owner, ttl)
            if lease is None:
                raise SessionBusy.held(store.backend, key)
            return lease
        if line is None:
            line = self._lines[where] = deque()
        waiter = _Waiter()
        line.append(waiter)
        try:
            lease = await _turn(store, line, waiter, key, owner, ttl, time.monotonic() + wait)
        except BaseException:  # cancelled, out of time, or the store failed: the next asks at once
            self._leave(where, line, waiter, ask=True)
            raise
        self._leave(where, line, waiter, ask=False)  # the lease was just taken: the next waits for it
        return lease

    def _leave(self, where: tuple[asyncio.AbstractEventLoop, SessionKey], line: deque[_Waiter], waiter: _Waiter,
               *, ask: bool) -> None:
        was_head = line[0] is waiter
        line.remove(waiter)
        if not line:
            del self._lines[where]
        elif was_head:
            _wake(line[0], ask=ask)


def _wake(waiter: _Waiter, *, ask: bool) -> None:
    waiter.ask = ask
    waiter.wake.set()


async def _turn(store: _Store[L], line: deque[_Waiter], waiter: _Waiter, key: SessionKey, owner: str, ttl: float,
                deadline: float) -> L:
    """Wait in `line` until `waiter` is its head and the store grants it the lease, or `deadline` passes."""
    delay = FIRST_DELAY
    while True:
        head = line[0] is waiter
        if head and waiter.ask:
            waiter.ask = False
            waiter.wake.clear()  # a release from now on wakes it again
            lease = await store.try_acquire_lease(key.tenant, key.id, owner, ttl)
            if lease is not None:
                return lease
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SessionBusy.held(store.backend, key)
        try:
            async with asyncio.timeout(min(delay, remaining) if head else remaining):
                await waiter.wake.wait()
            waiter.wake.clear()
        except TimeoutError:
            if head:
                waiter.ask = True
                delay = min(delay * 2, MAX_DELAY)
