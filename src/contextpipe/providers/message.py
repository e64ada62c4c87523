"""`MessageProvider`: a context provider that only contributes messages (the seeds' MessageAIContextProvider).

Many providers add nothing but messages: recalled memories, search results, a user's profile. Such
a provider needs less than a whole `RunContext`: the session, the running agent and the request
messages it is given. `MessageProvider` hands it just that (a `MessageContext`), tags what it
returns as ``context`` from this provider and applies the three message filters on the way in and
out, so a subclass only says which messages it adds (`provide_messages`) and, if it learns, what it
does with a finished turn (`store_messages`).

Because it needs no run, it also works on its own: `messages_for` gives the messages it would add to
any list of messages, for example from model middleware before every model call of a run.

>>> import asyncio
>>> class Profile(MessageProvider):
...     async def provide_messages(self, ctx):
...         return [Message.user("The user is Alice, in Suzhou.")]
>>> [m.text for m in asyncio.run(Profile("profile").messages_for([Message.user("Hi")]))]
['The user is Alice, in Suzhou.']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..messages import INPUT, Message, Source
from .base import ContextProvider, MessageFilter, external_input

if TYPE_CHECKING:
    from ..pipeline import RunContext, RunOutcome
    from ..session import Session

__all__ = ["MessageContext", "MessageProvider"]


@dataclass(frozen=True, slots=True)
class MessageContext:
    """What a `MessageProvider` is given: no instructions, no tools, only messages and who asks."""

    request_messages: Sequence[Message]
    """The request messages this provider works from, each tagged with its source in this run; in
    `provide_messages` they passed `input_filter` (default: the caller's input only), in
    `store_messages` `store_request_filter` (default: the same)."""
    session: Session | None = None
    """The session, or None for a run (or a call of `messages_for`) without one."""
    agent: Any = None
    """The agent that is running, when the run context names it (``ctx.agent``); None otherwise."""


class MessageProvider(ContextProvider):
    """Base of providers that only add messages; override `provide_messages` (and `store_messages` to learn).

    Before a run the request messages pass `input_filter` (default: the caller's input only) and
    `provide_messages` is called with them; what it returns is added to the context, tagged
    ``Source("context", source_id)`` (the caller's objects are not changed). After a successful run
    `store_messages` is called with the request messages that pass `store_request_filter` (default:
    the caller's input only) and the response messages that pass `store_response_filter` (default:
    all); after a failed run it is not called.

    `messages_for` does the before-run half on its own, outside any run.
    """

    def __init__(
        self,
        source_id: str,
        *,
        input_filter: MessageFilter | None = None,
        store_request_filter: MessageFilter | None = None,
        store_response_filter: MessageFilter | None = None,
    ) -> None:
        super().__init__(source_id, input_filter=input_filter, store_request_filter=store_request_filter,
                         store_response_filter=store_response_filter)
        self._source = Source("context", source_id)

    async def provide_messages(self, ctx: MessageContext) -> Sequence[Message]:
        """Return the messages to add to the context (none by default); `ctx` holds the filtered request."""
        return ()

    async def store_messages(self, ctx: MessageContext, response_messages: Sequence[Message]) -> None:
        """Learn from a successful run: `ctx.request_messages` and `response_messages` passed the store filters."""

    async def messages_for(self, messages: Sequence[Message], *, session: Session | None = None,
                           agent: Any = None) -> list[Message]:
        """Return the messages this provider adds for `messages`, tagged as its context; usable outside a run.

        `messages` pass `input_filter` first; a message with no source counts as the caller's input
        (as in the seeds, where an untagged message is External). Only the added messages are
        returned, not `messages`: put them where they belong in your request (a run puts a
        provider's messages before the caller's input).
        """
        given = [m if m.source is not None else m.with_source(INPUT) for m in messages]
        context = MessageContext((self.input_filter or external_input)(given), session, agent)
        return [m.with_source(self._source) for m in await self.provide_messages(context)]

    async def before_run(self, ctx: RunContext) -> None:
        """Add what `provide_messages` returns for the request messages that pass `input_filter`."""
        provided = await self.provide_messages(MessageContext(self.given_messages(ctx), ctx.session, _agent(ctx)))
        ctx.add_messages(provided)

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        """Call `store_messages` with what passes the store filters (only when the run succeeded)."""
        if outcome.error is not None or outcome.response_messages is None:
            return
        request, response = self._messages_to_store(outcome)
        await self.store_messages(MessageContext(request, ctx.session, _agent(ctx)), response)


def _agent(ctx: RunContext) -> Any:
    """Return the running agent when the run context carries it (``ctx.agent``), else None."""
    return getattr(ctx, "agent", None)
