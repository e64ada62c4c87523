"""AG-UI regenerate and edit: a resent history that drops the thread's last turn rewinds it, under the run's lease.

Only on a server that opts in (``ServeSettings(agui_rewinds=True)``, ``contextpipe serve
--agui-rewinds``): the protocol cannot tell two clients of one thread apart, nor a client's retry
after a dropped stream (a new ``runId``) from a regenerate, so it is for one client per thread.
The protocol has no regenerate message: a client regenerates the last answer by running again with
its history minus that answer, and edits its last message by running with the history before it
and the new message in its place. The route sees only the shape (`agui_plan`); the run's
`AgUiRun.before_input` decides, under the run's own lease and before its input is looked up as a
retry, whether the thread's log agrees (`settle`). It does only when the part of the view the
request drops is the thread's last turn as this AG-UI thread itself had it:

- the view's last user message came in through AG-UI (its metadata holds `INPUT_KEY`), it is the
  only user message of the view past the request's last held message (nothing sent over REST since,
  and no ``asap`` message waits in the session's queue: one read, only for a request of that
  shape), and its run completed with an answer and nothing followed it (a failed run is resumed,
  and one stopped at a limit answered from the log, as before: neither is rewound);
- the request's ``runId`` is not the thread's last run's (`AGUI_RUN_KEY`): that is a retry of it.

Then the thread is rewound (`contextpipe.rewind`: nothing is deleted, the messages stay in the log
marked rewound) to that user message, answered again (regenerate), or to before it, the request's
new user message taking its place (edit; a request of one new user message alone edits the
thread's first, when the view holds no other user message). Anything else runs as before: a
retry answered from the log, or a next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._run.replay import answered_last, same_input
from ..exchanges import is_late_result
from ..queue import pending
from ..rewind import rewind, rewound_ranges, view_messages
from ..session import AGUI_RUN_KEY

if TYPE_CHECKING:
    from .._run.writer import StepWriter
    from ..messages import Message
    from ..rewind import Rewound
    from ..session import Session
    from ..stores import SessionStore

__all__ = ["INPUT_KEY", "AgUiRewind", "agui_plan", "settle"]

INPUT_KEY: Final = "ag-ui.input"  # in `_run.replay.IGNORED_METADATA` too: a marked message is the same input
"""Metadata key (value True) of a user message stored as the input of an AG-UI request."""
_PAGE: Final = 64
"""View messages read per page, from the end, looking for the user messages past the request's history."""


@dataclass(frozen=True, slots=True)
class AgUiRewind:
    """What a request's shape may be: a regenerate of its last (held) user message, or an edit after `held`."""

    held: str | None
    """The id of the request's last message the thread holds; None: it holds none (an edit of the first message)."""
    regenerate: bool
    """True: the request ends on that user message; False: one new user message follows it (an edit)."""


def agui_plan(run_input: Any, at: int) -> AgUiRewind | None:
    """Return what the request may regenerate or edit, given its last held message `at` (None: neither)."""
    messages = run_input.messages
    if at < 0:  # one new user message alone: the thread's first (and only) one edited
        return AgUiRewind(None, False) if len(messages) == 1 and getattr(messages[0], "role", None) == "user" else None
    tail = messages[at + 1:]
    if not tail:  # (ending on a held answer instead: a retry, answered from the log)
        return AgUiRewind(messages[at].id, True) if getattr(messages[at], "role", None) == "user" else None
    users = [i for i, m in enumerate(tail) if getattr(m, "role", None) == "user"]
    return AgUiRewind(messages[at].id, False) if users == [len(tail) - 1] else None


async def settle(writer: StepWriter, run_id: str, plan: AgUiRewind | None, input: list[Message]) -> list[Message]:
    """Record the run's ``runId``, rewind the thread when `plan` holds (see the module); return the run's input."""
    session, store, lease = writer.session, writer.store, writer.lease
    assert session is not None
    assert lease is not None
    last = session.state.get(AGUI_RUN_KEY)
    session.state[AGUI_RUN_KEY] = run_id  # saved with the session when the run ends
    if plan is None or last == run_id:
        return input
    rewound = bool(input) and await _rewind(writer, plan, input[-1])
    # The runId saved now, not when the run ends (after the marker, when rewound): the same request sent again
    # after the run stored its answer and failed (an `AfterRunError`, a crash in its last save) is a retry of it,
    # not a regenerate; one sent after a crash before this finds the turn rewound already and is answered anew.
    session.state[AGUI_RUN_KEY] = run_id
    await store.save_session(session, lease=lease)
    return [] if rewound and plan.regenerate else input


async def _rewind(writer: StepWriter, plan: AgUiRewind, resent: Message) -> bool:
    """Rewind the thread as `plan` says when the log agrees (see the module); return whether it did."""
    session, store, lease = writer.session, writer.store, writer.lease
    assert session is not None
    assert lease is not None
    to = await _rewind_point(store, session, plan, resent)
    if to is None or any(q.when == "asap" for q in await pending(store, session.key)):
        # A message queued asap: the turn is no longer the thread's last. A declined regenerate is then a retry,
        # answered from the log, and delivers nothing: the queued message waits for the next run.
        return False
    await rewind(store, session.tenant, session.id, to, lease)
    await writer.refresh()
    return True


async def _rewind_point(store: SessionStore, session: Session, plan: AgUiRewind, resent: Message) -> int | None:
    """Return the sequence to rewind to, or None when the log does not agree with the plan (see the module)."""
    tenant, session_id = session.tenant, session.id
    seq = 0 if plan.held is None else await store.message_seq(tenant, session_id, plan.held)
    rewound = await rewound_ranges(store, tenant, session_id, session.state)
    if seq is None or seq in rewound:
        return None  # a message the view left out: the client's history is older than the thread's
    users = await _users_after(store, tenant, session_id, rewound, seq - 1 if plan.regenerate else seq)
    if len(users) != 1 or users[0][1].metadata.get(INPUT_KEY) is not True:
        return None  # more than the last turn, or a turn this thread did not bring
    last, message = users[0]
    if plan.regenerate and (last != seq or not same_input(message, resent)):
        return None  # (other content under the id: the run refuses it, as before)
    if not await answered_last(store, session, last, rewound):
        return None  # a failed run (resumed), one stopped at a limit or a later run after it (answered from the log)
    if plan.regenerate:
        return last
    before = await view_messages(store, tenant, session_id, rewound=rewound, before=last, limit=1)
    return before[0][0] if before else 0  # (the log's message before it may be rewound: an earlier edit's)


async def _users_after(store: SessionStore, tenant: str, session_id: str, rewound: Rewound,
                       floor: int) -> list[tuple[int, Message]]:
    """Return the view's user messages after sequence `floor`, newest first; two at most once there are more."""
    found: list[tuple[int, Message]] = []
    before: int | None = None
    while len(found) < 2:
        page = await view_messages(store, tenant, session_id, rewound=rewound, after=floor, before=before,
                                   limit=_PAGE)
        found += [(s, m) for s, m in reversed(page) if m.role == "user" and not is_late_result(m)]
        if len(page) < _PAGE:
            break
        before = page[0][0]
    return found[:2]
