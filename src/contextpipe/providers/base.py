"""`ContextProvider` and `HistoryProvider`: the two extension points of a run.

A context provider shapes every run of an agent. In `before_run` it contributes through the
`RunContext`: instructions, messages, tools, model middleware, or `replace_messages`,
`replace_instructions`, `remove_tools`. Providers run in registration order and each sees what
earlier ones added, each message tagged with its source in this run (``history``, ``context``,
``input``). `after_run` is always called, in reverse order, with the request, the response messages
(None on failure) and the error (None on success).

As in the seeds, a provider has three message filters: `given_messages` applies `input_filter`
(default: the caller's input only) and `messages_to_learn` applies `store_request_filter` (default:
the caller's input only) and `store_response_filter` (default: everything), so a provider that
learns from what it is given never learns the same turn twice.

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

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import HistoryPolicy
from ..errors import UsageError
from ..messages import Message
from ..trace import ContextChange

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome
    from ..session import Session
    from ..stores.base import Checkpoint, Lease, SessionStore

__all__ = ["ContextProvider", "HistoryProvider", "LoadedHistory", "MessageFilter", "external_input"]

MessageFilter = Callable[[Sequence[Message]], Sequence[Message]]
"""Takes messages (tagged with their `Source` in this run) and returns the ones to keep, in order."""


def external_input(messages: Sequence[Message]) -> list[Message]:
    """Keep only the caller's input of this run (source ``input``): the default of the provider filters.

    Loaded history, other providers' messages, model output and tool results are left out, so a
    provider that learns from what it is given never learns the same turn twice. A message with no
    source (built by hand in a filter or middleware) counts as input, as in the seeds, so it is
    never dropped unseen.
    """
    return [m for m in messages if m.source is None or m.source.kind == "input"]


@dataclass(frozen=True, slots=True)
class LoadedHistory:
    """What a history provider loaded for a run."""

    messages: Sequence[Message]
    """The messages to put into the context, oldest first."""
    first_seq: int | None = None
    """The log sequence of ``messages[0]`` when they are a contiguous run of the stored log (then
    compaction can save summaries as checkpoints through `HistoryProvider.save_checkpoint`)."""
    summary: Message | None = None
    """A summary checkpoint standing for the log before ``messages``, if there is one."""
    left_out: int = 0
    """How many messages of the log, older than ``messages`` and after the checkpoint, a bound left out
    (the run's traces say so: a ``history_bound`` change); counted from log sequences, never read."""


class ContextProvider:
    """Base class of everything that shapes a run's context; override the hooks you need.

    `source_id` must be unique among an agent's providers; `kind` is a free tag shown in traces
    (``history``, ``memory``, ``search``, ``skills``, ``compaction``, ``instructions``, ``mcp``, ...).
    Keep per-session data in `ProviderState`, never on the provider: one instance serves every session.
    """

    kind: str = "custom"
    """What sort of provider this is, for traces."""

    def __init__(
        self,
        source_id: str,
        *,
        input_filter: MessageFilter | None = None,
        store_request_filter: MessageFilter | None = None,
        store_response_filter: MessageFilter | None = None,
    ) -> None:
        if not source_id or not isinstance(source_id, str):
            raise UsageError(f"a context provider needs a non-empty source_id, got {source_id!r}")
        self.source_id = source_id
        """Unique (per agent) name of this provider; messages it adds carry it in their `Source`."""
        self.input_filter = input_filter
        """Which request messages `given_messages` returns; None: the caller's input only (`external_input`)."""
        self.store_request_filter = store_request_filter
        """Which request messages `messages_to_learn` returns; None: the caller's input only."""
        self.store_response_filter = store_response_filter
        """Which response messages `messages_to_learn` returns; None: all of them."""

    def given_messages(self, ctx: RunContext) -> Sequence[Message]:
        """Return the request messages this provider works from in `before_run` (its `input_filter` applied).

        By default only the caller's input of this run, as the seeds' providers do: no loaded
        history, no other provider's messages, so nothing feeds back on itself.
        """
        messages = ctx.messages
        return (self.input_filter or external_input)(messages)

    def messages_to_learn(self, outcome: RunOutcome) -> list[Message]:
        """Return the messages this provider stores or learns from in `after_run`; empty when the run failed.

        The request messages pass `store_request_filter` (default: the caller's input only), the
        response messages `store_response_filter` (default: all).
        """
        request, response = self._messages_to_store(outcome)
        return [*request, *response]

    def _messages_to_store(self, outcome: RunOutcome) -> tuple[Sequence[Message], Sequence[Message]]:
        """Return the request and the response messages that pass the store filters; both empty when the run failed."""
        if outcome.error is not None or outcome.response_messages is None:
            return (), ()
        request = (self.store_request_filter or external_input)(outcome.request_messages)
        response = outcome.response_messages
        if self.store_response_filter is not None:
            response = self.store_response_filter(response)
        return request, response

    @property
    def state_keys(self) -> tuple[str, ...]:
        """Keys this provider uses in ``session.state`` besides its `ProviderState` attributes' (found by themselves).

        No key may clash with another provider's, or be one the session keeps (``user_id``, ``user_name``).
        """
        return ()

    async def before_run(self, ctx: RunContext) -> None:
        """Contribute to the run through `ctx` before the first model call."""

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Look at the finished (or failed) run; always called, in reverse provider order."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source_id!r})"


class HistoryProvider(ContextProvider):
    """A context provider that loads and stores a session's messages.

    Implement `load` and `save`. What it loads and stores is its `policy` (a `HistoryPolicy`:
    `load_messages`, `store_inputs`, `store_outputs`, `store_context_messages` and the three
    filters; by default it loads the history and stores the caller's input and the model's and
    tools' messages). Only one provider of an agent may load messages.
    """

    kind = "history"

    store: SessionStore | None = None
    """The session store this provider writes to, if it writes to one. An agent given no store uses
    it, and a run fences this provider's writes with its lease when this is the store holding it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse, when it is defined, a subclass whose `save` or `load_view` misses a keyword the run passes."""
        super().__init_subclass__(**kwargs)
        for method, keyword in (("save", "durable"), ("load_view", "lease_token")):
            parameters = inspect.signature(getattr(cls, method)).parameters
            if keyword not in parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
                raise UsageError(f"{cls.__name__}.{method} must take the keyword argument {keyword!r}, which the "
                                 f"run passes: add it to the signature (see HistoryProvider.{method})")

    def __init__(self, source_id: str = "history", *, policy: HistoryPolicy | None = None) -> None:
        policy = policy if policy is not None else HistoryPolicy()
        super().__init__(source_id, store_request_filter=policy.store_request_filter,
                         store_response_filter=policy.store_response_filter)
        self.policy = policy
        """What this provider loads and stores."""

    @property
    def stores_anything(self) -> bool:
        """False when this provider would never save a message."""
        return self.policy.stores_anything

    async def load(self, session: Session) -> Sequence[Message]:
        """Return the session's messages to put into the context, oldest first, with the ids they were saved with.

        The ids matter: a resumed run finds the calls it must answer by them, and a tool call's
        idempotency key is made from its message's id (`contextpipe.ToolContext.idempotency_key`).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement load()")

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        """Append `messages` to the session's history; `lease` fences the write when given.

        The run passes ``durable=False`` for writes a crash would repair anyway (results of
        idempotent tools), and always follows them with a durable write before the next model call
        is answered; an implementation may ignore it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement save()")

    async def load_view(self, session: Session, *, lease_token: int | None = None) -> LoadedHistory:
        """Return what to load for a run; by default `load`'s messages, with no log positions.

        Override it (instead of `load`) to report where the messages sit in the log and a summary
        checkpoint, so compaction can save summaries through `save_checkpoint`. `lease_token` is the
        fencing token of the run's lease, when the run holds one (`History` keeps a session's
        loaded messages for its next run while the tokens follow one another).
        """
        return LoadedHistory(await self.load(session))

    async def save_checkpoint(self, session: Session, checkpoint: Checkpoint, *, lease: Lease | None = None) -> bool:
        """Keep `checkpoint` (a summary of the log up to a sequence); return False if not supported."""
        return False

    async def before_run(self, ctx: RunContext) -> None:
        """Load the session's history into the context (when ``policy.load_messages`` is set)."""
        policy = self.policy
        if not policy.load_messages or ctx.session is None:
            return
        self.provide(ctx, await self.load_view(ctx.session, lease_token=ctx.lease_token))

    def provide(self, ctx: RunContext, view: LoadedHistory, bounded_by: str = "the history provider's bound") -> None:
        """Put a loaded `view` into the run's context, noting in its traces what a bound left out."""
        policy = self.policy
        if view.left_out and view.first_seq is not None:
            first = view.first_seq - view.left_out
            ctx.journal.changes.append(ContextChange(self.source_id, "history_bound", (
                f"{view.left_out:,} older messages (log sequences {first:,} to {view.first_seq - 1:,}) not loaded: "
                f"{bounded_by}",)))
        if policy.provide_filter is not None:
            loaded = [view.summary, *view.messages] if view.summary is not None else view.messages
            ctx.add_history(policy.provide_filter(loaded))
            return
        if view.summary is not None:
            ctx.add_history([view.summary])
        ctx.add_history(view.messages, first_seq=view.first_seq)

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Nothing to do: the run's step writer saves through `save` (per step, or once per run)."""

    def select_request(self, ctx: RunContext) -> list[Message]:
        """Return the request messages this provider stores (the first save of a run)."""
        if self.store_request_filter is not None:
            return list(self.store_request_filter(ctx.messages))
        selected: list[Message] = []
        if self.policy.store_context_messages:
            for segment in ctx.segments:
                if segment.source.kind == "context":
                    selected.extend(segment.messages)
        if self.policy.store_inputs:
            selected.extend(ctx.input)
        return selected

    def select_response(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Return the response messages (model output, tool results) this provider stores."""
        if not self.policy.store_outputs:
            return ()
        if self.store_response_filter is not None:
            return self.store_response_filter(messages)
        return messages
