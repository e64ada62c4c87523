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

from .errors import RequestInvariantError
from .messages import FunctionCall, FunctionResult, Message

__all__ = ["check_messages", "tool_exchange_problem"]


def tool_exchange_problem(messages: Sequence[Message]) -> str | None:
    """Describe the first unanswered call or orphan result in `messages`, or return None."""
    open_calls: dict[str, str] = {}
    for index, message in enumerate(messages):
        flag = message._tool_flag
        if flag < 0:
            flag = message.tool_flag
        if flag == 0 and not open_calls:
            continue  # the common case: plain text with no exchange in progress
        if message.role == "tool" or (flag == 2 and message.role != "assistant"):
            for part in message.parts:
                if type(part) is FunctionResult:
                    if part.call_id not in open_calls:
                        return f"message {index} holds a result for call {part.call_id!r}, which is not open"
                    del open_calls[part.call_id]
            continue
        if open_calls:
            names = ", ".join(f"{name} ({cid})" for cid, name in open_calls.items())
            return f"message {index} ({message.role}) comes before the results of calls {names}"
        if flag & 2:
            return f"message {index} ({message.role}) holds function results but is not a tool message"
        for part in message.parts:
            if type(part) is FunctionCall:
                open_calls[part.call_id] = part.name
    if open_calls:
        names = ", ".join(f"{name} ({cid})" for cid, name in open_calls.items())
        return f"calls {names} have no result"
    return None


def check_messages(messages: Sequence[Message], *, latest_input: Message | None) -> None:
    """Raise `RequestInvariantError` unless `messages` may be sent to a model."""
    if not messages:
        raise RequestInvariantError("the request to the model has no messages")
    problem = tool_exchange_problem(messages)
    if problem is not None:
        raise RequestInvariantError(f"broken tool exchange in the request: {problem}")
    if latest_input is not None:
        wanted = latest_input.id
        if not any(m.id == wanted for m in reversed(messages)):
            raise RequestInvariantError(
                f"the caller's latest input ({latest_input.text[:60]!r}) was dropped from the request"
            )
