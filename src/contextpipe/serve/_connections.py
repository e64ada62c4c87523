"""The connections of ``contextpipe serve``: read deadlines, a cap on open connections, the open-files limit.

uvicorn closes an idle keep-alive connection, but it gives a request's head and body no deadline
and open connections no cap: a client that connects and sends nothing (or a byte now and then)
holds a file descriptor for ever, and some thousands of them leave the process unable to accept
anyone. `GuardedProtocol` is uvicorn's httptools protocol with, per `ServeSettings`:

- ``header_timeout``: a request's head must be whole this many seconds after the connection opens
  (or after the next request's first byte, for a keep-alive one), else the connection is closed;
- ``body_timeout``: its body must be whole this many seconds after its head (a pipelined request's:
  after the requests before it are answered), else it is cut: 408 when no response has started,
  and the connection is closed;
- ``keep_alive_timeout``: an idle keep-alive connection is closed after it;
- ``max_connections`` open at once per process: a connection beyond it closes the one idle the
  longest (idle: no request being answered, so a keep-alive one or one still sending its head), so
  idle clients cannot lock out a real request. When none is idle, the new one is answered 503 with
  ``Retry-After`` once its head is read, and closed.

The protocol builds its `Guard` from the settings ``contextpipe serve`` leaves in the environment for
its workers (`process_guard`), one per server process; an app served some other way is not held to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ._worker_config import read_config

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

__all__ = ["Guard", "GuardedProtocol", "default_max_connections", "open_files_limit", "process_guard",
           "raise_open_files"]


def open_files_limit() -> int | None:
    """Return the soft limit on the process's open files, or None where there is none to read (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def raise_open_files() -> int | None:
    """Raise the soft limit on open files to the hard limit (at most 2**20; the hard one is kept); return it."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):  # macOS refuses one above its per-process maximum
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return open_files_limit()


def default_max_connections(open_files: int | None) -> int | None:
    """Return the connections a process may hold: its open-files limit less a tenth (at least 64) for files."""
    return None if open_files is None else max(1, open_files - max(64, open_files // 10))


def _error(kind: str, message: str) -> bytes:
    return json.dumps({"error": {"type": kind, "message": message}}).encode()


class Guard:
    """One server process's connection settings (`ServeSettings`' fields), and its idle connections, oldest first."""

    def __init__(self, *, header_timeout: float, body_timeout: float, keep_alive_timeout: float,
                 max_connections: int | None, retry_after: int) -> None:
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.keep_alive_timeout = keep_alive_timeout
        self.max_connections = max_connections or default_max_connections(open_files_limit())
        self.retry_after = retry_after
        self.idle: OrderedDict[GuardedProtocol, None] = OrderedDict()

    def evict(self) -> bool:
        """Close the connection idle the longest, if there is one; say whether there was."""
        if not self.idle:
            return False
        self.idle.popitem(last=False)[0].transport.close()
        return True

    async def too_many(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 503 (an ASGI app): the connection is over the cap, and none was idle to make room."""
        body = _error("TooManyConnections", f"the server holds {self.max_connections} connections, all answering "
                      "requests; retry later")
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
            (b"retry-after", b"%d" % self.retry_after), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def process_guard(server_state: Any) -> Guard:
    """Return the `Guard` of the server whose protocols share `server_state` (made on its first connection)."""
    guard: Guard | None = getattr(server_state, "contextpipe_guard", None)
    if guard is None:
        try:
            settings = read_config()["settings"]
        except KeyError:
            raise RuntimeError("GuardedProtocol reads the settings `contextpipe serve` leaves its workers; serve "
                               "the app with `contextpipe serve`, or use uvicorn's own protocol") from None
        guard = Guard(header_timeout=settings["header_timeout"], body_timeout=settings["body_timeout"],
                      keep_alive_timeout=settings["keep_alive_timeout"], max_connections=settings["max_connections"],
                      retry_after=settings["retry_after"])
        server_state.contextpipe_guard = guard
    return guard


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines for a request's head and body, and the connection cap."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.guard = process_guard(server_state)
        self.timeout_keep_alive = self.guard.keep_alive_timeout  # type: ignore[assignment]  # (int in uvicorn; a float does)
        self.timer: asyncio.TimerHandle | None = None

    def arm(self, delay: float, then: Any) -> None:
        self.disarm()
        self.timer = self.loop.call_later(delay, then)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.guard.max_connections
        if cap is not None and len(self.connections) > cap and not self.guard.evict():
            self.app = self.guard.too_many  # this connection's one request is answered 503
        else:
            self.guard.idle[self] = None
        self.arm(self.guard.header_timeout, self.head_late)

    def data_received(self, data: bytes) -> None:
        if self.timer is None and (self.cycle is None or self.cycle.response_complete):
            self.arm(self.guard.header_timeout, self.head_late)  # the next request's head begins
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self.guard.idle.pop(self, None)
        queued = self.cycle is not None and not self.cycle.response_complete  # a pipelined request
        super().on_headers_complete()
        if queued:  # its time starts when the requests before it are answered (`on_response_complete`)
            self.disarm()
        else:
            self.arm(self.guard.body_timeout, self.body_late)

    def on_message_complete(self) -> None:
        self.disarm()
        if self.cycle is not None and self.cycle.response_complete:  # answered before its body was whole:
            self.arm(self.guard.header_timeout, self.head_late)  # what follows is the next request's head
        super().on_message_complete()

    def on_response_complete(self) -> None:
        started = self.pipeline[-1][0] if self.pipeline else None  # the pipelined request uvicorn starts now
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if started is None:
            self.guard.idle.pop(self, None)
            self.guard.idle[self] = None
        elif started is self.cycle and started.more_body:  # only the last one read may lack some body
            self.arm(self.guard.body_timeout, self.body_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.guard.idle.pop(self, None)
        super().connection_lost(exc)

    def head_late(self) -> None:
        """Close the connection: the request's head is not whole in time."""
        self.timer = None
        self.guard.idle.pop(self, None)
        self.transport.close()

    def body_late(self) -> None:
        """Answer 408 (if no response has started) and close: the request's body is not whole in time."""
        self.timer = None
        cycle = self.cycle
        if not cycle.response_started:
            cycle.response_started = True
            body = _error("RequestTimeout", f"the request's body did not arrive whole within "
                          f"{self.guard.body_timeout:g} seconds of its head; send it faster")
            head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            self.transport.write(STATUS_LINE[408] + head + body)
        cycle.disconnected = True  # the app reads the end of the body as a disconnect; what it sends is dropped
        cycle.message_event.set()
        self.transport.close()
