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
import hashlib
import json
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import unquote

import pydantic
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import Agent, __version__
from ..codec import message_from_dict, message_to_dict
from ..errors import (
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
from ..messages import Message, new_message_id
from ..session import validate_session_id
from ..stores import SessionStore
from ._facts import session_facts
from ._keys import ApiKeys
from ._openapi import openapi_schema
from ._runs import LiveRun, OnDisconnect, RunManager, error_to_json, result_to_json

__all__ = ["ServeSettings", "create_app"]

log = logging.getLogger("contextpipe.serve")
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


class _HTTPError(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"type": self.kind, "message": self.message}}, self.status,
                            headers=self.headers)


class _CreateSession(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    id: str | None = None
    ttl: float | None = pydantic.Field(default=None, gt=0)


class _RunRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    input: str | list[dict[str, Any]] | None
    message_id: str | None = pydantic.Field(default=None, min_length=1, max_length=200)
    stream: bool = False
    wait: float = pydantic.Field(default=0.0, ge=0)
    traces: bool = False


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

    async def __call__(self, request: Request) -> Response:
        try:
            tenant = self._tenant(request)
            raw = request.scope.get("raw_path") or request.scope["path"].encode()
            prefix = request.scope.get("root_path", "").encode() + b"/v1/"
            path = raw.split(b"?", 1)[0]
            if not path.startswith(prefix):
                raise _HTTPError(404, "NotFound", "no such route")
            segments = [unquote(s.decode("latin-1")) for s in path[len(prefix):].split(b"/")]
            handler, params = self._route(request.method, segments)
            return await handler(self, request, tenant, params)
        except _HTTPError as exc:
            return exc.response()
        except ContextPipeError as exc:
            return self._error(exc).response()

    def _tenant(self, request: Request) -> str:
        key = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if key is None and auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
        tenant = self.keys.tenant_for(key) if key else None
        if tenant is None:
            message = "a valid API key is needed: send 'Authorization: Bearer KEY'" if not key else "unknown API key"
            raise _HTTPError(401, "Unauthorized", message, {"WWW-Authenticate": "Bearer"})
        return tenant

    def _route(self, method: str, segments: list[str]) -> tuple[Handler, list[str]]:
        allowed = False
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
                handler = routes.get(method)
                if handler is not None:
                    return handler, params
                allowed = True
        if allowed:
            raise _HTTPError(405, "MethodNotAllowed", f"{method} is not allowed here")
        raise _HTTPError(404, "NotFound", "no such route; see /docs")

    def _error(self, exc: ContextPipeError) -> _HTTPError:
        kind = type(exc).__name__
        retry = {"Retry-After": str(self.settings.retry_after)}
        if isinstance(exc, SessionBusy):
            return _HTTPError(409, kind, "the session is busy: another run holds it; retry later, or send "
                              "\"wait\": SECONDS to wait for it", retry)
        if isinstance(exc, LeaseLost) and exc.gone:  # the session was deleted or expired: retrying cannot help
            return _HTTPError(410, kind, str(exc))
        if isinstance(exc, LeaseLost | ConcurrentUpdate):
            return _HTTPError(409, kind, str(exc), retry)
        if isinstance(exc, InputConflict):
            return _HTTPError(409, kind, str(exc))
        if isinstance(exc, UsageError | CodecError):
            return _HTTPError(400, kind, str(exc))
        if isinstance(exc, CorruptRecord):
            return _HTTPError(500, kind, str(exc))
        if isinstance(exc, StoreError):
            log.error("store error: %s", exc)
            return _HTTPError(503, kind, "the session store failed; retry later", retry)
        if isinstance(exc, ModelError):
            return _HTTPError(502, kind, str(exc))
        return _HTTPError(500, kind, str(exc))

    async def _body(self, request: Request) -> Any:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _HTTPError(413, "PayloadTooLarge", f"the request body is over {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _HTTPError(413, "PayloadTooLarge", f"the request body is over {limit} bytes")
            chunks.append(chunk)
        if not size:
            return {}
        try:
            return json.loads(b"".join(chunks))
        except ValueError:
            raise _HTTPError(400, "BadRequest", "the request body is not valid JSON") from None

    @staticmethod
    def _validate(model: type[pydantic.BaseModel], body: Any) -> Any:
        try:
            return model.model_validate(body)
        except pydantic.ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            raise _HTTPError(400, "BadRequest", f"invalid request: {problems}") from None

    @staticmethod
    def _int(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise _HTTPError(400, "BadRequest", f"{name} must be an integer, got {raw!r}") from None
        if not low <= value <= high:
            raise _HTTPError(400, "BadRequest", f"{name} must be between {low} and {high}, got {value}")
        return value

    async def _existing(self, tenant: str, session_id: str) -> Any:
        validate_session_id(session_id)
        session = await self.store.get_session(tenant, session_id)
        if session is None:
            raise _HTTPError(404, "NotFound", f"no session {session_id!r}")
        return session

    def _writable(self) -> RunManager:
        if self.settings.read_only or self.runs is None:
            raise _HTTPError(405, "ReadOnly", "this server is read-only (contextpipe ui); it cannot change sessions")
        return self.runs

    # --- routes --------------------------------------------------------------------------------------

    async def info(self, request: Request, tenant: str, params: list[str]) -> Response:
        agent = self.agent
        about: dict[str, Any] | None = None
        if agent is not None:
            about = {"name": agent.name, "model": agent.model.name, "tools": sorted(agent.tools),
                     "providers": [{"source_id": p.source_id, "kind": p.kind} for p in agent.providers],
                     "store_traces": agent.durability.store_traces}
        return JSONResponse({"tenant": tenant, "version": __version__, "store": self.store.backend,
                             "read_only": self.settings.read_only or agent is None, "agent": about})

    async def list_sessions(self, request: Request, tenant: str, params: list[str]) -> Response:
        limit = self._int(request, "limit", 50, 1, 500)
        assert limit is not None
        cursor = request.query_params.get("cursor") or None
        query = (request.query_params.get("q") or "").strip().lower()
        found, scanned = [], 0
        while True:
            listing = await self.store.list_sessions(tenant, limit=limit, cursor=cursor)
            scanned += len(listing.sessions)
            found += [s for s in listing.sessions if not query or query in s.session_id.lower()]
            cursor = listing.next_cursor
            # A search reads whole pages (nothing is skipped) and stops after about 1,000 sessions.
            if not query or cursor is None or len(found) >= limit or scanned >= 1000:
                break
        return JSONResponse({
            "sessions": [{"id": s.session_id, "version": s.version, "message_count": s.message_count,
                          "created_at": s.created_at, "updated_at": s.updated_at} for s in found],
            "next_cursor": cursor,
        })

    async def create_session(self, request: Request, tenant: str, params: list[str]) -> Response:
        self._writable()
        body = self._validate(_CreateSession, await self._body(request))
        assert self.agent is not None
        if body.id is None:
            session = await self.agent.create_session(tenant=tenant, ttl=body.ttl)
            return JSONResponse(_session_json(session, None), 201)
        validate_session_id(body.id)
        existing = await self.store.get_session(tenant, body.id)
        session = existing or await self.agent.session(body.id, tenant=tenant, ttl=body.ttl)
        return JSONResponse(_session_json(session, None), 200 if existing else 201)

    async def get_session(self, request: Request, tenant: str, params: list[str]) -> Response:
        session = await self._existing(tenant, params[0])
        checkpoint = await self.store.latest_checkpoint(tenant, session.id)
        return JSONResponse(_session_json(session, checkpoint))

    async def delete_session(self, request: Request, tenant: str, params: list[str]) -> Response:
        self._writable()
        validate_session_id(params[0])
        if not await self.store.delete_session(tenant, params[0]):
            raise _HTTPError(404, "NotFound", f"no session {params[0]!r}")
        return Response(status_code=204)

    async def messages(self, request: Request, tenant: str, params: list[str]) -> Response:
        session = await self._existing(tenant, params[0])
        limit = self._int(request, "limit", 100, 1, 1000)
        before = self._int(request, "before", None, 0, 2**62)
        after = self._int(request, "after", None, -1, 2**62)
        page = await self.store.load(tenant, session.id, limit=limit, before=before, after=after)
        return JSONResponse({
            "messages": [{"seq": seq, **message_to_dict(m)} for seq, m in enumerate(page.messages, page.first_seq)],
            "first_seq": page.first_seq, "has_more": page.has_more,
            "next_before": page.first_seq if page.has_more else None,
        })

    async def traces(self, request: Request, tenant: str, params: list[str]) -> Response:
        session = await self._existing(tenant, params[0])
        limit = self._int(request, "limit", None, 1, 10_000)
        return JSONResponse({"traces": await self.store.load_traces(tenant, session.id, limit=limit)})

    async def run(self, request: Request, tenant: str, params: list[str]) -> Response:
        runs = self._writable()
        body = self._validate(_RunRequest, await self._body(request))
        input = _named(body.input, _input(body.input), body.message_id, request.headers.get("idempotency-key"),
                       tenant, params[0])
        if runs.draining:
            raise _HTTPError(503, "ShuttingDown", "the server is shutting down; retry on another worker",
                             {"Retry-After": str(self.settings.retry_after)})
        session = await self._existing(tenant, params[0])
        wait = min(body.wait, self.settings.max_wait)
        streaming = body.stream or "text/event-stream" in request.headers.get("accept", "")
        if not streaming:
            return await self._await_run(request, runs, runs.start(session, input, lease_wait=wait, stream=False,
                                                                   traces=body.traces))
        # The status line goes out before the run's first event: see now whether the session is free
        # (a run that slips in between still cannot interleave; this one then ends with an error event).
        probe = await self.store.acquire_lease(tenant, session.id, "contextpipe-serve-probe", ttl=10, wait=wait)
        await self.store.release_lease(probe)
        run = runs.start(session, input, lease_wait=max(wait, 1.0), stream=True, traces=body.traces)
        return StreamingResponse(_sse(runs, run), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def _await_run(self, request: Request, runs: RunManager, run: LiveRun) -> Response:
        assert run.task is not None
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({run.task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not run.task.done():
                runs.detach(run)
                return Response(status_code=499)
        except asyncio.CancelledError:
            runs.detach(run)
            raise
        finally:
            gone.cancel()
        try:
            result = await run.wait()
        except ContextPipeError as exc:
            return self._error(exc).response()
        except asyncio.CancelledError:
            return _HTTPError(503, "Cancelled", "the run was cancelled: the server is shutting down").response()
        except Exception:
            log.exception("run failed")
            return JSONResponse(error_to_json(Exception()), 500)
        return JSONResponse(result_to_json(result, traces=run.traces))

    async def agui(self, request: Request, tenant: str, params: list[str]) -> Response:
        from ._agui import agui_events, agui_input

        runs = self._writable()
        run_input, new = agui_input(await self._body(request))
        if runs.draining:
            raise _HTTPError(503, "ShuttingDown", "the server is shutting down; retry on another worker",
                             {"Retry-After": str(self.settings.retry_after)})
        assert self.agent is not None
        session = await self.agent.session(run_input.thread_id, tenant=tenant)
        probe = await self.store.acquire_lease(tenant, session.id, "contextpipe-serve-probe", ttl=10)
        await self.store.release_lease(probe)
        run = runs.start(session, new or None, lease_wait=1.0, stream=True)

        async def body() -> AsyncIterator[str]:
            finished = False
            try:
                async for chunk in agui_events(run_input, run.events()):
                    yield chunk
                finished = True
            finally:
                if not finished:
                    runs.detach(run)

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})


_ROUTES: list[tuple[tuple[str | None, ...], dict[str, Handler]]] = [
    (("info",), {"GET": _Api.info}),
    (("sessions",), {"GET": _Api.list_sessions, "POST": _Api.create_session}),
    (("sessions", None), {"GET": _Api.get_session, "DELETE": _Api.delete_session}),
    (("sessions", None, "messages"), {"GET": _Api.messages}),
    (("sessions", None, "traces"), {"GET": _Api.traces}),
    (("sessions", None, "facts"), {"GET": session_facts}),
    (("sessions", None, "runs"), {"POST": _Api.run}),
    (("ag-ui",), {"POST": _Api.agui}),
]


def _session_json(session: Any, checkpoint: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"id": session.id, "version": session.version, "created_at": session.created_at,
                            "ttl": session.ttl, "state": session.state_to_json(), "checkpoint": None}
    if checkpoint is not None:
        data["checkpoint"] = {"seq": checkpoint.seq, "summary": message_to_dict(checkpoint.summary),
                              "created_at": checkpoint.created_at}
    return data


def _input(raw: str | list[dict[str, Any]] | None) -> str | list[Message] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        if not raw.strip():
            raise _HTTPError(400, "BadRequest", "input is empty: send text, messages, or null to resume the session")
        return raw
    if not raw:
        raise _HTTPError(400, "BadRequest", "input is an empty list: send text, messages, or null to resume")
    messages = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise _HTTPError(400, "BadRequest", f"input[{i}] must be a message object")
        message = message_from_dict({"v": 1, "id": new_message_id(), "created_at": time.time(), **item})
        if message.role != "user":
            raise _HTTPError(400, "BadRequest", f"input[{i}] has role {message.role!r}; input messages must be "
                             "user messages (the session holds the rest)")
        messages.append(message)
    return messages


def _named(raw: str | list[dict[str, Any]] | None, input: str | list[Message] | None, message_id: str | None,
           key: str | None, tenant: str, session_id: str) -> str | list[Message] | None:
    """Give the run's last input message the id the client chose, so that a retried request is not run twice.

    The id is ``message_id`` (text input), or the ``Idempotency-Key`` header's key turned into an id
    of this session (the same key in another session or tenant names another message).
    """
    if key is not None:
        if not 1 <= len(key) <= 255:
            raise _HTTPError(400, "BadRequest", "the Idempotency-Key header must be 1-255 characters")
        if message_id is not None:
            raise _HTTPError(400, "BadRequest", "send message_id or an Idempotency-Key header, not both")
        message_id = "idem_" + hashlib.sha256(f"{tenant}\0{session_id}\0{key}".encode()).hexdigest()[:32]
    if message_id is None:
        return input
    if input is None:
        raise _HTTPError(400, "BadRequest", "input is null (a resume): there is no input message to name; "
                         "leave out message_id and Idempotency-Key")
    if isinstance(input, str):
        return [Message.user(input, id=message_id)]
    if key is None:
        raise _HTTPError(400, "BadRequest", "message_id names text input; give a list of messages their ids "
                         "in the messages (\"id\": ...)")
    if isinstance(raw, list) and "id" in raw[-1]:
        raise _HTTPError(400, "BadRequest", "the last input message has an id and an Idempotency-Key was sent: "
                         "send one or the other")
    last = input[-1]
    return [*input[:-1], Message(last.role, last.parts, message_id, last.author_name, last.created_at,
                                 last.metadata)]


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _sse(runs: RunManager, run: LiveRun) -> AsyncIterator[str]:
    finished = False
    getter: asyncio.Future[tuple[str, dict[str, Any]] | None] | None = None
    try:
        yield ": run started\n\n"
        while True:
            if getter is None:
                getter = asyncio.ensure_future(run.queue.get())
            done, _ = await asyncio.wait({getter}, timeout=15)
            if not done:
                yield ": keep-alive\n\n"  # holds proxies open during long model or tool calls
                continue
            item, getter = getter.result(), None
            chunk = []
            while item is not None:  # send what is queued in one write
                name, payload = item
                chunk.append(f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n")
                if run.queue.empty():
                    break
                item = run.queue.get_nowait()
            if chunk:
                yield "".join(chunk)
            if item is None:
                break
        finished = True
    finally:
        if getter is not None:
            getter.cancel()
        if not finished:
            runs.detach(run)


def _drain_on_signals(runs: RunManager, timeout: float) -> Callable[[], object]:
    """Make SIGTERM / SIGINT start draining `runs` before the ASGI server's own handler runs.

    The server (uvicorn) then stops accepting connections and waits for the open ones; the runs in
    flight get `timeout` seconds in all before they are cancelled cleanly.
    """
    if threading.current_thread() is not threading.main_thread():
        return list
    installed: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Callable[..., Any] = previous) -> None:
            runs.begin_drain(timeout)
            previous(signum, frame)

        signal.signal(sig, handler)
        installed[sig] = previous

    def restore() -> None:
        for sig, previous in installed.items():
            signal.signal(sig, previous)

    return restore


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
    api = _Api(agent, store, keys, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        restore = _drain_on_signals(api.runs, settings.drain_timeout) if api.runs is not None else list
        try:
            yield
        finally:
            restore()
            if api.runs is not None:
                cancelled = await api.runs.drain(settings.drain_timeout)
                if cancelled:
                    log.warning("shutdown: %d run(s) did not finish in time and were cancelled", cancelled)
            if close_store:
                await store.close()

    async def healthz(request: Request) -> Response:
        draining = api.runs is not None and api.runs.draining
        return JSONResponse({"ok": not draining, "draining": draining}, 503 if draining else 200)

    async def schema(request: Request) -> Response:
        return JSONResponse(openapi_schema(read_only=settings.read_only or agent is None))

    async def docs(request: Request) -> Response:
        return Response((STATIC / "docs.html").read_text(encoding="utf-8"), media_type="text/html")

    async def root(request: Request) -> Response:
        return RedirectResponse(request.url_for("ui", path="/"), 307)

    async def v1(request: Request) -> Response:
        return await api(request)

    methods = ["GET", "POST", "DELETE", "PUT", "PATCH"]
    app = Starlette(routes=[
        Route("/", root),
        Route("/ui", root),
        Route("/healthz", healthz),
        Route("/openapi.json", schema),
        Route("/docs", docs),
        Route("/v1/{rest:path}", v1, methods=methods),
        Mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui"),
    ], lifespan=lifespan, middleware=[
        Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                   allow_headers=["Authorization", "X-API-Key", "Content-Type", "Accept"], max_age=600),
    ] if settings.cors_origins else None)
    app.state.api = api
    return app

