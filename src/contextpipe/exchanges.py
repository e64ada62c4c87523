"""Tool exchanges: the one module that knows how function calls and their results go together.

A *tool exchange* is an assistant message with function calls followed by the results of all of
those calls (in ``tool`` messages, one or several). Every other part of contextpipe asks this
module: compaction groups messages with `group_messages`, the request checks use
`exchange_problem`, the loop finds what an interrupted run left open with `unanswered_calls`, a
bounded history page drops results cut off from their calls with `drop_leading_orphans`, and model
clients decide which messages carry results with `carries_results`.

A call whose result came after the call was answered (a sync tool that outlived its timeout) gets
a `late_result`: a plain message after the exchange, never a second result for the same call. It
has the ``user`` role (every model API takes one there) but is no user turn: `group_messages`
does not count it as one, and the memory providers do not learn it as the user's words
(`is_late_result`).

Parallel calls may be answered by several ``tool`` messages, one per result, saved as each result
is produced: they still form one exchange, in any order, as long as no other message comes between.

>>> from contextpipe.messages import FunctionCall, FunctionResult, Message
>>> call = Message("assistant", (FunctionCall("c1", "lookup", "{}"),))
>>> [g.kind for g in group_messages([Message.user("hi"), call, Message("tool", (FunctionResult("c1", "ok"),))])]
['user', 'tool_exchange']
>>> exchange_problem([call])
'calls lookup (c1) have no result'
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from .messages import FunctionCall, FunctionResult, Message, Part, Source, TextPart

__all__ = [
    "LATE_RESULT_KEY",
    "Group",
    "GroupKind",
    "ValidatedChunks",
    "carries_results",
    "drop_leading_orphans",
    "exchange_problem",
    "group_messages",
    "is_late_result",
    "last_exchange",
    "late_result",
    "normalise_calls",
    "open_groups",
    "repair_exchanges",
    "tool_message",
    "unanswered_calls",
    "untagged",
]

GroupKind: TypeAlias = Literal["system", "summary", "user", "assistant", "tool_exchange", "orphan"]

_CALLS = 1
_RESULTS = 2


def _flag(message: Message) -> int:
    """0 without function parts, 1 with calls, 2 with results, 3 with both (cached on the message)."""
    flag = message._tool_flag
    return flag if flag >= 0 else message.tool_flag  # computed once, then cached on the message


class ValidatedChunks:
    """A sequence of messages that knows which of its parts were already validated.

    A run's request view (`pipeline.MessageView`) is one: it is made of parts (the providers'
    segments, the run's own messages), and a part the run validated once (its tool exchanges
    complete) cannot change afterwards. The checks of this module and `_run.invariants` use it to
    skip work they did before; any other sequence is checked message by message.
    """

    __slots__ = ()

    def validated_chunks(self) -> Iterator[tuple[Sequence[Message], bool]]:
        """Iterate the untagged messages part by part, each with whether it was already validated complete."""
        raise NotImplementedError

    def has_id(self, message_id: str) -> bool:
        """Return True when a message with this id is in the sequence (without tagging it)."""
        raise NotImplementedError


def untagged(messages: Sequence[Message]) -> Iterable[Message]:
    """Return the messages as contributed, without the tagged copies a run's view makes (counts read no source)."""
    if isinstance(messages, ValidatedChunks):
        return itertools.chain.from_iterable(chunk for chunk, _ in messages.validated_chunks())
    return messages


def carries_results(message: Message) -> bool:
    """Tell whether `message` answers calls: a ``tool`` message, or a non-assistant one with results."""
    return message.role == "tool" or (message.role != "assistant" and bool(_flag(message) & _RESULTS))


@dataclass(slots=True)
class Group:
    """Consecutive messages that are kept or dropped together: ``messages[start:end]``."""

    kind: GroupKind
    """What the group is (see `compaction`'s module docstring)."""
    start: int
    """Index of the group's first message."""
    end: int
    """Index after its last message."""
    tokens: int = 0
    """Tokens of its messages (when counts were given)."""
    call_ids: list[str] | None = None
    """For a tool exchange: the ids of its calls."""


def group_messages(messages: Sequence[Message], counts: Sequence[int] | None = None, *,
                   is_summary: Callable[[Message], bool] | None = None) -> list[Group]:
    """Split `messages` into groups; linear in the number of messages.

    A result whose call is not in `messages` forms an ``orphan`` group (it may not be sent). A plain
    message for which `is_summary` is true forms a ``summary`` group.
    """
    groups: list[Group] = []
    open_by_call: dict[str, Group] = {}
    for i, m in enumerate(messages):
        tokens = counts[i] if counts is not None else 0
        parts = m.parts
        flag = 0 if len(parts) == 1 and type(parts[0]) is TextPart else _flag(m)  # plain text: decided at once
        if flag == 0:
            groups.append(Group(_plain_kind(m, is_summary), i, i + 1, tokens))
        elif carries_results(m):
            _close_exchange(groups, open_by_call, m, i, tokens)
        else:
            group = Group("tool_exchange", i, i + 1, tokens, [p.call_id for p in m.parts if type(p) is FunctionCall])
            for cid in group.call_ids or ():
                open_by_call[cid] = group
            groups.append(group)
    return groups


def open_groups(groups: Sequence[Group], messages: Sequence[Message]) -> set[int]:
    """Return the ``id()`` of each tool exchange of `groups` with a call that has no result in it.

    Such calls wait for an approval, or a crashed run left them: compaction must keep them so the
    run answers or repairs them (an approval's resume finds them; the new input never comes before them).
    """
    found = set()
    for group in groups:
        if group.kind == "tool_exchange" and group.call_ids:
            answered = {r.call_id for m in messages[group.start:group.end] for r in m.function_results}
            if any(cid not in answered for cid in group.call_ids):
                found.add(id(group))
    return found


def _plain_kind(message: Message, is_summary: Callable[[Message], bool] | None) -> GroupKind:
    if message.metadata:
        if is_summary is not None and is_summary(message):
            return "summary"
        if LATE_RESULT_KEY in message.metadata:
            return "assistant"  # a tool's output, not a user turn: never counted or pinned as one
    role = message.role
    return "system" if role == "system" else "user" if role == "user" else "assistant"


def _close_exchange(groups: list[Group], open_by_call: dict[str, Group], message: Message, index: int,
                    tokens: int) -> None:
    owners = [open_by_call.get(p.call_id) for p in message.parts if type(p) is FunctionResult]
    known = [g for g in owners if g is not None]
    if not known:
        groups.append(Group("orphan", index, index + 1, tokens))
        return
    first = min(known, key=lambda g: g.start)
    # Merge everything from the call to this result into one group: never split an exchange.
    while groups[-1] is not first:
        absorbed = groups.pop()
        first.tokens += absorbed.tokens
        if absorbed.call_ids:
            assert first.call_ids is not None
            first.call_ids += absorbed.call_ids
            for cid in absorbed.call_ids:
                open_by_call[cid] = first
    first.end = index + 1
    first.tokens += tokens


def exchange_problem(messages: Sequence[Message]) -> str | None:
    """Describe the first unanswered call or orphan result in `messages`, or return None.

    A run's request view (a `ValidatedChunks`) says which of its parts were already validated
    complete; those are skipped when no call is open before them (they cannot change).
    """
    pieces: Iterable[tuple[Sequence[Message], bool]] = (
        messages.validated_chunks() if isinstance(messages, ValidatedChunks) else ((messages, False),))
    open_calls: dict[str, str] = {}
    start = 0
    for chunk, checked in pieces:
        if not checked or open_calls:
            problem = _scan(chunk, start, open_calls)
            if problem is not None:
                return problem
        start += len(chunk)
    if open_calls:
        return f"calls {_names(open_calls)} have no result"
    return None


def _scan(messages: Sequence[Message], start: int, open_calls: dict[str, str]) -> str | None:
    """Check `messages` (the first at index `start`) with the calls open before them; update `open_calls`."""
    for index, message in enumerate(messages, start):
        flag = message._tool_flag  # inline and cached: this loop runs over every request's messages
        if flag < 0:
            flag = _flag(message)
        if flag == 0 and not open_calls:
            continue  # the common case: plain text with no exchange in progress
        if message.role == "tool" or (flag & _RESULTS and message.role != "assistant"):
            problem = _answer(message, index, open_calls)
        else:
            problem = _open(message, index, flag, open_calls)
        if problem is not None:
            return problem
    return None


def _answer(message: Message, index: int, open_calls: dict[str, str]) -> str | None:
    """Close the calls `message`'s results answer; describe an orphan result."""
    for part in message.parts:
        if type(part) is FunctionResult:
            if part.call_id not in open_calls:
                return f"message {index} holds a result for call {part.call_id!r}, which is not open"
            del open_calls[part.call_id]
    return None


def _open(message: Message, index: int, flag: int, open_calls: dict[str, str]) -> str | None:
    """Open `message`'s calls; describe a message that comes while calls are open, or a bad call."""
    if open_calls:
        return f"message {index} ({message.role}) comes before the results of calls {_names(open_calls)}"
    if flag & _RESULTS:
        return f"message {index} ({message.role}) holds function results but is not a tool message"
    for part in message.parts:
        if type(part) is FunctionCall:
            if part.call_id in open_calls or not part.call_id:
                return f"message {index} repeats call id {part.call_id!r}"
            open_calls[part.call_id] = part.name
    return None


def _names(open_calls: dict[str, str]) -> str:
    return ", ".join(f"{name} ({cid})" for cid, name in open_calls.items())


def unanswered_calls(messages: Sequence[Message]) -> list[FunctionCall]:
    """Return the calls of the last assistant message in `messages` that have no result after it.

    Only the tail is read: trailing tool messages and the assistant message before them.
    """
    return last_exchange(messages)[1]


def last_exchange(messages: Sequence[Message]) -> tuple[Message | None, list[FunctionCall]]:
    """Return the last assistant message of `messages` and its calls without a result after it (none: None, []).

    Only the tail is read: trailing tool messages and the assistant message before them.
    """
    answered: set[str] = set()
    i = len(messages) - 1
    while i >= 0 and messages[i].role == "tool":
        answered.update(r.call_id for r in messages[i].function_results)
        i -= 1
    if i < 0 or messages[i].role != "assistant":
        return None, []
    return messages[i], [c for c in messages[i].function_calls if c.call_id not in answered]


def drop_leading_orphans(messages: list[Message]) -> list[Message]:
    """Drop tool results at the start of a bounded page whose calls were cut off by the bound."""
    start = 0
    while start < len(messages) and messages[start].role == "tool":
        start += 1
    return messages[start:] if start else messages


def tool_message(calls: Sequence[FunctionCall], results: Sequence[FunctionResult]) -> Message:
    """Return the ``tool`` message answering `calls` with `results` (attributed to the tool when only one)."""
    names = {c.name for c in calls}
    source = Source("tool", names.pop() if len(names) == 1 else None)
    return Message("tool", tuple(results), source=source)


LATE_RESULT_KEY: Final = "late_result"
"""Metadata key of a late result: the id of the call it belongs to (``metadata={"late_result": "call_1"}``)."""


def late_result(call: FunctionCall, result: FunctionResult) -> Message:
    """Return the message recording what `call` produced after it was answered with a timeout error.

    The call's exchange is complete already (the model read the timeout error), so the real
    result cannot be a second ``tool`` message for it: it is a ``user`` message of its own, with
    the tool as its source and the call id under `LATE_RESULT_KEY`, that goes after the exchange
    (at the next step, or at the end of the run) and that the model reads like any other.

    >>> call = FunctionCall("call_1", "build_report", "{}")
    >>> message = late_result(call, FunctionResult("call_1", "report ready"))
    >>> print(message.text)
    [Late result of call call_1 to 'build_report', which timed out] It has finished since and returned:
    report ready
    >>> message.metadata, message.source
    ({'late_result': 'call_1'}, Source(kind='tool', source_id='build_report'))
    """
    how = "failed" if result.is_error else "returned"
    text = f"[Late result of call {call.call_id} to {call.name!r}, which timed out] It has finished since and {how}:\n"
    text += result.result
    return Message("user", (TextPart(text), *result.parts), metadata={LATE_RESULT_KEY: call.call_id},
                   source=Source("tool", call.name))


def is_late_result(message: Message) -> bool:
    """Tell whether `message` is a tool's `late_result` (a ``user`` message that is a tool's output, not the user's).

    >>> is_late_result(late_result(FunctionCall("c1", "build_report", "{}"), FunctionResult("c1", "ready")))
    True
    >>> is_late_result(Message.user("ready"))
    False
    """
    return LATE_RESULT_KEY in message.metadata


def normalise_calls(messages: Sequence[Message], seen: set[str] | None = None) -> tuple[list[Message], list[str]]:
    """Make model output safe to store: every call has a name and a non-empty id, unique in the turn.

    `seen` holds call ids already taken (it is updated; by default a fresh set). Returns the
    messages (the same objects when nothing had to change) and one note per change made.
    """
    seen = set() if seen is None else seen
    notes: list[str] = []
    out: list[Message] = []
    for message in messages:
        if not _flag(message) & _CALLS:
            out.append(message)
            continue
        parts = list(message.parts)
        changed = False
        for index, part in enumerate(parts):
            if type(part) is not FunctionCall:
                continue
            fixed = _fixed_call(part, seen, notes)
            seen.add(fixed.call_id)
            if fixed is not part:
                parts[index] = fixed
                changed = True
        out.append(_with_parts(message, parts) if changed else message)
    return out, notes


def _fixed_call(call: FunctionCall, seen: set[str], notes: list[str]) -> FunctionCall:
    call_id, name = call.call_id, call.name
    if not call_id or call_id in seen:
        new_id = f"call_cp_{os.urandom(6).hex()}"
        notes.append(f"call id {call_id!r} of {name or '(unnamed)'!r} was "
                     f"{'empty' if not call_id else 'used twice'}; renamed {new_id!r}")
        call_id = new_id
    if not name:
        notes.append(f"call {call_id!r} had no tool name; it will be answered with an error")
        name = "(unnamed)"
    if call_id == call.call_id and name == call.name:
        return call
    return FunctionCall(call_id, name, call.arguments)


def _with_parts(message: Message, parts: Sequence[Part]) -> Message:
    return Message(message.role, tuple(parts), message.id, message.author_name, message.created_at,
                   message.metadata, message.source)


def repair_exchanges(messages: Sequence[Message]) -> tuple[list[Message], list[str]]:
    """Return a view of `messages` that satisfies `exchange_problem`, and a note per change.

    For a log that breaks the rules anyway (older data, a bug): a repeated or empty call id is
    renamed in the call and in its result, an orphan result is left out, a call whose result never
    came (before the next message) gets an error result right after its exchange; calls still open
    at the end of the log are left for the loop, which answers them as after a crash. Stored
    messages are never changed; a log that is already valid comes back as is, with no notes.
    """
    if exchange_problem(messages) is None:
        return list(messages), []
    notes: list[str] = []
    out: list[Message] = []
    open_calls: dict[str, FunctionCall] = {}
    renamed: dict[str, list[str]] = {}
    for message in messages:
        if carries_results(message):
            kept = _answered_results(message, open_calls, renamed, notes)
            if kept is not None:
                out.append(kept)
            continue
        _close_open_calls(out, open_calls, notes)
        if _flag(message) & _CALLS:
            message = _renamed_calls(message, renamed, notes)
            for call in message.function_calls:
                open_calls[call.call_id] = call
        out.append(message)
    return out, notes  # calls still open at the very end are the loop's to answer (resume repair)


def _renamed_calls(message: Message, renamed: dict[str, list[str]], notes: list[str]) -> Message:
    fixed, call_notes = normalise_calls([message])
    new = fixed[0]
    for before, after in zip(message.function_calls, new.function_calls, strict=True):
        if before.call_id != after.call_id:
            renamed.setdefault(before.call_id, []).append(after.call_id)
    notes.extend(call_notes)
    return new


def _answered_results(message: Message, open_calls: dict[str, FunctionCall], renamed: dict[str, list[str]],
                      notes: list[str]) -> Message | None:
    parts: list[Part] = []
    for part in message.parts:
        if type(part) is not FunctionResult:
            parts.append(part)
            continue
        call_id = part.call_id
        pending = [cid for cid in renamed.get(call_id, ()) if cid in open_calls]
        if call_id not in open_calls and pending:
            call_id = pending[0]
            part = FunctionResult(call_id, part.result, part.is_error, part.parts)
        if call_id not in open_calls:
            notes.append(f"left out result for call {part.call_id!r}, which was not open")
            continue
        del open_calls[call_id]
        parts.append(part)
    if not any(type(p) is FunctionResult for p in parts):
        return None
    return _with_parts(message, parts) if len(parts) != len(message.parts) or parts != list(message.parts) else message


def _close_open_calls(out: list[Message], open_calls: dict[str, FunctionCall], notes: list[str]) -> None:
    if not open_calls:
        return
    calls = list(open_calls.values())
    open_calls.clear()
    notes.append("answered calls " + ", ".join(f"{c.name} ({c.call_id})" for c in calls)
                 + " whose results were never stored")
    out.append(tool_message(calls, [FunctionResult(
        c.call_id, "Error: no result was recorded for this call (the stored log was inconsistent); "
        "it was not run again.", is_error=True) for c in calls]))
