"""`FakeOpenAIServer`: a small OpenAI-compatible HTTP server on 127.0.0.1 for tests and demos.

It serves ``POST /v1/chat/completions`` (plain JSON and SSE streaming, with tool calls and usage) and
``POST /v1/responses`` (the Responses API: reasoning items with encrypted content, function calls,
the streaming event sequence, stored responses for ``previous_response_id``) from a script of
replies, and ``POST /v1/embeddings`` (deterministic word-hashing vectors), and records every request
body. Requests are checked the way the APIs check them, with a 400 answer like theirs: on chat
completions, each role's content part types (a ``tool`` message takes text only), image URLs and
audio formats, and every ``tool_calls`` answered at once by ``tool`` messages; on
Responses, reasoning items must come back with the encrypted content the server issued and with
the item that followed them, tool outputs must answer a call and hold only ``input_text`` /
``input_image`` / ``input_file`` items, ``previous_response_id`` must name a stored response.
The checks live in `contextpipe.testing.wire`. Script steps can also be HTTP errors, malformed
bodies and streams cut mid-way, to test how clients fail.

>>> with FakeOpenAIServer() as server:
...     server.enqueue(FakeReply("Hello!"))
...     server.base_url.startswith("http://127.0.0.1:")
True

On its own, for ``contextpipe chat`` or any OpenAI client: ``python -m contextpipe.testing.fake_openai
[--port N] [--reply TEXT]...`` prints its ``base_url`` and the lines to use it, and serves until
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from ._http import FakeHandler, FakeHTTPServer
from .wire import chat_request_problem, responses_request_items

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


class FakeOpenAIServer(FakeHTTPServer):
    """An OpenAI-compatible chat completions server in a background thread.

    Use as a context manager (or call `start` / `stop`). It listens on `host`:`port` (default: a free
    port of 127.0.0.1; a port in use is a `UsageError`). `base_url` is what to give an OpenAI client;
    `requests` holds the JSON bodies received. When the script is empty the `default_reply` (a plain
    text ``"ok"``) is served, unless `strict` is set, in which case the call fails with HTTP 500.
    """

    _idle_reply: ClassVar[Any] = FakeReply("ok")
    _exhausted: ClassVar[Any] = FakeError(500, "the fake server's script is empty")

    def __init__(self, *, model: str = "fake-model", strict: bool = False, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        super().__init__(model=model, strict=strict, host=host, port=port)
        self.stored: dict[str, list[dict[str, Any]]] = {}
        """Responses API: the full item list (input and output) of each stored response, by id."""
        self.issued_reasoning: dict[str, str] = {}
        """Responses API: encrypted content issued for each reasoning item id."""

    def _stored_items(self, response_id: str) -> list[dict[str, Any]] | None:
        with self._lock:
            return self.stored.get(response_id)

    def _issued(self, item_id: str) -> str | None:
        with self._lock:
            return self.issued_reasoning.get(item_id)


class _OpenAIHandler(FakeHandler):
    fake: FakeOpenAIServer

    def do_POST(self) -> None:
        path = self.path.rstrip("/")
        try:
            body = self._read_json()
        except ValueError:
            self._json(400, {"error": {"message": "request body is not JSON", "type": "invalid_request_error"}})
            return
        if path.endswith("/embeddings"):
            self._embeddings(body)
        elif path.endswith("/responses"):
            self._responses(body)
        elif path.endswith("/chat/completions"):
            self._chat(body)
        else:
            self._json(404, {"error": {"message": f"unknown path {self.path}", "type": "not_found"}})

    def _error(self, step: FakeError) -> None:
        error: dict[str, Any] = {"message": step.message, "type": "fake_error", "code": step.code}
        self._json(step.status, {"error": error}, step.headers)

    def _bad_step(self, step: Any) -> None:
        self._json(500, {"error": {"message": f"bad script step {step!r}", "type": "fake_error"}})

    # --- chat completions ----------------------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> None:
        step = self.fake._next(body, dict(self.headers.items()))
        problem = chat_request_problem(body) if isinstance(step, FakeReply | FakeStreamCut) else None
        if problem:
            self._json(400, {"error": {"message": problem, "type": "invalid_request_error", "param": "messages",
                                       "code": None}})
        elif isinstance(step, FakeError):
            self._error(step)
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
            self._bad_step(step)

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

    def _stream(self, body: dict[str, Any], reply: FakeReply, cut_after: int | None) -> None:
        self._start_stream({"Content-Type": "text/event-stream"})
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
                self._drop()  # no terminating chunk, no [DONE]
                return
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    # --- Responses API -------------------------------------------------------------------------------

    def _responses(self, body: dict[str, Any]) -> None:
        fake = self.fake
        step = fake._next(body, dict(self.headers.items()))
        if isinstance(step, FakeError):
            self._error(step)
            return
        if isinstance(step, FakeRaw):
            self._send(step.status, step.body, step.content_type)
            return
        items, problem = responses_request_items(body, stored=fake._stored_items, issued=fake._issued)
        if problem:
            self._json(400, {"error": {"message": problem, "type": "invalid_request_error", "code": None}})
            return
        reply = step.reply if isinstance(step, FakeStreamCut | FakeStreamError) else step
        if not isinstance(reply, FakeReply):
            self._bad_step(step)
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
        self._start_stream({"Content-Type": "text/event-stream"})
        for n, event in enumerate(events):
            event["sequence_number"] = n
            if cut_after is not None and n >= cut_after:
                self._drop()
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


FakeOpenAIServer._handler = _OpenAIHandler

if __name__ == "__main__":  # python -m contextpipe.testing.fake_openai --help
    import sys

    from ._standalone import Vendor, serve

    raise SystemExit(serve(Vendor("OpenAI", "contextpipe.testing.fake_openai", FakeOpenAIServer, FakeReply, "OPENAI",
                                  "fake-model", "contextpipe chat"), sys.argv[1:]))
