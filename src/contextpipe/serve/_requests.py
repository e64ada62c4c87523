"""What the API takes: one strict pydantic model per request body, and the rules for query values.

The models are the schema: ``/openapi.json`` publishes their JSON Schema (`request_schemas`), and
every body is validated against them at the edge, after `read_json`, so the document is exactly
what the server accepts, no looser and no stricter. A body that does not fit is a 400 ``BadRequest``
naming each field and what to send instead.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal

import pydantic
from pydantic import Discriminator, Field, Tag
from starlette.requests import Request

from ..approvals import Decision, approve, reject
from ..codec import message_from_dict
from ..messages import Message, new_message_id
from ..stores._checks import decode_cursor, encode_cursor
from ._json import HTTPError, where
from ._keys import USER_ID

__all__ = ["ApprovalsRequest", "CreateSession", "ForkRequest", "RewindRequest", "RunRequest", "decisions",
           "http_cursor", "input_messages", "invalid", "idempotent_id", "name_input", "query_int", "request_schemas",
           "store_cursor", "validate"]

SESSION_ID: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@/=+-]{0,199}$"
"""A session id, as the stores check it (`contextpipe.session.validate_session_id`)."""
MESSAGE_ID: Final = r"^[^\x00-\x1f\x7f]{1,200}$"
"""A message id a client chooses: 1-200 characters, none of them a control character."""
MEDIA_TYPE: Final = r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$"
BASE64: Final = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
URI: Final = r"^[A-Za-z][A-Za-z0-9+.-]*:[!-~]+$"
NOT_BLANK: Final = r"[^ \t\n\r]"
CURSOR: Final = r"^(?:|-?[0-9]{1,20}(?:\.[0-9]{1,20})?(?:e[+-]?[0-9]{1,3})?~" + SESSION_ID[1:-1] + ")$"
"""A page cursor: the last listed session's update time and id (``1796218510.84~alice/trip``); empty: none."""
ROUTE_MARKS: Final = "ag-ui."
"""The metadata key prefix reserved for the AG-UI route's marks: dropped from REST input."""
DIGEST: Final = r"^[0-9a-f]{64}$"
"""A pending call's digest (`contextpipe.approvals.arguments_digest`): 64 lowercase hex digits."""
IDEMPOTENCY_KEY: Final = r"^[!-~](?:[ -~]{0,253}[!-~])?$"
"""An ``Idempotency-Key`` header: 1-255 printable ASCII characters, not starting or ending with a space."""
USER_FIELD: Final = ("The user the session belongs to (memories and facts are kept per user), given to a session "
                     "of no user yet: only a key granted 'users=any' may name one; a key bound to a user acts for "
                     "it. " + "1-200 characters: letters, digits and . _ : @ / = + -, starting with a letter or digit")
MIN_TTL, MAX_TTL = 60.0, 10 * 365 * 86400.0
"""The shortest and longest session TTL a request may set (a minute, ten years)."""

RULES: Final = {
    SESSION_ID: "1-200 characters: letters, digits and . _ : @ / = + -, starting with a letter or digit",
    MESSAGE_ID: "1-200 characters, none of them a control character",
    MEDIA_TYPE: "a media type like image/png",
    BASE64: "standard base64 with its padding (RFC 4648)",
    URI: "an absolute URI without spaces, like https://example.com/a.png or data:image/png;base64,...",
    DIGEST: "the digest of the pending approval (64 lowercase hex digits)",
}


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)


class CreateSession(_Body):
    """The body of ``POST /v1/sessions`` (it may be empty)."""

    id: Annotated[str, Field(pattern=SESSION_ID)] | None = Field(
        None, description="The session's id (none makes a random one): " + RULES[SESSION_ID])
    ttl: float | None = Field(None, ge=MIN_TTL, le=MAX_TTL,
                              description="Seconds of inactivity before the session expires: a minute to ten years.")
    user_id: Annotated[str, Field(pattern=USER_ID)] | None = Field(None, description=USER_FIELD)


class InputTextPart(_Body):
    """Text."""

    kind: Literal["text"]
    text: str


class InputDataPart(_Body):
    """Inline bytes (an image, audio, a file), base64-encoded."""

    kind: Literal["data"]
    media_type: Annotated[str, Field(pattern=MEDIA_TYPE)]
    data: Annotated[str, Field(pattern=BASE64)]


class InputUriPart(_Body):
    """Content by URI (``https:`` or ``data:``)."""

    kind: Literal["uri"]
    media_type: Annotated[str, Field(pattern=MEDIA_TYPE)]
    uri: Annotated[str, Field(pattern=URI)]


class InputMessage(_Body):
    """A user message of a run's input; the server gives it an id (unless it has one) and a time."""

    role: Literal["user"]
    parts: list[Annotated[InputTextPart | InputDataPart | InputUriPart, Field(discriminator="kind")]] = \
        Field(min_length=1)
    id: Annotated[str, Field(pattern=MESSAGE_ID)] | None = Field(
        None, description="The message's id: a retry with the same id and content returns the first result.")
    author_name: str | None = None
    metadata: dict[str, Any] | None = Field(
        None, description="The message's metadata. Keys starting with `ag-ui.` are reserved for the AG-UI route's "
                          "own marks: they are dropped from REST input (so a message read back from "
                          "`GET .../messages` can be posted again as it is).")
    # What `contextpipe.codec.message_to_dict` writes besides: a client may send a message in that form.
    v: Literal[1] | None = Field(None, description="The version of contextpipe's message form (1).")
    created_at: float | None = Field(None, description="When the message was written (seconds since the epoch); "
                                                       "the server's clock when absent.")


class ApproveDecision(_Body):
    """Run the call."""

    decision: Literal["approve"]
    digest: Annotated[str, Field(pattern=DIGEST)] | None = Field(
        None, description="The `digest` of the pending call shown: refused (409) when the call waiting under this "
                          "id has other arguments. Without it the call id is approved whatever its arguments.")
    always: bool = Field(False, description="Also allow every later call of this tool in the session, without "
                                            "asking.")


class RejectDecision(_Body):
    """Do not run the call: the model is told it was rejected, with the reason."""

    decision: Literal["reject"]
    reason: str = Field("", description="Why, for the model (it reads it and can answer or try another way).")
    digest: Annotated[str, Field(pattern=DIGEST)] | None = Field(
        None, description="The `digest` of the pending call shown: refused (409) when the call waiting under this "
                          "id has other arguments.")


Decisions = dict[str, Annotated[ApproveDecision | RejectDecision, Field(discriminator="decision")]]
"""Decisions by call id (the `call_id` of each pending approval)."""


def decisions(raw: Mapping[str, ApproveDecision | RejectDecision] | None) -> dict[str, Decision] | None:
    """Return the library's decisions (`contextpipe.approve` / `reject`) for validated `Decisions`."""
    if raw is None:
        return None
    return {call_id: approve(digest=d.digest, always=d.always) if isinstance(d, ApproveDecision)
            else reject(d.reason, digest=d.digest) for call_id, d in raw.items()}


class ApprovalsRequest(_Body):
    """The body of ``POST /v1/sessions/{session_id}/approvals``: decisions, and how to run on."""

    decisions: Decisions = Field(min_length=1, description="The decision on each call, by call id: "
                                 "`{\"decision\": \"approve\"}` or `{\"decision\": \"reject\", \"reason\": ...}`.")
    stream: bool = Field(False, description="Stream server-sent events instead of returning the result.")
    wait: float = Field(0.0, ge=0, description="Seconds to wait for a busy session instead of getting 409 "
                                               "(at most the server's max_wait).")
    traces: bool = Field(False, description="Put the run's prompt traces in the result.")


def _input_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "messages"
    return "resume" if value is None else None


class RunRequest(_Body):
    """The body of ``POST /v1/sessions/{session_id}/runs``."""

    # message_id names text input only: a message of a list has its own id, and a resume has none.
    # A queued run takes one user message (text, or a list of one) and no decisions (`_queued_input`).
    model_config = pydantic.ConfigDict(json_schema_extra={"allOf": [
        {"if": {"properties": {"input": {"type": "string"}}},
         "else": {"properties": {"message_id": {"type": "null"}}}},
        {"if": {"required": ["queue"], "properties": {"queue": {"type": "string"}}},
         "then": {"properties": {"input": {"type": ["string", "array"], "maxItems": 1},
                                 "approvals": {"type": "null"}}}}]})

    input: Annotated[
        Annotated[Annotated[str, Field(pattern=NOT_BLANK)], Tag("text")]
        | Annotated[Annotated[list[InputMessage], Field(min_length=1)], Tag("messages")]
        | Annotated[None, Tag("resume")],
        Discriminator(_input_kind, custom_error_type="input_kind",
                      custom_error_message="input must be text, a list of user messages, or null"),
    ] = Field(description="Text (not blank), a list of user messages, or null to resume the session.")
    message_id: Annotated[str, Field(pattern=MESSAGE_ID)] | None = Field(
        None, description="Id of the text input's message: a retry with the same id and text returns the first "
                          "result instead of running again.")
    stream: bool = Field(False, description="Stream server-sent events instead of returning the result.")
    wait: float = Field(0.0, ge=0, description="Seconds to wait for a busy session instead of getting 409 "
                                               "(at most the server's max_wait).")
    traces: bool = Field(False, description="Put the run's prompt traces (tokens by source per model call) in "
                                            "the result.")
    approvals: Decisions | None = Field(
        None, description="Decisions on calls awaiting approval, by call id, as for `/approvals`: they are answered "
                          "before the input.")
    user_id: Annotated[str, Field(pattern=USER_ID)] | None = Field(None, description=USER_FIELD)
    queue: Literal["asap", "next"] | None = Field(
        None, description="When the session is busy, queue the input instead of answering 409: `asap` (the run "
                          "holding the session gets it before its next model call) or `next` (a run of its own once "
                          "that run ends); answered 202 with the queued message's id. On an idle session the input "
                          "runs at once, as without `queue`.")

    @pydantic.model_validator(mode="after")
    def _message_id_names_text(self) -> RunRequest:
        if self.message_id is not None and not isinstance(self.input, str):
            what = "is null (a resume): there is no input message to name" if self.input is None else \
                "is a list of messages: give the messages their ids (\"id\": ...)"
            raise ValueError(f"message_id names text input, and input {what}")
        return self

    @pydantic.model_validator(mode="after")
    def _queued_input(self) -> RunRequest:
        if self.queue is None:
            return self
        if self.input is None or (isinstance(self.input, list) and len(self.input) != 1):
            raise ValueError("queue takes one user message: send input as text or a list of one message "
                             "(queue each message of a longer list in a request of its own)")
        if self.approvals is not None:
            raise ValueError("decisions cannot be queued: send approvals without queue (POST .../approvals)")
        return self


def _whole(value: Any) -> Any:
    """Read a whole float (``4.0``) as the integer it is: JSON Schema counts it an integer, and so does the API."""
    return int(value) if type(value) is float and value.is_integer() else value


Seq = Annotated[int, pydantic.BeforeValidator(_whole)]
"""A sequence of a session's log."""


class RewindRequest(_Body):
    """The body of ``POST /v1/sessions/{session_id}/rewind``."""

    to: Seq = Field(ge=0, le=2**62, description="The last sequence to keep in the session's view (0: leave it all "
                    "out); a point inside a tool exchange moves back to before it.")
    wait: float = Field(0.0, ge=0, description="Seconds to wait for a busy session instead of getting 409 "
                                               "(at most the server's max_wait).")


class ForkRequest(_Body):
    """The body of ``POST /v1/sessions/{session_id}/fork``."""

    at: Seq = Field(ge=0, le=2**62, description="The last sequence of the session's view the fork starts with "
                    "(moved back to before a tool exchange it falls in).")
    new_id: Annotated[str, Field(pattern=SESSION_ID)] | None = Field(
        None, description="The new session's id, of no existing session (none makes a random one): "
                          + RULES[SESSION_ID])


def request_schemas() -> dict[str, Any]:
    """Return the JSON Schemas of the request bodies, for ``components.schemas`` of the OpenAPI document."""
    out: dict[str, Any] = {}
    for model in (CreateSession, RunRequest, ApprovalsRequest, RewindRequest, ForkRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def validate(model: type[pydantic.BaseModel], body: Any, **options: Any) -> Any:
    """Return `body` validated as `model`, or raise the 400 saying what to change (`invalid`)."""
    try:
        return model.model_validate(body, **options)
    except pydantic.ValidationError as exc:
        raise invalid(exc, body) from None


def invalid(exc: pydantic.ValidationError, body: Any) -> HTTPError:
    """Return the 400 ``BadRequest`` for a body `exc` refused: each problem with its field and what to send."""
    problems = list(dict.fromkeys(_problem(error, body) for error in exc.errors(include_url=False)))
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return HTTPError(400, "BadRequest", "invalid request: " + "; ".join(problems[:5]) + more)


def _problem(error: Mapping[str, Any], body: Any) -> str:
    path = _path(body, error["loc"])
    at, kind, ctx = where(path), error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"{at}: unknown field: leave it out (/openapi.json lists the fields)"
    if kind == "union_tag_invalid" and ctx.get("discriminator") == "'kind'":
        return (f"{at}: a user message cannot hold a part of kind {ctx.get('tag')!r}: send parts of kind "
                "'text', 'data' or 'uri' (tool calls and their results come from the model and the tools, and "
                "the session keeps them)")
    if kind == "union_tag_not_found" and ctx.get("discriminator") == "'kind'":
        return f"{at}: a part needs its kind: 'text', 'data' or 'uri'"
    if kind == "literal_error" and path and path[-1] == "role":
        return f"{at}: input messages are user messages (role 'user'); the session holds the rest"
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == NOT_BLANK:
            return "input is empty: send text, messages, or null to resume the session"
        return f"{at}: must be {RULES.get(ctx.get('pattern', ''), 'of the form ' + str(ctx.get('pattern')))}"
    if kind == "value_error":
        return f"{at}: {ctx.get('error', error['msg'])}"
    if kind == "too_short" and path == ["input"]:
        return "input is an empty list: send text, messages, or null to resume"
    return f"{at}: {error['msg']}"


def _path(body: Any, loc: Sequence[str | int]) -> list[str | int]:
    """Return the JSON path of pydantic's `loc` in `body`, without the union tags pydantic puts in it."""
    out: list[str | int] = []
    node: Any = body
    for i, step in enumerate(loc):
        inside = isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node)
        if inside or (isinstance(node, dict) and step in node):
            node = node[step]
        elif not (i == len(loc) - 1 and isinstance(node, dict)):  # a missing field is named; a tag is not
            continue
        out.append(step)
    return out


def input_messages(raw: str | list[InputMessage] | None) -> str | list[Message] | None:
    """Return the run's input from a validated `RunRequest.input`, messages built with ids and times."""
    if not isinstance(raw, list):
        return raw
    messages = []
    for item in raw:
        data: dict[str, Any] = {"v": 1, "role": "user", "id": item.id or new_message_id(),
                                "created_at": time.time() if item.created_at is None else item.created_at,
                                "parts": [part.model_dump() for part in item.parts]}
        if item.author_name is not None:
            data["author_name"] = item.author_name
        # The AG-UI route's marks (`serve._agui_rewind.INPUT_KEY`) dropped: a REST message without them can never
        # be rewound by an AG-UI request, and a re-post of one read back is still a retry (`IGNORED_METADATA`).
        metadata = {k: v for k, v in (item.metadata or {}).items() if not k.startswith(ROUTE_MARKS)}
        if metadata:
            data["metadata"] = metadata
        messages.append(message_from_dict(data))
    return messages


def name_input(body: RunRequest, input: str | list[Message] | None, key: str | None, tenant: str,
               session_id: str) -> str | list[Message] | None:
    """Give the run's last input message the id the client chose, so that a retried request is not run twice.

    The id is ``message_id`` (text input) or the last message's ``id``; when the body names none, the
    ``Idempotency-Key`` header's key turned into an id of this session (the same key in another
    session or tenant names another message). A resume has no input message for the key to name, so
    the key could not keep a retried resume from running again: it is refused, not ignored (a 409, as
    the request is well formed: ``/openapi.json`` cannot tie a header to a body field).
    """
    if key is not None:
        idempotent_id(key, tenant, session_id)  # a key that is not one is a 400 before anything else
    if key is not None and input is None:
        raise HTTPError(409, "NotIdempotent", "an Idempotency-Key names the run's input message, and a resume "
                        "(\"input\": null) has none, so a retried resume would run again: leave the header out, "
                        "or resume an interrupted run safely: send its input again with the same message id (or "
                        "the same key), which resumes the run or returns its answer")
    if input is None:
        return None
    if body.message_id is not None:
        message_id = body.message_id
    elif key is None or (isinstance(body.input, list) and body.input[-1].id is not None):
        return input
    else:
        message_id = idempotent_id(key, tenant, session_id)
    if isinstance(input, str):
        return [Message.user(input, id=message_id)]
    last = input[-1]
    return [*input[:-1], Message(last.role, last.parts, message_id, last.author_name, last.created_at,
                                 last.metadata)]


def idempotent_id(key: str, tenant: str, session_id: str) -> str:
    """Return the id of the input message an ``Idempotency-Key`` header's `key` names in a session.

    The same key in another session or tenant names another message. A key that is not 1-255
    printable ASCII characters is a 400.
    """
    if not re.fullmatch(IDEMPOTENCY_KEY, key):
        raise HTTPError(400, "BadRequest", "the Idempotency-Key header must be 1-255 printable ASCII characters "
                        "(a UUID, say)")
    return "idem_" + hashlib.sha256(f"{tenant}\0{session_id}\0{key}".encode()).hexdigest()[:32]


_INTEGER: Final = re.compile(r"-?[0-9]{1,19}")


def query_int(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    """Return the integer query value `name` (`default` when absent); 400 unless in ``[low, high]``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        raise HTTPError(400, "BadRequest", f"{name} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise HTTPError(400, "BadRequest", f"{name} must be between {low} and {high}, got {value}")
    return value


_CURSOR: Final = re.compile(CURSOR)


def store_cursor(raw: str | None) -> str | None:
    """Return the store's cursor for the ``cursor`` query value `raw` (None: the first page); 400 if malformed."""
    if not raw:
        return None
    if not _CURSOR.fullmatch(raw):
        raise HTTPError(400, "BadRequest", f"cursor {raw[:60]!r} is not a cursor of this API: pass the "
                        "next_cursor of the previous page (URL-encoded), or leave cursor out for the first page")
    updated_at, session_id = raw.split("~", 1)
    return encode_cursor(float(updated_at), session_id)


def http_cursor(cursor: str | None) -> str | None:
    """Return the ``next_cursor`` the API gives for the store's `cursor`."""
    if cursor is None:
        return None
    updated_at, session_id = decode_cursor(cursor)
    return f"{updated_at!r}~{session_id}"
