"""Small frozen settings objects, as httpx has `Timeout` and `Limits`.

- `RunLimits`: bounds on one run's tool loop;
- `Durability`: how a run saves (per step or per run), how long its lease lives, how the
  lease is kept alive (`Heartbeat`), and whether its traces are stored;
- `HistoryPolicy`: what a history provider loads and stores (shared by `History` and every
  `HistoryProvider`).

>>> Durability().lease_ttl == DEFAULT_LEASE_TTL
True
>>> HistoryPolicy(load_messages=False, store_context_messages=True).stores_anything
True
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeAlias

from .errors import UsageError

if TYPE_CHECKING:
    from .messages import Message

__all__ = ["DEFAULT_DURABILITY", "DEFAULT_LEASE_TTL", "Durability", "Heartbeat", "HistoryPolicy", "Persistence",
           "RunLimits"]

DEFAULT_LEASE_TTL = 15.0
"""Seconds a session's lease lives without renewal: a killed worker's session is free again after this.

A live run renews it in the background every ``ttl / 3`` seconds (see `Heartbeat`), however long
its model calls and tools take, so the TTL only bounds how long a dead worker blocks its session.
It is also the default of `SessionStore.acquire_lease`."""

Persistence: TypeAlias = Literal["per_step", "per_run"]
"""``per_step``: save after every model call and tool result; ``per_run``: once when the run succeeds (and
the answer to calls the log left open, such as calls a person decided, as soon as it exists)."""

@dataclass(frozen=True, slots=True)
class RunLimits:
    """Bounds on one run's tool loop."""

    max_steps: int = 20
    """Model calls that may request tools; after that, one final call without tools."""
    max_consecutive_tool_errors: int = 3
    """Steps in a row whose tool calls all failed before the loop stops calling tools."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """How a run keeps its session's lease alive in the background.

    The lease is renewed every `interval` seconds (None: a third of the lease's TTL), waiting with
    `sleep`. With `shared_timer` (the default) a run waits for its *first* renewal on one timer
    shared by all the runs of its event loop (its clock, not `sleep`), so a run shorter than one
    interval starts no task; after that, and from the start without it, the run has a heartbeat
    task of its own. Tests that drive the beats by hand pass their own `sleep` and
    ``shared_timer=False``.
    """

    interval: float | None = None
    """Seconds between renewals; None renews every ``ttl / 3``, well inside the TTL."""
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)
    """Waits between renewals, and times a cancelled run's way out (``asyncio.sleep`` unless a test drives it)."""
    shared_timer: bool = True
    """Wait for the first renewal on the event loop's shared timer (False: the run's own task, at once)."""

    def __post_init__(self) -> None:
        if self.shared_timer and self.sleep is not asyncio.sleep:
            raise UsageError("the shared timer waits on the event loop's clock, not on a sleep of your own: "
                             "pass Heartbeat(sleep=..., shared_timer=False) so the run's own task uses it")


@dataclass(frozen=True, slots=True)
class Durability:
    """How a run on a session saves its work and holds the session.

    A run holds the session's lease, `lease_ttl` seconds renewed in the background by `heartbeat`
    for as long as it lives. If the lease is lost anyway (the session was deleted, or a paused
    process let it expire and another worker took over), the run stops at once with `LeaseLost`.
    """

    persistence: Persistence = "per_step"
    """``per_step`` (the default) or ``per_run``."""
    lease_ttl: float = DEFAULT_LEASE_TTL
    """Seconds a run's lease on its session lives without renewal (the heartbeat renews it)."""
    heartbeat: Heartbeat = field(default_factory=Heartbeat)
    """How the lease is kept alive."""
    store_traces: bool = False
    """Store each run's prompt traces with its session (for ``contextpipe inspect``)."""

    def __post_init__(self) -> None:
        if self.persistence not in ("per_step", "per_run"):
            raise UsageError(f"persistence must be 'per_step' or 'per_run', got {self.persistence!r}")
        if self.lease_ttl <= 0:
            raise UsageError(f"lease_ttl must be positive seconds, got {self.lease_ttl!r}")


DEFAULT_DURABILITY = Durability()
"""What an `Agent` given no `durability` does: saves per step, 15-second leases renewed in the background."""


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    """What a history provider loads into a run and stores from it.

    By default it loads the session's messages and stores the caller's input and the model's and
    tools' messages. The filters, when given, replace the flags' choice:

    - `provide_filter`: applied to loaded messages before they enter the context;
    - `store_request_filter`: chooses which request messages to store (by default messages loaded
      from history are dropped, as they are stored already, and context messages are dropped
      unless `store_context_messages` is set);
    - `store_response_filter`: chooses which response messages (model output, tool results) to store.
    """

    load_messages: bool = True
    """Add the loaded messages to the context (only one provider of an agent may)."""
    store_inputs: bool = True
    """Store the caller's messages."""
    store_outputs: bool = True
    """Store the model's and tools' messages."""
    store_context_messages: bool = False
    """Also store messages other context providers added (audit logs)."""
    # Each filter is a `contextpipe.providers.MessageFilter` (spelled out: that alias lives above this module).
    provide_filter: Callable[[Sequence[Message]], Sequence[Message]] | None = None
    store_request_filter: Callable[[Sequence[Message]], Sequence[Message]] | None = None
    store_response_filter: Callable[[Sequence[Message]], Sequence[Message]] | None = None

    @property
    def stores_anything(self) -> bool:
        """False when this policy would never save a message."""
        return self.store_inputs or self.store_outputs or self.store_context_messages
