"""What the vendors' APIs accept in a request: one home for validating a request body.

Two kinds of check, named for their contract:

- ``*_request_problem(body) -> str | None`` (and `responses_request_items`) are hand-written from the
  APIs' documented rules and error messages. They return the message the real API answers 400 with,
  or None; `FakeOpenAIServer` and `FakeAnthropicServer` answer with them.
- ``assert_*_request(body)`` validate `body` against the request types of the official SDKs
  (``openai``, ``anthropic``: their TypedDicts, through pydantic) and raise when it does not fit them.

The hand-written checks know what the types cannot say (every ``tool_calls`` answered at once,
thinking signatures, reasoning items sent back with their encrypted content); the SDK types catch
what a hand-written list forgets. The tests run both over what the model clients send.

>>> chat_request_problem({"messages": [{"role": "tool", "content": "4", "tool_call_id": "c1"}]})
"Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
>>> assert_chat_request({"model": "gpt-fake", "messages": [{"role": "user", "content": "Hi"}]})
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import pydantic

__all__ = [
    "assert_chat_request",
    "assert_messages_request",
    "assert_responses_request",
    "chat_request_problem",
    "message_blocks",
    "messages_request_problem",
    "responses_request_items",
    "signature_for",
]


# --- chat completions ---------------------------------------------------------------------------------------


def _image_url(url: Any) -> bool:
    """Whether `url` is what the APIs take for an image: http(s), or a base64 data URL of an image type."""
    if not isinstance(url, str):
        return False
    if url.startswith(("https://", "http://")):
        return True
    return bool(re.fullmatch(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/]*={0,2}", url))


_CHAT_PARTS = {"user": ("text", "image_url", "input_audio", "file"), "system": ("text",), "developer": ("text",),
               "tool": ("text",), "assistant": ("text", "refusal")}


def chat_request_problem(body: dict[str, Any]) -> str | None:
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
        problem = _chat_content_problem(message, n)
        if problem:
            return problem
        if role == "assistant":
            open_calls = {c.get("id") for c in message.get("tool_calls") or ()}
    return None


def _chat_content_problem(message: dict[str, Any], n: int) -> str | None:
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


# --- Responses API ------------------------------------------------------------------------------------------

Lookup: TypeAlias = Callable[[str], Any]
"""Finds what a server issued under an id (a stored response's items, a reasoning item's encrypted content), or None."""


def _nothing(_: str) -> None:
    return None


def responses_request_items(body: dict[str, Any], *, stored: Lookup = _nothing,
                            issued: Lookup = _nothing) -> tuple[list[dict[str, Any]], str | None]:
    """Return the full item list of a Responses request, and what the real API would reject in it.

    `stored` finds the item list of a stored response by id (for ``previous_response_id``), `issued`
    the encrypted content the server issued for a reasoning item id; by default neither finds any.
    The list is empty when there is a problem.
    """
    if not isinstance(body.get("model"), str):
        return [], "Missing required parameter: 'model'."
    raw = body.get("input", [])
    items: list[dict[str, Any]] = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
    previous = body.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous is not None:
        found = stored(previous)
        if found is None:
            return [], f"Previous response with id '{previous}' not found."
        history = list(found)
    if not all(_is_function_tool(tool) for tool in body.get("tools") or ()):
        return [], "Invalid tool: Responses API function tools are {type: 'function', name, parameters}."
    calls = {i.get("call_id") for i in history if i.get("type") == "function_call"}
    for n, item in enumerate(items):
        check = _ITEM_CHECKS.get(item.get("type", "message"))
        problem = check(issued, body, items, n, calls) if check is not None else \
            f"Invalid value: '{item.get('type')}' for 'input[{n}].type'."
        if problem:
            return [], problem
    return history + items, None


def _is_function_tool(tool: dict[str, Any]) -> bool:
    """Whether `tool` has the Responses API's flat function tool shape (no nested ``function`` object)."""
    return tool.get("type") == "function" and bool(tool.get("name")) and "function" not in tool


_Items: TypeAlias = list[dict[str, Any]]


def _item_message(issued: Lookup, body: dict[str, Any], items: _Items, n: int, calls: set[Any]) -> str | None:
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
    return next((p for j, part in enumerate(content) if (p := _input_part_problem(part, f"input[{n}].content[{j}]"))),
                None)


def _item_call(issued: Lookup, body: dict[str, Any], items: _Items, n: int, calls: set[Any]) -> str | None:
    item = items[n]
    if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
        return f"Missing required parameter in 'input[{n}]' (call_id, name, arguments)."
    calls.add(item["call_id"])
    return None


def _item_output(issued: Lookup, body: dict[str, Any], items: _Items, n: int, calls: set[Any]) -> str | None:
    item = items[n]
    if item.get("call_id") not in calls:
        return f"No tool call found for function call output with call_id {item.get('call_id')}."
    output = item.get("output")
    if not isinstance(output, str | list):
        return f"Missing required parameter: 'input[{n}].output'."
    for j, part in enumerate(output if isinstance(output, list) else ()):
        problem = _input_part_problem(part, f"input[{n}].output[{j}]")
        if problem:
            return problem
    return None


_INPUT_PARTS = ("input_text", "input_image", "input_file")


def _input_part_problem(part: Any, where: str) -> str | None:
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


def _item_reasoning(issued: Lookup, body: dict[str, Any], items: _Items, n: int, calls: set[Any]) -> str | None:
    item = items[n]
    content = issued(str(item.get("id")))
    if content is None or (item.get("encrypted_content") != content and not body.get("store", True)):
        return (f"Item with id '{item.get('id')}' not found. Items are not persisted when `store` is set to false; "
                "send the reasoning item with its encrypted_content.")
    if not isinstance(item.get("summary"), list):
        return f"Missing required parameter: 'input[{n}].summary'."
    following = items[n + 1] if n + 1 < len(items) else None
    if following is None or following.get("type") == "reasoning" or following.get("role") == "user":
        return f"Item '{item.get('id')}' of type 'reasoning' was provided without its required following item."
    return None


_ITEM_CHECKS: dict[str, Callable[[Lookup, dict[str, Any], _Items, int, set[Any]], str | None]] = {
    "message": _item_message, "function_call": _item_call, "function_call_output": _item_output,
    "reasoning": _item_reasoning,
}


# --- Messages API (Anthropic) -------------------------------------------------------------------------------

_SECRET = b"contextpipe-fake-anthropic"


def signature_for(thinking: str) -> str:
    """Return the signature the fake server gives a thinking block (and expects back unchanged)."""
    return "sig_" + hmac.new(_SECRET, thinking.encode(), hashlib.sha256).hexdigest()[:32]


def messages_request_problem(body: dict[str, Any], redacted: set[str] | frozenset[str] = frozenset()) -> str | None:
    """Return what the real Messages API would reject in `body`, or None when it is valid.

    Thinking blocks must carry the `signature_for` their text; `redacted` holds the data of the
    ``redacted_thinking`` blocks the server issued.
    """
    problem = _check_top(body) or _check_tools_and_system(body)
    if problem:
        return problem
    messages = body["messages"]
    thinking_on = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
    pending: set[str] = set()
    for i in range(len(messages)):
        problem, pending = _message_problem(i, messages, pending, redacted)
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
    first = message_blocks(message)[0].get("type")
    if first in ("thinking", "redacted_thinking"):
        return None
    return (f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. When "
            "`thinking` is enabled, a final `assistant` message must start with a thinking block")


def _check_breakpoints(body: dict[str, Any]) -> str | None:
    system = body.get("system")
    marked = [*(body.get("tools") or ()), *(system if isinstance(system, list) else ()),
              *(b for m in body["messages"] for b in message_blocks(m))]
    breakpoints = sum(1 for b in marked if isinstance(b, dict) and b.get("cache_control"))
    if breakpoints > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
    return None


def message_blocks(message: dict[str, Any]) -> Any:
    """Return a Messages API message's content as blocks (a string content is one text block)."""
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


def _message_problem(i: int, messages: list[dict[str, Any]], pending: set[str],
                     redacted: set[str] | frozenset[str]) -> tuple[str | None, set[str]]:
    """Check message `i` given the tool calls left open before it; return a problem and the calls it opens."""
    message = messages[i]
    role = message.get("role")
    if role not in ("user", "assistant"):
        return f"messages.{i}.role: Input should be 'user' or 'assistant'", pending
    if (i == 0 and role != "user") or (i and messages[i - 1].get("role") == role):
        return f"messages.{i}: roles must alternate between \"user\" and \"assistant\", starting with \"user\"", pending
    blocks = message_blocks(message)
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


def _check_block(where: str, role: str, block: dict[str, Any], redacted: set[str] | frozenset[str]) -> str | None:
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


def _check_result_content(where: str, content: Any, redacted: set[str] | frozenset[str]) -> str | None:
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


# --- the SDKs' request types --------------------------------------------------------------------------------


def _force(value: Any) -> Any:
    """Consume pydantic's lazy validators (``Iterable[...]`` fields) so every nested item is checked."""
    if isinstance(value, dict):
        return {k: _force(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_force(v) for v in value]
    if type(value).__name__ == "ValidatorIterator":
        return [_force(v) for v in value]
    return value


@cache
def _adapter(kind: str) -> pydantic.TypeAdapter[Any]:
    """Return the pydantic adapter of an SDK's non-streaming request type (the SDK is imported on first use)."""
    import pydantic

    if kind == "chat":
        from openai.types.chat import completion_create_params

        return pydantic.TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)
    if kind == "responses":
        from openai.types.responses import response_create_params

        return pydantic.TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)
    from anthropic.types import message_create_params

    return pydantic.TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)


def assert_chat_request(body: dict[str, Any]) -> None:
    """Raise when `body` is not a valid chat completions request (``openai`` SDK types)."""
    _force(_adapter("chat").validate_python({k: v for k, v in body.items() if k not in ("stream", "stream_options")}))


def assert_responses_request(body: dict[str, Any]) -> None:
    """Raise when `body` is not a valid Responses API request (``openai`` SDK types)."""
    _force(_adapter("responses").validate_python({k: v for k, v in body.items() if k != "stream"}))


def assert_messages_request(body: dict[str, Any]) -> None:
    """Raise when `body` is not a valid Messages API request (``anthropic`` SDK types)."""
    _force(_adapter("messages").validate_python({k: v for k, v in body.items() if k != "stream"}))
