"""What the fake vendor servers share: a scripted HTTP server in a background thread, and its handler base.

`FakeHTTPServer` holds the lifecycle (``with`` block, `start` / `stop`, `base_url`, the address it
listens on), the script of steps and the record of every request; `FakeHandler` the plumbing of an
answer (JSON bodies, chunked server-sent events, a connection dropped mid-stream).
`FakeOpenAIServer` and `FakeAnthropicServer` build on both and add only what their vendor's API says.
"""

from __future__ import annotations

import errno
import json
import socket
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Self

from ..errors import UsageError

__all__ = ["FakeHTTPServer", "FakeHandler"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class FakeHTTPServer:
    """A scripted HTTP server on `host`:`port` (default: a free port of 127.0.0.1), served from a background thread.

    Each request takes the next step of the script (`enqueue`); when the script is empty the
    `default_reply` is served, or `_exhausted` when `strict` is set.
    """

    _handler: ClassVar[type[FakeHandler]]
    """The request handler class (a subclass sets it)."""
    _idle_reply: ClassVar[Any]
    """The step served when the script is empty."""
    _exhausted: ClassVar[Any]
    """The step served when the script is empty and `strict` is set."""

    def __init__(self, *, model: str, strict: bool = False, host: str = "127.0.0.1", port: int = 0) -> None:
        if not 0 <= port <= 65535:
            raise UsageError(f"port must be 0 (a free port) to 65535, got {port}")
        self.model = model
        self.strict = strict
        self.host = host
        """The address to listen on (``::1`` and other IPv6 addresses too)."""
        self.port = port
        """The port to listen on; 0 picks a free one (`base_url` says which)."""
        self.default_reply: Any = self._idle_reply
        """The step served when the script is empty (unless `strict`): a text reply ``"ok"`` until changed."""
        self.requests: list[dict[str, Any]] = []
        """JSON bodies of the requests received, oldest first."""
        self.headers: list[dict[str, str]] = []
        """Headers of the requests received."""
        self.response_ids: list[str] = []
        """Ids of the responses sent (``chatcmpl-...``, ``resp_...``, Anthropic ``msg_...``), oldest first."""
        self._script: deque[Any] = deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._counter = 0

    @property
    def base_url(self) -> str:
        """The URL to pass as an OpenAI client's ``base_url``."""
        if self._httpd is None:
            raise RuntimeError("the server is not running; call start() or use it in a with block")
        host, port = self._httpd.server_address[:2]
        shown = f"[{host!s}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{port}/v1"

    def enqueue(self, *steps: Any) -> None:
        """Append steps to the script."""
        with self._lock:
            self._script.extend(steps)

    def start(self) -> Self:
        """Start serving on `host`:`port`; a port already in use is a `UsageError` saying so."""
        server = self

        class Handler(self._handler):  # type: ignore[name-defined,misc]
            fake = server

        try:
            self._httpd = (_Server6 if ":" in self.host else _Server)((self.host, self.port), Handler)
        except OSError as exc:
            the_port = isinstance(exc, PermissionError) or exc.errno == errno.EADDRINUSE  # else: the host is not ours
            hint = ("pick another port, or port 0 for a free one" if the_port
                    else "give an address of this machine (like 127.0.0.1 or ::1)")
            raise UsageError(f"the fake server cannot listen on {self.host}:{self.port}: {exc.strerror or exc}; "
                             f"{hint}") from None
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-openai",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """Record a request and return the script step that answers it (a callable step is called on `body`)."""
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self._counter += 1
            if self._script:
                step = self._script.popleft()
            elif self.strict:
                step = self._exhausted
            else:
                step = self.default_reply
        if callable(step):
            step = step(body)
        return step

    def _new_id(self) -> str:
        with self._lock:
            self._counter += 1
            return f"chatcmpl-{self._counter}"

    def _sent_id(self, response_id: str) -> str:
        with self._lock:
            self.response_ids.append(response_id)
        return response_id


class FakeHandler(BaseHTTPRequestHandler):
    """The request handler base: quiet, unbuffered, HTTP/1.1 with chunked streams."""

    fake: FakeHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def setup(self) -> None:
        """Send each small SSE write at once (no Nagle delay waiting for the client's ACK)."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _read_json(self) -> Any:
        """Return the request's JSON body; raise ValueError when it is not JSON."""
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length))

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, headers: dict[str, str]) -> None:
        """Send a 200 with `headers` and chunked transfer encoding; the body follows in `_write_chunk` calls."""
        self.send_response(200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _drop(self) -> None:
        """Drop the connection mid-body: no terminating chunk, no end-of-stream event."""
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(2)
