"""`StepWriter`: everything a run saves, fenced by the one lease the run holds.

``async with StepWriter.open(store, session, ...) as writer:`` takes the session's lease, starts
its heartbeat (`contextpipe._run.heartbeat`), brings the caller's `Session` up to date with the
store, and on the way out stops the heartbeat and gives the lease back. Inside, the loop hands the
writer each step. The writer saves:

- per step (the default): the request messages each storing history provider keeps, with the first
  model output; then every model output and every tool result as soon as it exists; a run
  interrupted before its first model output was saved (a cancelled task, Ctrl-C) still saves the
  request messages, so the caller's input is never lost (unless calls a previous run left open
  before it could not all be answered, `left_open`: the input never goes between a call and its result);
- per run: everything once, when the run has succeeded, but the answer to calls the log left open
  (decided by a person, or left by a run that stopped), saved as soon as it exists, and what a
  stopping run has of theirs (a thread's result, a late result) as it stops (`save_answer`);
- summary checkpoints (for compaction), the session's state (with the run's token calibration)
  and, when asked, the run's traces.

If a renewal fails with `LeaseLost` (another worker took the session over, or it was deleted),
the writer refuses every further write and `guard` stops whatever the run is awaiting at once
(in-flight tools are cancelled) with that error.

A cancelled run ends whatever a driver does. A driver that swallows the cancellation and returns
does not make the run go on: it is raised again after each step's save, as at each step boundary
and at the run's end (`contextpipe._run.threads.raise_swallowed_cancellation`). The heartbeat
renews nothing once the run's task is done, or cancelled with no tool thread holding it open
(`over`), so a driver call that swallows the cancellation and goes on waiting holds the task at
most until it returns, and the session is free within the lease's TTL meanwhile. And the calls a
cancelled run makes on its way out, once its tool threads are done (`keep`, `leaving`,
`release`), are abandoned when the lease's TTL is spent (`contextpipe._run.way_out`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ..approvals import awaiting_approval
from ..errors import LeaseLost, StoreError
from ..exchanges import LATE_RESULT_KEY, unanswered_calls
from ..stores.base import Checkpoint, SessionStore
from ..tokens import CALIBRATION_KEY
from .heartbeat import LeaseHeartbeat
from .threads import raise_swallowed_cancellation, wait_through_cancellation
from .way_out import WayOut, WayOutExpired

if TYPE_CHECKING:
    from ..config import Durability, Heartbeat
    from ..messages import FunctionCall, Message
    from ..pipeline import RunContext
    from ..providers.base import HistoryProvider
    from ..session import Session
    from ..stores.base import Lease
    from ..tokens import Calibration

__all__ = ["StepWriter"]

T = TypeVar("T")

_TAIL = 16
"""Messages read from the log's end at first when looking for the calls left open there (`StepWriter.open_calls`)."""


class StepWriter:
    """Saves one run's messages, checkpoints and session state, fenced by the run's lease."""

    def __init__(self, *, store: SessionStore, session: Session | None, lease: Lease | None,
                 history_providers: Sequence[HistoryProvider], per_step: bool, lease_ttl: float,
                 sleep: Callable[[float], Awaitable[None]]) -> None:
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
            if self._loader is None and p.policy.load_messages:
                self._loader = p
        self._request_stored = False  # a save of the request messages returned
        self._answered_early: set[str] = set()  # ids of the answers to open calls saved before a per-run save
        # The calls an earlier run left open without a saved answer (id: name); None until the loop read the history.
        self._left_open: dict[str, str] | None = None
        self.awaiting_approval: set[str] = set()
        """Of the calls `open_calls` found, those awaiting a person's decision: no repair answers them."""
        self.lost: LeaseLost | None = None
        """Set when a renewal failed: the run no longer holds the session and must stop."""
        self._inside: asyncio.Task[Any] | None = None  # the task awaiting inside `guard`, if any
        self._stopped = False  # the heartbeat cancelled that task
        self._heartbeat: LeaseHeartbeat | None = None
        self.way_out: WayOut | None = None
        """What is left of the run's way out, once a cancelled run has begun it (`leaving`)."""
        self._way_out_time = lease_ttl, sleep
        self.task: asyncio.Task[Any] | None = None
        """The run's task: the one that took the lease, then the one awaiting in `guard` (a stream may be driven by
        another task than the one that started it); no lease is renewed once it is done or being cancelled."""
        self.held_open: Callable[[], bool] = lambda: False
        """Tell whether tool threads still run: they keep a cancelled run's lease renewed (the loop sets it)."""

    @staticmethod
    def open(store: SessionStore, session: Session | None, *, history_providers: Sequence[HistoryProvider],
             durability: Durability, lease_wait: float = 0.0) -> _Open:
        """Return an async context manager that holds a writer for one run on `session` (or on none).

        Entering it takes the session's lease (waiting up to `lease_wait` seconds for a concurrent
        run), starts the heartbeat and brings `session` up to date with the store; leaving it stops
        the heartbeat and gives the lease back.
        """
        return _Open(store, session, history_providers, durability, lease_wait)

    # --- the lease ----------------------------------------------------------------------------------

    def keep_alive(self, heartbeat: Heartbeat) -> None:
        """Start renewing the lease in the background with `heartbeat` (until `release`, or the run is `over`)."""
        self.task = asyncio.current_task()
        self._heartbeat = LeaseHeartbeat(self, heartbeat)
        self._heartbeat.start()

    def over(self) -> bool:
        """Return True once the run's lease is renewed no more: its task done, or its way out begun."""
        task = self.task
        return self.way_out is not None or (task is not None and task.done())

    def paused(self) -> bool:
        """Return True while the run's task is being cancelled and not `held_open`: renew not (for now).

        A cancellation a driver swallowed leaves the task so, and its lease expires within the TTL; one
        withdrawn again (`asyncio.timeout` in a driver's call, then a retry) lets the next beat renew.
        """
        task = self.task
        return task is not None and task.cancelling() > 0 and not self.held_open()

    def leaving(self, awaitable: Awaitable[T], error: BaseException | None) -> Awaitable[T]:
        """Return `awaitable` to await as a call of the run's way out: bounded if the run is cancelled.

        The run is cancelled when `cancelled(error)` says so (a stream closed by a cancelled task is
        too); then the call goes through `way_out`, and raises `WayOutExpired` if the way out's time
        runs out first.
        """
        if (error is not None or self.way_out is not None) and self.cancelled(error):
            return self._leave().run(awaitable)
        return awaitable

    def cancelled(self, error: BaseException | None) -> bool:
        """Return True if the run stops for a cancellation: `error`, the task being cancelled, or its way out begun."""
        if self.way_out is not None or isinstance(error, asyncio.CancelledError):
            return True
        if error is None:  # a run that succeeded
            return False
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def keep(self, awaitable: Awaitable[Any], error: BaseException | None, *, cancelled: bool = False) -> bool:
        """Await a save of a stopping run to its end, even if cancelled again; return whether a cancellation came.

        The save of a cancelled run (`cancelled`, or `cancelled(error)`) that no tool thread holds
        open any more is a call of its way out (`leaving`): it raises `WayOutExpired` if the way
        out's time runs out first.
        """
        if (cancelled or self.cancelled(error)) and not self.held_open():
            await self._leave().run(awaitable)
            return True
        return await wait_through_cancellation(awaitable)

    def _leave(self) -> WayOut:
        """Return the run's way out, begun now if it was not yet."""
        if self.way_out is None:
            self.way_out = WayOut(*self._way_out_time)
        return self.way_out

    def lease_lost(self, error: LeaseLost) -> None:
        """Refuse every further write and stop what the run is awaiting (the heartbeat calls it)."""
        error.add_note("the run was stopped: another run took this session over (or it was deleted) "
                       "while this one was still working; nothing more was saved")
        self.lost = error
        if self._inside is not None:
            self._stopped = True
            self._inside.cancel()

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
        self._inside = self.task = task
        try:
            result = await awaitable
        except asyncio.CancelledError:
            if self._stopped:  # the heartbeat cancelled it: the lease is gone, not the caller's doing
                self._stopped = False
                task.uncancel()
                raise self.lost from None  # type: ignore[misc]
            raise
        finally:
            self._inside = None
        if self._stopped:  # the awaitable swallowed the heartbeat's cancellation: withdraw it all the same
            self._stopped = False
            task.uncancel()
            raise self.lost  # type: ignore[misc]
        return result

    @property
    def stores_messages(self) -> bool:
        """True when some history provider stores this run's messages."""
        return self.session is not None and bool(self._providers)

    def lease_for(self, provider: HistoryProvider) -> Lease | None:
        """Return the lease that fences `provider`'s writes.

        That is the run's lease when the provider writes to the store holding it, and None for
        providers writing elsewhere (an audit log in another store).
        """
        return self.lease if provider.store is self.store else None

    async def save_step(self, ctx: RunContext, response: Sequence[Message], *,
                        with_request: bool = True, durable: bool = True) -> list[Message]:
        """Save a step now (per-step mode only) and return what the first storing provider was given.

        Each storing provider gets `response`, preceded by the request messages it stores until a
        save of them returned (unless `with_request` is False): again after a save that was cut or
        failed, as appends are idempotent by message id. ``durable=False`` is for writes a crash
        would repair anyway (the result of an idempotent tool: a resumed run runs it again); the
        next model output is saved durably, which makes them durable too.
        """
        if not self.per_step or not self.stores_messages:
            return []
        first = with_request and not self._request_stored
        saved = await self._save(ctx, response, with_request=first, durable=durable)
        self._request_stored = self._request_stored or first
        raise_swallowed_cancellation()  # a driver swallowed it: the run must not go on (to its tools) as if saved
        return saved

    async def save_answer(self, ctx: RunContext, answers: Sequence[Message]) -> list[Message]:
        """Save now, in either mode, the `answers` to calls the log left open; return what was saved.

        Those calls (decided by a person, or left by a run that stopped) ran or were answered: a
        run saved per run that stops after them (fails, is cut) must not leave them open, or the
        next run would report a completed side effect "interrupted". The answers close calls an
        earlier run left, so they may come before this run's request messages; `save_run` skips
        them, and so does a second `save_answer` (once its save returned).
        """
        if self.per_step:
            return await self.save_step(ctx, answers, with_request=False)
        answers = [m for m in answers if m.id not in self._answered_early]
        if not self.stores_messages or not answers:
            return []
        saved = await self._save(ctx, answers, with_request=False)
        self._answered_early.update(m.id for m in answers)
        raise_swallowed_cancellation()
        return saved

    async def save_stopping(self, ctx: RunContext, messages: Sequence[Message], error: BaseException, what: str, *,
                            answering_open: bool = False) -> bool:
        """Save `messages` as the run stops with `error`, whatever cancels the wait; return whether they were.

        Per step (`save_step`); per run too when they answer calls the log left open (`answering_open`:
        `save_answer`). Appends are idempotent by message id: saving again what a cut save may have
        stored is safe. A failure is a note on `error` (the run's own error goes on); a lost lease
        saves nothing.
        """
        if self.lost is not None:
            return False
        if not messages:
            return True
        try:
            if answering_open:
                await self.keep(self.save_answer(ctx, messages), error)
            else:
                await self.keep(self.save_step(ctx, messages, with_request=False), error)
        except Exception as exc:
            error.add_note(f"{what} could not be saved as the run stopped: {type(exc).__name__}: {exc}")
            return False
        return True

    async def keep_open_answers(self, ctx: RunContext, messages: Sequence[Message], open_at_start: set[str],
                                error: BaseException) -> None:
        """Per run, save, as the run stops with `error`, what of its `messages` came of the calls the log left open.

        Their answers were saved as they were made; a thread's result or a late result that came
        after would otherwise be lost with a run saved per run, wherever the run failed (in the
        loop, or in the save of the whole run). Saving again what was saved stores nothing twice.
        """
        if open_at_start and not self.per_step:
            theirs = [m for m in messages if m.metadata.get(LATE_RESULT_KEY) in open_at_start
                      or any(r.call_id in open_at_start for r in m.function_results)]
            await self.save_stopping(ctx, theirs, error, "what came of the calls the log left open",
                                     answering_open=True)

    async def save_input(self, ctx: RunContext) -> None:
        """Keep the request messages of a run stopped before they were saved (per-step mode only).

        A run interrupted (a cancelled task, Ctrl-C) before its first model answer was saved would
        otherwise lose the caller's input, which is saved with that answer. Appending is idempotent
        by message id, so the input is stored once even if an interrupted save did land.

        Raises `StoreError`, storing nothing, while a call an earlier run left open has no saved
        answer (`left_open`): the input would come between the call and its result.
        """
        if not self.keeps_input(ctx):
            return
        if self._left_open:
            session = self.session
            assert session is not None
            names = ", ".join(f"{name} ({call_id})" for call_id, name in self._left_open.items())
            then = ("decide the calls awaiting approval (agent.run(None, session=..., approvals={...})), then send "
                    "the input again" if self.awaiting_approval & self._left_open.keys() else
                    "send the input again (the next run answers the calls first)")
            raise StoreError(
                f"calls {names} that the session's previous run left open have no saved answer, and the input may "
                f"not come between a call and its result; {then}",
                backend=self.store.backend, tenant=session.tenant, session_id=session.id)
        await self._save(ctx, [], with_request=True)
        self._request_stored = True

    def keeps_input(self, ctx: RunContext) -> bool:
        """Tell whether `save_input` would store request messages of `ctx` now (no save of them returned yet)."""
        return (not self._request_stored and self.per_step and self.stores_messages
                and any(p.select_request(ctx) for p in self._providers))

    def left_open(self, calls: Sequence[FunctionCall]) -> None:
        """Note the calls an earlier run left open: no input is kept (`save_input`) until each has an answer saved."""
        self._left_open = {c.call_id: c.name for c in calls}

    def outbox_problem(self) -> str | None:
        """Say why this run's tools cannot add outbox entries (`contextpipe.outbox`); None when they can.

        They can when a History stores the tool results in the session's store and that store keeps
        an outbox: the entries are committed with those results.
        """
        if self.session is None:
            return "its run has no session to commit them with; run the agent with session=..."
        if not self.store.keeps_outbox:
            return (f"the session's store ({self.store.backend}) keeps no outbox; use SQLiteStore, PostgresStore or "
                    "MemoryStore for a tool that writes through ctx.outbox")
        if not any(p.store is self.store and p.policy.store_outputs for p in self._providers):
            return "no History of the agent stores tool results in the session's store, where they would be committed"
        return None

    @property
    def history_read(self) -> bool:
        """True once the calls the loaded history left open are known (`left_open`; the loop reads them first)."""
        return self._left_open is not None

    async def open_calls(self) -> list[FunctionCall]:
        """Return the calls the end of the session's log leaves without results, read back from the log.

        For a run stopped before its loop read the history (`contextpipe._run.repair.answer_open_end`):
        the log is the one the history provider that loads it keeps.
        """
        loader, session = self._loader, self.session
        if loader is None or session is None:
            return []
        store = loader.store
        if not isinstance(store, SessionStore):
            return self._open_end(list(await loader.load(session)))
        limit = _TAIL
        while True:  # the tool messages at the end, and the message before them
            page = await store.load(session.tenant, session.id, limit=limit)
            if not page.has_more or any(m.role != "tool" for m in page.messages):
                return self._open_end(page.messages)
            limit *= 4

    def _open_end(self, messages: Sequence[Message]) -> list[FunctionCall]:
        """Return the calls the end of `messages` leaves open, noting those awaiting approval (`awaiting_approval`)."""
        calls = unanswered_calls(messages)
        made_by = next((m for m in reversed(messages) if m.role != "tool"), None)
        self.awaiting_approval = set(awaiting_approval(made_by)) & {c.call_id for c in calls}
        return calls

    async def save_run(self, ctx: RunContext, response: Sequence[Message]) -> None:
        """Save a whole successful run at once (per-run mode only).

        The answers to calls an earlier run left open were saved as they were made (`save_answer`):
        they are left out, so the input never comes between a call and its result.
        """
        if self.per_step or not self.stores_messages:
            return
        await self._save(ctx, [m for m in response if m.id not in self._answered_early], with_request=True)

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
            if batch:
                await provider.save(session, batch, lease=self.lease_for(provider), durable=durable or with_request)
            if saved is None:
                saved = batch
        if self._left_open:
            for message in response:
                for result in message.function_results:
                    self._left_open.pop(result.call_id, None)
        return saved or []

    async def save_checkpoint(self, seq: int, summary: Message) -> bool:
        """Have the history provider that loaded the messages keep `summary` as standing for the log up to `seq`."""
        if self.session is None or self._loader is None:
            return False
        self.check()
        checkpoint = Checkpoint(seq, summary, time.time())
        return await self._loader.save_checkpoint(self.session, checkpoint, lease=self.lease_for(self._loader))

    async def save_session(self, traces: Sequence[dict[str, Any]] = (), *,
                           calibration: Calibration | None = None) -> None:
        """Save the session's state (compare-and-swap) with the run's token `calibration`, and the run's traces."""
        session = self.session
        if session is None:
            return
        self.check()
        if calibration is not None:
            session.state[CALIBRATION_KEY] = calibration.to_dict()
        await self.store.save_session(session, lease=self.lease)
        if traces:
            await self.store.append_traces(session.tenant, session.id, list(traces), lease=self.lease)

    async def refresh(self) -> None:
        """Bring a stale `Session` object up to date with the store (another worker may have run)."""
        session = self.session
        assert session is not None
        stored = await self.store.get_session(session.tenant, session.id)
        if session.version > 0 and (stored is None or stored.created_at != session.created_at):
            # A session made again under the same id (after a delete or an expiry) is another session:
            # its state, its user and its log are not this run's to take up.
            raise LeaseLost.session_ended(self.store.backend, session.key, made_again=stored is not None)
        if stored is not None and stored.version != session.version:
            if session.version == 0:  # an object made by hand for a stored session: it is that session
                session.created_at = stored.created_at
                if session.ttl is None:  # (a ttl given on the object is the caller's to set)
                    session.ttl = stored.ttl
            session.state = stored.state
            session.version = stored.version

    async def release(self, error: BaseException | None = None) -> None:
        """Stop the heartbeat and give the session's lease back (the run is over, with `error` if it failed).

        On a cancelled run's way out both take their time from `way_out`: if it runs out, the lease is
        left to expire (within its TTL), and a note on `error` says so.
        """
        way_out = self._leave() if (error is not None or self.way_out is not None) and self.cancelled(error) else None
        try:
            if self._heartbeat is not None:
                heartbeat, self._heartbeat = self._heartbeat, None
                await heartbeat.stop(way_out)
            if self.lease is not None:
                lease, self.lease = self.lease, None
                if self.lost is not None:
                    return
                if way_out is None:
                    await self.store.release_lease(lease)
                    return
                try:
                    await way_out.run(self.store.release_lease(lease))
                except WayOutExpired as exc:
                    if error is not None:
                        error.add_note(f"the session's lease was not given back (it expires by itself): {exc}")
        finally:
            if self.way_out is not None:
                self.way_out.close()


class _Open:
    """``async with StepWriter.open(...)``: the writer of one run, from taking the lease to giving it back."""

    __slots__ = ("_durability", "_providers", "_session", "_store", "_wait", "_writer")

    def __init__(self, store: SessionStore, session: Session | None, providers: Sequence[HistoryProvider],
                 durability: Durability, lease_wait: float) -> None:
        self._store, self._session, self._providers = store, session, providers
        self._durability, self._wait = durability, lease_wait
        self._writer: StepWriter | None = None

    async def __aenter__(self) -> StepWriter:
        store, session, durability = self._store, self._session, self._durability
        per_step = durability.persistence == "per_step"
        if session is None:
            self._writer = StepWriter(store=store, session=None, lease=None, history_providers=self._providers,
                                      per_step=per_step, lease_ttl=durability.lease_ttl,
                                      sleep=durability.heartbeat.sleep)
            return self._writer
        lease = await store.acquire_lease(session.tenant, session.id, os.urandom(8).hex(),
                                          ttl=durability.lease_ttl, wait=self._wait)
        writer = self._writer = StepWriter(store=store, session=session, lease=lease,
                                           history_providers=self._providers, per_step=per_step,
                                           lease_ttl=durability.lease_ttl, sleep=durability.heartbeat.sleep)
        writer.keep_alive(durability.heartbeat)
        try:
            await writer.refresh()
        except BaseException as exc:
            self._writer = None
            await writer.release(exc)
            raise
        return writer

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            await writer.release(exc)
