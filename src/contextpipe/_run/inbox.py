"""`Inbox`: a run's delivery of the messages queued for its session (`contextpipe.queue`), at step boundaries.

The loop asks at every step boundary, before each model call, once the last step's tool results (and the late
results of tool threads) are saved, so a delivered message never comes inside a tool exchange. At the run's
first boundary the messages go before its input (they were queued before the run took the session), after
that at the end of the working set. Delivery is one append to the log, fenced by the run's lease: the model
sees the messages in its next call and the next run finds them in the history.

A boundary asks the store first whether it knows that nothing waits (`contextpipe.queue.nothing_queued`: the
memory store looks in its dict; SQLite's appends fenced by the run's lease look at the queue in their
transaction), and reads the queue only when it does not know: most boundaries deliver nothing, and on SQLite
this spares each one a trip to the store's thread. `probe=False` always reads (the plain path, which
tests/stores/test_queue_probe.py checks the fast one against). Once a step's tools start, what the step's
model output save saw is forgotten (`forget`), so only a save made after the tools can spare the look.

A run saved per run (``Durability(persistence="per_run")``) delivers only at its first boundary, before its
input: the rest of its log is written at its end, so a message delivered mid-run would be stored before the
steps it followed. A run without a session has no inbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..events import MessageDelivered
from ..messages import INPUT, Message
from ..pipeline import Segment
from ..queue import deliver, nothing_queued
from ..stores._checks import key_of

if TYPE_CHECKING:
    from .writer import StepWriter

__all__ = ["Inbox"]


class Inbox:
    """Delivers the session's ``asap`` messages into one run's working set (see the module docstring)."""

    __slots__ = ("_key", "_probe", "_want_events", "_writer")

    def __init__(self, writer: StepWriter, want_events: bool, *, probe: bool = True) -> None:
        self._writer = writer
        self._want_events = want_events
        self._probe = probe
        session = writer.session
        self._key = key_of(session.tenant, session.id) if session is not None else None  # validated (and kept) once

    def forget(self) -> None:
        """Forget what the store saw of the queue at the latest save (a step's tools start: it may be stale by then)."""
        lease = self._writer.lease
        if lease is not None and self._key is not None:
            nothing_queued(self._writer.store, self._key, lease)

    async def deliver(self, parts: list[Segment], tail: list[Message], steps: int) -> Sequence[MessageDelivered]:
        """Deliver what is queued into the working set (`parts` and `tail`); return the events (none if unwanted).

        `steps` is the number of model calls made: 0 puts the messages before the input (the last of `parts`).
        """
        writer, key = self._writer, self._key
        lease = writer.lease
        if lease is None or key is None or (steps and not writer.per_step):
            return ()
        if self._probe and nothing_queued(writer.store, key, lease):
            return ()
        messages = await writer.guard(deliver(writer.store, key, lease))
        if not messages:
            return ()
        if steps:
            tail.extend(messages)
        else:
            parts.insert(len(parts) - 1, Segment(INPUT, messages, _tagged=messages))
        return [MessageDelivered(m, steps) for m in messages] if self._want_events else ()
