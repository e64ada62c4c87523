"""A cancelled run ends whatever its store's driver does, and its session is free again within the lease's TTL.

redis-py 8.1.0 now and then swallows a cancellation: the call catches the `CancelledError` and goes on.
Here one chosen store call does that on purpose (`Held`): the call is made (the store did the work),
then, as if it were still reading the answer, it waits for an event the test sets, dropping every
cancellation meanwhile. On Redis the hold sits inside the client (the EVALSHA of the store's script);
on the other stores in the store's method, since the run's logic is the same for all.

The run's sleeps are driven by hand (`Clock`): the heartbeat's beats (TTL / 3) and the budget of a
cancelled run's way out (TTL) each wait until the test ends them, so nothing here waits on the wall
clock to make something happen. Only the servers' lease expiry is real time (`elapse`), `TTL` seconds.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent, ContextProvider, Durability, Heartbeat, tool
from contextpipe._run.way_out import WayOutExpired
from contextpipe.models import ModelRequest
from contextpipe.pipeline import RunContext
from contextpipe.providers import History
from contextpipe.session import Session
from contextpipe.stores import Lease, SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import describe

from .backends import BACKENDS, elapse, open_store, server_address

TTL = 1.0
"""The runs' lease TTL, in seconds: the servers really wait it out once per test that lets a lease expire."""
BEAT = TTL / 3
"""The heartbeat's interval (a third of the TTL)."""
EXPIRED = str(WayOutExpired(TTL))


class Held:
    """One store call that ignores cancellation: once `arm`ed, the next call waits for `answer` after doing its work."""

    def __init__(self, *, armed: bool = True) -> None:
        self.armed = armed
        self.entered = asyncio.Event()
        self.answer = asyncio.Event()
        self.dropped = asyncio.Event()  # set once it has dropped a cancellation
        self.swallowed = 0

    def arm(self) -> None:
        self.armed = True

    async def hold(self) -> None:
        if not self.armed:
            return
        self.armed = False  # once: later calls go through
        self.entered.set()
        while not self.answer.is_set():
            try:
                await self.answer.wait()
            except asyncio.CancelledError:
                self.swallowed += 1  # what the driver does: the cancellation is dropped
                self.dropped.set()


_SCRIPTS = {"renew_lease": "_lua_renew", "append": "_lua_append", "save_session": "_lua_save"}
"""The Redis store's script behind each held method."""


def _holding_redis(url: str) -> Any:
    """A real redis-py client whose EVALSHA of a held script holds (`Held`) once the server has answered."""
    import redis.asyncio

    class HoldingRedis(redis.asyncio.Redis):
        holds: dict[str, Held]

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            result = await super().execute_command(*args, **options)
            if args[0] == "EVALSHA" and (held := self.holds.get(args[1])) is not None:
                await held.hold()
            return result

    client = HoldingRedis.from_url(url)
    client.holds = {}
    return client


class Store:
    """A real store of one backend whose chosen calls hold (`hold`), and its renewals counted."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.backend = backend
        self._client: Any = None
        if backend == "redis":
            from contextpipe.stores import RedisStore

            address = server_address("redis")
            assert address is not None
            self._client = _holding_redis(address)
            self.store: SessionStore = RedisStore(client=self._client)
        else:
            self.store = open_store(backend, tmp_path)
        self.renewals = 0
        self.renewing = asyncio.Event()  # set at each renewal's start
        renew = self.store.renew_lease

        async def counted(lease: Lease) -> Lease:
            self.renewals += 1
            self.renewing.set()
            return await renew(lease)

        self.store.renew_lease = counted  # type: ignore[method-assign]

    def hold(self, method: str, *, armed: bool = True) -> Held:
        """Make the store's `method` hold once (when armed): inside the Redis client, else in the method."""
        held = Held(armed=armed)
        if self._client is not None:
            self._client.holds[getattr(self.store, _SCRIPTS[method]).sha] = held
            return held
        real = getattr(self.store, method)

        async def holding(*args: Any, **kwargs: Any) -> Any:
            result = await real(*args, **kwargs)
            await held.hold()
            return result

        setattr(self.store, method, holding)
        return held

    async def close(self) -> None:
        await self.store.close()
        if self._client is not None:
            await self._client.aclose()


class Clock:
    """The run's sleeps, each waiting until the test ends it: the heartbeat's beats and the way out's budget."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, asyncio.Future[None]]] = []
        self._new = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        entry = (seconds, asyncio.get_running_loop().create_future())
        self.pending.append(entry)
        self._new.set()
        try:
            await entry[1]
        finally:
            self.pending.remove(entry)

    async def due(self, seconds: float, run: asyncio.Future[Any]) -> asyncio.Future[None] | None:
        """Return the pending sleep of `seconds` once there is one; None if `run` ends first."""
        while True:
            for s, future in self.pending:
                if s == seconds and not future.done():
                    return future
            if run.done():
                return None
            self._new.clear()
            new = asyncio.ensure_future(self._new.wait())
            await asyncio.wait([new, run], return_when=asyncio.FIRST_COMPLETED)
            new.cancel()

    async def end(self, seconds: float, run: asyncio.Future[Any]) -> None:
        """End the next sleep of `seconds` (it must come before `run` ends)."""
        future = await self.due(seconds, run)
        assert future is not None, f"the run ended before it slept {seconds} s"
        future.set_result(None)


@pytest.fixture(params=BACKENDS)
async def held_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(request.param, tmp_path)
    yield s
    await s.close()


@pytest.fixture
def holds() -> Iterator[list[Held]]:
    """The held calls of a test, all answered when it ends (so no task outlives the test)."""
    made: list[Held] = []
    yield made
    for held in made:
        held.answer.set()


def bounded(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Fail the test, rather than hang the suite, if a run never ends (what these tests look for): a bound only."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        async with asyncio.timeout(60):
            await test(*args, **kwargs)

    return run


def agent_on(s: Store, clock: Clock, model: ScriptedModel, **kwargs: Any) -> Agent:
    durability = Durability(lease_ttl=TTL, heartbeat=Heartbeat(sleep=clock.sleep, shared_timer=False))
    return Agent(model, providers=[History(s.store)], durability=durability, **kwargs)


def start(agent: Agent, text: str, session: Session) -> tuple[asyncio.Task[Any], list[BaseException]]:
    """Start ``agent.run`` in a task; the list gets the error it ends with (a cancelled task raises a new one)."""
    raised: list[BaseException] = []

    async def run() -> Any:
        try:
            return await agent.run(text, session=session)
        except BaseException as exc:
            raised.append(exc)
            raise

    return asyncio.create_task(run()), raised


def notes(raised: list[BaseException]) -> str:
    assert len(raised) == 1 and isinstance(raised[0], asyncio.CancelledError)
    return "\n".join(getattr(raised[0], "__notes__", []))


def thinking() -> tuple[asyncio.Event, Any]:
    """A model step that waits for ever (until cancelled); the event says it has been reached."""
    reached = asyncio.Event()

    async def step(request: ModelRequest) -> str:
        reached.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return reached, step


def heartbeat_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "LeaseHeartbeat._renew"]  # type: ignore[union-attr]


async def assert_renews_no_more(s: Store, clock: Clock, run: asyncio.Task[Any]) -> None:
    """End the heartbeat's pending beat: it must end, or wait for the next, without renewing (the run is cancelled)."""
    before = s.renewals
    s.renewing.clear()
    beating = heartbeat_tasks()
    assert len(beating) == 1
    await clock.end(BEAT, run)
    renewing = asyncio.ensure_future(s.renewing.wait())
    next_beat = asyncio.ensure_future(clock.due(BEAT, run))
    await asyncio.wait([beating[0], renewing, next_beat], return_when=asyncio.FIRST_COMPLETED)
    renewing.cancel()
    next_beat.cancel()
    assert s.renewals == before, "the heartbeat renewed the lease of a cancelled run"


async def assert_free(agent: Agent, s: Store, tenant: str, *, expired: bool) -> None:
    """Another run takes the session: at once when the lease was given back, else once its TTL has passed."""
    if expired:
        await elapse(s.store, TTL)
    result = await agent.run("Anyone there?", session=await agent.session("chat", tenant=tenant),
                             lease_wait=2 * TTL if expired else 0)
    assert result.text == "Yes."


@bounded
async def test_a_renewal_that_swallows_the_heartbeats_cancellation_does_not_keep_the_run(
        held_store: Store, holds: list[Held], tenant: str) -> None:
    s, clock = held_store, Clock()
    reached, step = thinking()
    agent = agent_on(s, clock, ScriptedModel([step, "Yes."]))
    holds.append(held := s.hold("renew_lease"))
    run, _ = start(agent, "What is new?", await agent.session("chat", tenant=tenant))
    await reached.wait()
    await clock.end(BEAT, run)
    await held.entered.wait()  # the renewal is in the driver
    run.cancel()
    await held.dropped.wait()  # the run is on its way out, stopping its heartbeat: the renewal drops that
    await clock.due(TTL, run)  # ... and the way out's time runs
    held.answer.set()  # the driver answers at last
    waiting = asyncio.ensure_future(clock.due(BEAT, run))  # the old heartbeat went on beating here
    await asyncio.wait([run, waiting], return_when=asyncio.FIRST_COMPLETED)
    assert run.done(), "the run waited for a heartbeat that swallowed its cancellation"
    with pytest.raises(asyncio.CancelledError):
        await run
    assert held.swallowed == 1 and s.renewals == 1 and not heartbeat_tasks()
    await assert_free(agent, s, tenant, expired=False)  # the lease was given back
    assert describe(await agent.history(await agent.session("chat", tenant=tenant)))[0] == "user:What is new?"


@bounded
async def test_a_renewal_that_never_answers_is_left_behind_when_the_way_out_runs_out(
        held_store: Store, holds: list[Held], tenant: str) -> None:
    s, clock = held_store, Clock()
    reached, step = thinking()
    agent = agent_on(s, clock, ScriptedModel([step, "Yes."]))
    holds.append(held := s.hold("renew_lease"))
    run, raised = start(agent, "What is new?", await agent.session("chat", tenant=tenant))
    await reached.wait()
    await clock.end(BEAT, run)
    await held.entered.wait()
    run.cancel()
    await held.dropped.wait()  # the run's way out is stopping the heartbeat, whose renewal holds
    await clock.end(TTL, run)  # ... until the way out's time runs out
    with pytest.raises(asyncio.CancelledError):
        await run
    assert s.renewals == 1  # the held renewal was the last
    # Everything was saved; only the lease may be left to expire (a store that answers at once gave it back).
    assert notes(raised) in ("", "the session's lease was not given back (it expires by itself): " + EXPIRED)
    await assert_free(agent, s, tenant, expired=True)


@bounded
async def test_a_save_that_swallows_the_cancellation_ends_the_run_before_its_tool_runs(
        held_store: Store, holds: list[Held], tenant: str) -> None:
    s, clock = held_store, Clock()
    calls = 0

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        nonlocal calls
        calls += 1
        return "sent"

    agent = agent_on(s, clock, ScriptedModel([tool_call("send_email", to="bob@example.com"), "Yes."]),
                     tools=[send_email])
    holds.append(held := s.hold("append"))
    run, _ = start(agent, "Email Bob.", await agent.session("chat", tenant=tenant))
    await held.entered.wait()  # the model's call to send_email is being saved
    run.cancel()
    await held.dropped.wait()  # the cancellation reaches the driver, which drops it
    await assert_renews_no_more(s, clock, run)
    held.answer.set()  # the save returns as if nothing had happened: the run must not go on to the tool
    with pytest.raises(asyncio.CancelledError):
        await run
    assert calls == 0 and s.renewals == 0
    await assert_free(agent, s, tenant, expired=False)
    history = describe(await agent.history(await agent.session("chat", tenant=tenant)))
    assert history[:2] == ["user:Email Bob.", "assistant:call:send_email"] and calls == 0


@bounded
async def test_a_way_out_save_that_never_answers_is_abandoned_within_the_ttl(
        held_store: Store, holds: list[Held], tenant: str) -> None:
    s, clock = held_store, Clock()
    reached, step = thinking()
    agent = agent_on(s, clock, ScriptedModel([step, "Yes."]))
    holds.append(held := s.hold("save_session", armed=False))
    session = await agent.session("chat", tenant=tenant)  # saved: the next save is the run's
    held.arm()
    run, raised = start(agent, "What is new?", session)
    await reached.wait()
    run.cancel()
    await held.entered.wait()  # the way out saves the session's state: the store does not answer
    await clock.due(TTL, run)
    await assert_renews_no_more(s, clock, run)
    await clock.end(TTL, run)
    with pytest.raises(asyncio.CancelledError):
        await run
    assert "'session state': WayOutExpired: abandoned after 1 s (the lease's TTL)" in notes(raised)
    assert s.renewals == 0
    await assert_free(agent, s, tenant, expired=True)
    assert describe(await agent.history(await agent.session("chat", tenant=tenant)))[0] == "user:What is new?"


@bounded
async def test_a_run_whose_last_save_swallows_the_cancellation_still_ends_cancelled(
        held_store: Store, holds: list[Held], tenant: str) -> None:
    s, clock = held_store, Clock()
    agent = agent_on(s, clock, ScriptedModel(["Done.", "Yes."]))
    holds.append(held := s.hold("save_session", armed=False))
    session = await agent.session("chat", tenant=tenant)
    held.arm()  # the run's last save: its session's state
    run, _ = start(agent, "Say done.", session)
    await held.entered.wait()
    run.cancel()
    await held.dropped.wait()
    held.answer.set()  # the save returns as if nothing had happened: the run must not pass for a success
    with pytest.raises(asyncio.CancelledError):
        await run
    await assert_free(agent, s, tenant, expired=False)
    assert describe(await agent.history(session))[:2] == ["user:Say done.", "assistant:Done."]


@bounded
async def test_tool_threads_keep_the_lease_then_what_they_produced_is_saved_within_the_ttl(
        held_store: Store, holds: list[Held], tenant: str) -> None:
    s, clock = held_store, Clock()
    entered, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        loop.call_soon_threadsafe(entered.set)
        release.wait(timeout=120)  # the bound only stops a broken test from hanging the suite
        return "sent"

    agent = agent_on(s, clock, ScriptedModel([tool_call("send_email", to="bob@example.com"), "Yes."]),
                     tools=[send_email])
    holds.append(held := s.hold("append", armed=False))
    run, raised = start(agent, "Email Bob.", await agent.session("chat", tenant=tenant))
    try:
        await entered.wait()
        held.arm()  # the next save, the thread's result, does not answer
        run.cancel()
        for renewals in (1, 2):  # the thread runs: the run keeps its lease, renewed
            await clock.end(BEAT, run)
            await s.renewing.wait()
            s.renewing.clear()
            assert s.renewals == renewals
    finally:
        release.set()
    await held.entered.wait()  # the thread is done: its result is being saved, the way out has begun
    await clock.due(TTL, run)
    await assert_renews_no_more(s, clock, run)
    await clock.end(TTL, run)
    with pytest.raises(asyncio.CancelledError):
        await run
    assert "could not be saved: WayOutExpired" in notes(raised)
    await assert_free(agent, s, tenant, expired=True)
    # The store did save the result before it stopped answering: the call is not reported interrupted.
    history = describe(await agent.history(await agent.session("chat", tenant=tenant)))
    assert history[:3] == ["user:Email Bob.", "assistant:call:send_email", "tool:result:sent"]


@bounded
async def test_a_cancelled_run_whose_tool_thread_runs_renews_its_lease_while_it_saves_what_finished(
        held_store: Store, holds: list[Held], tenant: str) -> None:
    s, clock = held_store, Clock()
    entered, release, go = asyncio.Event(), threading.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        loop.call_soon_threadsafe(entered.set)
        release.wait(timeout=120)  # the bound only stops a broken test from hanging the suite
        return "sent"

    @tool
    async def look_up(name: str) -> str:
        """Look a contact up."""
        await go.wait()
        return "bob@example.com"

    calls = tool_call("look_up", name="Bob") + tool_call("send_email", to="bob@example.com")
    agent = agent_on(s, clock, ScriptedModel([calls, "Yes."]), tools=[send_email, look_up])
    holds.append(first := s.hold("append", armed=False))
    run, _ = start(agent, "Email Bob.", await agent.session("chat", tenant=tenant))
    try:
        await entered.wait()
        first.arm()  # look_up's result is saved next, and the save does not answer
        go.set()
        await first.entered.wait()
        run.cancel()
        await first.dropped.wait()
        holds.append(again := s.hold("append"))  # saved again as the run stops: that save does not answer either
        first.answer.set()
        await again.entered.wait()  # the task is being cancelled, but send_email's thread still runs
        await clock.end(BEAT, run)
        await s.renewing.wait()  # ... so the lease is renewed
        assert s.renewals == 1
    finally:
        release.set()
    again.answer.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    await assert_free(agent, s, tenant, expired=False)
    history = describe(await agent.history(await agent.session("chat", tenant=tenant)))
    assert sorted(history[2:4]) == ["tool:result:bob@example.com", "tool:result:sent"]


class Swallowing(ContextProvider):
    """A provider whose `before_run` drops a cancellation (as a driver it awaits might)."""

    def __init__(self) -> None:
        super().__init__("swallowing")
        self.entered = asyncio.Event()
        self.answer = asyncio.Event()
        self.dropped = asyncio.Event()

    async def before_run(self, ctx: RunContext) -> None:
        self.entered.set()
        while not self.answer.is_set():
            try:
                await self.answer.wait()
            except asyncio.CancelledError:
                self.dropped.set()


@bounded
async def test_a_step_does_not_start_once_the_run_is_cancelled_though_nothing_raised_it(tmp_path: Path) -> None:
    swallowing = Swallowing()
    model = ScriptedModel(["Yes."])
    agent = Agent(model, providers=[History(open_store("memory", tmp_path)), swallowing])
    run = asyncio.create_task(agent.run("What is new?", session=await agent.session("chat")))
    await swallowing.entered.wait()
    run.cancel()
    await swallowing.dropped.wait()
    swallowing.answer.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert model.requests == []  # the model was never called


@bounded
async def test_a_cancellation_a_driver_withdraws_again_does_not_stop_the_heartbeat(
        held_store: Store, tenant: str) -> None:
    """`asyncio.timeout` inside a driver's call cancels the run's task, then withdraws it: the run goes on, renewed."""
    s, clock = held_store, Clock()
    reached, step = thinking()

    @tool
    async def look_up(name: str) -> str:
        """Look a contact up."""
        return "bob@example.com"

    agent = agent_on(s, clock, ScriptedModel([tool_call("look_up", name="Bob"), step]), tools=[look_up])
    in_window, window_over = asyncio.Event(), asyncio.Event()
    append = s.store.append

    async def timing_out(*args: Any, **kwargs: Any) -> Any:  # as a driver's read timing out, then retried
        s.store.append = append  # type: ignore[method-assign]
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # what `asyncio.timeout` does when it fires
        try:
            await window_over.wait()
        except asyncio.CancelledError:
            in_window.set()
            await window_over.wait()  # the driver's clean-up (closing the connection) as the task is cancelling
            task.uncancel()  # ... then the timeout withdraws it and the driver retries
        return await append(*args, **kwargs)

    s.store.append = timing_out  # type: ignore[method-assign]
    run, _ = start(agent, "Email Bob.", await agent.session("chat", tenant=tenant))
    try:
        await in_window.wait()
        await clock.end(BEAT, run)  # a beat comes while the task is cancelling: that one renews not
        await clock.due(BEAT, run)  # ... but the heartbeat goes on
        assert s.renewals == 0
        window_over.set()
        await reached.wait()  # the run went on
        await clock.end(BEAT, run)
        await s.renewing.wait()  # ... and its lease is renewed again
        assert s.renewals == 1
    finally:
        window_over.set()
        run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
