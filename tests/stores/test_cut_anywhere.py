"""Wherever a run with new input is cut, its session's log keeps every tool exchange whole, on every backend.

One property, on a run that has it all: it answers the calls a crashed worker left open (tools that
are idempotent, async or sync, and one that is not), calls a sync tool that outlives its timeout,
then an async one, then answers. The run is cancelled at its n-th cut point (the history loaded,
each tool's start, each save just before and just after it lands, in the order the run reaches
them): the run stops there until the test has cancelled it, so where it is cut is exact. Then the log must be valid
(no unanswered call before another message, no orphan result), hold the input exactly once, have
the late result of a tool thread that completed, and a resumed run must finish it; no call to a
tool that is not idempotent ever runs twice.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, FunctionCall, FunctionResult, Message, tool
from contextpipe.exchanges import LATE_RESULT_KEY, exchange_problem, tool_message, unanswered_calls
from contextpipe.models import ModelRequest
from contextpipe.providers import History, LoadedHistory
from contextpipe.session import Session
from contextpipe.stores import Lease, SessionStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from helpers import describe

WAIT = 60.0
"""Bound on a blocked thread's wait: it only stops a broken test from hanging the suite."""


class Cuts:
    """The run's cut points: the `at`-th one reached blocks until the test releases it (after cancelling)."""

    def __init__(self, at: int) -> None:
        self.at, self.count = at, 0
        self.loop = asyncio.get_running_loop()
        self.reached = asyncio.Event()
        self.released = asyncio.Event()
        self.thread_released = threading.Event()
        self._lock = threading.Lock()

    def _hit(self) -> bool:
        with self._lock:
            self.count += 1
            hit = self.count == self.at
        if hit:
            self.loop.call_soon_threadsafe(self.reached.set)
        return hit

    async def point(self) -> None:
        if self._hit():
            await self.released.wait()

    def thread_point(self) -> None:
        if self._hit():
            self.thread_released.wait(WAIT)

    def release(self) -> None:
        self.thread_released.set()
        self.released.set()


class CutHistory(History):
    """History with a cut point once it has loaded the log, just before each save and just after it landed."""

    def __init__(self, store: SessionStore, cuts: Cuts) -> None:
        super().__init__(store)
        self.cuts = cuts

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        await self.cuts.point()
        await super().save(session, messages, lease=lease, durable=durable)
        await self.cuts.point()

    async def load_view(self, session: Session, *, lease_token: int | None = None) -> LoadedHistory:
        view = await super().load_view(session, lease_token=lease_token)
        await self.cuts.point()
        return view


def closed(log: list[Message]) -> list[Message]:
    """Return `log` with the calls still open at its very end answered, as the next run's repair does."""
    if not (open_calls := unanswered_calls(log)):
        return log
    return [*log, tool_message(open_calls, [FunctionResult(c.call_id, "repaired") for c in open_calls])]


LEFT_OPEN = st.lists(st.sampled_from(["async", "sync", "plain"]), max_size=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(left_open=LEFT_OPEN, at=st.integers(1, 24))
async def test_property_a_run_cut_anywhere_leaves_a_valid_log_with_its_input_and_every_result(
        store: SessionStore, tenant: str, left_open: list[str], at: int) -> None:
    cuts = Cuts(at)
    runs: Counter[str] = Counter()  # runs of each call to a tool that is not idempotent
    builds = [threading.Event()]  # the last one is the current run's: its model's answer sets it

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        await cuts.point()
        return "Sunny"

    @tool(idempotent=True)
    def get_time(city: str) -> str:
        """Return the local time in a city."""
        cuts.thread_point()
        return "09:00"

    @tool
    async def send_email(to: str) -> str:
        """Send an email."""
        runs["send_email"] += 1
        return "sent"

    @tool(timeout=0.001)  # blocks until the model answers (or the run is cut): the timeout always comes first
    def build_report(ref: str) -> str:
        """Build the monthly report."""
        runs[ref] += 1
        builds[-1].wait(WAIT)
        return "report ready"

    @tool
    async def notify_team(text: str) -> str:
        """Tell the team."""
        await cuts.point()
        runs[text] += 1
        return "told"

    question = Message.user("Make the report and tell the team.")
    ids = iter(range(100))

    def plan(request: ModelRequest) -> Turn | str:
        """Build the report, then tell the team, then answer (whatever part of it the log already holds)."""
        after = [m for i, m in enumerate(request.messages) if any(p.id == question.id for p in request.messages[:i])]
        called = {c.name for m in after for c in m.function_calls}
        if "build_report" not in called:
            return tool_call("build_report", ref=(ref := f"b{next(ids)}"), call_id=ref)
        if "notify_team" not in called:
            return tool_call("notify_team", text=(ref := f"n{next(ids)}"), call_id=ref)
        builds[-1].set()  # the thread returns after the answer: its late result comes at the end of the run
        return "Done."

    tools = {"async": ("get_forecast", '{"city": "Suzhou"}'), "sync": ("get_time", '{"city": "Suzhou"}'),
             "plain": ("send_email", '{"to": "bob@x.org"}')}
    calls = tuple(FunctionCall(f"c{i}", *tools[kind]) for i, kind in enumerate(left_open))
    session_id = f"cut-{uuid.uuid4().hex[:8]}"
    session = await store.load_or_create(tenant, session_id)
    log: list[Any] = [Message.user("Weather in Suzhou?")]
    if calls:
        log.append(Message("assistant", calls))
    await store.append(tenant, session_id, log)
    agent = Agent(ScriptedModel([plan] * 8), tools=[get_forecast, get_time, send_email, build_report, notify_team],
                  providers=[CutHistory(store, cuts)])

    run = asyncio.create_task(agent.run(question, session=session))
    reached = asyncio.create_task(cuts.reached.wait())
    try:
        await asyncio.wait([run, reached], return_when=asyncio.FIRST_COMPLETED)
        if reached.done():
            run.cancel()
    finally:
        reached.cancel()
        cuts.release()
        builds[-1].set()
    try:
        await run
    except asyncio.CancelledError:
        assert cuts.count >= at
    stored = (await store.load(tenant, session_id)).messages
    assert exchange_problem(closed(stored)) is None, describe(stored)  # calls open at the very end: the next run's
    assert [m.id for m in stored].count(question.id) == 1, describe(stored)
    late = {m.metadata[LATE_RESULT_KEY] for m in stored if LATE_RESULT_KEY in m.metadata}
    assert late == {ref for ref in runs if ref.startswith("b")}, describe(stored)  # each thread's result is kept

    builds.append(threading.Event())
    try:
        resumed = await agent.run(None, session=await store.load_or_create(tenant, session_id))
    finally:
        builds[-1].set()
    stored = (await store.load(tenant, session_id)).messages
    assert exchange_problem(stored) is None, describe(stored)
    assert resumed.text == "Done." and [m.id for m in stored].count(question.id) == 1, describe(stored)
    assert runs["send_email"] == 0 and set(runs.values()) <= {1}, runs  # no call run twice
