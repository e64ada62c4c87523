"""The lease heartbeat's two ways to wait for a first renewal renew alike, on a virtual clock.

`Heartbeat(shared_timer=True)` (the default) waits for a run's first renewal on one timer shared by
the event loop's runs; ``shared_timer=False`` starts a task per run. Both must renew the same
leases at the same times and stop a run whose lease is lost at the same moment. The runs here
go on an event loop whose clock only moves when nothing is ready to run (it jumps to the next
timer), so the times are exact and no test waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Durability, Heartbeat, LeaseLost, tool
from contextpipe.providers import History
from contextpipe.stores import Lease, MemoryStore
from contextpipe.testing import ScriptedModel, tool_call


class _JumpingSelector:
    """A selector that never blocks: where the loop would wait for a timer, the clock jumps to it."""

    def __init__(self, real: selectors.BaseSelector, loop: VirtualClockLoop) -> None:
        self._real, self._loop = real, loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = self._real.select(0)
        if not events and timeout:
            self._loop.now += timeout
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``asyncio.sleep(3600)`` returns at once, an hour later."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self._selector = _JumpingSelector(self._selector, self)  # type: ignore[has-type,assignment]

    def time(self) -> float:
        return self.now


class RecordingStore(MemoryStore):
    """Records each renewal's (virtual time, session); the `lose_at`-th renewal of a session finds it lost."""

    def __init__(self, lose_at: dict[str, int | None]) -> None:
        super().__init__()
        self.lose_at = lose_at
        self.renewals: list[tuple[float, str]] = []

    async def renew_lease(self, lease: Lease) -> Lease:
        self.renewals.append((asyncio.get_running_loop().time(), lease.session_id))
        count = sum(1 for _, s in self.renewals if s == lease.session_id)
        if count == self.lose_at[lease.session_id]:
            raise LeaseLost.taken_over(self.backend, lease.key, lease.token, lease.token + 1)
        return await super().renew_lease(lease)


@tool
async def work(seconds: float) -> str:
    """Take `seconds` (of the loop's clock)."""
    await asyncio.sleep(seconds)
    return "worked"


@dataclass(frozen=True)
class Run:
    interval: int
    """Seconds between renewals."""
    work: float
    """Seconds the run's one tool call takes (never a renewal time: a half second past a whole one)."""
    lose_at: int | None
    """The renewal that finds the lease lost (1 = the first), or None."""


def _play(runs: list[Run], shared_timer: bool) -> tuple[list[tuple[float, str]], list[tuple[str, float]]]:
    """Start every run at time 0; return the renewals and how and when each run ended."""
    store = RecordingStore({f"s{i}": r.lose_at for i, r in enumerate(runs)})
    ended: list[tuple[str, float]] = []

    async def one(i: int, run: Run) -> None:
        beat = Heartbeat(interval=float(run.interval), shared_timer=shared_timer)
        agent = Agent(ScriptedModel([tool_call("work", seconds=run.work), "done"]), tools=[work],
                      providers=[History(store)],
                      durability=Durability(heartbeat=beat))
        session = await agent.session(f"s{i}")
        try:
            outcome = (await agent.run("go", session=session)).text
        except LeaseLost:
            outcome = "lost"
        ended.append((f"s{i}:{outcome}", asyncio.get_running_loop().time()))

    async def main() -> None:
        await asyncio.gather(*(one(i, r) for i, r in enumerate(runs)))

    loop = VirtualClockLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return sorted(store.renewals), sorted(ended)  # runs renewing at the same instant may do so in either order


def _expected(i: int, run: Run) -> tuple[list[tuple[float, str]], tuple[str, float]]:
    """What the heartbeat must do for `run` alone: renew every interval until the work is done or the lease is lost."""
    times = [float(k * run.interval) for k in range(1, int(run.work // run.interval) + 1)]
    if run.lose_at is not None and run.lose_at <= len(times):
        times = times[:run.lose_at]
        return [(t, f"s{i}") for t in times], (f"s{i}:lost", times[-1])
    return [(t, f"s{i}") for t in times], (f"s{i}:done", run.work)


runs_strategy = st.lists(
    st.builds(Run, interval=st.integers(1, 30), work=st.integers(0, 120).map(lambda n: n + 0.5),
              lose_at=st.none() | st.integers(1, 4)),
    min_size=1, max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(runs_strategy)
def test_the_shared_timer_and_a_task_per_run_renew_alike_and_stop_a_lost_run_alike(runs: list[Run]) -> None:
    shared = _play(runs, shared_timer=True)
    own_task = _play(runs, shared_timer=False)
    assert shared == own_task
    expected = [_expected(i, r) for i, r in enumerate(runs)]
    assert shared[0] == sorted(t for renewals, _ in expected for t in renewals)
    assert shared[1] == sorted(end for _, end in expected)


def test_a_run_shorter_than_one_interval_renews_nothing_either_way() -> None:
    for shared_timer in (True, False):
        renewals, ended = _play([Run(interval=10, work=9.5, lose_at=1)], shared_timer)
        assert renewals == [] and ended == [("s0:done", 9.5)]


class _SwallowingModel(ScriptedModel):
    """A model whose call takes `seconds` and returns its answer even when cancelled meanwhile (as redis-py can)."""

    def __init__(self, seconds: float, script: list[Any]) -> None:
        super().__init__(script)
        self.seconds = seconds

    async def complete(self, request: Any) -> Any:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(self.seconds)
        return await super().complete(request)


def test_a_lost_lease_whose_cancellation_the_model_call_swallowed_ends_the_run_with_lease_lost() -> None:
    """The heartbeat's cancellation is withdrawn, not left on the caller's task to be taken for the caller's own."""
    store = RecordingStore({"s0": 1, "s1": None})
    seen: list[tuple[str, int]] = []

    async def main() -> None:
        agent = Agent(_SwallowingModel(2.5, ["one", "two"]), providers=[History(store)],
                      durability=Durability(heartbeat=Heartbeat(interval=1.0)))
        session = await agent.session("s0")
        task = asyncio.current_task()
        assert task is not None
        try:
            await agent.run("go", session=session)
            seen.append(("done", task.cancelling()))
        except LeaseLost:
            seen.append(("lost", task.cancelling()))
        except asyncio.CancelledError:
            seen.append(("cancelled", task.cancelling()))
        # The task is not left cancelled: its next run (on another session) is not stopped at once.
        other = Agent(ScriptedModel(["three"]), providers=[History(store)])
        seen.append(((await other.run("again", session=await other.session("s1"))).text, task.cancelling()))

    loop = VirtualClockLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert seen == [("lost", 0), ("three", 0)]
