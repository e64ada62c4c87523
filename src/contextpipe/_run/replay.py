"""Answered inputs: a run whose input was answered before in its session gives back that answer.

A client that retries (a timeout, a dropped connection, a restarted worker) sends the same input
message again, with the same id. Under the run's lease, before anything else, the agent asks the
session's log whether that id is there (`find_earlier`): one lookup in the index that makes appends
idempotent (`SessionStore.message_seq`), and none at all for text input, whose message id was made
for this run. When the id is there:

- the earlier run finished: its messages are read back from the log and returned as a `RunResult`
  marked ``replayed`` (no model call, nothing stored);
- the earlier run was interrupted (its input stored, no final answer) and nothing came after it:
  the call resumes it, as ``agent.run(None)`` resumes a session, and its result holds the earlier
  run's messages before the new ones;
- otherwise (other content under that id, or an interrupted run that later runs followed) the call
  is refused with `InputConflict`.

A run's input is what it stored: the given messages the log did not hold yet, ending at the looked-up
one; the given messages before them (a client sending its history again) must be stored, unchanged,
earlier in the log. A run's messages are the ones after its input that a model or a tool produced
(source ``model`` or ``tool``), up to its final answer: the first assistant message without function
calls, or the first message carrying the stop reason of a run stopped at a limit under `STOP_KEY`
(the model's last answer, or the tool message answering the calls it made when its tools were
withdrawn). What follows is another run's, even when it is a model's too (``agent.run(None)`` after
the answer). A message of another kind before the final answer (the next run's input or context)
means the run was interrupted. Every built-in model adapter answers a call with one message; a
model that answers one call with several, the first without function calls, replays up to that one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast, get_args

from ..errors import InputConflict, shorten
from ..events import RunResult, StopReason
from ..messages import Message
from ..models.base import Usage
from ..stores.base import SessionStore

if TYPE_CHECKING:
    from ..providers.base import HistoryProvider
    from ..rewind import Rewound
    from ..session import Session

__all__ = ["IGNORED_METADATA", "STOP_KEY", "EarlierRun", "answered_last", "find_earlier", "log_store", "marked_stopped",
           "replayed", "same_input"]

IGNORED_METADATA: Final = frozenset({"ag-ui.input"})
"""Metadata keys a route marks its input with (the AG-UI route's ``serve._agui_rewind.INPUT_KEY``): not part
of what the input says, so a message stored before a route marked it is the same input as one marked."""
STOP_KEY: Final = "stop_reason"
"""Metadata key of the last message of a run stopped at a limit: why the run stopped there."""


def marked_stopped(message: Message, reason: StopReason) -> Message:
    """Return `message`, the last of a run stopped at a limit, saying why in its metadata (`STOP_KEY`)."""
    return Message(message.role, message.parts, message.id, message.author_name, message.created_at,
                   {**message.metadata, STOP_KEY: reason}, message.source)

_PAGE: Final = 64
"""Messages read per page while looking for the end of an earlier run (most runs fit in one)."""

_STOPS: Final = frozenset(get_args(StopReason))


@dataclass(frozen=True, slots=True)
class EarlierRun:
    """A run of the session whose input was the same as this call's."""

    input: list[Message]
    """Its input messages, as stored."""
    messages: list[Message]
    """What its model and tools produced, as stored."""
    stop_reason: StopReason | None
    """Why it stopped; None when it was interrupted before its final answer (this call resumes it)."""

    def result(self, session: Session) -> RunResult:
        """Return the earlier run's result, rebuilt from the log and marked replayed."""
        return RunResult(text=final_text(self.messages), messages=list(self.messages), input=list(self.input),
                         usage=Usage(), traces=[], stop_reason=self.stop_reason or "completed", steps=0,
                         session=session, replayed=True)


def replayed(earlier: EarlierRun | None, session: Session | None) -> RunResult | None:
    """Return the result to give back instead of running: the earlier run's, when it finished."""
    if earlier is None or earlier.stop_reason is None or session is None:
        return None
    return earlier.result(session)


def final_text(messages: Sequence[Message]) -> str:
    """Return the text of the last assistant message (empty when there is none)."""
    for m in reversed(messages):
        if m.role == "assistant":
            return m.text
    return ""


def log_store(providers: Sequence[HistoryProvider]) -> SessionStore | None:
    """Return the store of the history the run loads, when its log tells what each run was.

    That is a history in a `SessionStore` that stores every input and every output, unfiltered: a
    log without the answers would make every answered run look interrupted, and one without some
    inputs could not match a retry. Otherwise retries are not looked up (they run again).
    """
    for p in providers:
        if p.policy.load_messages:
            policy = p.policy
            whole = (policy.store_inputs and policy.store_outputs and p.store_request_filter is None
                     and p.store_response_filter is None)
            return p.store if isinstance(p.store, SessionStore) and whole else None
    return None


async def find_earlier(store: SessionStore, session: Session, input: Sequence[Message]) -> EarlierRun | None:
    """Return the run of `session` that had this `input` (found by its last message's id), or None.

    Only the session's view counts (`contextpipe.rewind`): what a rewind left out of it is no run's
    answer. Raises `InputConflict` when the id is there with other content, is itself rewound, or
    names an interrupted run that later runs followed.
    """
    tenant, session_id, last = session.tenant, session.id, input[-1]
    seq = await store.message_seq(tenant, session_id, last.id)
    if seq is None:
        return None
    from ..rewind import rewound_ranges  # here: only a retry reads the view, and a first run need not load it

    rewound = await rewound_ranges(store, tenant, session_id, session.state)  # never rewound: no lookup
    if seq in rewound:
        raise InputConflict(
            f"message {shorten(last.id)} of session {shorten(session_id)} was rewound (undone), so its run is no "
            "longer the session's; send the input again with a new message id")
    page = await store.load(tenant, session_id, after=max(seq - len(input), 0), before=seq + 1 + _PAGE)
    at = seq - page.first_seq  # where the input's last message is in the page
    given, stored = _stored_input(input, page.messages, at, session_id)
    before = await _stored_before(store, session, input[:given], seq - len(stored) + 1, last)
    produced, ended = await _produced(store, session, list(enumerate(page.messages, page.first_seq))[at + 1:],
                                      seq + _PAGE, rewound)
    stop = _stop_reason(produced)
    if stop is None and ended:
        raise InputConflict(
            f"message {shorten(last.id)} was sent to session {shorten(session_id)} before, but that run was "
            "interrupted before its answer and later runs followed it, so it cannot be resumed; send the input "
            "again with a new message id")
    return EarlierRun([*before, *stored], produced, stop)


async def answered_last(store: SessionStore, session: Session, seq: int, rewound: Rewound) -> bool:
    """Tell whether the run whose input ends at `seq` completed (with an answer) and nothing follows it in the view."""
    page = await store.load(session.tenant, session.id, after=seq, before=seq + 1 + _PAGE)
    produced, ended = await _produced(store, session, list(enumerate(page.messages, page.first_seq)),
                                      seq + _PAGE, rewound)
    return not ended and _stop_reason(produced) == "completed"


def _stored_input(input: Sequence[Message], window: Sequence[Message], at: int,
                  session_id: str) -> tuple[int, list[Message]]:
    """Return how many of `input` the earlier run found in the log already, and the ones it stored.

    It stored the input messages the log did not hold yet, in order, ending at ``window[at]``; the
    ones before them (a client sending its history again) must be stored ones, earlier in the log.
    """
    last = input[-1]
    if not 0 <= at < len(window) or window[at].id != last.id:
        raise _conflict(last, session_id)
    given, start = len(input), at
    while given and start >= 0 and window[start].id == input[given - 1].id:
        given, start = given - 1, start - 1
    stored = list(window[start + 1:at + 1])
    if any(_content(a) != _content(b) or _not_input(b) for a, b in zip(input[given:], stored, strict=True)):
        raise _conflict(last, session_id)
    return given, stored


async def _produced(store: SessionStore, session: Session, rest: Sequence[tuple[int, Message]], end: int,
                    rewound: Rewound) -> tuple[list[Message], bool]:
    """Return the earlier run's messages in the view and whether a message of another run follows them.

    They are read from `rest` (the page after its input, with sequences, ending at sequence `end`),
    then page by page; rewound messages (and the markers) are passed over.
    """
    produced: list[Message] = []
    while True:
        for s, m in rest:
            if s in rewound:
                continue
            if m.source is None or m.source.kind not in ("model", "tool") or _stop_reason(produced) is not None:
                return produced, True  # another run's input or context, or a later run after this one's answer
            produced.append(m)
        if len(rest) < _PAGE:
            return produced, False
        page = await store.load(session.tenant, session.id, after=end, before=end + 1 + _PAGE)
        rest = list(enumerate(page.messages, page.first_seq))
        end += _PAGE


async def _stored_before(store: SessionStore, session: Session, messages: Sequence[Message], first: int,
                         last: Message) -> list[Message]:
    """Return the stored copies of `messages`, each found by its id before sequence `first`.

    These are the input messages the log held before the earlier run (so it did not store them
    again); a client that sends its history along with a retry sends them again. Each costs a
    lookup and a read, on a retry only. Raises `InputConflict` when one is not there, or differs.
    """
    found: list[Message] = []
    for m in messages:
        seq = await store.message_seq(session.tenant, session.id, m.id)
        page = None if seq is None or seq >= first else await store.load(
            session.tenant, session.id, after=seq - 1, before=seq + 1)
        if page is None or [s.id for s in page.messages] != [m.id] or _content(page.messages[0]) != _content(m):
            raise _conflict(last, session.id)
        found.append(page.messages[0])
    return found


def _conflict(message: Message, session_id: str) -> InputConflict:
    return InputConflict(
        f"message {shorten(message.id)} is already in session {shorten(session_id)}, but not as this input "
        "(its content or the messages before it differ); a retried input must be sent exactly as before, "
        "and a new one needs a new message id")


def _stop_reason(produced: Sequence[Message]) -> StopReason | None:
    """Return why the run that produced these messages stopped, or None if it did not finish."""
    if not produced:
        return None
    last = produced[-1]
    reason = last.metadata.get(STOP_KEY) if last.metadata else None
    if reason in _STOPS:
        return cast("StopReason", reason)
    if last.metadata and last.metadata.get("output") == "invalid":  # sent back (`_run.output`): not the answer
        return None
    return "completed" if last.role == "assistant" and not last.function_calls else None


def _not_input(stored: Message) -> bool:
    """Whether a stored message is not a run's input (a model's or a tool's, or a provider's context)."""
    return stored.source is not None and stored.source.kind != "input"


def same_input(a: Message, b: Message) -> bool:
    """Tell whether `a` and `b` are the same input: alike in everything but id, creation time, source and marks."""
    return _content(a) == _content(b)


def _content(message: Message) -> str:
    """Return what makes two messages the same input: everything but id, creation time, source and marks.

    The marks are the `IGNORED_METADATA` keys.
    """
    from ..codec import message_to_dict  # here: only a retry compares inputs, and a first run need not load the codec

    d = message_to_dict(message)
    for key in ("id", "created_at", "source"):
        d.pop(key, None)
    metadata = {k: v for k, v in d.pop("metadata", {}).items() if k not in IGNORED_METADATA}
    if metadata:
        d["metadata"] = metadata
    return json.dumps(d, sort_keys=True, ensure_ascii=False, default=str)
