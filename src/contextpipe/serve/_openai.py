"""OpenAI-compatible routes: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``GET /v1/models``.

Any OpenAI client (the ``openai`` SDK, Open WebUI, LibreChat) can talk to a served agent. A request
runs the agent as ``POST /v1/sessions/{id}/runs`` does: in a session of the key's tenant, with the
agent's tools on the server and every step persisted; the answer comes back in OpenAI's shapes,
streamed or not. The answer's text is the text of every assistant message of the run, in order, a
blank line between two (a model may say something before it calls a tool).

Which session a request runs in:

- Chat Completions: the one the ``X-Session-Id`` header names (created if new). Without the header a
  request starts a new session holding the conversation it sends. Either way the response's
  ``X-Session-Id`` header names the session: send it back to go on there. Clients send the whole
  conversation every turn, so in a session that has messages only the ones after the request's
  last non-user message are new.
- Responses: the one of ``previous_response_id`` (which must be the conversation's latest response:
  this server does not branch), ``conversation`` (a session id, created if new) or the header; with
  none, a new one. ``input`` is the turn's new input. The response id names its session and its
  input message, so a retried request (``Idempotency-Key``) is answered from the log, not run again.

Every answer also carries ``contextpipe``: the session id, the run's ``stop_reason`` and any
``pending_approvals`` (decide them with ``POST /v1/sessions/{id}/approvals``).
"""

from __future__ import annotations

import base64
import binascii
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..errors import UsageError
from ..messages import Message, TextPart
from ..session import Session, user_id, validate_session_id
from ._json import HTTPError, clean, dumps, json_response
from ._openai_requests import (
    ChatRequest,
    ResponsesRequest,
    chat_messages,
    response_messages,
    run_settings,
)
from ._requests import NOT_BLANK, idempotent_id, validate
from ._runs import LiveRun, RunManager, result_to_json
from ._users import claim, request_user, visible

if TYPE_CHECKING:
    from .. import Agent, RunResult
    from ..stores import SessionStore

__all__ = ["chat_completions", "get_model", "list_models", "responses"]

SESSION_HEADER = "X-Session-Id"


class _Api(Protocol):
    """What the routes need of the API (`serve._app._Api`)."""

    agent: Agent | None
    store: SessionStore

    def _writable(self) -> RunManager: ...
    def _refuse_when_draining(self, runs: RunManager) -> None: ...
    async def _body(self, request: Request) -> Any: ...
    async def admit(self, request: Request, runs: RunManager, run: LiveRun) -> Response | None: ...
    async def await_result(self, request: Request, runs: RunManager, run: LiveRun) -> RunResult | Response: ...


# --- models -------------------------------------------------------------------------------------------


def model_id(agent: Agent) -> str:
    """Return the id OpenAI clients know the served agent by: its name, else its model's name."""
    return agent.name or agent.model.name


def _model(agent: Agent) -> dict[str, Any]:
    return {"id": model_id(agent), "object": "model", "created": 0, "owned_by": "contextpipe"}


async def list_models(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """``GET /v1/models``: the served agent, as the one model."""
    return json_response({"object": "list", "data": [_model(api.agent)] if api.agent is not None else []})


async def get_model(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """``GET /v1/models/{model}``: the served agent, when it is the one named."""
    if api.agent is None or params[0] != model_id(api.agent):
        raise _no_model(api.agent, params[0])
    return json_response(_model(api.agent))


def _no_model(agent: Agent | None, name: str) -> HTTPError:
    served = f"the agent {model_id(agent)!r}: send model={model_id(agent)!r}" if agent is not None else "no agent"
    return HTTPError(404, "ModelNotFound", f"no model {name!r}: this server serves {served} (GET /v1/models)")


# --- Chat Completions ---------------------------------------------------------------------------------


async def chat_completions(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """``POST /v1/chat/completions``: run on the conversation's new user messages, answer as a chat completion."""
    runs, agent, body = await _start(api, request, ChatRequest)
    named = _header_session(request)
    conversation = chat_messages(body.messages)
    if conversation[-1].role != "user":  # refused before a session is made, or claimed, for it
        raise _nothing_to_run("messages")
    _refuse_blank_input(conversation)
    session = await _session(api, request, tenant, named, _user(request, body.user))
    if named is not None and await _has_messages(api, session):
        conversation = _trailing_user(conversation)
    input = _named(conversation, request, tenant, session.id)
    headers = {SESSION_HEADER: session.id}
    completion = f"chatcmpl-{uuid.uuid4().hex}"
    render = _ChatRender(completion, model_id(agent), include_usage=bool(body.stream_options
                                                                            and body.stream_options.include_usage))
    return await _answer(api, request, runs, session, input, run_settings(body), body.stream, render, headers)


def _nothing_to_run(field: str) -> HTTPError:
    return HTTPError(409, "NothingToRun", f"{field} must end with the user's message (the new input): there is "
                     "nothing to answer after an answer or a system message")


class _ChatRender:
    """Renders a run as a chat completion, or as the chunks of one."""

    def __init__(self, completion: str, model: str, *, include_usage: bool) -> None:
        self.completion, self.model, self.include_usage = completion, model, include_usage
        self.created = int(time.time())

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        return _data({"id": self.completion, "object": "chat.completion.chunk", "created": self.created,
                      "model": self.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                                        "logprobs": None}]})

    def result(self, done: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.completion, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": _text(done), "refusal": None,
                                                     "annotations": []},
                             "finish_reason": _finish(done), "logprobs": None}],
                "usage": _chat_usage(done), "contextpipe": _about(done)}

    def start(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def text(self, delta: str) -> list[str]:
        return [self._chunk({"content": delta})]

    def done(self, done: dict[str, Any]) -> list[str]:
        last = {"id": self.completion, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [{"index": 0, "delta": {}, "finish_reason": _finish(done),
                                                  "logprobs": None}], "contextpipe": _about(done)}
        out = [_data(last)]
        if self.include_usage:
            out.append(_data({"id": self.completion, "object": "chat.completion.chunk", "created": self.created,
                              "model": self.model, "choices": [], "usage": _chat_usage(done)}))
        return [*out, "data: [DONE]\n\n"]

    def error(self, error: dict[str, Any]) -> list[str]:
        return [_data(error)]  # the SDK raises an APIError for a chunk that is an error


def _finish(done: dict[str, Any]) -> str:
    return "length" if done["stop_reason"] == "max_steps" else "stop"


def _chat_usage(done: dict[str, Any]) -> dict[str, Any]:
    usage = done["usage"]
    return {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["input_tokens"] + usage["output_tokens"],
            "prompt_tokens_details": {"cached_tokens": usage["cache_read_tokens"]},
            "completion_tokens_details": {"reasoning_tokens": usage["reasoning_tokens"]}}


# --- Responses ----------------------------------------------------------------------------------------


async def responses(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """``POST /v1/responses``: run on the turn's input, answer as a response (or its events)."""
    runs, agent, body = await _start(api, request, ResponsesRequest)
    header = _header_session(request)
    previous = _decode_response_id(body.previous_response_id) if body.previous_response_id else None
    named = [n for n in (header, body.conversation_id(), previous and previous[0]) if n is not None]
    if len(set(named)) > 1:  # a 409, as the body is well formed: /openapi.json cannot tie a header to it
        raise HTTPError(409, "Conflict", f"the request names two conversations ({named[0]!r} and {named[1]!r}): "
                        f"name it once, with previous_response_id, conversation or the {SESSION_HEADER} header")
    user = _user(request, body.user)
    input = response_messages(body)
    if input[-1].role != "user":  # refused before a session is made, or claimed, for it
        raise _nothing_to_run("input")
    if previous is not None:
        session = await _latest_response(api, request, tenant, body.previous_response_id or "", *previous)
        await claim(api.store, session, user)
    else:
        session = await _session(api, request, tenant, named[0] if named else None, user)
    if body.instructions is not None and body.instructions != await _instructions(api, session):
        input = [Message.system(body.instructions), *input]
    input = _named(input, request, tenant, session.id)
    render = _ResponseRender(_encode_response_id(session.id, input[-1].id), model_id(agent), body)
    return await _answer(api, request, runs, session, input, run_settings(body), body.stream, render,
                         {SESSION_HEADER: session.id})


class _ResponseRender:
    """Renders a run as a response, or as the events of one."""

    def __init__(self, response: str, model: str, body: ResponsesRequest) -> None:
        self.response, self.model = response, model
        self.created = int(time.time())
        self.item = "msg_" + response[5:].replace(".", "_")
        self.previous = body.previous_response_id
        self.instructions = body.instructions
        self.sequence = 0
        self.streamed: list[str] = []

    def _event(self, kind: str, **fields: Any) -> str:
        self.sequence += 1
        return f"event: {kind}\n" + _data({"type": kind, "sequence_number": self.sequence - 1, **fields})

    def _message(self, text: str, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [{"type": "output_text", "text": text, "annotations": [],
                                                       "logprobs": []}]
        return {"type": "message", "id": self.item, "status": status, "role": "assistant", "content": content}

    def result(self, done: dict[str, Any] | None) -> dict[str, Any]:
        status = "in_progress" if done is None else "completed" if done["stop_reason"] == "completed" else "incomplete"
        usage = done["usage"] if done is not None else None
        return {
            "id": self.response, "object": "response", "created_at": self.created, "model": self.model,
            "status": status, "output": [] if done is None else [self._message(_text(done), "completed")],
            "output_text": "" if done is None else _text(done),
            "previous_response_id": self.previous, "instructions": self.instructions, "error": None,
            "incomplete_details": {"reason": None} if status == "incomplete" else None,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "metadata": {},
            "usage": None if usage is None else {
                "input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
                "total_tokens": usage["input_tokens"] + usage["output_tokens"],
                "input_tokens_details": {"cached_tokens": usage["cache_read_tokens"],
                                         "cache_write_tokens": usage["cache_write_tokens"]},
                "output_tokens_details": {"reasoning_tokens": usage["reasoning_tokens"]}},
            **({} if done is None else {"contextpipe": _about(done)}),
        }

    def start(self) -> list[str]:
        return [self._event("response.created", response=self.result(None)),
                self._event("response.in_progress", response=self.result(None)),
                self._event("response.output_item.added", output_index=0, item=self._message("", "in_progress")),
                self._event("response.content_part.added", item_id=self.item, output_index=0, content_index=0,
                            part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

    def text(self, delta: str) -> list[str]:
        self.streamed.append(delta)
        return [self._event("response.output_text.delta", item_id=self.item, output_index=0, content_index=0,
                            delta=delta, logprobs=[])]

    def done(self, done: dict[str, Any]) -> list[str]:
        text = "".join(self.streamed)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        response = self.result(done)
        response["output"] = [self._message(text, "completed")]
        response["output_text"] = text
        return [self._event("response.output_text.done", item_id=self.item, output_index=0, content_index=0,
                            text=text, logprobs=[]),
                self._event("response.content_part.done", item_id=self.item, output_index=0, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=0, item=self._message(text, "completed")),
                self._event("response.completed" if done["stop_reason"] == "completed" else "response.incomplete",
                            response=response)]

    def error(self, error: dict[str, Any]) -> list[str]:
        detail = error["error"]
        return [self._event("error", code=detail["type"], message=detail["message"], param=None)]


def _encode_response_id(session_id: str, message_id: str) -> str:
    def b64(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()

    return f"resp_{b64(session_id)}.{b64(message_id)}"


def _decode_response_id(response_id: str) -> tuple[str, str]:
    """Return the session id and input message id a response id of this server names (404 if it names none)."""
    try:
        session_id, message_id = (base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)).decode()
                                  for p in response_id[5:].split("."))
        validate_session_id(session_id)
    except (ValueError, binascii.Error, UnicodeDecodeError, UsageError):  # UsageError: no session id
        raise HTTPError(404, "NotFound", f"no response {response_id!r}: send previous_response_id as a response "
                        "of this server gave it") from None
    return session_id, message_id


async def _latest_response(api: _Api, request: Request, tenant: str, response_id: str, session_id: str,
                           message_id: str) -> Session:
    """Return the session of `response_id`, if its input is the latest user message there (404 / 409 if not).

    A retry (the request's ``Idempotency-Key`` names the latest user message) passes too: its first
    attempt ran, so the response it continues from is no longer the latest, and the retry is then
    answered from the log.
    """
    session = await api.store.get_session(tenant, session_id)
    if session is None or not visible(request.state.grant, session):
        raise HTTPError(404, "NotFound", f"no response {response_id!r}: its conversation was deleted, or expired")
    latest = await _last(api.store, tenant, session_id, "user")
    key = request.headers.get("idempotency-key")
    retried = key is not None and latest is not None and latest.id == idempotent_id(key, tenant, session_id)
    if latest is None or (latest.id != message_id and not retried):  # a retry: its own input is the latest now
        raise HTTPError(409, "NotLatest", f"response {response_id!r} is not the latest of its conversation, and this "
                        "server does not branch conversations: continue from the latest response, or send "
                        f"conversation={session_id!r} to continue there")
    return session


async def _instructions(api: _Api, session: Session) -> str | None:
    """Return the text of the session's latest system message (None: it has none)."""
    latest = await _last(api.store, session.tenant, session.id, "system")
    return None if latest is None else latest.text


async def _last(store: SessionStore, tenant: str, session_id: str, role: str) -> Message | None:
    """Return the session's latest message of `role` (None: it has none), reading its log back page by page."""
    before: int | None = None
    while True:
        page = await store.load(tenant, session_id, limit=200, before=before)
        for m in reversed(page.messages):
            if m.role == role:
                return m
        if not page.has_more:
            return None
        before = page.first_seq


# --- shared -------------------------------------------------------------------------------------------


async def _start(api: _Api, request: Request, model: type[Any]) -> tuple[RunManager, Agent, Any]:
    runs = api._writable()
    body = validate(model, await api._body(request))
    api._refuse_when_draining(runs)
    agent = api.agent
    assert agent is not None
    if body.model != model_id(agent):
        raise _no_model(agent, body.model)
    key = request.headers.get("idempotency-key")
    if key is not None:
        idempotent_id(key, "", "")  # a key that is not one is a 400 before a session is made for the request
    return runs, agent, body


def _user(request: Request, named: str | None) -> str | None:
    """Return the user a request is for: its key's; or, for a key granted ``users=any``, the ``user`` it names.

    OpenAI's ``user`` is an end-user hint that clients send on their own (LibreChat sends its user
    id on every request): for a key that may not name users the key decides, and the field changes nothing.
    """
    grant = request.state.grant
    return request_user(grant, named if grant.names_users else None, "user")


def _header_session(request: Request) -> str | None:
    named = request.headers.get(SESSION_HEADER)
    if named is not None:
        try:
            validate_session_id(named)
        except ValueError as exc:
            raise HTTPError(400, "BadRequest", f"the {SESSION_HEADER} header: {exc}") from None
    return named


async def _session(api: _Api, request: Request, tenant: str, named: str | None, user: str | None) -> Session:
    """Return the session `named` (created if new; None: a new one), given to `user` if it has no user yet.

    A key bound to a user reaches its user's sessions only: any other is answered 404, as on every route.
    """
    assert api.agent is not None
    if named is None:
        session = await api.agent.create_session(tenant=tenant)
    else:
        session = await api.store.get_session(tenant, named) or await api.agent.session(named, tenant=tenant)
        if not visible(request.state.grant, session) and (user_id(session) is not None
                                                          or await _has_messages(api, session)):
            raise HTTPError(404, "NotFound", f"no session {named!r}")  # another user's, or of no user
    await claim(api.store, session, user)
    return session


async def _has_messages(api: _Api, session: Session) -> bool:
    return bool((await api.store.load(session.tenant, session.id, limit=1)).messages)


def _trailing_user(messages: Sequence[Message]) -> list[Message]:
    """Return the user messages after the last message that is not the user's (the turn's new input)."""
    at = len(messages)
    while at > 0 and messages[at - 1].role == "user":
        at -= 1
    return list(messages[at:])


def _refuse_blank_input(conversation: list[Message]) -> None:
    """Refuse a blank message among the conversation's new user messages: there is nothing to answer.

    A blank user message before an answer is kept as sent: clients resend the whole conversation every
    turn, and a conversation that was answered once is answered again.
    """
    new = _trailing_user(conversation)
    for at, message in enumerate(new, len(conversation) - len(new)):
        if all(isinstance(p, TextPart) for p in message.parts) and not re.search(NOT_BLANK, message.text):
            raise HTTPError(409, "NothingToRun", f"messages[{at}].content is blank, and it is one of the turn's new "
                            "user messages (those after the last non-user message): send the user's text, or an "
                            "image, to answer")


def _named(input: list[Message], request: Request, tenant: str, session_id: str) -> list[Message]:
    """Give the last input message the id an ``Idempotency-Key`` header names, so a retry is not run twice."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return input
    last = input[-1]
    return [*input[:-1], Message(last.role, last.parts, idempotent_id(key, tenant, session_id), last.author_name,
                                 last.created_at, last.metadata)]


class _Render(Protocol):
    def result(self, done: dict[str, Any]) -> dict[str, Any]: ...
    def start(self) -> list[str]: ...
    def text(self, delta: str) -> list[str]: ...
    def done(self, done: dict[str, Any]) -> list[str]: ...
    def error(self, error: dict[str, Any]) -> list[str]: ...


async def _answer(api: _Api, request: Request, runs: RunManager, session: Session, input: list[Message],
                  settings: Any, stream: bool, render: _Render, headers: dict[str, str]) -> Response:
    if not stream:
        result = await api.await_result(request, runs, runs.start(session, input, lease_wait=0.0, stream=False,
                                                                  settings=settings))
        if isinstance(result, Response):
            result.headers.update(headers)
            return result
        return json_response(render.result(clean(result_to_json(result), items=("input", "messages"))),
                             headers=headers)
    run = runs.start(session, input, lease_wait=0.0, stream=True, settings=settings)
    refused = await api.admit(request, runs, run)  # a busy session is a 409, before the status line goes out
    if refused is not None:
        refused.headers.update(headers)
        return refused
    return StreamingResponse(_events(runs, run, render), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", **headers})


async def _events(runs: RunManager, run: LiveRun, render: _Render) -> AsyncIterator[str]:
    """Translate the run's events: its text as it comes (a blank line between two steps' texts), then the end."""
    finished = False
    try:
        for chunk in render.start():
            yield chunk
        sent, step_ended = False, False
        async for batch in run.batches():
            out: list[str] = []
            for name, payload in batch:
                if name == "text_delta" and payload["text"]:
                    if sent and step_ended:
                        out += render.text("\n\n")
                    out += render.text(payload["text"])
                    sent, step_ended = True, False
                elif name == "step_persisted":
                    step_ended = True
                elif name == "done":
                    text = _text(payload)
                    if not sent and text:  # a retry answered from the log streamed nothing
                        out += render.text(text)
                    out += render.done(payload)
                elif name == "error":
                    out += render.error(payload)
            yield "".join(out) if out else ": keep-alive\n\n"
        finished = True
    finally:
        if not finished:
            runs.detach(run)


def _text(done: dict[str, Any]) -> str:
    """Return the answer of a run's result (`result_to_json`): the text of its assistant messages."""
    texts = ["".join(p["text"] for p in m["parts"] if p.get("kind") == "text")
             for m in done["messages"] if m["role"] == "assistant"]
    return "\n\n".join(t for t in texts if t)


def _about(done: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": done["session_id"], "stop_reason": done["stop_reason"],
            "pending_approvals": done["pending_approvals"]}


def _data(payload: dict[str, Any]) -> str:
    return f"data: {dumps(payload)}\n\n"

