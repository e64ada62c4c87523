"""What the OpenAI-compatible routes take: the request bodies of Chat Completions and Responses.

Strict models, as for the native routes (`_requests`): ``/openapi.json`` publishes their schema and
every body is validated against it. They hold the fields of OpenAI's APIs that mean something for
a served agent, and the common sampling fields clients send: `temperature`, the token limit,
`seed`, `reasoning_effort`, `response_format` (Responses: `text.format`) apply to the run's model
calls; the fields marked "accepted, not applied" are taken so that clients sending them still work. What cannot mean
anything here is refused with a 400 that says why: the client's own tools (the agent's tools run on
the server), ``n`` > 1, and on Responses ``store: false`` (the server keeps every conversation).
"""

from __future__ import annotations

import mimetypes
import re
from typing import Annotated, Any, Final, Literal, TypeAlias

import pydantic
from pydantic import Discriminator, Field, Tag

from ..messages import Message, Part, TextPart, UriPart, new_message_id
from ..models import ModelSettings
from ._keys import USER_ID
from ._requests import MEDIA_TYPE, NOT_BLANK, RULES, SESSION_ID, URI, USER_FIELD

__all__ = ["ChatRequest", "ResponsesRequest", "chat_messages", "image_part", "openai_request_schemas",
           "response_messages", "run_settings"]

NOT_APPLIED: Final = "Accepted, not applied: the agent's model settings decide."
RESPONSE_ID: Final = r"^resp_[A-Za-z0-9_-]{1,300}\.[A-Za-z0-9_-]{1,300}$"
"""A response id of this server: ``resp_`` and the base64url of its session id and of its input message id."""
_TOOLS: Final = ("this agent's tools run on the server, and a client's own tools are not supported on this "
                 "endpoint: leave the field out (GET /v1/info lists the agent's tools)")


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


_Whole = pydantic.BeforeValidator(_whole)
"""Integers as JSON may write them (``5`` or ``5.0``, as JSON Schema's ``integer`` takes both)."""
TOKENS: TypeAlias = Annotated[int, Field(ge=1, le=2**31), _Whole]
SEED: TypeAlias = Annotated[int, Field(ge=-(2**63), le=2**63 - 1), _Whole]
ONE: TypeAlias = Annotated[int, Field(ge=1, le=1), _Whole]


Effort: TypeAlias = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
"""How hard a reasoning model thinks, as the OpenAI APIs name it (`ModelSettings` ``reasoning_effort``)."""


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)


def _refuse_tools(data: Any, fields: tuple[str, ...]) -> Any:
    if isinstance(data, dict):
        for name in fields:
            if name in data:
                raise ValueError(f"{name}: {_TOOLS}")
    return data


def _text_or_list(value: Any) -> str | None:
    """Return the union tag of text-or-list content: None for neither, and for an empty list."""
    if isinstance(value, str):
        return "text"
    return "list" if isinstance(value, list) and value else None


def _new_text_or_list(value: Any) -> str | None:
    """As `_text_or_list`, and None for blank text: what is all new input (on Responses) cannot be blank.

    The members' own ``pattern`` and ``min_length`` say the same in the JSON Schema.
    """
    return None if isinstance(value, str) and not re.search(NOT_BLANK, value) else _text_or_list(value)


_PARTS: Final = "At least one part."
_NEW_TEXT: Final = "Text, not blank."


# --- Chat Completions ---------------------------------------------------------------------------------


class ChatText(_Body):
    """Text."""

    type: Literal["text"]
    text: str


class ChatImageUrl(_Body):
    url: Annotated[str, Field(pattern=URI, description="An image: " + RULES[URI])]
    detail: Literal["auto", "low", "high"] | None = None


class ChatImage(_Body):
    """An image, by URL (``https:`` or ``data:``)."""

    type: Literal["image_url"]
    image_url: ChatImageUrl


# Chat Completions content may be blank: a client resends the whole conversation, and the endpoint refuses a
# blank user message among the turn's new ones only (an earlier one was answered already).
ChatUserContent: TypeAlias = Annotated[
    Annotated[str, Field(description="Text; among the turn's new messages (after the last non-user message) "
                                     "not blank, or it is a 409."), Tag("text")]
    | Annotated[list[Annotated[ChatText | ChatImage, Field(discriminator="type")]],
                Field(min_length=1, description=_PARTS), Tag("list")],
    Discriminator(_text_or_list, custom_error_type="chat_user_content",
                  custom_error_message="must be text, or a list of text and image_url parts (at least one)")]
ChatTextContent: TypeAlias = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[ChatText], Field(min_length=1, description=_PARTS), Tag("list")],
    Discriminator(_text_or_list, custom_error_type="chat_text_content",
                  custom_error_message="must be text, or a list of text parts (at least one)")]


class ChatUserMessage(_Body):
    """The user's message: text, or parts of text and images."""

    role: Literal["user"]
    content: ChatUserContent
    name: str | None = Field(None, description="The author's name.")


class ChatTextMessage(_Body):
    """A system (or developer) message, or an earlier answer: text."""

    role: Literal["system", "developer", "assistant"]
    content: ChatTextContent
    name: str | None = Field(None, description="The author's name.")


ChatMessage = Annotated[ChatUserMessage | ChatTextMessage, Field(discriminator="role")]


def _tool_messages(messages: Any) -> Any:
    """Refuse the tool messages of a conversation, saying why (before the schema's own, vaguer error)."""
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(m, dict) and (m.get("role") in ("tool", "function") or "tool_calls" in m
                                    or "function_call" in m):
            raise ValueError(f"messages[{i}]: tool calls and their results are the agent's own (its tools run on "
                             "the server, and the session keeps them): send user, assistant and system messages")
    return messages


class StreamOptions(_Body):
    include_usage: bool = Field(False, description="Send a last chunk with the run's token usage.")
    include_obfuscation: bool | None = Field(None, description=NOT_APPLIED)


class PlainFormat(_Body):
    """The answer's format (Responses' ``text.format``, Chat's ``response_format``): plain text or any JSON object."""

    type: Literal["text", "json_object"]


class ChatJsonSchema(_Body):
    """``response_format.json_schema`` of a Chat Completions request."""

    name: str = Field(description="The schema's name.")
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="The JSON Schema of the answer.")
    description: str | None = None
    strict: bool | None = None


class ChatSchemaFormat(_Body):
    """``response_format`` of a Chat Completions request: JSON matching a schema."""

    type: Literal["json_schema"]
    json_schema: ChatJsonSchema


ResponseFormat: TypeAlias = Annotated[PlainFormat | ChatSchemaFormat, Field(discriminator="type")]


class ChatRequest(_Body):
    """The body of ``POST /v1/chat/completions``."""

    model: str = Field(description="The served agent's id (GET /v1/models).")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation; it ends with the user's "
                                        "message. In a session that has messages, the ones after the last "
                                        "non-user message are new, and the rest are the session's already.")
    stream: bool = Field(False, description="Stream chat.completion.chunk events.")
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: TOKENS | None = Field(None, description="The most tokens each model call generates.")
    max_completion_tokens: TOKENS | None = Field(None, description="As max_tokens (its newer name).")
    seed: SEED | None = None
    reasoning_effort: Effort | None = None
    response_format: ResponseFormat | None = None
    n: ONE | None = Field(None, description="1: one answer per request.")
    top_p: float | None = Field(None, ge=0, le=1, description=NOT_APPLIED)
    presence_penalty: float | None = Field(None, ge=-2, le=2, description=NOT_APPLIED)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description=NOT_APPLIED)
    stop: str | list[str] | None = Field(None, description=NOT_APPLIED)
    user: Annotated[str, Field(pattern=USER_ID)] | None = Field(None, description=USER_FIELD)
    metadata: dict[str, str] | None = Field(None, description=NOT_APPLIED)
    store: bool | None = Field(None, description="Accepted, not applied: the server keeps every conversation.")
    parallel_tool_calls: bool | None = Field(None, description=NOT_APPLIED)
    service_tier: str | None = Field(None, description=NOT_APPLIED)
    logprobs: Literal[False] | None = Field(None, description="false: log probabilities are not available.")
    top_logprobs: Annotated[int, Field(ge=0, le=0), _Whole] | None = Field(None, description="0: log "
                                                                              "probabilities are not available.")
    logit_bias: dict[str, float] | None = Field(None, description=NOT_APPLIED)
    safety_identifier: str | None = Field(None, description=NOT_APPLIED)
    prompt_cache_key: str | None = Field(None, description=NOT_APPLIED)
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description=NOT_APPLIED)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _no_client_tools(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _tool_messages(data.get("messages"))
        return _refuse_tools(data, ("tools", "tool_choice", "functions", "function_call"))


def chat_messages(messages: list[ChatUserMessage | ChatTextMessage]) -> list[Message]:
    """Return contextpipe messages for a conversation of `ChatRequest.messages` (each with a new id)."""
    out = []
    for m in messages:
        parts: list[Part] = [TextPart(m.content)] if isinstance(m.content, str) else [
            image_part(p.image_url.url) if isinstance(p, ChatImage) else TextPart(p.text) for p in m.content]
        out.append(_message(m.role, parts, m.name))
    return out


# --- Responses ------------------------------------------------------------------------------------------


class InputText(_Body):
    type: Literal["input_text"]
    text: str


class OutputText(_Body):
    """Text of an earlier answer (an output item sent back as input)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputImage(_Body):
    type: Literal["input_image"]
    image_url: Annotated[str, Field(pattern=URI, description="An image: " + RULES[URI])]
    detail: Literal["auto", "low", "high"] | None = None


InputUserContent: TypeAlias = Annotated[
    Annotated[str, Field(pattern=NOT_BLANK, description=_NEW_TEXT), Tag("text")]
    | Annotated[list[Annotated[InputText | InputImage, Field(discriminator="type")]],
                Field(min_length=1, description=_PARTS), Tag("list")],
    Discriminator(_new_text_or_list, custom_error_type="input_user_content", custom_error_message="must be the "
                  "user's text (not blank), or a list of input_text and input_image parts (at least one)")]
InputTextContent: TypeAlias = Annotated[
    Annotated[str, Field(pattern=NOT_BLANK, description=_NEW_TEXT), Tag("text")]
    | Annotated[list[Annotated[InputText | OutputText, Field(discriminator="type")]],
                Field(min_length=1, description=_PARTS), Tag("list")],
    Discriminator(_new_text_or_list, custom_error_type="input_text_content", custom_error_message="must be "
                  "text (not blank), or a list of input_text and output_text parts (at least one)")]


class InputUserMessage(_Body):
    """The user's message: text, or parts of text and images."""

    type: Literal["message"] | None = None
    role: Literal["user"]
    content: InputUserContent
    id: str | None = Field(None, description=NOT_APPLIED)
    status: Literal["in_progress", "completed", "incomplete"] | None = Field(None, description=NOT_APPLIED)


class InputTextMessage(_Body):
    """A system (or developer) message, or an earlier answer sent back: text."""

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "assistant"]
    content: InputTextContent
    id: str | None = Field(None, description=NOT_APPLIED)
    status: Literal["in_progress", "completed", "incomplete"] | None = Field(None, description=NOT_APPLIED)


InputMessage = Annotated[InputUserMessage | InputTextMessage, Field(discriminator="role")]
ResponsesInput: TypeAlias = Annotated[
    Annotated[str, Field(pattern=NOT_BLANK, description="The user's text, not blank."), Tag("text")]
    | Annotated[list[InputMessage], Field(min_length=1, description="At least one message."), Tag("list")],
    Discriminator(_new_text_or_list, custom_error_type="responses_input", custom_error_message="must be the "
                  "user's text (not blank), or a list of messages (at least one)")]


def _items(items: Any) -> Any:
    """Refuse the input items that are not messages, saying why (before the schema's own, vaguer error)."""
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if isinstance(item, dict) and item.get("type") not in (None, "message"):
            raise ValueError(f"input[{i}]: an input item of type {item.get('type')!r} is not supported: the agent's "
                             "tool calls and their results are its own (they run on the server); send messages")
    return items


class Conversation(_Body):
    id: Annotated[str, Field(pattern=SESSION_ID)]


class Reasoning(_Body):
    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = Field(None, description=NOT_APPLIED)


class SchemaFormat(_Body):
    """``text.format`` of a Responses request: JSON matching a schema."""

    type: Literal["json_schema"]
    name: str = Field(description="The schema's name.")
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema of the answer.")
    description: str | None = None
    strict: bool | None = None


TextFormat: TypeAlias = Annotated[PlainFormat | SchemaFormat, Field(discriminator="type")]


class TextOptions(_Body):
    format: TextFormat | None = Field(None, description="The answer's format, for every model call of the run.")
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description=NOT_APPLIED)


class ResponsesRequest(_Body):
    """The body of ``POST /v1/responses``."""

    model_config = pydantic.ConfigDict(json_schema_extra={"not": {  # one of them names the conversation
        "required": ["previous_response_id", "conversation"],
        "properties": {"previous_response_id": {"type": "string"}, "conversation": {"type": ["string", "object"]}}}})

    model: str = Field(description="The served agent's id (GET /v1/models).")
    input: ResponsesInput = Field(
        description="This turn's input, ending with the user's message: text, or a list of messages.")
    instructions: str | None = Field(None, description="A system message for the conversation: kept in the "
                                     "session as a system message when the session has none with this text "
                                     "since its last instructions.")
    previous_response_id: Annotated[str, Field(pattern=RESPONSE_ID)] | None = Field(
        None, description="Continue the conversation of this response (its session): it must be the latest one.")
    conversation: Annotated[str, Field(pattern=SESSION_ID)] | Conversation | None = Field(
        None, description="The conversation's id: a session id (created if new).")
    stream: bool = Field(False, description="Stream the Responses events.")
    temperature: float | None = Field(None, ge=0, le=2)
    max_output_tokens: TOKENS | None = Field(None, description="The most tokens each model call "
                                          "generates.")
    reasoning: Reasoning | None = None
    text: TextOptions | None = None
    top_p: float | None = Field(None, ge=0, le=1, description=NOT_APPLIED)
    user: Annotated[str, Field(pattern=USER_ID)] | None = Field(None, description=USER_FIELD)
    metadata: dict[str, str] | None = Field(None, description=NOT_APPLIED)
    store: Literal[True] | None = Field(None, description="true: the server keeps every conversation.")
    parallel_tool_calls: bool | None = Field(None, description=NOT_APPLIED)
    service_tier: str | None = Field(None, description=NOT_APPLIED)
    truncation: Literal["auto", "disabled"] | None = Field(None, description=NOT_APPLIED)
    include: list[str] | None = Field(None, description=NOT_APPLIED)
    stream_options: dict[str, bool] | None = Field(None, description=NOT_APPLIED)
    max_tool_calls: Annotated[int, Field(ge=1, le=2**31), _Whole] | None = Field(None, description=NOT_APPLIED)
    safety_identifier: str | None = Field(None, description=NOT_APPLIED)
    prompt_cache_key: str | None = Field(None, description=NOT_APPLIED)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _no_client_tools(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _items(data.get("input"))
        return _refuse_tools(data, ("tools", "tool_choice"))

    @pydantic.model_validator(mode="after")
    def _one_conversation(self) -> ResponsesRequest:
        if self.previous_response_id is not None and self.conversation is not None:
            raise ValueError("previous_response_id and conversation both name the conversation: send one of them")
        return self

    def conversation_id(self) -> str | None:
        """Return the session id `conversation` names (None: it names none)."""
        return self.conversation.id if isinstance(self.conversation, Conversation) else self.conversation


def response_messages(body: ResponsesRequest) -> list[Message]:
    """Return contextpipe messages for the input of a `ResponsesRequest` (each with a new id)."""
    if isinstance(body.input, str):
        return [Message.user(body.input, id=new_message_id())]
    out = []
    for m in body.input:
        parts: list[Part] = [TextPart(m.content)] if isinstance(m.content, str) else [
            image_part(p.image_url) if isinstance(p, InputImage) else TextPart(p.text) for p in m.content]
        out.append(_message(m.role, parts, None))
    return out


def run_settings(body: ChatRequest | ResponsesRequest) -> ModelSettings | None:
    """Return the model settings a request gives its run (None: it gives none)."""
    settings = ModelSettings()
    if body.temperature is not None:
        settings["temperature"] = body.temperature
    if isinstance(body, ChatRequest):
        limit = body.max_completion_tokens or body.max_tokens
        effort = body.reasoning_effort
        if body.seed is not None:
            settings["seed"] = body.seed
        if body.response_format is not None and body.response_format.type != "text":
            settings["response_format"] = body.response_format.model_dump(exclude_none=True, by_alias=True)
    else:
        limit = body.max_output_tokens
        effort = body.reasoning.effort if body.reasoning is not None else None
        answer_format = body.text.format if body.text is not None else None
        if answer_format is not None and answer_format.type != "text":
            settings["response_format"] = _chat_format(answer_format)
    if limit is not None:
        settings["max_output_tokens"] = limit
    if effort is not None:
        settings["reasoning_effort"] = effort
    return settings or None


def _chat_format(answer_format: PlainFormat | SchemaFormat) -> dict[str, Any]:
    """Return Responses' `answer_format` as `ModelSettings.response_format` takes it (Chat Completions' shape)."""
    if isinstance(answer_format, PlainFormat):
        return {"type": answer_format.type}
    schema = answer_format.model_dump(exclude_none=True, by_alias=True, exclude={"type"})
    return {"type": "json_schema", "json_schema": schema}


def _message(role: str, parts: list[Part], name: str | None) -> Message:
    kind = "system" if role == "developer" else role
    return Message(kind, tuple(parts), new_message_id(), name)  # type: ignore[arg-type]


def image_part(url: str) -> UriPart:
    """Return the part for an image URL, with its media type (a ``data:`` URL's own, or from the file name)."""
    if url.startswith("data:"):
        media_type = url[5:].partition(",")[0].partition(";")[0]
        if re.fullmatch(MEDIA_TYPE, media_type):
            return UriPart(url, media_type)
    return UriPart(url, mimetypes.guess_type(url)[0] or "image/*")


def openai_request_schemas(model_id: str | None) -> dict[str, Any]:
    """Return the JSON Schemas of the request bodies, for ``components.schemas`` of the OpenAPI document.

    `model_id` is the one ``model`` served (any other is a 404 naming it).
    """
    out: dict[str, Any] = {}
    for model in (ChatRequest, ResponsesRequest):
        schema = model.model_json_schema(ref_template="#/components/schemas/OpenAI{model}")
        out.update({f"OpenAI{name}": definition for name, definition in schema.pop("$defs", {}).items()})
        if model_id is not None:
            schema["properties"]["model"]["enum"] = [model_id]
        out[f"OpenAI{model.__name__}"] = schema
    return out
