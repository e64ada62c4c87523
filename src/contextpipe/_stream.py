"""`AgentStream`: the events of one streamed run (`Agent.stream`), and the mark of its admission.

A run's event generator (`Agent._events`) yields `ADMITTED` first, once the run holds its
session's lease, its input was accepted (no other content under its message id) and its approval
decisions were checked against the session's log; any error before that is the run's admission
error. `AgentStream` takes the mark out of the events: `AgentStream.start` waits for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Final, Generic, Literal

from .errors import UsageError
from .events import OutputT, RunDone, RunResult, StreamEvent

__all__ = ["ADMITTED", "AgentStream", "Admitted"]


class Admitted:
    """The mark a run's event generator yields once the run is admitted (never shown to a caller)."""

    kind: Literal["admitted"] = "admitted"


ADMITTED: Final = Admitted()


class AgentStream(Generic[OutputT]):
    """The events of one streamed run; iterate it, or use it as an async context manager.

    ``AgentStream[City]`` is the stream of a run given ``output_type=City``: its `result` has ``output: City``.
    """

    def __init__(self, events: AsyncIterator[StreamEvent | Admitted]) -> None:
        self._events = events
        self._admitted = False
        self.result: RunResult[OutputT] | None = None
        """The run's result, once the stream has finished."""

    async def start(self) -> None:
        """Wait until the run is admitted; raise its error if it cannot start.

        Admitted means: the run holds its session's lease, its input is accepted (no other content
        under its message id) and its approval decisions fit the session's log. Until then nothing
        was run, and an error (`SessionBusy`, `InputConflict`, `ApprovalError`, `LeaseLost` for a
        session deleted meanwhile, ...) is raised here, with nothing stored. After it, iterating
        yields every event of the run, from the first; errors of the run itself come from the
        iteration. A server holds its answer's status line until then, so a busy session is a 409,
        not a stream that fails. Calling it again returns at once; iterating without it works too.
        Start and iterate the stream in the same task: the run's lease is kept alive for that task.

        >>> import asyncio
        >>> from contextpipe import Agent, SessionBusy
        >>> from contextpipe.testing import ScriptedModel
        >>> agent = Agent(ScriptedModel(["Hello!"]))
        >>> async def main():
        ...     session = await agent.session("chat")
        ...     async with agent.stream("Hi", session=session) as events:
        ...         await events.start()  # the run holds the session now
        ...         try:
        ...             await agent.stream("Hi again", session=session).start()
        ...         except SessionBusy:
        ...             print("busy")
        ...         kinds = [event.kind async for event in events]
        ...     return kinds[-1], events.result.text
        >>> asyncio.run(main())
        busy
        ('run_done', 'Hello!')
        """
        if self._admitted:
            return
        try:
            await self._admit()
        except StopAsyncIteration:
            raise UsageError("this stream was closed before its run started: start a new one") from None

    async def _admit(self) -> None:
        first = await self._events.__anext__()
        assert isinstance(first, Admitted), first  # (`Agent._events` yields it before any event)
        self._admitted = True

    def __aiter__(self) -> AgentStream[OutputT]:
        return self

    async def __anext__(self) -> StreamEvent:
        if not self._admitted:
            await self._admit()
        event = await self._events.__anext__()
        assert not isinstance(event, Admitted)
        if isinstance(event, RunDone):
            self.result = event.result
        return event

    async def __aenter__(self) -> AgentStream[OutputT]:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the run now (if still going): providers get `after_run`, the lease is released."""
        closer = getattr(self._events, "aclose", None)
        if closer is not None:
            await closer()
