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

A run's messages in the log are the ones after its input that a model or a tool produced (source
``model`` or ``tool``), up to the first that neither did (the next run's input or context). The
run finished when the last of them is an assistant message without function calls, or carries the
stop reason of a run stopped at a limit under `STOP_KEY` (the model's last answer, or the tool
message answering the calls it made when its tools were withdrawn).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast, get_args

from ..codec import message_to_dict
from ..errors import InputConflict, shorten
from ..events import RunResult, StopReason
from ..models.base import Usage
from ..stores.base import SessionStore

if TYPE_CHECKING:
    from ..messages import Message
    from ..providers.base import HistoryProvider
    from ..session import Session

__all__ = ["STOP_KEY", "EarlierRun", "find_earlier", "log_store", "replayed"]

STOP_KEY: Final = "stop_reason"
"""Metadata key of the tool message answering calls withdrawn at a limit: why the run stopped there."""

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
    """Return the store of the history the run loads, when that history lives in a `SessionStore`."""
    for p in providers:
        if p.policy.load_messages:
            return p.store if isinstance(p.store, SessionStore) and p.policy.store_inputs else None
    return None


async def find_earlier(store: SessionStore, session: Session, input: Sequence[Message]) -> EarlierRun | None:
    """Return the run of `session` that had this `input` (found by its last message's id), or None.

    Raises `InputConflict` when the id is there with other content, or names an interrupted run
    that later runs followed.
    """
    tenant, session_id, last = session.tenant, session.id, input[-1]
    seq = await store.message_seq(tenant, session_id, last.id)
    if seq is None:
        return None
    first = seq - len(input) + 1
    page = await store.load(tenant, session_id, after=first - 1, before=seq + 1 + _PAGE)
    stored = page.messages[:len(input)] if page.first_seq == first else []
    if len(stored) != len(input) or any(_content(a) != _content(b) or _not_input(b)
                                        for a, b in zip(input, stored, strict=True)):
        raise InputConflict(
            f"message {shorten(last.id)} is already in session {shorten(session_id)}, but not as this input "
            "(its content or the messages before it differ); a retried input must be sent exactly as before, "
            "and a new one needs a new message id")
    produced: list[Message] = []
    ended = False  # a message of another run follows (the log does not end with this one)
    rest, end = page.messages[len(input):], seq + _PAGE
    while True:
        for m in rest:
            if m.source is None or m.source.kind not in ("model", "tool"):
                ended = True
                break
            produced.append(m)
        if ended or len(rest) < _PAGE:
            break
        rest = (await store.load(tenant, session_id, after=end, before=end + 1 + _PAGE)).messages
        end += _PAGE
    stop = _stop_reason(produced)
    if stop is None and ended:
        raise InputConflict(
            f"message {shorten(last.id)} was sent to session {shorten(session_id)} before, but that run was "
            "interrupted before its answer and later runs followed it, so it cannot be resumed; send the input "
            "again with a new message id")
    return EarlierRun(list(stored), produced, stop)


def _stop_reason(produced: Sequence[Message]) -> StopReason | None:
    """Return why the run that produced these messages stopped, or None if it did not finish."""
    if not produced:
        return None
    last = produced[-1]
    reason = last.metadata.get(STOP_KEY) if last.metadata else None
    if reason in _STOPS:
        return cast("StopReason", reason)
    return "completed" if last.role == "assistant" and not last.function_calls else None


def _not_input(stored: Message) -> bool:
    """Whether a stored message is not a run's input (a model's or a tool's, or a provider's context)."""
    return stored.source is not None and stored.source.kind != "input"


def _content(message: Message) -> str:
    """Return what makes two messages the same input: everything but id, creation time and source."""
    d = message_to_dict(message)
    for key in ("id", "created_at", "source"):
        d.pop(key, None)
    return json.dumps(d, sort_keys=True, ensure_ascii=False, default=str)
