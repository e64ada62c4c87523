"""Steering, undo and branching over HTTP: queued input, the session's queue, rewind and fork.

- ``POST .../runs`` with ``"queue": "asap" | "next"`` on a busy session queues its input
  (`contextpipe.queue`) instead of answering 409 (`queue_input`): 202 with the queued message. A
  ``next`` message is run by a task of this server once the session is free (`RunManager.spawn`).
- ``GET .../queue`` lists what is queued and not delivered yet (`list_queue`), on a read-only server too.
- ``POST .../rewind`` leaves the view's messages after a sequence out (`contextpipe.rewind`), and
  ``POST .../fork`` starts a new session with the view up to a sequence (`fork_session`).
- ``GET .../messages`` marks rewound messages and rewind markers, or lists the view only (`log_entries`).

A sequence the log cannot take (past its end, or rewound already) is a 409 ``BadSequence``: the body
is well formed, and whether a sequence can be rewound to depends on the log as it is now.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from starlette.requests import Request
from starlette.responses import Response

from ..codec import message_to_dict
from ..errors import ContextPipeError, UsageError
from ..messages import Message
from ..queue import QueuedMessage, When, key_of, pending
from ..rewind import MARKER_KEY, is_marker, rewound_ranges
from ._json import HTTPError, json_response
from ._requests import ForkRequest, RewindRequest, validate
from ._session_tools import session_json

if TYPE_CHECKING:
    from ..agent import Agent
    from ..session import Session, SessionKey
    from ..stores import MessagePage, SessionStore
    from ._runs import RunManager

__all__ = ["fork_session", "list_queue", "log_entries", "queue_input", "rewind_session"]

log = logging.getLogger("contextpipe.serve")

NEXT_WAIT: Final = 3600.0
"""Seconds the run of a queued ``next`` message waits for the session; past it the message stays queued."""
_HINT: Final = "GET /v1/sessions/{id}/messages?view=true lists the sequences of the view"


class _Settings(Protocol):
    @property
    def max_wait(self) -> float: ...


class _Api(Protocol):
    """What the routes need of the API (`serve._app._Api`)."""

    agent: Agent | None
    store: SessionStore

    @property
    def settings(self) -> _Settings: ...

    def _writable(self) -> RunManager: ...

    async def _body(self, request: Request) -> Any: ...

    async def _existing(self, request: Request, tenant: str, session_id: str) -> Any: ...


def queued_json(queued: QueuedMessage) -> dict[str, Any]:
    """Return the JSON form of a queued message: its id, when it goes, its text and the message itself."""
    message = message_to_dict(queued.message)
    return {"id": queued.id, "when": queued.when, "text": queued.message.text,
            "created_at": message["created_at"], "message": message}


async def queue_input(api: _Api, runs: RunManager, session: Session, input: str | Sequence[Message],
                      when: When) -> Response:
    """Queue the input of a run the busy `session` refused; answer 202 with the queued message."""
    assert api.agent is not None
    message = Message.user(input) if isinstance(input, str) else input[0]  # (one message: `RunRequest`)
    queued = await api.agent.enqueue(session.id, message, when=when, tenant=session.tenant)
    if when == "next":
        runs.spawn(_run_next(api.agent, session.key), name=f"contextpipe-next:{session.tenant}/{session.id}")
    return json_response({"session_id": session.id, **queued_json(queued)}, 202)


async def _run_next(agent: Agent, key: SessionKey) -> None:
    """Run the session's ``next`` messages once it is free; what cannot run now stays queued for a later drain."""
    try:
        await agent.drain_queue(key.id, tenant=key.tenant, lease_wait=NEXT_WAIT)
    except ContextPipeError as exc:
        log.warning("queued messages of %s/%s stay queued: %s", key.tenant, key.id, exc)


async def list_queue(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Return the session's queued messages not delivered yet, oldest first."""
    session = await api._existing(request, tenant, params[0])
    entries = await pending(api.store, key_of(session, tenant))
    # An ``asap`` entry delivered by a run that stopped before settling it is in the log already: not listed.
    waiting = [q for q in entries if await api.store.message_seq(tenant, session.id, q.id) is None]
    return json_response({"queued": [queued_json(q) for q in waiting]}, items=("queued",))


async def rewind_session(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Leave the view's messages after ``to`` out (under the session's lease); return the point kept."""
    api._writable()
    body = validate(RewindRequest, await api._body(request))
    session = await api._existing(request, tenant, params[0])
    assert api.agent is not None
    try:
        kept = await api.agent.rewind(session.id, to=body.to, tenant=tenant,
                                      lease_wait=min(body.wait, api.settings.max_wait))
    except UsageError as exc:
        raise HTTPError(409, "BadSequence", f"{exc} ({_HINT})") from None
    return json_response({"session_id": session.id, "to": kept})


async def fork_session(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Start a new session with the view of this one up to ``at``; answer 201 with the new session."""
    api._writable()
    body = validate(ForkRequest, await api._body(request))
    session = await api._existing(request, tenant, params[0])
    assert api.agent is not None
    new_id = body.new_id or f"s-{uuid.uuid4().hex}"
    # The fork takes the source's state (its user too): it must not land on a session that is someone's already.
    if await api.store.get_session(tenant, new_id) is not None:
        raise HTTPError(409, "Conflict", f"session {new_id!r} exists already: name a new session in new_id, or "
                        "leave new_id out for a random id")
    last = (await api.store.load(tenant, session.id, limit=1)).last_seq
    if body.at > last:
        raise HTTPError(409, "BadSequence", f"cannot fork {session.id!r} at sequence {body.at}: its log ends at "
                        f"{last} ({_HINT})")
    try:
        forked = await api.agent.fork(session.id, at=body.at, new_id=new_id, tenant=tenant)
    except UsageError as exc:
        raise HTTPError(409, "BadSequence", f"{exc} ({_HINT})") from None
    return json_response(session_json(forked, None), 201)


async def log_entries(store: SessionStore, session: Session, page: MessagePage, *, view: bool) -> list[dict[str, Any]]:
    """Return a page of the log as ``.../messages`` lists it.

    A rewound message carries ``"rewound": true`` and a rewind marker also ``"rewind_to"`` (the last
    sequence it kept); with `view` both are left out. A session never rewound costs no lookup.
    """
    rewound = await rewound_ranges(store, session.tenant, session.id, session.state)
    out = []
    for seq, message in enumerate(page.messages, page.first_seq):
        entry: dict[str, Any] = {"seq": seq, **message_to_dict(message)}
        if seq in rewound:
            if view:
                continue
            entry["rewound"] = True
            if is_marker(message):
                entry["rewind_to"] = message.metadata[MARKER_KEY]["to"]
        out.append(entry)
    return out
