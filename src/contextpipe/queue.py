"""Talking to a running agent: messages queued for a session, delivered by whichever run holds it.

``await agent.enqueue(session, message, when=...)`` writes the message to the session's store at
once, in its own transaction, whoever holds the session's lease (the caller does not take it), and
returns a `QueuedMessage`:

- ``when="asap"``: the run holding the session delivers it at its next step boundary, before its
  next model call, never inside a tool exchange (a call and its results stay together). Messages
  queued when no run holds the session, or left when a run ended, are delivered by the next run on
  the session, before its own input.
- ``when="next"``: it waits for the run in progress to end; ``await agent.drain_queue(session)``
  then runs each such message as a run of its own, in order (waiting up to `lease_wait` for the run
  in progress).

Both kinds go in the order they were queued, each exactly once. A queued message keeps its id as a
message of the log, and an ``asap`` entry counts as delivered as soon as the log holds a message with
its id: delivery is that one append, atomic, idempotent by id and fenced by the run's lease, so a
crash can neither deliver it twice nor lose it. The entry is then marked settled, which only keeps
the queue's reading short (a mark lost in a crash is made by the next reader). A ``next`` entry is
settled once its run has returned; a run cut before that is run again with the same message, and the
run that finds its input answered in the log gives the earlier result back instead (`RunResult.replayed`).

Delivery mid-run needs per-step persistence (the default): a run saved per run (``Durability(
persistence="per_run")``) delivers only before its input, as its log is written at its end.

>>> import asyncio
>>> from contextpipe import Agent
>>> from contextpipe.testing import ScriptedModel
>>> async def main():
...     agent = Agent(ScriptedModel(["Noted: use metric units."]))
...     queued = await agent.enqueue("chat-1", "Please use metric units.")
...     result = await agent.run(None, session=await agent.session("chat-1"))
...     return [m.text for m in await agent.history(result.session)], queued.id == (await agent.history(
...         result.session))[0].id
>>> asyncio.run(main())
(['Please use metric units.', 'Noted: use metric units.'], True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeAlias, get_args

from .errors import UsageError, shorten
from .messages import INPUT, Message
from .session import Session, SessionKey
from .stores.memory import MemoryStore

if TYPE_CHECKING:
    from .events import RunResult
    from .stores._queue import QueueTable
    from .stores.base import Lease, SessionStore

__all__ = ["QueuedMessage", "When", "deliver", "drain", "enqueue", "key_of", "nothing_queued", "pending", "settle"]

When: TypeAlias = Literal["asap", "next"]
"""When a queued message reaches the session: at the running run's next step boundary, or as a run of its own."""

_WHENS: Final = get_args(When)


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message queued for a session (`contextpipe.Agent.enqueue`)."""

    id: str
    """The entry's id: the message's id, which it keeps in the session's log once delivered."""
    tenant: str
    """The session's tenant."""
    session_id: str
    """The session it is queued for."""
    when: When
    """``asap`` or ``next`` (see `contextpipe.queue`)."""
    message: Message
    """The user message, as it will be delivered."""


def _as_message(message: str | Message, when: str) -> Message:
    """Return `message` as the user message to queue, or raise `UsageError` saying what is wrong."""
    if when not in _WHENS:
        raise UsageError(f"unknown when={shorten(when)}: use 'asap' (at the running run's next step boundary) "
                         "or 'next' (a run of its own once the running one ends)")
    if isinstance(message, str):
        message = Message.user(message)
    elif not isinstance(message, Message):
        raise UsageError(f"a queued message is text or a Message, got {type(message).__name__}")
    if message.role != "user":
        raise UsageError(f"only user messages can be queued, got a {message.role} message; use Message.user(...)")
    if not message.text.strip() and all(p.kind == "text" for p in message.parts):
        raise UsageError("a queued message must not be empty: give the text (or media) the session should get")
    return message


def _table(store: SessionStore) -> QueueTable:
    """Return the store's queue table: the memory store's own (loaded with it), the others' from `stores._queue_sql`."""
    if isinstance(store, MemoryStore):
        return store.queue_table
    from .stores._queue_sql import table_for

    return table_for(store)


def key_of(session: Session | str, tenant: str) -> SessionKey:
    """Return the key of `session` (a `Session`, or an id in `tenant`)."""
    return session.key if isinstance(session, Session) else SessionKey(tenant, session)


async def enqueue(store: SessionStore, key: SessionKey, message: str | Message, when: str = "asap") -> QueuedMessage:
    """Queue `message` for the session now, without its lease; return the entry (see the module docstring).

    The session need not exist: it is created by the run that delivers the message. Queuing again a
    message with an id already queued adds nothing.
    """
    from .stores._rows import encode_message

    queued = _as_message(message, when)
    try:
        await _table(store).add(key, queued.id, when, encode_message(queued))
    except Exception as exc:
        raise store._store_error(exc) from exc
    return QueuedMessage(queued.id, key.tenant, key.id, when, queued)  # type: ignore[arg-type]


async def pending(store: SessionStore, key: SessionKey) -> list[QueuedMessage]:
    """Return the session's entries not settled, in the order they were queued (a delivered one may be among them)."""
    try:
        rows = await _table(store).rows(key)
    except Exception as exc:
        raise store._store_error(exc) from exc
    if not rows:
        return []
    from .stores._rows import decode_message

    return [QueuedMessage(entry_id, key.tenant, key.id, when, decode_message(store.backend, key, 0, body))  # type: ignore[arg-type]
            for entry_id, when, body in rows]


async def settle(store: SessionStore, key: SessionKey, entry_ids: Sequence[str]) -> None:
    """Mark entries settled: `pending` lists them no more."""
    if entry_ids:
        try:
            await _table(store).settle(key, entry_ids)
        except Exception as exc:
            raise store._store_error(exc) from exc


def nothing_queued(store: SessionStore, key: SessionKey, lease: Lease) -> bool:
    """Return True when the store knows, without asking its backend, that nothing is queued for the session.

    The fast path of a run's step boundary (`contextpipe._run.inbox`); False means "look" (`deliver`),
    so a store that knows nothing is always asked. The memory store looks in its own dict; SQLite
    answers from the run's latest append fenced by `lease`, which looked at the queue in its own
    transaction (once: the answer is taken). A message queued after that append is delivered at the
    boundary after, as if it came just after this one's look.
    """
    return _table(store).nothing_queued(key, lease)


async def deliver(store: SessionStore, key: SessionKey, lease: Lease | None) -> list[Message]:
    """Deliver the session's ``asap`` entries: append those not in the log yet, in order, in one append; settle all.

    Returns the messages this call appended (tagged as input), for the run's working set: an entry whose
    message the log holds already (a run that crashed before it settled it) is settled, not delivered again.
    """
    queued = [q for q in await pending(store, key) if q.when == "asap"]
    if not queued:
        return []
    fresh = [q.message.with_source(INPUT) for q in queued
             if await store.message_seq(key.tenant, key.id, q.id) is None]
    if fresh:
        await store.append(key.tenant, key.id, fresh, lease=lease)
    await settle(store, key, [q.id for q in queued])
    return fresh


class _Agent(Protocol):
    """What `drain` needs of an `contextpipe.Agent`."""

    store: SessionStore

    async def session(self, session_id: str, *, tenant: str = ...) -> Session: ...

    async def run(self, input: Message, *, session: Session, lease_wait: float = ...) -> RunResult: ...


async def drain(agent: _Agent, key: SessionKey, lease_wait: float) -> list[RunResult]:
    """Run the session's ``next`` entries one by one, each settled once its run returned (`Agent.drain_queue`)."""
    results: list[RunResult] = []
    while next_up := [q for q in await pending(agent.store, key) if q.when == "next"]:
        queued = next_up[0]
        session = await agent.session(key.id, tenant=key.tenant)
        # The message keeps its id: run again after a crash, the run finds it answered (or resumes it).
        result = await agent.run(queued.message, session=session, lease_wait=lease_wait)
        await settle(agent.store, key, [queued.id])
        results.append(result)
        if result.stop_reason in ("approval_required", "client_tool_calls"):
            break  # the next input would have to wait for the decision: the rest stay queued
    return results
