"""``POST /v1/ag-ui``: a run through the AG-UI protocol (`serve._agui` translates it), streamed as AG-UI events.

The thread is the session, made when new; the request's new user messages are the input (with
``ServeSettings.agui_rewinds``, a history that drops the thread's last turn may regenerate or edit
it: `serve._agui_rewind`), its
``resume`` decides approvals, and its shared state and context entries go to the run through an
`AgUiRun`. Everything a request can get wrong is answered before the stream starts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..session import Session, user_id
from ._json import HTTPError
from ._users import claim, visible

if TYPE_CHECKING:
    from ..agent import Agent
    from ..approvals import Decision
    from ..messages import Message
    from ..stores import SessionStore
    from ._agui_rewind import AgUiRewind
    from ._runs import LiveRun, RunManager

__all__ = ["agui"]


class _Settings(Protocol):
    """What the route reads of the server's settings (`serve._app.ServeSettings`)."""

    @property
    def agui_rewinds(self) -> bool: ...


class _Api(Protocol):
    """What the route needs of the API (`serve._app._Api`)."""

    agent: Agent | None
    store: SessionStore

    @property
    def settings(self) -> _Settings: ...

    def _writable(self) -> RunManager: ...

    def _refuse_when_draining(self, runs: RunManager) -> None: ...

    async def _body(self, request: Request) -> Any: ...

    async def _holds(self, session: Session | None, message_id: str) -> bool: ...

    async def _empty(self, tenant: str, session_id: str) -> bool: ...

    async def admit(self, request: Request, runs: RunManager, run: LiveRun) -> Response | None: ...


async def agui(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Run on the request's thread and stream the run as AG-UI events."""
    from ._agui import AgUiRun, agui_decisions, agui_events, agui_input
    from ._agui_tools import agui_tools

    runs = api._writable()
    run_input = agui_input(await api._body(request))
    approvals = agui_decisions(run_input)
    api._refuse_when_draining(runs)
    assert api.agent is not None
    tools = agui_tools(run_input, api.agent)
    thread = run_input.thread_id
    existing = await api.store.get_session(tenant, thread)
    if existing is not None and not visible(request.state.grant, existing):
        raise HTTPError(404, "NotFound", f"no thread {thread!r}")  # another user's, or of no user
    new, approvals, plan = await _what_to_run(api, run_input, existing, approvals)
    if approvals and existing is None:
        raise HTTPError(404, "NotFound", f"no thread {thread!r}: its resume answers no interrupt of it")
    if not new and not approvals and (existing is None or await api._empty(tenant, thread)):
        raise HTTPError(409, "NothingToRun", f"thread {thread!r} has no messages yet, and the request's messages "
                        "do not end with a user message: end them with the user's message to run on")
    session = existing or await api.agent.session(thread, tenant=tenant)
    if not visible(request.state.grant, session) and user_id(session) is not None:
        raise HTTPError(404, "NotFound", f"no thread {thread!r}")  # made meanwhile, for another user
    await claim(api.store, session, request.state.grant.user)  # a user-bound key's new thread is its user's
    agui_run = AgUiRun(run_input, session, plan, rewinds=api.settings.agui_rewinds)
    run = runs.start(session, new or None, lease_wait=0.0, stream=True, approvals=approvals, providers=[agui_run],
                     tools=tools)
    refused = await api.admit(request, runs, run)  # a busy thread, or a resume that cannot apply: before the stream
    if refused is not None:
        return refused

    async def body() -> AsyncIterator[str]:
        finished = False
        try:
            async for chunk in agui_events(run_input, run.events(), agui_run):
                yield chunk
            finished = True
        finally:
            if not finished:
                runs.detach(run)

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


async def _what_to_run(api: _Api, run_input: Any, existing: Session | None, resumed: dict[str, Decision] | None
                       ) -> tuple[list[Message], dict[str, Decision] | None, AgUiRewind | None]:
    """Return the run's input, its decisions (the `resumed` ones, and the results front-end tools gave), and plan.

    The plan is what the request may regenerate or edit (only with ``ServeSettings.agui_rewinds``);
    the run itself decides, under its lease (`serve._agui_rewind`).
    """
    from ._agui import agui_known, agui_new
    from ._agui_rewind import agui_plan
    from ._agui_tools import agui_approvals

    assert api.agent is not None
    # The history the client resends: what the session holds is not input again.
    at = await agui_known(run_input, lambda i: api._holds(existing, i))
    approvals = await agui_approvals(run_input, at, api.agent, existing, resumed)
    new = agui_new(run_input, at, answering=len(approvals or {}) > len(resumed or {}))
    rewinds = api.settings.agui_rewinds and existing is not None and not approvals
    return new, approvals, (agui_plan(run_input, at) if rewinds else None)
