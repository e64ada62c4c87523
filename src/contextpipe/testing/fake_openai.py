"""`FakeOpenAIServer`: a small OpenAI-compatible HTTP server on 127.0.0.1 for tests and demos.

It serves ``POST /v1/chat/completions`` (plain JSON and SSE streaming, with tool calls and usage) and
``POST /v1/responses`` (the Responses API: reasoning items with encrypted content, function calls,
the streaming event sequence, stored responses for ``previous_response_id``) from a script of
replies, and ``POST /v1/embeddings`` (deterministic word-hashing vectors), and records every request
body. Requests are checked the way the APIs check them, with a 400 answer like theirs: on chat
completions, each role's content part types (a ``tool`` message takes text only), image URLs and
audio formats, and every ``tool_calls`` answered at once by ``tool`` messages (`check_chat`); on
Responses, reasoning items must come back with the encrypted content the server issued and with
the item that followed them, tool outputs must answer a call and hold only ``input_text`` /
``input_image`` / ``input_file`` items, ``previous_response_id`` must name a stored response.
Script steps can also be HTTP errors, malformed bodies and streams cut mid-way, to test how clients
fail.

>>> with FakeOpenAIServer() as server:
...     server.enqueue(FakeReply("Hello!"))
...     server.base_url.startswith("http://127.0.0.1:")
True
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeAlias

__all__ = ["FakeError", "FakeOpenAIServer", "FakeRaw", "FakeReply", "FakeStep", "FakeStreamCut", "FakeStreamError"]


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
    """Reasoning text, sent as ``reasoning_content`` like vLLM and DeepSeek servers do (on the Responses
    API: the summary of a reasoning item, which also carries encrypted content)."""
    cached_tokens: int = 0
    """Of the prompt tokens, how many to report as read from the prompt cache."""
    reasoning_tokens: int = 0
    """Of the completion tokens, how many to report as reasoning (Responses API)."""
    incomplete: str | None = None
    """Responses API: end the response ``incomplete`` for this reason (``max_output_tokens``, ...)."""


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
class FakeStreamError:
    """A streamed reply interrupted after `after_events` events by an error event (the HTTP status stays 200).

    `reply` is a `FakeReply` (Responses API ``error`` event) or a `contextpipe.testing.AnthropicReply`
    (Messages API ``error`` event).
    """

    reply: Any
    after_events: int = 3
    error_type: str | None = None
    message: str = "Overloaded"


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
        self.stored: dict[str, list[dict[str, Any]]] = {}
        """Responses API: the full item list (input and output) of each stored response, by id."""
        self.issued_reasoning: dict[str, str] = {}
        """Responses API: encrypted content issued for each reasoning item id."""
        self.response_ids: list[str] = []
        """Ids of the responses sent (``chatcmpl-...``, ``resp_...``, Anthropic ``msg_...``), oldest first."""

    _handler: type[BaseHTTPRequestHandler]  # set below the handler class

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

        class Handler(self._handler):  # type: ignore[name-defined,misc]
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

    def _sent_id(self, response_id: str) -> str:
        with self._lock:
            self.response_ids.append(response_id)
        return response_id


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def setup(self) -> None:
        """Send each small SSE write at once (no Nagle delay waiting for the client's ACK)."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

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
        if path.endswith("/responses"):
            self._responses(body)
            return
        if not path.endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"unknown path {self.path}", "type": "not_found"}})
            return
        step = self.fake._next(body, dict(self.headers.items()))
        problem = check_chat(body) if isinstance(step, FakeReply | FakeStreamCut) else None
        if problem:
            self._json(400, {"error": {"message": problem, "type": "invalid_request_error", "param": "messages",
                                       "code": None}})
        elif isinstance(step, FakeError):
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
            "id": self.fake._sent_id(self.fake._new_id()), "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.fake.model),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": _chat_usage(reply),
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
        cid, model, created = self.fake._sent_id(self.fake._new_id()), body.get("model", self.fake.model), \
            int(time.time())

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
            events.append(chunk({}, usage=_chat_usage(reply), empty=True))
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

    # --- Responses API -------------------------------------------------------------------------------

    def _responses(self, body: dict[str, Any]) -> None:
        fake = self.fake
        step = fake._next(body, dict(self.headers.items()))
        if isinstance(step, FakeError):
            error: dict[str, Any] = {"message": step.message, "type": "fake_error", "code": step.code}
            self._json(step.status, {"error": error}, step.headers)
            return
        if isinstance(step, FakeRaw):
            self._send(step.status, step.body, step.content_type)
            return
        items, problem = _responses_input(fake, body)
        if problem:
            self._json(400, {"error": {"message": problem, "type": "invalid_request_error", "code": None}})
            return
        reply = step.reply if isinstance(step, FakeStreamCut | FakeStreamError) else step
        if not isinstance(reply, FakeReply):
            self._json(500, {"error": {"message": f"bad script step {step!r}", "type": "fake_error"}})
            return
        response = self._response_object(body, reply)
        if body.get("store", True):
            with fake._lock:
                fake.stored[response["id"]] = items + list(response["output"])
        if not body.get("stream"):
            self._json(200, response)
            return
        cut = step.after_chunks if isinstance(step, FakeStreamCut) else None
        error_after = step.after_events if isinstance(step, FakeStreamError) else None
        self._responses_stream(response, reply, cut, error_after, step if isinstance(step, FakeStreamError) else None)

    def _response_object(self, body: dict[str, Any], reply: FakeReply) -> dict[str, Any]:
        fake = self.fake
        rid = fake._new_id().replace("chatcmpl-", "")
        output: list[dict[str, Any]] = []
        if reply.reasoning is not None:
            item_id = f"rs_{rid}"
            encrypted = "enc_" + hashlib.sha256(f"{item_id}:{reply.reasoning}".encode()).hexdigest()
            with fake._lock:
                fake.issued_reasoning[item_id] = encrypted
            item: dict[str, Any] = {"type": "reasoning", "id": item_id,
                                    "summary": [{"type": "summary_text", "text": reply.reasoning}] if reply.reasoning
                                    else [], "status": "completed"}
            if "reasoning.encrypted_content" in (body.get("include") or ()):
                item["encrypted_content"] = encrypted
            output.append(item)
        if reply.text:
            output.append({"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": reply.text, "annotations": [],
                                        "logprobs": []}]})
        for index, (name, arguments) in enumerate(reply.tool_calls):
            output.append({"type": "function_call", "id": f"fc_{rid}_{index}", "call_id": f"call_{rid}_{index}",
                           "name": name, "arguments": arguments, "status": "completed"})
        prompt, completion = reply.usage
        return {
            "id": fake._sent_id(f"resp_{rid}"), "object": "response", "created_at": time.time(),
            "status": "incomplete" if reply.incomplete else "completed",
            "incomplete_details": {"reason": reply.incomplete} if reply.incomplete else None,
            "error": None, "model": body.get("model", fake.model), "output": output,
            "instructions": body.get("instructions"), "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
            "temperature": body.get("temperature", 1.0), "top_p": 1.0, "metadata": {},
            "previous_response_id": body.get("previous_response_id"), "store": body.get("store", True),
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": reply.cached_tokens,
                                                                       "cache_write_tokens": 0},
                      "output_tokens": completion,
                      "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
                      "total_tokens": prompt + completion},
        }

    def _responses_stream(self, response: dict[str, Any], reply: FakeReply, cut_after: int | None,
                          error_after: int | None, error: FakeStreamError | None) -> None:
        size = max(1, reply.chunk_size)
        events: list[dict[str, Any]] = []
        pending = dict(response, status="in_progress", output=[], usage=None)
        events.append({"type": "response.created", "response": pending})
        events.append({"type": "response.in_progress", "response": pending})
        for index, item in enumerate(response["output"]):
            events += _item_events(index, item, size)
        final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        events.append({"type": final, "response": response})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, event in enumerate(events):
            event["sequence_number"] = n
            if cut_after is not None and n >= cut_after:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if error_after is not None and error is not None and n >= error_after:
                failure = {"type": "error", "code": error.error_type or "server_error", "message": error.message,
                           "param": None, "sequence_number": n}
                self._write_chunk(f"event: error\ndata: {json.dumps(failure)}\n\n".encode())
                self._write_chunk(b"")
                return
            self._write_chunk(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"")


def _item_events(index: int, item: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """Return the Responses stream events of one output item, ``output_item.added`` to ``output_item.done``."""
    events: list[dict[str, Any]] = []
    kind = item["type"]
    if kind == "reasoning":
        added = dict(item, summary=[])
        added.pop("encrypted_content", None)
        events.append({"type": "response.output_item.added", "output_index": index, "item": added})
        for s_index, summary in enumerate(item["summary"]):
            events.append({"type": "response.reasoning_summary_part.added", "item_id": item["id"],
                           "output_index": index, "summary_index": s_index,
                           "part": {"type": "summary_text", "text": ""}})
            text = summary["text"]
            events += [{"type": "response.reasoning_summary_text.delta", "item_id": item["id"],
                        "output_index": index, "summary_index": s_index, "delta": text[i:i + size]}
                       for i in range(0, len(text), size)]
            events.append({"type": "response.reasoning_summary_text.done", "item_id": item["id"],
                           "output_index": index, "summary_index": s_index, "text": text})
            events.append({"type": "response.reasoning_summary_part.done", "item_id": item["id"],
                           "output_index": index, "summary_index": s_index, "part": summary})
    elif kind == "message":
        text = item["content"][0]["text"]
        events.append({"type": "response.output_item.added", "output_index": index,
                       "item": dict(item, content=[], status="in_progress")})
        events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                       "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
        events += [{"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                    "content_index": 0, "delta": text[i:i + size], "logprobs": []}
                   for i in range(0, len(text), size)]
        events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                       "content_index": 0, "text": text, "logprobs": []})
        events.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                       "content_index": 0, "part": item["content"][0]})
    else:
        arguments = item["arguments"]
        events.append({"type": "response.output_item.added", "output_index": index,
                       "item": dict(item, arguments="", status="in_progress")})
        events += [{"type": "response.function_call_arguments.delta", "item_id": item["id"],
                    "output_index": index, "delta": arguments[i:i + size]}
                   for i in range(0, len(arguments), size)]
        events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                       "output_index": index, "arguments": arguments, "name": item["name"]})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def _chat_usage(reply: FakeReply) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": reply.usage[0], "completion_tokens": reply.usage[1],
                             "total_tokens": sum(reply.usage)}
    if reply.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
    if reply.reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
    return usage


def _responses_input(fake: FakeOpenAIServer, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """Return the full item list of a Responses request, and what the real API would reject in it."""
    if not isinstance(body.get("model"), str):
        return [], "Missing required parameter: 'model'."
    raw = body.get("input", [])
    items: list[dict[str, Any]] = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
    previous = body.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous is not None:
        with fake._lock:
            stored = fake.stored.get(previous)
        if stored is None:
            return [], f"Previous response with id '{previous}' not found."
        history = list(stored)
    for tool in body.get("tools") or ():
        if tool.get("type") != "function" or not tool.get("name") or "function" in tool:
            return [], "Invalid tool: Responses API function tools are {type: 'function', name, parameters}."
    calls = {i.get("call_id") for i in history if i.get("type") == "function_call"}
    for n, item in enumerate(items):
        check = _ITEM_CHECKS.get(item.get("type", "message"))
        problem = check(fake, body, items, n, calls) if check is not None else \
            f"Invalid value: '{item.get('type')}' for 'input[{n}].type'."
        if problem:
            return [], problem
    return history + items, None


_Items: TypeAlias = list[dict[str, Any]]


def _check_message(fake: FakeOpenAIServer, body: dict[str, Any], items: _Items, n: int, calls: set[Any]) -> str | None:
    item = items[n]
    if item.get("role") not in ("user", "assistant", "system", "developer"):
        return f"Invalid value for 'input[{n}].role'."
    content = item.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"Missing required parameter: 'input[{n}].content'."
    allowed = ("output_text", "refusal") if item["role"] == "assistant" else ("input_text", "input_image", "input_file")
    bad = [part.get("type") for part in content if part.get("type") not in allowed]
    if bad:
        return f"Invalid value: '{bad[0]}'. Supported values are: {allowed}."
    if item["role"] == "assistant":
        return None
    return next((p for j, part in enumerate(content) if (p := _check_input_part(part, f"input[{n}].content[{j}]"))),
                None)


def _check_call(fake: FakeOpenAIServer, body: dict[str, Any], items: _Items, n: int, calls: set[Any]) -> str | None:
    item = items[n]
    if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
        return f"Missing required parameter in 'input[{n}]' (call_id, name, arguments)."
    calls.add(item["call_id"])
    return None


def _check_output(fake: FakeOpenAIServer, body: dict[str, Any], items: _Items, n: int, calls: set[Any]) -> str | None:
    item = items[n]
    if item.get("call_id") not in calls:
        return f"No tool call found for function call output with call_id {item.get('call_id')}."
    output = item.get("output")
    if not isinstance(output, str | list):
        return f"Missing required parameter: 'input[{n}].output'."
    for j, part in enumerate(output if isinstance(output, list) else ()):
        problem = _check_input_part(part, f"input[{n}].output[{j}]")
        if problem:
            return problem
    return None


_INPUT_PARTS = ("input_text", "input_image", "input_file")


def _check_input_part(part: Any, where: str) -> str | None:
    """Return what the Responses API rejects in one ``input_text`` / ``input_image`` / ``input_file`` item."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in _INPUT_PARTS:
        return f"Invalid value: '{kind}' for '{where}.type'. Supported values are: {_INPUT_PARTS}."
    if kind == "input_text" and not isinstance(part.get("text"), str):
        return f"Missing required parameter: '{where}.text'."
    if kind == "input_image" and not (part.get("file_id") or _image_url(part.get("image_url"))):
        return f"Invalid '{where}.image_url': expected an https URL or a base64 data URL of an image."
    if kind == "input_file" and not (part.get("file_id") or part.get("file_url")
                                     or (isinstance(part.get("file_data"), str) and part.get("filename"))):
        return f"'{where}': an input_file needs file_id, file_url, or file_data with filename."
    return None


def _image_url(url: Any) -> bool:
    """Whether `url` is what the APIs take for an image: http(s), or a base64 data URL of an image type."""
    if not isinstance(url, str):
        return False
    if url.startswith(("https://", "http://")):
        return True
    return bool(re.fullmatch(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/]*={0,2}", url))


_CHAT_PARTS = {"user": ("text", "image_url", "input_audio", "file"), "system": ("text",), "developer": ("text",),
               "tool": ("text",), "assistant": ("text", "refusal")}


def check_chat(body: dict[str, Any]) -> str | None:
    """Return what the real chat completions API would reject in `body`'s messages, or None.

    Checked: roles, the content part types each role may carry (a ``tool`` message takes text only),
    image URLs and audio formats, and that every assistant ``tool_calls`` is followed at once by one
    ``tool`` message per call id, and every ``tool`` message answers such a call.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1."
    open_calls: set[str] = set()
    for n, message in enumerate(messages):
        role = message.get("role")
        if role not in _CHAT_PARTS:
            return f"Invalid value: '{role}' for 'messages[{n}].role'."
        if open_calls and role != "tool":
            return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                    f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                    f"{', '.join(sorted(open_calls))}")
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                return ("Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                        "with 'tool_calls'.")
            open_calls.discard(message["tool_call_id"])
        problem = _check_chat_content(message, n)
        if problem:
            return problem
        if role == "assistant":
            open_calls = {c.get("id") for c in message.get("tool_calls") or ()}
    return None


def _check_chat_content(message: dict[str, Any], n: int) -> str | None:
    content, role = message.get("content"), message["role"]
    if content is None or isinstance(content, str):
        return None if content is not None or role == "assistant" else f"Missing 'messages[{n}].content'."
    if not isinstance(content, list):
        return f"Invalid type for 'messages[{n}].content': expected a string or an array of content parts."
    allowed = _CHAT_PARTS[role]
    for j, part in enumerate(content):
        where = f"messages[{n}].content[{j}]"
        kind = part.get("type")
        if kind not in allowed:
            return f"Invalid value: '{kind}' for '{where}.type'. Supported values are: {allowed}."
        if kind == "image_url" and not _image_url((part.get("image_url") or {}).get("url")):
            return f"Invalid '{where}.image_url.url': expected an https URL or a base64 data URL of an image."
        if kind == "input_audio" and (part.get("input_audio") or {}).get("format") not in ("wav", "mp3"):
            return f"Invalid value for '{where}.input_audio.format': supported values are 'wav' and 'mp3'."
    return None


def _check_reasoning(fake: FakeOpenAIServer, body: dict[str, Any], items: _Items, n: int,
                     calls: set[Any]) -> str | None:
    item = items[n]
    with fake._lock:
        issued = fake.issued_reasoning.get(str(item.get("id")))
    if issued is None or (item.get("encrypted_content") != issued and not body.get("store", True)):
        return (f"Item with id '{item.get('id')}' not found. Items are not persisted when `store` is set to false; "
                "send the reasoning item with its encrypted_content.")
    if not isinstance(item.get("summary"), list):
        return f"Missing required parameter: 'input[{n}].summary'."
    following = items[n + 1] if n + 1 < len(items) else None
    if following is None or following.get("type") == "reasoning" or following.get("role") == "user":
        return f"Item '{item.get('id')}' of type 'reasoning' was provided without its required following item."
    return None


_ITEM_CHECKS: dict[str, Callable[[FakeOpenAIServer, dict[str, Any], _Items, int, set[Any]], str | None]] = {
    "message": _check_message, "function_call": _check_call, "function_call_output": _check_output,
    "reasoning": _check_reasoning,
}


FakeOpenAIServer._handler = _Handler
