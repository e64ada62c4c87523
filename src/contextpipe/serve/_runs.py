"""Runs in flight: each in its own task, so a client that goes away never loses a run.

A run's events go through a queue to whoever streams them. When the client disconnects, the run
either goes on to the end and persists everything (``on_disconnect="finish"``, the default) or is
cancelled at once (``"cancel"``); either way the agent closes the run, so providers are told and
the session's lease is released. `RunManager.drain` (on SIGTERM) refuses new runs and waits for the
ones in flight up to a deadline, then cancels the rest cleanly. `RunManager.cancel` stops a session's
run the same way when a client asks (``POST /v1/sessions/{id}/cancel``): its stream ends with an
``error`` event of type ``Cancelled`` (`cancelled_json`), whose ``reason`` tells a cancel request from
a shutdown.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeAlias

from .. import Agent, RunResult, Session
from ..approvals import Decision, PendingApproval
from ..codec import message_to_dict
from ..errors import ContextPipeError
from ..messages import Message
from ..models import ModelSettings
from ..providers.base import ContextProvider
from ..tools import Tool
from ._json import clean

__all__ = ["LiveRun", "OnDisconnect", "RunManager", "cancelled_json", "event_to_json", "pending_to_json",
           "result_to_json"]

OnDisconnect: TypeAlias = Literal["finish", "cancel"]


def result_to_json(result: RunResult, *, traces: bool = False) -> dict[str, Any]:
    """Return the JSON form of a run's result (with its prompt traces when `traces`)."""
    data = {
        "session_id": result.session.id if result.session is not None else None,
        "text": result.text,
        "stop_reason": result.stop_reason,
        "steps": result.steps,
        "replayed": result.replayed,
        "usage": asdict(result.usage),
        "input": [message_to_dict(m) for m in result.input],
        "messages": [message_to_dict(m) for m in result.messages],
        "pending_approvals": [pending_to_json(p) for p in result.pending_approvals],
    }
    if traces:
        data["traces"] = [t.to_dict(compact_runs=True) for t in result.traces]
    return data


def pending_to_json(pending: PendingApproval) -> dict[str, Any]:
    """Return the JSON form of a call awaiting approval: what to show a person, and what to send back."""
    return {"call_id": pending.call_id, "tool_name": pending.tool_name, "arguments": pending.arguments,
            "why": pending.why, "digest": pending.digest, "message_id": pending.message_id, "client": pending.client}


def event_to_json(event: Any, *, traces: bool = False) -> tuple[str, dict[str, Any]] | None:
    """Return the SSE name and JSON payload of a stream event (None for events not sent).

    Events are told apart by their ``kind`` so this keeps working whichever module defines them.
    """
    kind = getattr(event, "kind", None)
    if kind in ("text_delta", "reasoning_delta"):
        return kind, {"text": event.text}
    if kind == "tool_call_started":
        call = event.call
        return kind, {"call_id": call.call_id, "name": call.name, "arguments": call.arguments}
    if kind == "tool_call_finished":
        call, res = event.call, event.result
        return kind, {"call_id": call.call_id, "name": call.name, "result": res.result, "is_error": res.is_error}
    if kind == "step_persisted":
        messages: Sequence[Message] = event.messages
        return kind, {"step": event.step, "messages": [message_to_dict(m) for m in messages]}
    if kind == "message_delivered":
        return kind, {"step": event.step, "message": message_to_dict(event.message)}
    if kind == "approval_required":
        return kind, {"pending_approvals": [pending_to_json(p) for p in event.pending]}
    if kind == "run_done":
        return "done", result_to_json(event.result, traces=traces)
    return None


def error_to_json(exc: BaseException) -> dict[str, Any]:
    """Return the JSON body describing a failed run."""
    message = str(exc) if isinstance(exc, ContextPipeError) else "the run failed; see the server log"
    return {"error": {"type": type(exc).__name__, "message": message}}


def cancelled_json(run: LiveRun) -> dict[str, Any]:
    """Return the JSON body telling `run`'s client it was cancelled: by a cancel request, or by a shutdown."""
    if run.cancel_requested:
        message = ("the run was cancelled by a cancel request (POST /v1/sessions/{id}/cancel); what it stored "
                   "stays, and a tool call it stopped is answered with an error")
        return {"error": {"type": "Cancelled", "reason": "request", "run_id": run.id, "message": message}}
    return {"error": {"type": "Cancelled", "reason": "shutdown", "run_id": run.id,
                      "message": "the run was cancelled (server shutdown)"}}


_ORDER = itertools.count()


@dataclass(eq=False)
class LiveRun:
    """One run in flight: its task and the queue its events go to."""

    session: Session
    traces: bool = False
    """Whether the result sent to the client carries the prompt traces."""
    queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    listening: bool = True
    """False once the client went away (events are no longer queued)."""
    detached: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client went away."""
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a streamed run holds its session's lease, its input and decisions accepted (`AgentStream.start`)."""
    result: RunResult | None = None
    error: BaseException | None = None
    id: str = field(default_factory=lambda: "run_" + secrets.token_hex(8))
    """Names the run to its client (the ``X-Run-Id`` header) and in a cancel's answer."""
    order: int = field(default_factory=lambda: next(_ORDER))
    """When it started among this process's runs (the oldest of a session's is the one a cancel stops)."""
    cancel_requested: bool = False
    """True once a client asked to cancel it (`RunManager.cancel`)."""

    async def events(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Yield ``(name, payload)`` pairs until the run ends (the last is ``done`` or ``error``)."""
        while True:
            item = await self.queue.get()
            if item is None:
                return
            yield item

    async def batches(self, keep_alive: float = 15.0) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
        """Yield the run's events as they come, each time all that is queued, until the run ends.

        After `keep_alive` seconds without an event it yields an empty batch: the time to send the
        client a keep-alive, which holds proxies open during long model or tool calls.
        """
        getter: asyncio.Future[tuple[str, dict[str, Any]] | None] | None = None
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(self.queue.get())
                done, _ = await asyncio.wait({getter}, timeout=keep_alive)
                if not done:
                    yield []
                    continue
                item, getter = getter.result(), None
                batch = []
                while item is not None:
                    batch.append(item)
                    if self.queue.empty():
                        break
                    item = self.queue.get_nowait()
                if batch:
                    yield batch
                if item is None:
                    return
        finally:
            if getter is not None:
                getter.cancel()

    async def wait(self) -> RunResult:
        """Wait for the run to end; return its result or raise its error."""
        assert self.task is not None
        await asyncio.shield(self.task)
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _send(run: LiveRun, name: str, payload: dict[str, Any]) -> None:
    """Queue an event for `run`'s client (if it still listens), repaired to render as JSON (`clean`)."""
    if run.listening:
        run.queue.put_nowait((name, clean(payload, items=("input", "messages", "traces"))))


class RunManager:
    """Starts runs in their own tasks, tracks them, and drains them at shutdown."""

    def __init__(self, agent: Agent, *, on_disconnect: OnDisconnect = "finish") -> None:
        if on_disconnect not in ("finish", "cancel"):
            raise ValueError(f"on_disconnect must be 'finish' or 'cancel', got {on_disconnect!r}")
        self.agent = agent
        self.on_disconnect: OnDisconnect = on_disconnect
        self.runs: set[LiveRun] = set()
        self.background: set[asyncio.Task[Any]] = set()
        """Work for no client (the runs of queued ``next`` messages): drained at shutdown as runs are."""
        self.draining = False
        self.deadline: float | None = None

    def begin_drain(self, timeout: float) -> None:
        """Refuse new runs from now on; runs in flight have `timeout` seconds to finish."""
        if not self.draining:
            self.draining = True
            self.deadline = time.monotonic() + timeout

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `work` in a task of its own, tracked like a run: `drain` waits for it, then cancels it."""
        task = asyncio.create_task(work, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def start(self, session: Session, input: str | Sequence[Message] | None, *, lease_wait: float,
              stream: bool, traces: bool = False, approvals: Mapping[str, Decision] | None = None,
              settings: ModelSettings | None = None, providers: Sequence[ContextProvider] = (),
              tools: Sequence[Tool] = ()) -> LiveRun:
        """Start a run on `session` in its own task and return it (`traces`: put them in the result).

        `approvals` decides calls awaiting approval, `settings` are the run's model settings and
        `providers` its own context providers and `tools` its own tools, as in `Agent.run`.
        """
        run = LiveRun(session, traces=traces)
        run.task = asyncio.create_task(self._drive(run, input, lease_wait, stream, approvals, settings, providers,
                                                   tools),
                                       name=f"contextpipe-run:{session.tenant}/{session.id}")
        self.runs.add(run)
        run.task.add_done_callback(lambda _: self.runs.discard(run))
        return run

    async def _drive(self, run: LiveRun, input: str | Sequence[Message] | None, lease_wait: float,
                     stream: bool, approvals: Mapping[str, Decision] | None,
                     settings: ModelSettings | None, providers: Sequence[ContextProvider],
                     tools: Sequence[Tool] = ()) -> None:
        try:
            if stream:
                async with self.agent.stream(input, session=run.session, lease_wait=lease_wait,
                                             approvals=approvals, settings=settings, providers=providers,
                                             tools=tools) as events:
                    await events.start()
                    run.admitted.set()
                    async for event in events:
                        item = event_to_json(event, traces=run.traces)
                        if item is not None:
                            _send(run, *item)
                    run.result = events.result
            else:
                run.result = await self.agent.run(input, session=run.session, lease_wait=lease_wait,
                                                  approvals=approvals, settings=settings, providers=providers,
                                                  tools=tools)
                _send(run, "done", result_to_json(run.result, traces=run.traces))
        except asyncio.CancelledError as exc:
            run.error = exc
            _send(run, "error", cancelled_json(run))
        except Exception as exc:
            run.error = exc
            _send(run, "error", error_to_json(exc))
        finally:
            run.queue.put_nowait(None)

    async def started(self, run: LiveRun) -> None:
        """Wait until `run` is admitted, or raise the error that kept it from starting (`AgentStream.start`).

        A streamed run is admitted once it holds its session's lease and its input and approval
        decisions were accepted: a server sends its status line then, so what refuses the run is an
        HTTP error, not an event after a 200. A run that is not streamed is admitted when it ends.
        """
        assert run.task is not None
        admitted = asyncio.ensure_future(run.admitted.wait())
        try:
            await asyncio.wait({admitted, run.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            admitted.cancel()
        if not run.admitted.is_set():
            await run.wait()

    def detach(self, run: LiveRun) -> None:
        """Stop sending `run` events (its client went away); finish or cancel it, per `on_disconnect`."""
        run.listening = False
        run.detached.set()
        if self.on_disconnect == "cancel" and run.task is not None and not run.task.done():
            run.task.cancel()

    def cancel(self, tenant: str, session_id: str) -> LiveRun | None:
        """Cancel the run in flight on the session in this process and return it (None when there is none).

        It stops at its next safe point, as on a disconnect with ``on_disconnect="cancel"``: what it
        stored stays, and a tool call it stopped is answered. Of several runs on the session here (the
        others wait for its lease), the oldest is cancelled: the one holding the session. Asked again
        while it stops, it returns the same run and cancels nothing more (its way out is left whole).
        """
        live = [r for r in self.runs if r.session.tenant == tenant and r.session.id == session_id
                and r.task is not None and not r.task.done()]
        if not live:
            return None
        run = min(live, key=lambda r: r.order)
        if not run.cancel_requested:
            run.cancel_requested = True
            assert run.task is not None
            run.task.cancel()
        return run

    async def drain(self, grace: float | None = None) -> int:
        """Wait for runs in flight until the drain deadline, cancel the rest; return how many were cancelled.

        Draining starts now with `grace` seconds unless a signal already started it.
        """
        if self.deadline is None:
            self.begin_drain(grace or 0.0)
        tasks = [r.task for r in self.runs if r.task is not None and not r.task.done()]
        tasks += [t for t in self.background if not t.done()]
        if not tasks:
            return 0
        assert self.deadline is not None
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, self.deadline - time.monotonic()))
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        return len(pending)
