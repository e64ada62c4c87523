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

>>> with FakeAnthropicServer() as server:
...     server.enqueue(AnthropicReply("Hello!"))
...     server.base_url.startswith("http://127.0.0.1:")
True
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .fake_openai import FakeError, FakeOpenAIServer, FakeRaw, FakeStreamError, _Handler

__all__ = ["AnthropicReply", "FakeAnthropicCut", "FakeAnthropicServer", "FakeStreamError", "signature_for"]

_SECRET = b"contextpipe-fake-anthropic"
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


def signature_for(thinking: str) -> str:
    """Return the signature the fake server gives a thinking block (and expects back unchanged)."""
    return "sig_" + hmac.new(_SECRET, thinking.encode(), hashlib.sha256).hexdigest()[:32]


def _tokens(obj: Any) -> int:
    return max(1, len(json.dumps(obj, sort_keys=True, separators=(",", ":"))) // 4)


class FakeAnthropicServer(FakeOpenAIServer):
    """An Anthropic Messages API server in a background thread (see the module docstring).

    `base_url` is what to give ``anthropic.AsyncAnthropic(base_url=...)``; `requests` holds the JSON
    bodies received and `headers` their headers. When the script is empty a text reply ``"ok"`` is
    served, unless `strict` is set. `min_cache_tokens` is the smallest prefix the simulated cache keeps.
    """

    def __init__(self, *, model: str = "claude-fake", strict: bool = False, min_cache_tokens: int = 0) -> None:
        super().__init__(model=model, strict=strict)
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
                step = AnthropicReply("ok")
        if callable(step):
            step = step(body)
        return step

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
    sections += [(m.get("role"), b) for m in body.get("messages") or () for b in _blocks_of(m) or ()]
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


def check_request(body: dict[str, Any], redacted: set[str]) -> str | None:
    """Return what the real Messages API would reject in `body`, or None when it is valid."""
    problem = _check_top(body) or _check_tools_and_system(body)
    if problem:
        return problem
    messages = body["messages"]
    thinking_on = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
    pending: set[str] = set()
    for i in range(len(messages)):
        problem, pending = _check_message(i, messages, pending, redacted)
        if problem:
            return problem
        if thinking_on and i == len(messages) - 2 and pending:
            problem = _thinking_first(i, messages[i])
            if problem:
                return problem
    if pending:
        return "messages: the last message has tool_use blocks without tool_result"
    return _check_breakpoints(body)


def _check_top(body: dict[str, Any]) -> str | None:
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: Field required"
    if not isinstance(body.get("model"), str):
        return "model: Field required"
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return "messages: at least one message is required"
    return None


def _thinking_first(i: int, message: dict[str, Any]) -> str | None:
    """With thinking on, the assistant turn whose calls the request answers must open with its thinking."""
    first = _blocks_of(message)[0].get("type")
    if first in ("thinking", "redacted_thinking"):
        return None
    return (f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. When "
            "`thinking` is enabled, a final `assistant` message must start with a thinking block")


def _check_breakpoints(body: dict[str, Any]) -> str | None:
    system = body.get("system")
    marked = [*(body.get("tools") or ()), *(system if isinstance(system, list) else ()),
              *(b for m in body["messages"] for b in _blocks_of(m))]
    breakpoints = sum(1 for b in marked if isinstance(b, dict) and b.get("cache_control"))
    if breakpoints > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
    return None


def _blocks_of(message: dict[str, Any]) -> Any:
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _check_tools_and_system(body: dict[str, Any]) -> str | None:
    for tool in body.get("tools") or ():
        if set(tool) - {"name", "description", "input_schema", "cache_control", "type", "strict"}:
            return f"tools: unexpected field in tool {tool.get('name')!r}"
        if not isinstance(tool.get("input_schema"), dict) or tool["input_schema"].get("type") != "object":
            return f"tools.{tool.get('name')}.input_schema.type: Input should be 'object'"
    system = body.get("system")
    if system is not None and not isinstance(system, str) and any(b.get("type") != "text" for b in system):
        return "system: only text blocks are accepted"
    return None


def _check_message(i: int, messages: list[dict[str, Any]], pending: set[str],
                   redacted: set[str]) -> tuple[str | None, set[str]]:
    """Check message `i` given the tool calls left open before it; return a problem and the calls it opens."""
    message = messages[i]
    role = message.get("role")
    if role not in ("user", "assistant"):
        return f"messages.{i}.role: Input should be 'user' or 'assistant'", pending
    if (i == 0 and role != "user") or (i and messages[i - 1].get("role") == role):
        return f"messages.{i}: roles must alternate between \"user\" and \"assistant\", starting with \"user\"", pending
    blocks = _blocks_of(message)
    if not isinstance(blocks, list) or not blocks:
        return f"messages.{i}.content: at least one content block is required", pending
    problem = _check_pairing(i, role, blocks, pending)
    if problem:
        return problem, pending
    opened: set[str] = set()
    for j, block in enumerate(blocks):
        problem = _check_block(f"messages.{i}.content.{j}", role, block, redacted)
        if problem:
            return problem, opened
        if block.get("type") == "tool_use":
            opened.add(block.get("id"))
    return None, opened


def _check_pairing(i: int, role: str, blocks: list[dict[str, Any]], pending: set[str]) -> str | None:
    """Every open call is answered, first thing, in the next user turn; no result answers nothing."""
    results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
    if pending and (role != "user" or set(results) != pending):
        return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{sorted(pending)}")
    if pending and any(b.get("type") != "tool_result" for b in blocks[:len(results)]):
        return f"messages.{i}: tool_result blocks must come first in the user message"
    if results and not pending:
        return f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks: {results}"
    return None


_BLOCK_ROLES = {"text": ("user", "assistant"), "image": ("user", "assistant"), "document": ("user", "assistant"),
                "tool_use": ("assistant",), "tool_result": ("user",), "thinking": ("assistant",),
                "redacted_thinking": ("assistant",)}


def _check_block(where: str, role: str, block: dict[str, Any], redacted: set[str]) -> str | None:
    kind = block.get("type")
    if kind not in _BLOCK_ROLES:
        return f"{where}.type: unknown content block type {kind!r}"
    if role not in _BLOCK_ROLES[kind]:
        return f"{where}: {kind} blocks do not belong in {role} messages"
    source = (block.get("source") or {}).get("type")
    if kind == "image" and source == "base64" and block["source"].get("media_type") not in _IMAGE_TYPES:
        return (f"{where}.source.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or "
                "'image/webp'")
    if kind == "tool_result":
        return _check_result_content(where, block.get("content"), redacted)
    if source == "url" and not str(block["source"].get("url", "")).startswith(("https://", "http://")):
        return f"{where}.source.url: only http and https URLs are supported"
    problems = {
        "text": not isinstance(block.get("text"), str) or not block["text"],
        "image": source not in ("base64", "url"),
        "document": source not in ("base64", "url", "text"),
        "tool_use": not isinstance(block.get("input"), dict),
        "thinking": block.get("signature") != signature_for(block.get("thinking", "")),
        "redacted_thinking": block.get("data") not in redacted,
    }
    if not problems[kind]:
        return None
    return {"text": f"{where}: text content blocks must be non-empty",
            "image": f"{where}.source: unknown image source", "document": f"{where}.source: unknown document source",
            "tool_use": f"{where}: tool_use needs an object input",
            "thinking": f"{where}: Invalid `signature` in `thinking` block",
            "redacted_thinking": f"{where}: Invalid `data` in `redacted_thinking` block"}[kind]


_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_RESULT_BLOCKS = ("text", "image", "document", "search_result")


def _check_result_content(where: str, content: Any, redacted: set[str]) -> str | None:
    """Check a ``tool_result``'s content: absent, a string, or text / image / document / search_result blocks."""
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"{where}.content: Input should be a valid string or a list of content blocks"
    for j, inner in enumerate(content):
        kind = inner.get("type") if isinstance(inner, dict) else None
        if kind not in _RESULT_BLOCKS:
            return (f"{where}.content.{j}.type: Input tag '{kind}' does not match any of the expected tags: "
                    f"{', '.join(repr(k) for k in _RESULT_BLOCKS)}")
        problem = None if kind == "search_result" else _check_block(f"{where}.content.{j}", "user", inner, redacted)
        if problem:
            return problem
    return None


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


class _AnthropicHandler(_Handler):
    fake: FakeAnthropicServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
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
        problem = check_request(dict(body, max_tokens=1), self.fake.redacted)
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
        problem = check_request(body, self.fake.redacted)
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
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("request-id", "req_fake")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, (name, data) in enumerate(events):
            if interrupt is not None and n >= interrupt.after_events:
                if isinstance(interrupt, FakeStreamError):
                    self._event("error", _error_body(interrupt.error_type or "overloaded_error", interrupt.message))
                    self._write_chunk(b"")
                else:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                return
            self._event(name, data)
        self._write_chunk(b"")

    def _event(self, name: str, data: dict[str, Any]) -> None:
        self._write_chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())


FakeAnthropicServer._handler = _AnthropicHandler

