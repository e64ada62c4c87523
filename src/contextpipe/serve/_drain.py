"""Shutdown on SIGTERM / SIGINT: drain the runs in flight while the server still listens, then let it stop.

An ASGI server (uvicorn) stops accepting connections as soon as a signal comes. Until the runs in
flight have ended, though, the process can still answer: its routes refuse new work with 503
``ShuttingDown`` and ``Retry-After``, which a client or load balancer retries elsewhere, where a
closed socket would read as a refused connection. So the signal first starts the drain, and
reaches the server's own handler only when the drain is over.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ._runs import RunManager

__all__ = ["drain", "drain_on_signals"]

log = logging.getLogger("contextpipe.serve")


async def drain(runs: RunManager, grace: float) -> None:
    """Let the runs in flight finish within `grace` seconds (or the deadline a signal set), cancel the rest."""
    cancelled = await runs.drain(grace)
    if cancelled:
        log.warning("shutdown: %d run(s) did not finish in time and were cancelled", cancelled)


def drain_on_signals(runs: RunManager, timeout: float) -> Callable[[], object]:
    """Make SIGTERM / SIGINT drain `runs` (`timeout` seconds) before the server's own handler runs; return an undo.

    The server listens on meanwhile. A second signal goes to the server's handler at once (uvicorn:
    stop listening, the runs keep the rest of their time; a third SIGINT quits). Call it in the
    server's event loop.
    """
    if threading.current_thread() is not threading.main_thread():
        return list
    loop = asyncio.get_running_loop()
    installed: dict[int, Any] = {}
    tasks: set[asyncio.Task[None]] = set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        async def then_stop(signum: int, previous: Callable[..., Any] = previous) -> None:
            await drain(runs, timeout)
            previous(signum, None)

        def start(signum: int, then_stop: Callable[[int], Any] = then_stop) -> None:
            task = loop.create_task(then_stop(signum))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def handler(signum: int, frame: FrameType | None, previous: Callable[..., Any] = previous,
                    start: Callable[[int], None] = start) -> None:
            if runs.draining:
                previous(signum, frame)
                return
            runs.begin_drain(timeout)
            loop.call_soon_threadsafe(start, signum)  # (a signal handler may not touch the loop's task list)

        signal.signal(sig, handler)
        installed[sig] = previous

    def restore() -> None:
        for sig, previous in installed.items():
            signal.signal(sig, previous)

    return restore
