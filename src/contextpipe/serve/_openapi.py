"""The OpenAPI 3.1 description of the ``/v1`` API, served at ``/openapi.json`` (and shown at ``/docs``)."""

from __future__ import annotations

from typing import Any

from .. import __version__

__all__ = ["openapi_schema"]

_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"},
       "description": "Session id, percent-encoded (a `/` in the id is sent as `%2F`)."}


def _q(name: str, description: str, kind: str = "integer") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": {"type": kind}, "description": description}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Bad input (the message says what is wrong).", 401: "No API key, or an unknown one.",
            404: "No such session for this tenant.", 405: "Read-only server.",
            409: "The session is busy (another run holds it; see `Retry-After`), or the input's message id "
                 "is taken by other content (`InputConflict`).",
            410: "The session was deleted, or expired, while the run ran.",
            413: "The request body is too large.", 503: "The server is shutting down; see `Retry-After`."}
    return {str(c): {"description": text[c], "content": _json("Error")} for c in codes}


def openapi_schema(*, read_only: bool = False) -> dict[str, Any]:
    """Return the OpenAPI document (writing routes are left out when `read_only`)."""
    paths: dict[str, Any] = {
        "/v1/info": {"get": {"summary": "Who am I: tenant, agent, store", "operationId": "info",
                             "responses": {"200": {"description": "About this server and the caller's tenant."},
                                           **_errors(401)}}},
        "/v1/sessions": {
            "get": {"summary": "List sessions, most recently updated first", "operationId": "listSessions",
                    "parameters": [_q("limit", "Sessions per page (1-500, default 50)."),
                                   _q("cursor", "`next_cursor` of the previous page.", "string"),
                                   _q("q", "Only sessions whose id contains this text.", "string")],
                    "responses": {"200": {"description": "A page of sessions.", "content": _json("SessionList")},
                                  **_errors(400, 401)}},
            "post": {"summary": "Create a session (or return it when `id` exists)", "operationId": "createSession",
                     "requestBody": {"content": _json("CreateSession")},
                     "responses": {"201": {"description": "Created.", "content": _json("Session")},
                                   "200": {"description": "Already existed.", "content": _json("Session")},
                                   **_errors(400, 401, 413)}},
        },
        "/v1/sessions/{session_id}": {
            "parameters": [_ID],
            "get": {"summary": "A session: version, state, latest summary checkpoint", "operationId": "getSession",
                    "responses": {"200": {"description": "The session.", "content": _json("Session")},
                                  **_errors(400, 401, 404)}},
            "delete": {"summary": "Delete a session and everything stored for it", "operationId": "deleteSession",
                       "responses": {"204": {"description": "Deleted."}, **_errors(400, 401, 404)}},
        },
        "/v1/sessions/{session_id}/messages": {
            "parameters": [_ID],
            "get": {"summary": "A page of the session's messages, oldest first", "operationId": "listMessages",
                    "parameters": [_q("limit", "Messages per page (1-1000, default 100): the newest ones."),
                                   _q("before", "Only messages with a sequence below this (`next_before`)."),
                                   _q("after", "Only messages with a sequence above this (to follow a session).")],
                    "responses": {"200": {"description": "A page.", "content": _json("MessagePage")},
                                  **_errors(400, 401, 404)}},
        },
        "/v1/sessions/{session_id}/traces": {
            "parameters": [_ID],
            "get": {"summary": "Stored prompt traces: tokens by source per model call", "operationId": "listTraces",
                    "parameters": [_q("limit", "Only the newest N.")],
                    "responses": {"200": {"description": "Traces, oldest first (PromptTrace.to_dict)."},
                                  **_errors(400, 401, 404)}},
        },
        "/v1/sessions/{session_id}/facts": {
            "parameters": [_ID],
            "get": {"summary": "The history of every fact FactMemory keeps about the session's user",
                    "operationId": "listFacts",
                    "responses": {"200": {"description": "Per FactMemory of the agent: each fact's versions, oldest "
                                                         "first, with valid_from / valid_to and source message ids."},
                                  **_errors(400, 401, 404)}},
        },
        "/v1/sessions/{session_id}/runs": {
            "parameters": [_ID],
            "post": {
                "summary": "Run the agent on the session",
                "description": "Returns the result; with `\"stream\": true` or `Accept: text/event-stream`, streams "
                               "server-sent events instead: `text_delta`, `reasoning_delta`, `tool_call_started`, "
                               "`tool_call_finished`, `step_persisted`, then `done` (the result) or `error`. "
                               "A request whose input message id was answered in the session before (a retry) "
                               "gets that answer back, marked `replayed`, without running again.",
                "operationId": "run", "requestBody": {"required": True, "content": _json("RunRequest")},
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                                "description": "Names the run's input (its last message) in this session: a retry "
                                               "with the same key and input returns the first result."}],
                "responses": {"200": {"description": "The result, or the event stream.",
                                      "content": {**_json("RunResult"), "text/event-stream": {}}},
                              "502": {"description": "The model failed.", "content": _json("Error")},
                              **_errors(400, 401, 404, 409, 410, 413, 503)}},
        },
        "/v1/ag-ui": {
            "post": {"summary": "Run through the AG-UI protocol (threadId is the session id)", "operationId": "agui",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"type": "object", "description": "AG-UI RunAgentInput"}}}},
                     "responses": {"200": {"description": "AG-UI events.", "content": {"text/event-stream": {}}},
                                   **_errors(400, 401, 409, 413, 503)}},
        },
    }
    if read_only:
        for item in paths.values():
            for method in ("post", "delete"):
                item.pop(method, None)
        paths = {k: v for k, v in paths.items() if set(v) - {"parameters"}}
    message = {"type": "object", "description": "A message as contextpipe stores it (role, parts, id, source).",
               "properties": {"role": {"type": "string"}, "parts": {"type": "array", "items": {"type": "object"}}}}
    schemas: dict[str, Any] = {
        "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
            "type": {"type": "string"}, "message": {"type": "string"}}}}},
        "CreateSession": {"type": "object", "additionalProperties": False, "properties": {
            "id": {"type": "string", "description": "1-200 characters: letters, digits and . _ : @ / = + -"},
            "ttl": {"type": "number", "description": "Seconds of inactivity before the session expires."}}},
        "Session": {"type": "object", "properties": {
            "id": {"type": "string"}, "version": {"type": "integer"}, "created_at": {"type": "number"},
            "ttl": {"type": ["number", "null"]}, "state": {"type": "object"},
            "checkpoint": {"type": ["object", "null"]}}},
        "SessionList": {"type": "object", "properties": {
            "sessions": {"type": "array", "items": {"type": "object"}},
            "next_cursor": {"type": ["string", "null"]}}},
        "MessagePage": {"type": "object", "properties": {
            "messages": {"type": "array", "items": message}, "first_seq": {"type": "integer"},
            "has_more": {"type": "boolean"}, "next_before": {"type": ["integer", "null"]}}},
        "RunRequest": {"type": "object", "additionalProperties": False, "required": ["input"], "properties": {
            "input": {"description": "Text, a list of user messages, or null to resume the session.",
                      "oneOf": [{"type": "string"}, {"type": "array", "items": message}, {"type": "null"}]},
            "message_id": {"type": "string", "minLength": 1, "maxLength": 200,
                           "description": "Id of the text input's message: a retry with the same id and text "
                                          "returns the first result instead of running again."},
            "stream": {"type": "boolean", "default": False},
            "wait": {"type": "number", "default": 0,
                     "description": "Seconds to wait for a busy session instead of getting 409."},
            "traces": {"type": "boolean", "default": False,
                       "description": "Put the run's prompt traces (tokens by source per model call) in the result."}}},
        "RunResult": {"type": "object", "properties": {
            "text": {"type": "string"}, "stop_reason": {"type": "string"}, "steps": {"type": "integer"},
            "replayed": {"type": "boolean", "description": "The input was answered before: this is that answer."},
            "usage": {"type": "object"}, "messages": {"type": "array", "items": message},
            "traces": {"type": "array", "items": {"type": "object"}}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "contextpipe", "version": __version__,
                 "description": "Sessions and runs of a contextpipe agent. Every /v1 route needs an API key "
                                "(`Authorization: Bearer KEY`) and acts on that key's tenant only."},
        "paths": paths,
        "components": {"schemas": schemas,
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}],
    }
