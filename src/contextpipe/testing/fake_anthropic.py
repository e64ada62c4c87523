"""`FakeAnthropicServer`: a small Anthropic Messages API server on 127.0.0.1 for tests and demos.

It serves ``POST /v1/messages`` (plain JSON, and the SSE event stream exactly as the API sends it:
``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``ping``, ``message_delta``,
``message_stop``, and ``error`` events mid-stream) and ``POST /v1/messages/count_tokens``, from a script
of replies (also in the Vertex AI and the non-streaming Bedrock forms), and records every request
body. It checks what the real API checks and answers 400 with
an ``invalid_request_error`` like the API does: roles alternating from ``user``, every ``tool_use``
answered by a ``tool_result`` first in the next user turn (its content text, image or document blocks, images
of the four accepted types), thinking blocks sent back unchanged (their
signatures are verified), at most four cache breakpoints, ``max_tokens`` present. Prompt caching is
simulated: prefixes ending at a ``cache_control`` breakpoint are remembered, and later requests that
repeat them report ``cache_read_input_tokens`` (tokens are counted as 4 characters of canonical JSON).
The checks live in `contextpipe.testing.wire` (`messages_request_problem`).

>>> with FakeAnthropicServer() as server:
...     server.enqueue(AnthropicReply("Hello!"))
...     server.base_url.startswith("http://127.0.0.1:")
True
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any, ClassVar

from ._http import FakeHandler
from .fake_openai import FakeError, FakeOpenAIServer, FakeRaw, FakeStreamError
from .wire import message_blocks, messages_request_problem, signature_for

__all__ = ["AnthropicReply", "FakeAnthropicCut", "FakeAnthropicServer", "FakeStreamError", "signature_for"]

_BEDROCK = re.compile(r"/model/(?P<model>[^/]+)/invoke$")
_VERTEX = re.compile(r"/publishers/anthropic/models/(?P<model>[^/:]+):(?P<verb>rawPredict|streamRawPredict)$")


@dataclass(frozen=True)
class AnthropicReply:
    """A successful Messages API answer: thinking, text and/or tool calls ``(name, input_json)``."""

    text: str = ""
    tool_calls: tuple[tuple[str, str], ...] = ()
    thinking: str | None = None
    """Thinking text, sent first as a ``thinking`` block with a signature the server later verifies."""
    redacted_thinking: str | None = None
    """Opaque data of a ``redacted_thinking`` block sent before the others."""
    stop_reason: str | None = None
    """Defaults to ``tool_use`` when there are tool calls, else ``end_turn``."""
    output_tokens: int = 5
    input_tokens: int | None = None
    """Reported uncached input tokens; by default counted from the request (minus cached tokens)."""
    chunk_size: int = 4
    """Characters per streamed text, thinking or input-JSON delta."""
    pings: int = 1
    """``ping`` events sent after ``message_start``."""


@dataclass(frozen=True)
class FakeAnthropicCut:
    """A streamed reply whose connection is dropped after `after_events` events."""

    reply: AnthropicReply
    after_events: int = 3


def _tokens(obj: Any) -> int:
    return max(1, len(json.dumps(obj, sort_keys=True, separators=(",", ":"))) // 4)


class FakeAnthropicServer(FakeOpenAIServer):
    """An Anthropic Messages API server in a background thread (see the module docstring).

    `base_url` is what to give ``anthropic.AsyncAnthropic(base_url=...)``; `requests` holds the JSON
    bodies received and `headers` their headers. When the script is empty the `default_reply` (a text
    ``"ok"``) is served, unless `strict` is set. `min_cache_tokens` is the smallest prefix the
    simulated cache keeps. `host` and `port` are as for `FakeOpenAIServer`; on its own:
    ``python -m contextpipe.testing.fake_anthropic [--port N] [--reply TEXT]...``.
    """

    _idle_reply: ClassVar[Any] = AnthropicReply("ok")

    def __init__(self, *, model: str = "claude-fake", strict: bool = False, min_cache_tokens: int = 0,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(model=model, strict=strict, host=host, port=port)
        self.min_cache_tokens = min_cache_tokens
        self.redacted: set[str] = set()
        self._cache: set[str] = set()
        self._cache_lock = threading.Lock()

    def _new_id(self) -> str:
        with self._lock:
            self._counter += 1
            return f"{self._counter:024x}"

    @property
    def base_url(self) -> str:
        """The URL to pass as an Anthropic client's ``base_url``."""
        return super().base_url.removesuffix("/v1")

    # --- prompt cache ------------------------------------------------------------------------------

    def cache_usage(self, body: dict[str, Any]) -> tuple[int, int, int]:
        """Return ``(uncached input, cache read, cache write)`` tokens for `body`, updating the cache."""
        blocks, marks = _prefix_blocks(body)
        total = _tokens(blocks) if blocks else 0
        keys = [(n, hashlib.sha256(json.dumps(blocks[:n], sort_keys=True).encode()).hexdigest()) for n in marks]
        read = write = 0
        with self._cache_lock:
            hit = max((n for n, key in keys if key in self._cache), default=0)
            if hit:
                read = _tokens(blocks[:hit])
            longest = max(marks, default=0)
            size = _tokens(blocks[:longest]) if longest > hit else 0
            if size >= max(1, self.min_cache_tokens):
                write = max(0, size - read)
            self._cache.update(key for n, key in keys if _tokens(blocks[:n]) >= self.min_cache_tokens)
        return max(0, total - read - write), read, write


def _prefix_blocks(body: dict[str, Any]) -> tuple[list[Any], list[int]]:
    """Return the request as the cache sees it (tools, system, messages, unmarked) and where breakpoints end."""
    blocks: list[Any] = []
    marks: list[int] = []
    system = body.get("system")
    sections: list[tuple[str | None, Any]] = [(None, t) for t in body.get("tools") or ()]
    sections += [(None, b) for b in ([{"type": "text", "text": system}] if isinstance(system, str) else system or ())]
    sections += [(m.get("role"), b) for m in body.get("messages") or () for b in message_blocks(m) or ()]
    for role, block in sections:
        bare = {k: v for k, v in block.items() if k != "cache_control"}
        blocks.append(bare if role is None else [role, bare])
        if block.get("cache_control"):
            marks.append(len(blocks))
    return blocks, marks


def _error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": "req_fake"}


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                529: "overloaded_error"}


def _route(path: str, body: dict[str, Any]) -> str:
    """Map the Bedrock and Vertex AI forms of a request to the first-party path (moving the model into `body`)."""
    bedrock = _BEDROCK.search(path)
    if bedrock is not None:  # Claude on Bedrock (non-streaming; its stream is AWS event-stream framed)
        body["model"] = urllib.parse.unquote(bedrock["model"])
        return "/v1/messages"
    vertex = _VERTEX.search(path)
    if vertex is None:
        return path
    if vertex["model"] == "count-tokens":
        return "/v1/messages/count_tokens"
    body["model"] = vertex["model"]
    body["stream"] = vertex["verb"] == "streamRawPredict"
    return "/v1/messages"


class _AnthropicHandler(FakeHandler):
    fake: FakeAnthropicServer

    def do_POST(self) -> None:
        try:
            body = self._read_json()
        except ValueError:
            self._json(400, _error_body("invalid_request_error", "request body is not JSON"))
            return
        path = _route(self.path.split("?")[0].rstrip("/"), body)
        if path.endswith("/v1/messages/count_tokens"):
            self._count_tokens(body)
        elif path.endswith("/v1/messages"):
            self._messages(body)
        else:
            self._json(404, _error_body("not_found_error", f"unknown path {self.path}"))

    def _count_tokens(self, body: dict[str, Any]) -> None:
        with self.fake._lock:
            self.fake.requests.append(body)
            self.fake.headers.append(dict(self.headers.items()))
        problem = messages_request_problem(dict(body, max_tokens=1), self.fake.redacted)
        if problem:
            self._json(400, _error_body("invalid_request_error", problem))
            return
        self._json(200, {"input_tokens": _tokens([body.get("tools") or [], body.get("system") or "",
                                                  body.get("messages")])})

    def _messages(self, body: dict[str, Any]) -> None:
        step = self.fake._next(body, dict(self.headers.items()))
        if isinstance(step, FakeError):
            self._json(step.status, _error_body(step.code or _ERROR_TYPES.get(step.status, "api_error"), step.message),
                       {"request-id": "req_fake", **step.headers})
            return
        if isinstance(step, FakeRaw):
            self._send(step.status, step.body, step.content_type)
            return
        problem = messages_request_problem(body, self.fake.redacted)
        if problem:
            self._json(400, _error_body("invalid_request_error", problem))
            return
        if isinstance(step, FakeStreamError | FakeAnthropicCut):
            self._sse(body, step.reply, step)
        elif isinstance(step, AnthropicReply):
            if body.get("stream"):
                self._sse(body, step, None)
            else:
                self._json(200, self._message(body, step))
        else:
            self._json(500, _error_body("api_error", f"bad script step {step!r}"))

    # --- content ------------------------------------------------------------------------------------

    def _blocks(self, reply: AnthropicReply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.redacted_thinking is not None:
            with self.fake._lock:
                self.fake.redacted.add(reply.redacted_thinking)
            blocks.append({"type": "redacted_thinking", "data": reply.redacted_thinking})
        if reply.thinking is not None:
            blocks.append({"type": "thinking", "thinking": reply.thinking, "signature": signature_for(reply.thinking)})
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for name, arguments in reply.tool_calls:
            blocks.append({"type": "tool_use", "id": f"toolu_{self.fake._new_id()}", "name": name,
                           "input": json.loads(arguments)})
        return blocks

    def _usage(self, body: dict[str, Any], reply: AnthropicReply) -> dict[str, Any]:
        uncached, read, write = self.fake.cache_usage(body)
        return {"input_tokens": reply.input_tokens if reply.input_tokens is not None else uncached,
                "cache_creation_input_tokens": write, "cache_read_input_tokens": read,
                "output_tokens": reply.output_tokens}

    def _message(self, body: dict[str, Any], reply: AnthropicReply) -> dict[str, Any]:
        return {"id": self.fake._sent_id(f"msg_{self.fake._new_id()}"), "type": "message", "role": "assistant",
                "model": body.get("model", self.fake.model), "content": self._blocks(reply),
                "stop_reason": reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn"),
                "stop_sequence": None, "usage": self._usage(body, reply)}

    def _sse(self, body: dict[str, Any], reply: AnthropicReply,
                interrupt: FakeStreamError | FakeAnthropicCut | None) -> None:
        message = self._message(body, reply)
        size = max(1, reply.chunk_size)
        events: list[tuple[str, dict[str, Any]]] = []
        start_usage = dict(message["usage"], output_tokens=1)
        events.append(("message_start", {"type": "message_start", "message": dict(
            message, content=[], stop_reason=None, usage=start_usage)}))
        events += [("ping", {"type": "ping"})] * reply.pings
        for index, block in enumerate(message["content"]):
            kind = block["type"]
            if kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": block["thinking"][i:i + size]}
                          for i in range(0, len(block["thinking"]), size)]
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
            elif kind == "text":
                start = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": block["text"][i:i + size]}
                          for i in range(0, len(block["text"]), size)]
            elif kind == "tool_use":
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}  # type: ignore[dict-item]
                arguments = json.dumps(block["input"])
                deltas = [{"type": "input_json_delta", "partial_json": ""}]
                deltas += [{"type": "input_json_delta", "partial_json": arguments[i:i + size]}
                           for i in range(0, len(arguments), size)]
            else:
                start, deltas = block, []
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": start}))
            events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
                       for d in deltas]
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        usage = message["usage"]
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                         "usage": {"output_tokens": usage["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        self._start_stream({"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
                            "request-id": "req_fake"})
        for n, (name, data) in enumerate(events):
            if interrupt is not None and n >= interrupt.after_events:
                if isinstance(interrupt, FakeStreamError):
                    self._event("error", _error_body(interrupt.error_type or "overloaded_error", interrupt.message))
                    self._write_chunk(b"")
                else:
                    self._drop()
                return
            self._event(name, data)
        self._write_chunk(b"")

    def _event(self, name: str, data: dict[str, Any]) -> None:
        self._write_chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())


FakeAnthropicServer._handler = _AnthropicHandler

if __name__ == "__main__":  # python -m contextpipe.testing.fake_anthropic --help
    import sys

    from ._standalone import Vendor, serve

    raise SystemExit(serve(Vendor("Anthropic", "contextpipe.testing.fake_anthropic", FakeAnthropicServer,
                                  AnthropicReply, "ANTHROPIC", "claude-fake", "contextpipe chat --provider anthropic"),
                           sys.argv[1:]))

