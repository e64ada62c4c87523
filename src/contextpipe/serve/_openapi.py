"""The OpenAPI 3.1 description of the ``/v1`` API, served at ``/openapi.json`` (and shown at ``/docs``).

Request bodies are described by the very models the server validates them with (`request_schemas`,
`agui_schemas`), and parameters by the rules it checks, so the document is what the server accepts;
schemathesis holds the server to it in the test suite (``tests/serve/test_fuzz.py``).
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..errors import UsageError
from ._openai_requests import openai_request_schemas
from ._requests import CURSOR, IDEMPOTENCY_KEY, RULES, SESSION_ID, request_schemas

__all__ = ["openapi_schema"]

_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": SESSION_ID},
       "description": f"Session id ({RULES[SESSION_ID]}), percent-encoded (a `/` in the id is sent as `%2F`)."}
_RETRY = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "string"}}}
_ERRORS = {
    400: "A client mistake: the body is not strict JSON (`InvalidJSON`), holds a lone surrogate (`InvalidText`), "
         "or does not fit this route (`BadRequest`); the message names the field and what to send.",
    401: "No API key, or an unknown one.",
    403: "The API key may not name this user (`Forbidden`): only a key granted `users=any` names users, and a key "
         "bound to a user acts for that user only.",
    404: "No such session for this tenant (or, for a key bound to a user, for its user).",
    409: "The session is busy (`SessionBusy`, see `Retry-After`), the input's message id is taken by other "
         "content (`InputConflict`), there is nothing to run (`NothingToRun`: no input, and no messages to "
         "resume from; on the OpenAI routes, input that does not end with the user's message; on Chat "
         "Completions, a blank new user message), an `Idempotency-Key` came with a resume, which it cannot make "
         "safe to retry (`NotIdempotent`), a decision on a tool call cannot apply (`ApprovalError`: the call "
         "is not awaiting approval, it was answered already, or the digest is of other arguments; or input came "
         "while calls await a decision), the session belongs to another user than the one named "
         "(`UserMismatch`), a create names a session that is not this key's user's (`Conflict`), or a cancel request "
         "stopped the run (`Cancelled`, with `reason` `request`), or a rewind or fork names a sequence the log cannot "
         "take: past its end, or rewound already (`BadSequence`).",
    410: "The session was deleted, or expired, while the run ran or waited for it.",
    413: "The request body is too large.",
    502: "The model failed.",
    503: "The server is shutting down, or the store failed; see `Retry-After`.",
}


def _int(name: str, description: str, low: int, high: int) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": {"type": "integer", "minimum": low, "maximum": high}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(name)}}


def _responses(ok: dict[str, Any], *codes: int) -> dict[str, Any]:
    out = dict(ok)
    for code in sorted({*codes, 401, 503}):
        out[str(code)] = {"description": _ERRORS[code], "content": _json("Error")}
        if code in (409, 503):
            out[str(code)]["headers"] = _RETRY
    out["401"]["headers"] = {"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}}
    return out


_RUN_EVENTS = ("text_delta", "reasoning_delta", "tool_call_started", "tool_call_finished", "step_persisted",
               "message_delivered", "approval_required", "done", "error")


def _event(names: tuple[str, ...]) -> dict[str, Any]:
    """Describe one server-sent event: its name and its JSON text."""
    return {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"type": "string", "enum": list(names)},
        "data": {"type": "string", "contentMediaType": "application/json"}}}


def _links(*operations: str) -> dict[str, Any]:
    return {op[0].upper() + op[1:]: {"operationId": op, "parameters": {"session_id": "$response.body#/id"}}
            for op in operations}


def _paths() -> dict[str, Any]:
    session_links = _links("getSession", "listMessages", "listTraces", "listFacts", "listApprovals",
                           "decideApprovals", "run", "cancelRun", "exportSession", "listQueue", "rewindSession",
                           "forkSession", "deleteSession")
    run_responses = _responses({"200": {
        "description": "The result, or the event stream.",
        "content": {**_json("RunResult"), "text/event-stream": {"schema": _event(_RUN_EVENTS)}}}},
        400, 403, 404, 409, 410, 413, 502)
    return {
        "/v1/info": {"get": {
            "summary": "Who am I: tenant, agent, store", "operationId": "info",
            "responses": _responses({"200": {"description": "About this server and the caller's tenant.",
                                             "content": _json("Info")}})}},
        "/v1/sessions": {
            "get": {"summary": "List sessions, most recently updated first", "operationId": "listSessions",
                    "parameters": [_int("limit", "Sessions per page (default 50).", 1, 500),
                                   {"name": "cursor", "in": "query", "required": False,
                                    "schema": {"type": "string", "pattern": CURSOR},
                                    "description": "`next_cursor` of the previous page (URL-encoded)."},
                                   {"name": "q", "in": "query", "required": False, "schema": {"type": "string"},
                                    "description": "Only sessions whose id contains this text (any case)."}],
                    "responses": _responses({"200": {"description": "A page of sessions.",
                                                     "content": _json("SessionList")}}, 400)},
            "post": {"summary": "Create a session (or return it when `id` exists)", "operationId": "createSession",
                     "requestBody": {"required": False, "content": _json("CreateSession")},
                     "responses": _responses({
                         "201": {"description": "Created.", "content": _json("Session"), "links": session_links},
                         "200": {"description": "Already existed.", "content": _json("Session"),
                                 "links": session_links}}, 400, 403, 404, 409, 413)},
        },
        "/v1/sessions/{session_id}": {
            "parameters": [_ID],
            "get": {"summary": "A session: version, state, latest summary checkpoint", "operationId": "getSession",
                    "responses": _responses({"200": {"description": "The session.", "content": _json("Session")}},
                                            400, 404)},
            "delete": {"summary": "Delete a session and everything stored for it", "operationId": "deleteSession",
                       "responses": _responses({"204": {"description": "Deleted."}}, 400, 404)},
        },
        "/v1/sessions/{session_id}/messages": {
            "parameters": [_ID],
            "get": {"summary": "A page of the session's messages, oldest first", "operationId": "listMessages",
                    "parameters": [_int("limit", "Messages per page (default 100): the newest ones, or with "
                                        "`after` the oldest ones above it.", 1, 1000),
                                   _int("before", "Only messages with a sequence below this (`next_before`).",
                                        0, 2**62),
                                   _int("after", "Only messages with a sequence above this, paging forward "
                                        "(`next_after`: to follow a session).", -1, 2**62),
                                   {"name": "view", "in": "query", "required": False,
                                    "schema": {"type": "boolean", "default": False},
                                    "description": "Only the session's view: no rewound messages, no rewind markers "
                                                   "(a page may then hold fewer than `limit`)."}],
                    "responses": _responses({"200": {"description": "A page.", "content": _json("MessagePage")}},
                                            400, 404)},
        },
        "/v1/sessions/{session_id}/traces": {
            "parameters": [_ID],
            "get": {"summary": "Stored prompt traces: tokens by source per model call", "operationId": "listTraces",
                    "parameters": [_int("limit", "Only the newest N.", 1, 10_000)],
                    "responses": _responses({"200": {"description": "Traces, oldest first (PromptTrace.to_dict).",
                                                     "content": _json("TraceList")}}, 400, 404)},
        },
        "/v1/sessions/{session_id}/facts": {
            "parameters": [_ID],
            "get": {"summary": "The history of every fact FactMemory keeps about the session's user",
                    "operationId": "listFacts",
                    "responses": _responses({"200": {"description": "Per FactMemory of the agent: each fact's "
                                                     "versions, oldest first, with valid_from / valid_to and source "
                                                     "message ids.", "content": _json("FactList")}}, 400, 404)},
        },
        "/v1/sessions/{session_id}/runs": {
            "parameters": [_ID],
            "post": {
                "summary": "Run the agent on the session",
                "description": "Returns the result; with `\"stream\": true` or `Accept: text/event-stream`, streams "
                               "server-sent events instead: `text_delta`, `reasoning_delta`, `tool_call_started`, "
                               "`tool_call_finished`, `step_persisted`, `message_delivered` (a queued message "
                               "joined the run), `approval_required` (the calls awaiting a "
                               "decision, when the run stops for them), then `done` (the result) or `error`. "
                               "A request whose input message id was answered in the session before (a retry) "
                               "gets that answer back, marked `replayed`, without running again.",
                "operationId": "run", "requestBody": {"required": True, "content": _json("RunRequest")},
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY},
                                "description": "Names the run's input (its last message) in this session: a retry "
                                               "with the same key and input returns the first result."}],
                "responses": {**run_responses, "202": {
                    "description": "With `queue`, the session was busy: the input is queued (the queued message).",
                    "content": _json("QueuedMessage")}}},
        },
        **_conversation_paths(),
        "/v1/sessions/{session_id}/approvals": {
            "parameters": [_ID],
            "get": {"summary": "The tool calls awaiting a person's decision at the end of the session's log",
                    "operationId": "listApprovals",
                    "responses": _responses({"200": {"description": "The calls awaiting approval (none: an empty "
                                                     "list).", "content": _json("ApprovalList")}}, 400, 404)},
            "post": {
                "summary": "Decide tool calls awaiting approval and resume the run",
                "description": "Approved calls run, rejected ones are answered with the reason, then the model is "
                               "called: the run goes on as `POST .../runs` with `\"input\": null` would, with the "
                               "same result or event stream. A decision that cannot apply is a 409 "
                               "`ApprovalError`, and nothing runs.",
                "operationId": "decideApprovals", "requestBody": {"required": True, "content": _json(
                    "ApprovalsRequest")},
                "responses": run_responses},
        },
        **_session_tool_paths(),
        **_openai_paths(),
        "/v1/ag-ui": {
            "post": {"summary": "Run through the AG-UI protocol (threadId is the session id)", "operationId": "agui",
                     "description": "The request's `tools` are front-end tools: a run that calls them streams the "
                                    "calls and finishes (`pendingToolCallIds`); the next request's `tool` messages "
                                    "carry their results, and the run continues.",
                     "requestBody": {"required": True, "content": _json("AgUiRunAgentInput")},
                     "responses": _responses({"200": {"description": "AG-UI events.", "content": {
                         "text/event-stream": {"schema": _event(("message",))}}}}, 400, 404, 409, 410, 413)},
        },
    }


def _conversation_paths() -> dict[str, Any]:
    """Describe ``.../queue``, ``.../rewind`` and ``.../fork`` (`serve._conversation`)."""
    def post(summary: str, operation: str, body: str, ok: dict[str, Any]) -> dict[str, Any]:
        return {"parameters": [_ID], "post": {"summary": summary, "operationId": operation,
                                             "requestBody": {"required": True, "content": _json(body)},
                                             "responses": _responses(ok, 400, 403, 404, 409, 410, 413)}}

    return {
        "/v1/sessions/{session_id}/queue": {
            "parameters": [_ID],
            "get": {"summary": "The messages queued for the session and not delivered yet, oldest first",
                    "operationId": "listQueue",
                    "responses": _responses({"200": {"description": "The queued messages (none: an empty list).",
                                                     "content": _json("QueueList")}}, 400, 404)}},
        "/v1/sessions/{session_id}/rewind": post(
            "Leave the view's messages after a sequence out (they stay stored, marked rewound)", "rewindSession",
            "RewindRequest", {"200": {"description": "Rewound: `to` is the point kept (moved back to before a tool "
                                      "exchange it fell in).", "content": _json("Rewound")}}),
        "/v1/sessions/{session_id}/fork": post(
            "Start a new session with this one's view up to a sequence", "forkSession", "ForkRequest",
            {"201": {"description": "The new session.", "content": _json("Session")}}),
    }


def _session_tool_paths() -> dict[str, Any]:
    """Describe ``.../cancel`` and ``.../export`` (`serve._session_tools`)."""
    cancel = _responses({"202": {"description": "The run in flight on the session in this server process was "
                                 "cancelled: it stops at its next safe point, and its stream ends with an `error` "
                                 "event of type `Cancelled` (`reason` `request`).", "content": _json("Cancelled")}},
                        400, 404, 409)
    cancel["404"]["description"] = ("No such session (`NotFound`), or nothing runs on it (`NoRunInFlight`): no run "
                                    "in this server process, and its lease is free.")
    cancel["409"]["description"] = ("A run holds the session, but not in this server process (`RunElsewhere`): "
                                    "with several workers a cancel stops only the runs of the worker that answers.")
    disposition = {"Content-Disposition": {"required": True, "schema": {"type": "string"},
                                           "description": "`attachment; filename=\"ID.json\"` (or `ID.md`)."}}
    export = _responses({"200": {"description": "The whole session.", "headers": disposition, "content": {
        **_json("SessionExport"), "text/markdown": {"schema": {"type": "string"}}}}}, 400, 404)
    return {
        "/v1/sessions/{session_id}/cancel": {
            "parameters": [_ID],
            "post": {"summary": "Cancel the run in flight on the session (in this server process)",
                     "description": "Stops the run as a disconnect does with `on_disconnect=cancel`: what it stored "
                                    "stays, and a tool call it stopped is answered with an error. A run is a task of "
                                    "the process that started it: with `serve --workers N`, only the worker "
                                    "running it can cancel it (another answers 409 `RunElsewhere`).",
                     "operationId": "cancelRun", "responses": cancel}},
        "/v1/sessions/{session_id}/export": {
            "parameters": [_ID],
            "get": {"summary": "The whole session: as JSON (session, messages, traces) or a Markdown transcript",
                    "operationId": "exportSession",
                    "parameters": [{"name": "format", "in": "query", "required": False,
                                    "schema": {"type": "string", "enum": ["json", "markdown"], "default": "json"},
                                    "description": "`json` (the default) or `markdown`."}],
                    "responses": export}},
    }


def _openai_paths() -> dict[str, Any]:
    """Describe the OpenAI-compatible routes (`serve._openai`): the SDK's own shapes, plus a ``contextpipe`` object."""
    session = {"name": "X-Session-Id", "in": "header", "required": False,
               "schema": {"type": "string", "pattern": SESSION_ID},
               "description": "The session to run in (created if new); without it, a new session (Responses: "
                              "unless previous_response_id or conversation names one)."}
    key = {"name": "Idempotency-Key", "in": "header", "required": False,
           "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY},
           "description": "Names the turn's input message: a retry with the same key is answered from the log."}
    named = {"X-Session-Id": {"description": "The session the run ran in.", "schema": {"type": "string"}}}

    def route(summary: str, operation: str, body: str, result: str, events: str) -> dict[str, Any]:
        stream = {"type": "object", "required": ["data"], "description": events, "properties": {
            "event": {"type": "string"}, "data": {"type": "string"}}}
        ok = {"200": {"description": "The answer, or its event stream (`\"stream\": true`).", "headers": named,
                      "content": {**_json(result), "text/event-stream": {"schema": stream}}}}
        return {"post": {"summary": summary, "operationId": operation, "parameters": [session, key],
                         "requestBody": {"required": True, "content": _json(body)},
                         "responses": _responses(ok, 400, 403, 404, 409, 410, 413, 502)}}

    return {
        "/v1/chat/completions": route("OpenAI Chat Completions: run on the conversation's new user messages",
                                      "openaiChatCompletions", "OpenAIChatRequest", "OpenAIChatCompletion",
                                      "`data:` lines of chat.completion.chunk objects, then `data: [DONE]`."),
        "/v1/responses": route("OpenAI Responses: run on the turn's input", "openaiResponses",
                               "OpenAIResponsesRequest", "OpenAIResponse",
                               "Responses events: response.created ... response.output_text.delta ... "
                               "response.completed (or response.incomplete, or error)."),
        "/v1/models": {"get": {"summary": "OpenAI models: the served agent", "operationId": "openaiModels",
                               "responses": _responses({"200": {"description": "The served agent, as a model.",
                                                                "content": _json("OpenAIModelList")}})}},
        "/v1/models/{model}": {"get": {
            "summary": "OpenAI model: the served agent, by its id", "operationId": "openaiModel",
            "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": _responses({"200": {"description": "The served agent.", "content": _json("OpenAIModel")}},
                                    404)}},
    }


def _openai_schemas() -> dict[str, Any]:
    text, integer, about = {"type": "string"}, {"type": "integer"}, {"type": "object", "required": [
        "session_id", "stop_reason", "pending_approvals"], "properties": {
        "session_id": {"type": ["string", "null"]}, "stop_reason": {"type": "string"},
        "pending_approvals": {"type": "array", "items": _ref("PendingApproval")}}}
    model = {"type": "object", "required": ["id", "object", "created", "owned_by"], "properties": {
        "id": text, "object": {"const": "model"}, "created": integer, "owned_by": text}}
    choice = {"type": "object", "required": ["index", "message", "finish_reason"], "properties": {
        "index": integer, "finish_reason": text, "message": {"type": "object", "required": ["role", "content"],
                                                             "properties": {"role": {"const": "assistant"},
                                                                            "content": text}}}}
    return {
        "OpenAIModel": model,
        "OpenAIModelList": {"type": "object", "required": ["object", "data"], "properties": {
            "object": {"const": "list"}, "data": {"type": "array", "items": model}}},
        "OpenAIChatCompletion": {"type": "object", "required": ["id", "object", "created", "model", "choices",
                                                                "usage", "contextpipe"], "properties": {
            "id": text, "object": {"const": "chat.completion"}, "created": integer, "model": text,
            "choices": {"type": "array", "items": choice}, "usage": {"type": "object"}, "contextpipe": about,
            "repaired": _ref("Repaired")}},
        "OpenAIResponse": {"type": "object", "required": ["id", "object", "created_at", "model", "status", "output",
                                                          "usage", "contextpipe"], "properties": {
            "id": text, "object": {"const": "response"}, "created_at": integer, "model": text,
            "status": {"enum": ["completed", "incomplete"]}, "output": {"type": "array", "items": {"type": "object"}},
            "output_text": text, "usage": {"type": "object"}, "contextpipe": about, "repaired": _ref("Repaired")}},
    }


def _message(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Describe a message as the server returns it (`contextpipe.codec.message_to_dict`, plus `extra`)."""
    number = {"type": ["number", "null"]}  # null only where a stored NaN was repaired
    properties: dict[str, Any] = {
        "v": {"type": "integer"}, "id": {"type": "string"},
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "parts": {"type": "array", "items": _ref("Part")}, "created_at": number,
        "author_name": {"type": "string"}, "metadata": {"type": "object"},
        "source": {"type": "object", "required": ["kind"], "properties": {
            "kind": {"type": "string"}, "source_id": {"type": ["string", "null"]}}},
        "repaired": _ref("Repaired"), **(extra or {})}
    return {"type": "object", "required": ["v", "id", "role", "parts", "created_at", *(extra or {})],
            "properties": properties}


def _logged() -> dict[str, Any]:
    """Describe a message of ``.../messages``: with its sequence, and marked when a rewind left it out."""
    schema = _message({"seq": {"type": "integer"}})
    schema["properties"] |= {
        "rewound": {"const": True, "description": "Present on a message a rewind left out of the view (and on "
                                                  "the rewind marker itself)."},
        "rewind_to": {"type": "integer", "description": "Present on a rewind marker: the last sequence it kept."}}
    return schema


def _queue_schemas() -> dict[str, Any]:
    queued = {"type": "object", "required": ["id", "when", "text", "created_at", "message"], "properties": {
        "id": {"type": "string", "description": "The message's id, which it keeps in the log once delivered."},
        "when": {"enum": ["asap", "next"]}, "text": {"type": "string"},
        "created_at": {"type": ["number", "null"], "description": "When the message was written: the server's "
                       "clock when it was queued, unless the client sent `created_at`."},
        "message": _ref("Message"), "session_id": {"type": "string"}, "repaired": _ref("Repaired")}}
    return {
        "QueuedMessage": queued,
        "QueueList": {"type": "object", "required": ["queued"], "properties": {
            "queued": {"type": "array", "items": queued}, "repaired": _ref("Repaired")}},
        "Rewound": {"type": "object", "required": ["session_id", "to"], "properties": {
            "session_id": {"type": "string"}, "to": {"type": "integer"}}},
    }


def _fact() -> dict[str, Any]:
    """Describe a version of a fact as the server returns it (`contextpipe.providers.Fact.to_dict`)."""
    number, text, ids = {"type": ["number", "null"]}, {"type": ["string", "null"]}, {"type": "array", "items": {
        "type": "string"}}
    return {"type": "object", "required": ["id", "text", "lineage", "valid_from", "valid_to", "sources", "ended_by",
                                           "session_id", "replaces", "replaced_by"],
            "properties": {"id": {"type": "string"}, "text": {"type": "string"}, "lineage": {"type": "string"},
                           "valid_from": number, "valid_to": number, "sources": ids, "ended_by": ids,
                           "session_id": text, "replaces": text, "replaced_by": text}}


def _response_schemas() -> dict[str, Any]:
    number, text = {"type": ["number", "null"]}, {"type": "string"}
    listed = {"type": "object", "required": ["id", "version", "message_count", "created_at", "updated_at"],
              "properties": {"id": text, "version": {"type": "integer"}, "message_count": {"type": "integer"},
                             "created_at": number, "updated_at": number, "repaired": _ref("Repaired")}}
    checkpoint = {"type": "object", "required": ["seq", "summary", "created_at"], "properties": {
        "seq": {"type": "integer"}, "summary": _ref("Message"), "created_at": number}}
    agent = {"type": "object", "properties": {
        "name": {"type": ["string", "null"]}, "model": text, "tools": {"type": "array", "items": text},
        "providers": {"type": "array", "items": {"type": "object"}}, "store_traces": {"type": "boolean"},
        "tool_definitions": {"type": "array", "description": "What the model is told of each of the agent's own "
                             "tools: name, description, JSON schema of its parameters.", "items": {
                                 "type": "object", "required": ["name", "description", "parameters"],
                                 "properties": {"name": text, "description": text, "parameters": {"type": "object"}}}}}}
    pending = {"type": "object", "required": ["call_id", "tool_name", "arguments", "why", "digest", "message_id",
                                              "client"],
               "properties": {
                   "call_id": {"type": "string", "description": "The key of the decision in `decisions`."},
                   "tool_name": text, "arguments": {"type": "string", "description": "The arguments, as JSON text."},
                   "why": {"type": "string", "description": "Why it needs approval."},
                   "digest": {"type": "string", "description": "Send it back with the decision: it binds the "
                              "decision to these arguments."},
                   "message_id": {"type": "string", "description": "The model message that made the call."},
                   "client": {"type": "boolean", "description": "True for a call to a front-end tool (AG-UI "
                              "`tools`): the client runs it and sends its result (stop_reason `client_tool_calls`)."}}}
    return {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["type", "message"], "properties": {"type": text, "message": text}}}},
        "Repaired": {"type": "string", "description": "Present when the stored object held what JSON cannot carry "
                                                      "(lone surrogates, NaN): says what is shown repaired."},
        "Part": {"type": "object", "required": ["kind"], "properties": {"kind": text},
                 "description": "A content part: `text`, `function_call`, `function_result`, `data`, `uri`, "
                                "`reasoning`, or a kind of a newer contextpipe (kept as stored)."},
        "Message": _message(),
        "Info": {"type": "object", "required": ["tenant", "user", "names_users", "version", "store", "read_only",
                                                "agent"],
                 "properties": {"tenant": text, "user": {"type": ["string", "null"],
                                                         "description": "The user the key is bound to (`user=ID`)."},
                                "names_users": {"type": "boolean",
                                                "description": "The key may name users per request (`users=any`)."},
                                "version": text, "store": text, "read_only": {"type": "boolean"},
                                "agent": {"oneOf": [agent, {"type": "null"}]}}},
        "Session": {"type": "object", "required": ["id", "version", "created_at", "ttl", "state", "checkpoint"],
                    "properties": {"id": text, "version": {"type": "integer"}, "created_at": number, "ttl": number,
                                   "state": {"type": "object"}, "checkpoint": {"oneOf": [checkpoint, {"type": "null"}]},
                                   "repaired": _ref("Repaired")}},
        "SessionList": {"type": "object", "required": ["sessions", "next_cursor"], "properties": {
            "sessions": {"type": "array", "items": listed}, "next_cursor": {"type": ["string", "null"]}}},
        "MessagePage": {"type": "object", "required": ["messages", "first_seq", "has_more", "next_before",
                                                       "next_after"],
                        "properties": {"messages": {"type": "array", "items": _logged()},
                                       "first_seq": {"type": "integer"}, "has_more": {"type": "boolean"},
                                       "next_before": {"type": ["integer", "null"]},
                                       "next_after": {"type": ["integer", "null"]}}},
        "TraceList": {"type": "object", "required": ["traces"], "properties": {
            "traces": {"type": "array", "items": {"type": "object"}}}},
        "FactList": {"type": "object", "required": ["user_id", "memories"], "properties": {
            "user_id": {"type": ["string", "null"]}, "memories": {"type": "array", "items": {
                "type": "object", "required": ["source_id", "collection", "facts"], "properties": {
                    "source_id": text, "collection": text, "facts": {"type": "array", "items": {
                        "type": "object", "required": ["lineage", "versions"], "properties": {
                            "lineage": text, "versions": {"type": "array", "items": _fact()}}}}}}},
            "repaired": _ref("Repaired")}},
        "PendingApproval": pending,
        "Cancelled": {"type": "object", "required": ["cancelled", "run_id"], "properties": {
            "cancelled": {"const": True}, "run_id": {"type": "string", "description": "The run cancelled (the "
                                                                                      "`X-Run-Id` of its stream)."}}},
        "SessionExport": {"type": "object", "required": ["session", "messages", "traces"], "properties": {
            "session": _ref("Session"), "messages": {"type": "array", "items": _message({"seq": {"type": "integer"}})},
            "traces": {"type": "array", "items": {"type": "object"}}}},
        "ApprovalList": {"type": "object", "required": ["pending_approvals"], "properties": {
            "pending_approvals": {"type": "array", "items": _ref("PendingApproval")}, "repaired": _ref("Repaired")}},
        "RunResult": {"type": "object", "required": ["session_id", "text", "stop_reason", "steps", "replayed",
                                                     "usage", "input", "messages", "pending_approvals"], "properties": {
            "session_id": {"type": ["string", "null"]}, "text": text, "stop_reason": text,
            "steps": {"type": "integer"},
            "replayed": {"type": "boolean", "description": "The input was answered before: this is that answer."},
            "usage": {"type": "object"}, "input": {"type": "array", "items": _ref("Message")},
            "messages": {"type": "array", "items": _ref("Message")},
            "pending_approvals": {"type": "array", "items": _ref("PendingApproval"), "description": "With "
                                  "`stop_reason` `approval_required`: the calls awaiting a decision."},
            "traces": {"type": "array", "items": {"type": "object"}}, "repaired": _ref("Repaired")}},
    }


def _agui_schemas() -> dict[str, Any]:
    from ._agui import agui_schemas

    try:
        return agui_schemas()
    except UsageError:  # ag-ui-protocol is not installed: the route answers 400 saying so
        return {"AgUiRunAgentInput": {"type": "object", "description": "AG-UI RunAgentInput"}}


def openapi_schema(*, read_only: bool = False, model: str | None = None) -> dict[str, Any]:
    """Return the OpenAPI document (writing routes are left out when `read_only`).

    `model` is the served agent's model id for OpenAI clients (`serve._openai.model_id`): the one
    value the ``model`` field of their requests takes.
    """
    paths = _paths()
    schemas = _response_schemas() | _openai_schemas() | _queue_schemas()
    if read_only:
        for item in paths.values():
            for method in ("post", "delete"):
                item.pop(method, None)
        paths = {k: v for k, v in paths.items() if set(v) - {"parameters"}}
    else:
        schemas |= request_schemas() | openai_request_schemas(model) | _agui_schemas()
    return {
        "openapi": "3.1.0",
        "info": {"title": "contextpipe", "version": __version__,
                 "description": "Sessions and runs of a contextpipe agent. Every /v1 route needs an API key "
                                "(`Authorization: Bearer KEY`, or `X-API-Key: KEY`) and acts on that key's tenant "
                                "only."},
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                           "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}},
        "security": [{"bearer": []}, {"apiKey": []}],
    }
