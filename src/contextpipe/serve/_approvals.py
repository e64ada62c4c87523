"""``/v1/sessions/{session_id}/approvals``: the tool calls awaiting a person's decision, and the decisions.

``GET`` lists the calls awaiting approval at the end of the session's log (`contextpipe.approvals`),
read without a run, on a read-only server too. ``POST`` sends decisions by call id and resumes the
session as ``POST .../runs`` with ``"input": null`` does: the same result, or the same event stream.
A decision that cannot apply (the call was answered already, or the digest is another call's) is a
409 ``ApprovalError`` with the library's message, and nothing runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from starlette.requests import Request
from starlette.responses import Response

from .._run.approvals import pending_in
from ._json import json_response
from ._requests import ApprovalsRequest, decisions, validate
from ._runs import pending_to_json

if TYPE_CHECKING:
    from ..approvals import Decision
    from ..messages import Message
    from ..session import Session
    from ..stores import SessionStore
    from ._runs import RunManager

__all__ = ["decide_approvals", "list_approvals"]

TAIL: Final = 64
"""Messages read at a time from the end of the log: the calls awaiting approval are in the last model message."""


class _Api(Protocol):
    """What the routes need of the API (`serve._app._Api`)."""

    store: SessionStore

    def _writable(self) -> RunManager: ...

    def _refuse_when_draining(self, runs: RunManager) -> None: ...

    async def _body(self, request: Request) -> Any: ...

    async def _existing(self, request: Request, tenant: str, session_id: str) -> Any: ...

    async def start_run(self, request: Request, runs: RunManager, session: Session,
                        input: str | Sequence[Message] | None, approvals: Mapping[str, Decision] | None, *,
                        wait: float, stream: bool, traces: bool) -> Response: ...


async def list_approvals(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Return the calls awaiting approval at the end of the session's log (an empty list when none)."""
    session = await api._existing(request, tenant, params[0])
    pending = pending_in(await log_tail(api.store, session), session)
    return json_response({"pending_approvals": [pending_to_json(p) for p in pending]})


async def decide_approvals(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Decide calls awaiting approval and resume the session's run (the result, or its events)."""
    runs = api._writable()
    body = validate(ApprovalsRequest, await api._body(request))
    api._refuse_when_draining(runs)
    session = await api._existing(request, tenant, params[0])
    return await api.start_run(request, runs, session, None, decisions(body.decisions), wait=body.wait,
                               stream=body.stream, traces=body.traces)


async def log_tail(store: SessionStore, session: Session) -> list[Message]:
    """Return the end of the session's log: back to its last message that is not a tool's (the last model message)."""
    page = await store.load(session.tenant, session.id, limit=TAIL)
    messages = page.messages
    while page.has_more and all(m.role == "tool" for m in messages):
        page = await store.load(session.tenant, session.id, limit=TAIL, before=page.first_seq)
        messages = [*page.messages, *messages]
    return messages
