"""`FakeOpenAIServer`: a small OpenAI-compatible HTTP server on 127.0.0.1 for tests and demos.

It serves ``POST /v1/chat/completions`` (plain JSON and SSE streaming, with tool calls and usage)
from a script of replies, and ``POST /v1/embeddings`` (deterministic word-hashing vectors), and
records every request body. Script steps can also be HTTP errors,
malformed bodies and streams cut mid-way, to test how clients fail.

>>> with FakeOpenAIServer() as server:
...     server.enqueue(FakeReply("Hello!"))
...     server.base_url.startswith("http://127.0.0.1:")
True
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeAlias

__all__ = ["FakeError", "FakeOpenAIServer", "FakeRaw", "FakeReply", "FakeStep", "FakeStreamCut"]


@dataclass(frozen=True)
class FakeReply:
    """A successful chat completion: text and/or tool calls ``(name, arguments_json)``."""

    text: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()
    usage: tuple[int, int] = (10, 5)
    """(prompt_tokens, completion_tokens) reported."""
    chunk_size: int = 4
    """Characters per streamed text or argument chunk."""
    reasoning: str | None = None
    """Reasoning text, sent as ``reasoning_content`` like vLLM and DeepSeek servers do."""


@dataclass(frozen=True)
class FakeError:
    """An HTTP error answer with an OpenAI-style error body."""

    status: int
    message: str = "fake error"
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FakeRaw:
    """An answer with an arbitrary body (for malformed responses)."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"


@dataclass(frozen=True)
class FakeStreamCut:
    """A streamed reply that stops after `after_chunks` chunks, dropping the connection."""

    reply: FakeReply
    after_chunks: int = 2


FakeStep: TypeAlias = "FakeReply | FakeError | FakeRaw | FakeStreamCut | Callable[[dict[str, Any]], Any]"


class FakeOpenAIServer:
    """An OpenAI-compatible chat completions server in a background thread.

    Use as a context manager (or call `start` / `stop`). `base_url` is what to give an OpenAI
    client; `requests` holds the JSON bodies received. When the script is empty a plain text reply
    ``"ok"`` is served, unless `strict` is set, in which case the call fails with HTTP 500.
    """

    def __init__(self, *, model: str = "fake-model", strict: bool = False) -> None:
        self.model = model
        self.strict = strict
        self.requests: list[dict[str, Any]] = []
        """JSON bodies of the requests received, oldest first."""
        self.headers: list[dict[str, str]] = []
        """Headers of the requests received."""
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
        return f"http://{host!s}:{port}/v1"

    def enqueue(self, *steps: Any) -> None:
        """Append steps to the script."""
        with self._lock:
            self._script.extend(steps)

    def start(self) -> FakeOpenAIServer:
        """Start serving on a free port of 127.0.0.1."""
        server = self

        class Handler(_Handler):
            fake = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
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

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self._counter += 1
            if self._script:
                step = self._script.popleft()
            elif self.strict:
                step = FakeError(500, "the fake server's script is empty")
            else:
                step = FakeReply("ok")
        if callable(step):
            step = step(body)
        return step

    def _new_id(self) -> str:
        with self._lock:
            self._counter += 1
            return f"chatcmpl-{self._counter}"


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        path = self.path.rstrip("/")
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(400, {"error": {"message": "request body is not JSON", "type": "invalid_request_error"}})
            return
        if path.endswith("/embeddings"):
            self._embeddings(body)
            return
        if not path.endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"unknown path {self.path}", "type": "not_found"}})
            return
        step = self.fake._next(body, dict(self.headers.items()))
        if isinstance(step, FakeError):
            error: dict[str, Any] = {"message": step.message, "type": "fake_error", "code": step.code}
            self._json(step.status, {"error": error}, step.headers)
        elif isinstance(step, FakeRaw):
            self._send(step.status, step.body, step.content_type)
        elif isinstance(step, FakeStreamCut):
            self._stream(body, step.reply, cut_after=step.after_chunks)
        elif isinstance(step, FakeReply):
            if body.get("stream"):
                self._stream(body, step, cut_after=None)
            else:
                self._json(200, self._completion(body, step))
        else:
            self._json(500, {"error": {"message": f"bad script step {step!r}", "type": "fake_error"}})

    # --- embeddings ----------------------------------------------------------------------------------

    def _embeddings(self, body: dict[str, Any]) -> None:
        """Deterministic embeddings: the word-hashing vectors of `HashEmbedder` (dimension 64)."""
        from ..vectors.embedders import HashEmbedder

        with self.fake._lock:
            self.fake.requests.append(body)
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        embedder = HashEmbedder(int(body.get("dimensions") or 64))
        data = [{"object": "embedding", "index": i, "embedding": embedder._one(str(t))} for i, t in enumerate(texts)]
        self._json(200, {"object": "list", "data": data, "model": body.get("model", "fake-embedding"),
                         "usage": {"prompt_tokens": sum(len(str(t).split()) for t in texts),
                                   "total_tokens": sum(len(str(t).split()) for t in texts)}})

    # --- plain ---------------------------------------------------------------------------------------

    def _completion(self, body: dict[str, Any], reply: FakeReply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{i}_{self.fake._counter}", "type": "function",
                 "function": {"name": name, "arguments": args}}
                for i, (name, args) in enumerate(reply.tool_calls)
            ]
        return {
            "id": self.fake._new_id(), "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.fake.model),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": {"prompt_tokens": reply.usage[0], "completion_tokens": reply.usage[1],
                      "total_tokens": sum(reply.usage)},
        }

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

    # --- streaming -----------------------------------------------------------------------------------

    def _stream(self, body: dict[str, Any], reply: FakeReply, cut_after: int | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        cid, model, created = self.fake._new_id(), body.get("model", self.fake.model), int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None,
                  empty: bool = False) -> dict[str, Any]:
            out: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "choices": [] if empty else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage is not None:
                out["usage"] = usage
            return out

        size = max(1, reply.chunk_size)
        events: list[dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        if reply.reasoning:
            events.append(chunk({"reasoning_content": reply.reasoning}))
        events += [chunk({"content": reply.text[i:i + size]}) for i in range(0, len(reply.text), size)]
        for index, (name, args) in enumerate(reply.tool_calls):
            events.append(chunk({"tool_calls": [{"index": index, "id": f"call_{index}_{cid}", "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}))
            events += [chunk({"tool_calls": [{"index": index, "function": {"arguments": args[i:i + size]}}]})
                       for i in range(0, len(args), size)]
        events.append(chunk({}, finish="tool_calls" if reply.tool_calls else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": reply.usage[0], "completion_tokens": reply.usage[1],
                     "total_tokens": sum(reply.usage)}
            events.append(chunk({}, usage=usage, empty=True))
        for n, event in enumerate(events):
            if cut_after is not None and n >= cut_after:
                # Drop the connection mid-body: no terminating chunk, no [DONE].
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
