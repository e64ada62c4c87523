"""`ContextProvider` and `HistoryProvider`: the two extension points of a run.

A context provider shapes every run of an agent. In `before_run` it contributes through the
`RunContext`: instructions, messages, tools, model middleware, or `replace_messages`. Providers run
in registration order and each sees what earlier ones added. `after_run` is always called, in
reverse order, with the request, the response messages (None on failure) and the error (None on
success).

A history provider is a context provider that loads a session's messages before the run and saves
the run's messages: per step by default (each model call's new messages right after the call, each
tool result right after it is produced), or once at the end in per-run mode.

>>> class Greeting(ContextProvider):
...     async def before_run(self, ctx):
...         ctx.add_instructions("Greet the user by name: Alice.")
>>> Greeting("greeting").source_id
'greeting'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..messages import Message

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome
    from ..session import Session
    from ..stores.base import Lease

__all__ = ["ContextProvider", "HistoryProvider", "MessageFilter"]

MessageFilter = Callable[[Sequence[Message]], Sequence[Message]]
"""Takes messages (tagged with their `Source`) and returns the ones to keep, in order."""


class ContextProvider:
    """Base class of everything that shapes a run's context; override the hooks you need.

    `source_id` must be unique among an agent's providers; `kind` is a free tag shown in traces
    (``history``, ``memory``, ``search``, ``skills``, ``compaction``, ``instructions``, ``mcp``, ...).
    Keep per-session data in `ProviderState`, never on the provider: one instance serves every session.
    """

    kind: str = "custom"
    """What sort of provider this is, for traces."""

    def __init__(self, source_id: str) -> None:
        if not source_id or not isinstance(source_id, str):
            raise UsageError(f"a context provider needs a non-empty source_id, got {source_id!r}")
        self.source_id = source_id
        """Unique (per agent) name of this provider; messages it adds carry it in their `Source`."""

    @property
    def state_keys(self) -> tuple[str, ...]:
        """Keys this provider uses in ``session.state`` (must not clash with other providers')."""
        return ()

    async def before_run(self, ctx: RunContext) -> None:
        """Contribute to the run through `ctx` before the first model call."""

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Look at the finished (or failed) run; always called, in reverse provider order."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source_id!r})"


class HistoryProvider(ContextProvider):
    """A context provider that loads and stores a session's messages.

    Implement `load` and `save`. Options:

    - `load_messages`: add the loaded messages to the context (only one provider of an agent may).
    - `store_inputs` / `store_outputs`: store the caller's messages / the model's and tools' messages.
    - `store_context_messages`: also store messages other context providers added (audit logs).
    - `provide_filter`: applied to loaded messages before they enter the context.
    - `store_request_filter`: chooses which request messages to store. By default messages loaded
      from history are dropped (they are stored already), and context messages are dropped unless
      `store_context_messages` is set.
    - `store_response_filter`: chooses which response messages (model output, tool results) to store.
    """

    kind = "history"

    def __init__(
        self,
        source_id: str = "history",
        *,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_outputs: bool = True,
        store_context_messages: bool = False,
        provide_filter: MessageFilter | None = None,
        store_request_filter: MessageFilter | None = None,
        store_response_filter: MessageFilter | None = None,
    ) -> None:
        super().__init__(source_id)
        self.load_messages = load_messages
        self.store_inputs = store_inputs
        self.store_outputs = store_outputs
        self.store_context_messages = store_context_messages
        self.provide_filter = provide_filter
        self.store_request_filter = store_request_filter
        self.store_response_filter = store_response_filter

    @property
    def stores_anything(self) -> bool:
        """False when this provider would never save a message."""
        return self.store_inputs or self.store_outputs or self.store_context_messages

    async def load(self, session: Session) -> Sequence[Message]:
        """Return the session's messages to put into the context, oldest first."""
        raise NotImplementedError(f"{type(self).__name__} must implement load()")

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None) -> None:
        """Append `messages` to the session's history; `lease` fences the write when given."""
        raise NotImplementedError(f"{type(self).__name__} must implement save()")

    async def before_run(self, ctx: RunContext) -> None:
        """Load the session's history into the context (when `load_messages` is set)."""
        if not self.load_messages or ctx.session is None:
            return
        messages = await self.load(ctx.session)
        if self.provide_filter is not None:
            messages = self.provide_filter(messages)
        ctx.add_history(messages)

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """In per-run mode, store the whole run now; in per-step mode every step is stored already."""
        if ctx.per_step_persistence or outcome.error is not None or ctx.session is None:
            return
        messages = [*self.select_request(ctx), *self.select_response(outcome.response_messages or ())]
        if messages:
            await self.save(ctx.session, messages, lease=ctx.lease_for(self))

    def select_request(self, ctx: RunContext) -> list[Message]:
        """Return the request messages this provider stores (the first save of a run)."""
        if self.store_request_filter is not None:
            return list(self.store_request_filter(ctx.tagged_request_messages()))
        selected: list[Message] = []
        if self.store_context_messages:
            for segment in ctx.segments:
                if segment.source.kind == "context":
                    selected.extend(segment.messages)
        if self.store_inputs:
            selected.extend(ctx.input)
        return selected

    def select_response(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Return the response messages (model output, tool results) this provider stores."""
        if not self.store_outputs:
            return ()
        if self.store_response_filter is not None:
            return self.store_response_filter(messages)
        return messages
