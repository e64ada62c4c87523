"""The chat's ``/undo``, ``/retry``, ``/fork`` and ``/history``: the session's view, over `contextpipe.rewind`.

Nothing is deleted: ``/undo`` and ``/retry`` append a rewind marker (`Agent.rewind`), ``/fork`` copies the view
into a new session (`Agent.fork`); ``/history`` shows the view and where it leaves rewound messages out, and
``sessions show`` the whole log with its rewound messages and markers marked (`log_line`).
"""

from __future__ import annotations

from ..agent import Agent
from ..errors import UsageError
from ..rewind import MARKER_KEY, LogEntry, is_marker, last_user_seq, rewound_ranges, view_messages
from ..session import Session
from ._shared import message_line

__all__ = ["NothingToDo", "fork_here", "history_lines", "log_line", "undo", "unreply"]

_NOT_SEEN = "undone or retried; not seen by the model"


class NothingToDo(Exception):
    """Raised when the session's view holds nothing the command can act on; the message says so."""


async def _last_user(agent: Agent, session: Session, what: str) -> int:
    try:
        return await last_user_seq(agent.store, session.tenant, session.id)
    except UsageError:
        raise NothingToDo(f"nothing to {what}: the session holds no message of yours") from None


async def undo(agent: Agent, session: Session) -> tuple[Session, str]:
    """Rewind to before the view's last user message; return the session as now stored and that message's text."""
    seq = await _last_user(agent, session, "undo")
    page = await agent.store.load(session.tenant, session.id, after=seq - 1, before=seq + 1)
    await agent.rewind(session.id, to=seq - 1, tenant=session.tenant)
    return await agent.session(session.id, tenant=session.tenant), page.messages[0].text


async def unreply(agent: Agent, session: Session) -> Session:
    """Rewind what followed the view's last user message (to answer it again); return the session as now stored."""
    seq = await _last_user(agent, session, "retry")
    await agent.rewind(session.id, to=seq, tenant=session.tenant)
    return await agent.session(session.id, tenant=session.tenant)


async def fork_here(agent: Agent, session: Session, new_id: str | None) -> tuple[Session, int]:
    """Fork the session at the end of its view into `new_id` (default ``<id>-fork-<n>``, the first not stored).

    Returns the new session and the sequence it was forked at.
    """
    last = await view_messages(agent.store, session.tenant, session.id, limit=1)
    if not last:
        raise NothingToDo("nothing to fork: the session has no messages yet")
    if new_id is None:
        n = 1
        while await agent.store.get_session(session.tenant, f"{session.id}-fork-{n}") is not None:
            n += 1
        new_id = f"{session.id}-fork-{n}"
    at = last[0][0]
    return await agent.fork(session.id, at=at, new_id=new_id, tenant=session.tenant), at


async def history_lines(agent: Agent, session: Session, last: int) -> list[str]:
    """Return the view's last `last` messages as lines, with a line where rewound messages are left out."""
    store, tenant = agent.store, session.tenant
    rewound = await rewound_ranges(store, tenant, session.id)
    view = await view_messages(store, tenant, session.id, rewound=rewound, limit=last)
    start = view[0][0] if view else 0
    entries: list[tuple[int, str]] = [(seq, message_line(seq, m)) for seq, m in view]
    for lo, hi in rewound.ranges:
        if hi > start:
            gap = f"{lo}" if lo == hi else f"{lo}-{hi}"
            entries.append((lo, f"[dim]{'':>5} … {gap} rewound ({_NOT_SEEN})[/dim]"))
    entries.sort(key=lambda entry: entry[0])
    return [line for _, line in entries] or ["[dim]no messages yet[/dim]"]


def log_line(entry: LogEntry) -> str:
    """Return one message of the raw log (`contextpipe.rewind.read_log`) as a line: rewound ones and markers marked."""
    if is_marker(entry.message):
        to = entry.message.metadata[MARKER_KEY]["to"]
        return f"[dim]{entry.seq:>5} {'rewind':<9} the messages after {to} up to here are rewound ({_NOT_SEEN})[/dim]"
    return message_line(entry.seq, entry.message, tag="(rewound)" if entry.rewound else "")
