"""What every request sent to a model must satisfy, checked before each call.

- the request is not empty;
- every function call is answered by a result before the next turn, and no result is an orphan;
- the caller's latest input is present;
- system instructions come first (they travel in `ModelRequest.instructions`, ahead of all messages).

A violation is a bug in a provider, middleware or compaction strategy: it raises
`RequestInvariantError` instead of sending the model a request it would reject or misread.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import RequestInvariantError
from ..exchanges import ValidatedChunks, exchange_problem
from ..messages import Message

__all__ = ["check_messages"]


def check_messages(messages: Sequence[Message], *, latest_input: Message | None) -> None:
    """Raise `RequestInvariantError` unless `messages` may be sent to a model."""
    if not messages:
        raise RequestInvariantError("the request to the model has no messages")
    problem = exchange_problem(messages)
    if problem is not None:
        raise RequestInvariantError(f"broken tool exchange in the request: {problem}")
    if latest_input is not None:
        wanted = latest_input.id
        # A run's view finds its input without a scan of its tail.
        found = (messages.has_id(wanted) if isinstance(messages, ValidatedChunks)
                 else any(m.id == wanted for m in reversed(messages)))
        if not found:
            raise RequestInvariantError(
                f"the caller's latest input ({latest_input.text[:60]!r}) was dropped from the request"
            )
