"""The ASGI application: sessions and runs over HTTP, per tenant, plus the inspector and the docs.

Every ``/v1`` route needs an API key (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``) and acts
on the key's tenant only: an unknown key gets 401, another tenant's session reads as absent (404).
Session ids go in the path percent-encoded (``/`` as ``%2F``), so every valid id has a URL.

A run request is safe to retry: its input message's id (``message_id`` with text input, ``id`` in
the last input message, or derived from an ``Idempotency-Key`` header) makes a second request with
the same input return the first one's result (``"replayed": true``) instead of running again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from .. import Agent, RunResult, __version__
from ..approvals import Decision
from ..errors import (
    ApprovalError,
    CodecError,
    ConcurrentUpdate,
    ContextPipeError,
    CorruptRecord,
    InputConflict,
    LeaseLost,
    ModelError,
    SessionBusy,
    StoreError,
    UsageError,
)
from ..messages import Message
from ..queue import When
from ..session import Session, validate_session_id
from ..stores import MessagePage, SessionStore
from ._agui import check_state_key
from ._agui_route import agui
from ._approvals import decide_approvals, list_approvals
from ._conversation import fork_session, list_queue, log_entries, queue_input, rewind_session
from ._drain import drain, drain_on_signals
from ._facts import session_facts
from ._json import HTTPError, dumps, json_response, read_json
from ._keys import ApiKeys
from ._openai import chat_completions, get_model, list_models, model_id, responses
from ._openapi import openapi_schema
from ._requests import (
    CreateSession,
    RunRequest,
    decisions,
    http_cursor,
    input_messages,
    name_input,
    query_int,
    store_cursor,
    validate,
)
from ._runs import LiveRun, OnDisconnect, RunManager, cancelled_json, error_to_json, result_to_json
from ._session_tools import cancel_run, export_session, session_json
from ._users import claim, reaches, request_user, reuse, visible

__all__ = ["ServeSettings", "create_app"]

log = logging.getLogger("contextpipe.serve")
T = TypeVar("T")
STATIC = Path(__file__).parent / "static"


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """How the server behaves; the defaults suit most deployments."""

    max_body_bytes: int = 1 << 20
    """Largest request body accepted (413 above it)."""
    on_disconnect: OnDisconnect = "finish"
    """When a client disconnects mid-run: ``finish`` (run on and persist) or ``cancel`` (stop cleanly)."""
    drain_timeout: float = 30.0
    """On SIGTERM: seconds runs in flight get to finish before they are cancelled."""
    max_wait: float = 60.0
    """Longest a request may ask to wait for a busy session (``wait`` in a run request)."""
    retry_after: int = 1
    """Seconds suggested in ``Retry-After`` when a session is busy or the server is draining."""
    read_only: bool = False
    """Serve reading routes only (the ``contextpipe ui --db FILE`` mode)."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins (like ``https://app.example.com``) whose pages may call the API (CORS)."""
    header_timeout: float = 10.0
    """Seconds a connection has to send a request's head, from its start or its next request's first byte (serve)."""
    body_timeout: float = 60.0
    """Seconds a request's body has to arrive whole after its head; then 408 and the connection closes (``serve``)."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle keep-alive connection is kept open (``serve``)."""
    max_connections: int | None = None
    """Connections open at once per process (``serve``); None: the open-files limit less a tenth (at least 64).

    Past it, a new connection closes the one idle the longest; with none idle, it is answered 503.
    """
    agui_rewinds: bool = False
    """Take an AG-UI history that drops the thread's last turn as a regenerate or an edit of it (a rewind).

    For one client per thread (CopilotKit's regenerate and edit). Off, a regenerate-shaped request is
    a retry and an edit-shaped one a next turn, and the route records no ``runId``. Either way the
    route marks the user messages it stores (``ag-ui.input``), and a retry is answered from the
    session's view: a retry of an input a rewind left out is refused (409 ``InputConflict``). See the
    serving guide for what a second tab, or a retry after a dropped stream, can do.
    """


Handler = Callable[["_Api", Request, str, list[str]], Awaitable[Response]]


class _Api:
    """The ``/v1`` routes (dispatched here on the raw path, so ids may hold an encoded ``/``)."""

    def __init__(self, agent: Agent | None, store: SessionStore, keys: ApiKeys, settings: ServeSettings) -> None:
        self.agent = agent
        self.store = store
        self.keys = keys
        self.settings = settings
        self.runs = RunManager(agent, on_disconnect=settings.on_disconnect) if agent is not None else None

    # --- plumbing ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handle(Request(scope, receive))
        await response(scope, receive, send)

    async def handle(self, request: Request) -> Response:
        """Answer one ``/v1`` request: every client mistake a 4xx JSON error, every route's own errors mapped."""
        try:
            if self.runs is not None:
                self._refuse_when_draining(self.runs)
            tenant = self._tenant(request)
            raw = request.scope.get("raw_path") or request.scope["path"].encode()
            prefix = request.scope.get("root_path", "").encode() + b"/v1/"
            path = raw.split(b"?", 1)[0]
            if not path.startswith(prefix):
                raise HTTPError(404, "NotFound", "no such route; see /docs")
            segments = [unquote(s.decode("latin-1")) for s in path[len(prefix):].split(b"/")]
            handler, params = self._route(request.method, segments)
            return await handler(self, request, tenant, params)
        except HTTPError as exc:
            return exc.response()
        except ContextPipeError as exc:
            return self._error(exc).response()

    def _tenant(self, request: Request) -> str:
        key = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if key is None and auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
        grant = self.keys.grant_for(key) if key else None
        if grant is None:
            message = "a valid API key is needed: send 'Authorization: Bearer KEY'" if not key else "unknown API key"
            raise HTTPError(401, "Unauthorized", message, {"WWW-Authenticate": "Bearer"})
        request.state.grant = grant
        return grant.tenant

    def _route(self, method: str, segments: list[str]) -> tuple[Handler, list[str]]:
        for pattern, routes in _ROUTES:
            if len(pattern) != len(segments):
                continue
            params = []
            for want, got in zip(pattern, segments, strict=True):
                if want is None:
                    params.append(got)
                elif want != got:
                    break
            else:
                served = routes
                if self.settings.read_only or self.runs is None:
                    served = {m: h for m, h in routes.items() if m not in _WRITING}
                handler = served.get(method)
                if handler is not None:
                    return handler, params
                allow = {"Allow": ", ".join(served)}
                if method in routes:
                    raise HTTPError(405, "ReadOnly", "this server is read-only (contextpipe ui); it cannot change "
                                    "sessions", allow)
                raise HTTPError(405, "MethodNotAllowed", f"{method} is not allowed here; this route takes "
                                f"{', '.join(served)}", allow)
        raise HTTPError(404, "NotFound", "no such route; see /docs")

    def _error(self, exc: ContextPipeError) -> HTTPError:
        kind = type(exc).__name__
        retry = {"Retry-After": str(self.settings.retry_after)}
        if isinstance(exc, SessionBusy):
            return HTTPError(409, kind, "the session is busy: another run holds it; retry later, or send "
                             "\"wait\": SECONDS to wait for it", retry)
        if isinstance(exc, LeaseLost) and exc.gone:  # the session was deleted or expired: retrying cannot help
            return HTTPError(410, kind, str(exc))
        if isinstance(exc, LeaseLost | ConcurrentUpdate):
            return HTTPError(409, kind, str(exc), retry)
        if isinstance(exc, InputConflict | ApprovalError):
            return HTTPError(409, kind, str(exc))
        if isinstance(exc, UsageError | CodecError):
            return HTTPError(400, kind, str(exc))
        if isinstance(exc, CorruptRecord):
            return HTTPError(500, kind, str(exc))
        if isinstance(exc, StoreError):
            log.error("store error: %s", exc)
            return HTTPError(503, kind, "the session store failed; retry later", retry)
        if isinstance(exc, ModelError):
            return HTTPError(502, kind, str(exc))
        return HTTPError(500, kind, str(exc))

    async def _body(self, request: Request) -> Any:
        """Return the request's JSON body, read strictly (`read_json`); an empty body reads as ``{}``."""
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, "PayloadTooLarge", f"the request body is over {limit} bytes")
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPError(413, "PayloadTooLarge", f"the request body is over {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect:  # the client went, or was too slow (`ServeSettings.body_timeout`): none will read
            raise HTTPError(400, "ClientDisconnect", "the connection closed before the request's body ended") from None
        raw = b"".join(chunks)
        return read_json(raw) if raw.strip() else {}

    async def _holds(self, session: Session | None, message_id: str) -> bool:
        # A thread not made yet holds nothing: no lookup per message of the history a client brings to it.
        return session is not None and await self.store.message_seq(session.tenant, session.id, message_id) is not None

    async def _empty(self, tenant: str, session_id: str) -> bool:
        return not (await self.store.load(tenant, session_id, limit=1)).messages

    async def _existing(self, request: Request, tenant: str, session_id: str) -> Any:
        """Return the session of the caller's tenant (and user, for a key bound to one), or answer 404."""
        validate_session_id(session_id)
        session = await self.store.get_session(tenant, session_id)
        if session is None or not visible(request.state.grant, session):
            raise HTTPError(404, "NotFound", f"no session {session_id!r}")
        return session

    def _refuse_when_draining(self, runs: RunManager) -> None:
        if runs.draining:
            raise HTTPError(503, "ShuttingDown", "the server is shutting down; retry on another worker",
                            {"Retry-After": str(self.settings.retry_after), "Connection": "close"})

    def _writable(self) -> RunManager:
        assert self.runs is not None  # (`_route` answers writing requests to a read-only server with 405)
        return self.runs

    # --- routes --------------------------------------------------------------------------------------

    async def info(self, request: Request, tenant: str, params: list[str]) -> Response:
        agent = self.agent
        about: dict[str, Any] | None = None
        if agent is not None:
            about = {"name": agent.name, "model": agent.model.name, "tools": sorted(agent.tools),
                     # What the model is told of each of the agent's own tools (a trace keeps only names).
                     "tool_definitions": [{"name": t.spec.name, "description": t.spec.description,
                                           "parameters": t.spec.parameters} for t in agent.tools.values()],
                     "providers": [{"source_id": p.source_id, "kind": p.kind} for p in agent.providers],
                     "store_traces": agent.durability.store_traces}
        grant = request.state.grant
        return json_response({"tenant": tenant, "user": grant.user, "names_users": grant.names_users,
                              "version": __version__, "store": self.store.backend,
                              "read_only": self.settings.read_only or agent is None, "agent": about})

    async def list_sessions(self, request: Request, tenant: str, params: list[str]) -> Response:
        limit = query_int(request, "limit", 50, 1, 500)
        assert limit is not None
        cursor = store_cursor(request.query_params.get("cursor"))
        query = (request.query_params.get("q") or "").strip().lower()
        found, scanned = [], 0
        while True:
            listing = await self.store.list_sessions(tenant, limit=limit, cursor=cursor)
            scanned += len(listing.sessions)
            found += [s for s in listing.sessions if (not query or query in s.session_id.lower())
                      and await reaches(self.store, request.state.grant, tenant, s.session_id)]
            cursor = listing.next_cursor
            # A search reads whole pages (nothing is skipped) and stops after about 1,000 sessions.
            if not query or cursor is None or len(found) >= limit or scanned >= 1000:
                break
        return json_response({
            "sessions": [{"id": s.session_id, "version": s.version, "message_count": s.message_count,
                          "created_at": s.created_at, "updated_at": s.updated_at} for s in found],
            "next_cursor": http_cursor(cursor),
        }, items=("sessions",))

    async def create_session(self, request: Request, tenant: str, params: list[str]) -> Response:
        self._writable()
        body = validate(CreateSession, await self._body(request))
        user = request_user(request.state.grant, body.user_id)
        assert self.agent is not None
        if body.id is None:
            session = await self.agent.create_session(tenant=tenant, ttl=body.ttl)
        else:
            existing = await self.store.get_session(tenant, body.id)
            if existing is not None:
                return json_response(session_json(await reuse(self.store, request.state.grant, existing, user),
                                                   None))
            session = await self.agent.session(body.id, tenant=tenant, ttl=body.ttl)
        await claim(self.store, session, user)
        return json_response(session_json(session, None), 201)

    async def get_session(self, request: Request, tenant: str, params: list[str]) -> Response:
        session = await self._existing(request, tenant, params[0])
        checkpoint = await self.store.latest_checkpoint(tenant, session.id)
        return json_response(session_json(session, checkpoint))

    async def delete_session(self, request: Request, tenant: str, params: list[str]) -> Response:
        self._writable()
        validate_session_id(params[0])
        if not await reaches(self.store, request.state.grant, tenant, params[0]) or \
                not await self.store.delete_session(tenant, params[0]):
            raise HTTPError(404, "NotFound", f"no session {params[0]!r}")
        return Response(status_code=204)

    async def messages(self, request: Request, tenant: str, params: list[str]) -> Response:
        session = await self._existing(request, tenant, params[0])
        limit = query_int(request, "limit", 100, 1, 1000)
        before = query_int(request, "before", None, 0, 2**62)
        after = query_int(request, "after", None, -1, 2**62)
        assert limit is not None
        view = {None: False, "false": False, "true": True}.get(request.query_params.get("view"))
        if view is None:
            raise HTTPError(400, "BadRequest", "view must be true (the view only: no rewound messages) or false")
        page, next_after = await self._page(tenant, session.id, limit, before, after)
        return json_response({
            "messages": await log_entries(self.store, session, page, view=view),
            "first_seq": page.first_seq, "has_more": page.has_more,
            "next_before": page.first_seq if page.has_more else None, "next_after": next_after,
        }, items=("messages",))

    async def _page(self, tenant: str, session_id: str, limit: int, before: int | None,
                    after: int | None) -> tuple[MessagePage, int | None]:
        """Return a page of the log and, paging forward, the `after` of the next page (None: no newer messages).

        Without `after` the page holds the newest `limit` messages below `before`. With it, the
        oldest `limit` above it: a log is a contiguous run of sequences, so that is the window up to
        ``after + limit``, read with one message more to tell whether others follow.
        """
        if after is None:
            return await self.store.load(tenant, session_id, limit=limit, before=before), None
        after = max(after, 0)  # sequences start at 1
        end = after + limit + 2 if before is None else min(before, after + limit + 2)
        page = await self.store.load(tenant, session_id, limit=limit + 1, before=end, after=after)
        if len(page.messages) <= limit:
            return page, None
        return MessagePage(page.messages[:limit], page.first_seq, page.has_more), page.first_seq + limit - 1

    async def traces(self, request: Request, tenant: str, params: list[str]) -> Response:
        session = await self._existing(request, tenant, params[0])
        limit = query_int(request, "limit", None, 1, 10_000)
        traces = await self.store.load_traces(tenant, session.id, limit=limit)
        return json_response({"traces": traces}, items=("traces",))

    async def run(self, request: Request, tenant: str, params: list[str]) -> Response:
        runs = self._writable()
        body = validate(RunRequest, await self._body(request))
        input = name_input(body, input_messages(body.input), request.headers.get("idempotency-key"), tenant,
                           params[0])
        approvals = decisions(body.approvals)
        self._refuse_when_draining(runs)
        session = await self._existing(request, tenant, params[0])
        await claim(self.store, session, request_user(request.state.grant, body.user_id),
                    wait=min(body.wait, self.settings.max_wait))
        if input is None and not approvals and await self._empty(tenant, session.id):
            raise HTTPError(409, "NothingToRun", "input is null (resume the session), but the session has no "
                            "messages to resume from: send input (text or user messages)")
        return await self.start_run(request, runs, session, input, approvals, wait=body.wait, stream=body.stream,
                                    traces=body.traces, queue=body.queue)

    async def start_run(self, request: Request, runs: RunManager, session: Session,
                        input: str | Sequence[Message] | None, approvals: Mapping[str, Decision] | None, *,
                        wait: float, stream: bool, traces: bool, queue: When | None = None) -> Response:
        """Run on `session` and answer with the result, or stream its events (`stream`, or ``Accept`` asks).

        With `queue`, input the busy session refuses is queued instead (`queue_input`: 202).
        """
        wait = min(wait, self.settings.max_wait)
        streaming = stream or "text/event-stream" in request.headers.get("accept", "")
        run = runs.start(session, input, lease_wait=wait, stream=streaming, traces=traces, approvals=approvals)
        if not streaming and queue is None:
            return await self._await_run(request, runs, run)
        # The status line goes out once the run is admitted (it holds the session's lease, its input and
        # decisions accepted): what refuses it is answered as the route's JSON error, not an event after a 200.
        refused = await self.admit(request, runs, run)  # (a run not streamed is admitted when it ends)
        if refused is not None:
            if queue is not None and input is not None and isinstance(run.error, SessionBusy):
                return await queue_input(self, runs, session, input, queue)
            return refused
        if not streaming:
            assert run.result is not None
            return json_response(result_to_json(run.result, traces=run.traces), items=("input", "messages", "traces"))
        return StreamingResponse(_sse(runs, run), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Run-Id": run.id})

    async def _await_run(self, request: Request, runs: RunManager, run: LiveRun) -> Response:
        result = await self.await_result(request, runs, run)
        if isinstance(result, Response):
            return result
        return json_response(result_to_json(result, traces=run.traces), items=("input", "messages", "traces"))

    async def await_result(self, request: Request, runs: RunManager, run: LiveRun) -> RunResult | Response:
        """Wait for `run` to end; return its result, or the error response to send (499: the client went away)."""
        return await self._watch(request, runs, run, run.wait())

    async def admit(self, request: Request, runs: RunManager, run: LiveRun) -> Response | None:
        """Wait until the streamed `run` is admitted (`RunManager.started`): None; else the error response to send.

        That is the error the route gives when it does not stream (a 409 for a busy session), or a
        499 when the client went away meanwhile.
        """
        return await self._watch(request, runs, run, runs.started(run))

    async def _watch(self, request: Request, runs: RunManager, run: LiveRun, step: Awaitable[T]) -> T | Response:
        """Await `step` of `run`; return what it returns, or the error response to send (499: the client went away)."""
        waiting = asyncio.ensure_future(step)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                runs.detach(run)
                return Response(status_code=499)
        except asyncio.CancelledError:
            waiting.cancel()
            runs.detach(run)
            raise
        finally:
            gone.cancel()
        try:
            return waiting.result()
        except ContextPipeError as exc:
            return self._error(exc).response()
        except asyncio.CancelledError:
            if run.cancel_requested:
                return json_response(cancelled_json(run), 409)
            return HTTPError(503, "Cancelled", "the run was cancelled: the server is shutting down").response()
        except Exception:
            log.exception("run failed")
            return json_response(error_to_json(Exception()), 500)


_WRITING = frozenset({"POST", "DELETE"})
_ROUTES: list[tuple[tuple[str | None, ...], dict[str, Handler]]] = [
    (("info",), {"GET": _Api.info}),
    (("sessions",), {"GET": _Api.list_sessions, "POST": _Api.create_session}),
    (("sessions", None), {"GET": _Api.get_session, "DELETE": _Api.delete_session}),
    (("sessions", None, "messages"), {"GET": _Api.messages}),
    (("sessions", None, "traces"), {"GET": _Api.traces}),
    (("sessions", None, "facts"), {"GET": session_facts}),
    (("sessions", None, "runs"), {"POST": _Api.run}),
    (("sessions", None, "queue"), {"GET": list_queue}),
    (("sessions", None, "rewind"), {"POST": rewind_session}),
    (("sessions", None, "fork"), {"POST": fork_session}),
    (("sessions", None, "approvals"), {"GET": list_approvals, "POST": decide_approvals}),
    (("sessions", None, "cancel"), {"POST": cancel_run}),
    (("sessions", None, "export"), {"GET": export_session}),
    (("ag-ui",), {"POST": agui}),
    (("chat", "completions"), {"POST": chat_completions}),
    (("responses",), {"POST": responses}),
    (("models",), {"GET": list_models}),
    (("models", None), {"GET": get_model}),
]


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _sse(runs: RunManager, run: LiveRun) -> AsyncIterator[str]:
    finished = False
    try:
        yield ": run started\n\n"
        async for batch in run.batches():  # what is queued goes in one write; silence, a keep-alive
            yield "".join(f"event: {name}\ndata: {dumps(payload)}\n\n" for name, payload in batch) or ": keep-alive\n\n"
        finished = True
    finally:
        if not finished:
            runs.detach(run)


def create_app(
    agent: Agent | None,
    *,
    keys: ApiKeys,
    store: SessionStore | None = None,
    settings: ServeSettings | None = None,
    close_store: bool = False,
) -> Starlette:
    """Return the ASGI app serving `agent` (or, with only `store`, a read-only inspector of it).

    Routes: ``/v1/...`` (the API, see ``/openapi.json``), ``/ui/`` (the inspector), ``/docs``,
    ``/healthz``. With `close_store` the store is closed when the app shuts down. At shutdown the
    runs in flight are drained (see `ServeSettings.drain_timeout`).
    """
    settings = settings or ServeSettings()
    if store is None:
        if agent is None:
            raise UsageError("create_app needs an agent, or a store to inspect")
        store = agent.store
    if agent is not None:
        check_state_key(agent)
    api = _Api(agent, store, keys, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        restore = drain_on_signals(api.runs, settings.drain_timeout) if api.runs is not None else list
        try:
            yield
        finally:
            restore()
            if api.runs is not None:
                await drain(api.runs, settings.drain_timeout)
            if close_store:
                await store.close()

    async def healthz(request: Request) -> Response:
        draining = api.runs is not None and api.runs.draining
        return JSONResponse({"ok": not draining, "draining": draining}, 503 if draining else 200)

    async def schema(request: Request) -> Response:
        return JSONResponse(openapi_schema(read_only=settings.read_only or agent is None,
                                           model=model_id(agent) if agent is not None else None))

    async def docs(request: Request) -> Response:
        return Response((STATIC / "docs.html").read_text(encoding="utf-8"), media_type="text/html")

    async def root(request: Request) -> Response:
        return RedirectResponse(request.url_for("ui", path="/"), 307)

    async def not_routed(request: Request, exc: Exception) -> Response:  # e.g. a path no route matches
        assert isinstance(exc, StarletteHTTPException)
        kind, message = {404: ("NotFound", "no such route; see /docs"),
                         405: ("MethodNotAllowed", f"{request.method} is not allowed here")}.get(
                             exc.status_code, ("BadRequest", str(exc.detail)))
        return HTTPError(exc.status_code, kind, message, exc.headers).response()

    app = Starlette(exception_handlers={StarletteHTTPException: not_routed}, routes=[
        Route("/", root),
        Route("/ui", root),
        Route("/healthz", healthz),
        Route("/openapi.json", schema),
        Route("/docs", docs),
        Route("/v1/{rest:path}", api),  # every method: `_Api` answers 405 (with Allow) itself
        Mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui"),
    ], lifespan=lifespan, middleware=[
        Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                   allow_headers=["Authorization", "X-API-Key", "Content-Type", "Accept"], max_age=600),
    ] if settings.cors_origins else None)
    app.state.api = api
    return app

