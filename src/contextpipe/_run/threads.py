"""The worker threads of a run's sync tools, kept until what each one produced is in the log.

A sync tool runs in a worker thread (`contextpipe.tools.ToolThread`), and nothing can stop a thread
from outside. So when the run stops waiting for one, the thread goes on, and the run keeps hold of
it (`RunThreads`) instead of forgetting it:

- the tool's ``timeout`` passed: the model is answered with a timeout error and the run goes on;
  when the thread finishes, its real result is recorded as a late result
  (`contextpipe.exchanges.late_result`) before the next model call, or at the end of the run;
- the run was cancelled (or failed) while the thread ran: the call has no result yet, and the
  run waits for the thread before it ends, then records the thread's result as the call's own.

Either way the run ends, and gives its session's lease back, only once every thread it started has
finished and its result is saved: the heartbeat keeps the lease alive meanwhile, a second run gets
`SessionBusy`, no resumed run can start the same call again while the first still runs, and no
call that completed is ever answered "interrupted". The wait is bounded by nothing but the threads
(a cancellation, even repeated, does not cut it short); only a lost lease does, since the run may
then write nothing more anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..messages import FunctionResult

if TYPE_CHECKING:
    from ..messages import FunctionCall, Message
    from ..tools import ToolThread

__all__ = ["RunThreads", "raise_swallowed_cancellation", "wait_through_cancellation"]

Guard = Callable[[Awaitable[Any]], Awaitable[Any]]


@dataclass(slots=True, eq=False)
class _Kept:
    call: FunctionCall
    thread: ToolThread
    answer: Message | None = None
    """The tool message answering the call, once the run built it (the thread's result or a timeout error)."""
    saved: bool = False
    """True once `answer` is saved."""


class RunThreads:
    """The tool threads one run started, each kept until its result (or late result) is saved."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: list[_Kept] = []

    def __bool__(self) -> bool:
        return bool(self._kept)

    def started(self, call: FunctionCall, thread: ToolThread) -> None:
        """Keep `thread`, which runs `call` (the tool tells it before anything waits for the thread)."""
        self._kept.append(_Kept(call, thread))

    def answering(self, call: FunctionCall, message: Message) -> None:
        """Note that `message` answers `call` and is being saved (a timeout error, or the thread's own result)."""
        for kept in self._kept:  # a handful at most: most runs keep none
            if kept.call is call:
                kept.answer = message

    def saved(self, call: FunctionCall) -> None:
        """Forget `call`'s thread once its answer is saved, unless a late result is still to come."""
        if not self._kept:
            return
        for kept in self._kept:
            if kept.call is call:
                kept.saved = True
        self._kept = [k for k in self._kept if k.call is not call or k.thread.timed_out]

    def running(self) -> bool:
        """Tell whether a kept thread still runs: the run stays open, its lease renewed, until none does."""
        return any(not k.thread.outcome.done() for k in self._kept)

    def unanswered(self, call: FunctionCall) -> bool:
        """Tell whether `call` has a thread kept and no answer yet: `finish` gives it the thread's result."""
        return any(k.call is call and k.answer is None for k in self._kept)

    def late(self) -> list[tuple[FunctionCall, FunctionResult]]:
        """Return (and forget) the calls answered with a timeout whose thread has finished since, with its result."""
        done = [k for k in self._kept if k.thread.timed_out and k.answer is not None and k.thread.outcome.done()]
        if not done:
            return []
        self._kept = [k for k in self._kept if k not in done]
        return [(k.call, _result(k)) for k in done]

    def unsaved(self) -> list[Message]:
        """Return the answers built but perhaps not saved (their save was cut): saving them again is idempotent.

        Each message comes once, though it may answer several calls (the repair of an interrupted run).
        """
        answers = {k.answer.id: k.answer for k in self._kept if k.answer is not None and not k.saved}
        return list(answers.values())

    def finish(self) -> tuple[list[tuple[FunctionCall, FunctionResult]], list[tuple[FunctionCall, FunctionResult]]]:
        """Once every thread is done: return the unanswered calls with their results, and the late results."""
        unanswered = [(k.call, _result(k)) for k in self._kept if k.answer is None]
        late = [(k.call, _result(k)) for k in self._kept if k.answer is not None and k.thread.timed_out]
        self._kept = []
        return unanswered, late

    async def wait(self, guard: Guard) -> bool:
        """Wait until every kept thread has finished, whatever cancels the wait; return whether something did.

        `guard` is the run's (`StepWriter.guard`): a lost lease ends the wait with `LeaseLost`. The
        task defers its cancellations meanwhile, and says so (`Task.uncancel`): nothing, the lease's
        heartbeat included, takes it for a task being cancelled while it waits on purpose. The caller
        raises `CancelledError` again once the threads are done.
        """
        task = asyncio.current_task()
        cancelled = _defer_cancellation(task)
        pending = [k.thread.outcome for k in self._kept if not k.thread.outcome.done()]
        while pending:
            waiter = asyncio.ensure_future(asyncio.wait(pending))  # cancelling it leaves the threads' futures be
            try:
                await guard(waiter)
            except asyncio.CancelledError:
                cancelled = True  # the thread still runs: keep the session until it is done
                _defer_cancellation(task)
            finally:
                waiter.cancel()
            pending = [f for f in pending if not f.done()]
        return cancelled


def raise_swallowed_cancellation() -> None:
    """Raise `CancelledError` if the current task is being cancelled although nothing raised it.

    Something swallowed the cancellation: a driver that catches it and returns (redis-py on Python
    3.11 awaits reads with `asyncio.wait_for`, which returns a read that completed as the
    cancellation came), or a tool that does. The run calls this at each step boundary so a
    cancelled run ends there instead of going on. A cancellation withdrawn on purpose
    (`Task.uncancel`, as `RunThreads.wait` does) does not count.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _defer_cancellation(task: asyncio.Task[Any] | None) -> bool:
    """Withdraw `task`'s pending cancellation requests (to raise `CancelledError` later); return whether it had any."""
    if task is None or not task.cancelling():
        return False
    while task.cancelling():
        task.uncancel()
    return True


def _result(kept: _Kept) -> FunctionResult:
    outcome = kept.thread.outcome
    call = kept.call
    if outcome.cancelled():
        return FunctionResult(call.call_id, f"Error: the thread running tool {call.name!r} was cancelled.",
                              is_error=True)
    error = outcome.exception()
    if error is not None:  # a KeyboardInterrupt or SystemExit raised in the thread
        return FunctionResult(call.call_id, f"Error: tool {call.name!r} raised {type(error).__name__}: {error}",
                              is_error=True)
    value = outcome.result()
    return FunctionResult(call.call_id, value.result, value.is_error, value.parts)


async def wait_through_cancellation(awaitable: Awaitable[Any]) -> bool:
    """Run `awaitable` to its end even if the waiting task is cancelled (its error is raised); return whether it was."""
    current = asyncio.current_task()
    cancelled = _defer_cancellation(current)
    task = asyncio.ensure_future(awaitable)
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
            _defer_cancellation(current)
    task.result()
    return cancelled
