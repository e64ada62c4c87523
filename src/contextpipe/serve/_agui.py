"""The AG-UI event protocol (``ag-ui-protocol`` package) over a contextpipe run.

AG-UI clients post a ``RunAgentInput`` (thread id, run id, the conversation as they see it) and read
server-sent events. The thread id is the session id; the session keeps the history. Clients resend
the whole history each turn, so messages the session already holds are recognised by id (`agui_new`)
and only the user messages after them are the run's input.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from ..approvals import Decision, approve, reject
from ..errors import UsageError
from ..messages import Message
from ._json import HTTPError
from ._requests import DIGEST, RULES, SESSION_ID, validate

__all__ = ["agui_decisions", "agui_events", "agui_input", "agui_new", "agui_schemas"]


def _require() -> Any:
    try:
        from ag_ui import core
    except ImportError:
        raise UsageError('the AG-UI protocol needs the ag-ui-protocol package: pip install "contextpipe[serve]"') \
            from None
    return core


def agui_schemas() -> dict[str, Any]:
    """Return the JSON Schemas of ``RunAgentInput`` and its parts (``AgUi...``), as `agui_input` validates it.

    It is the protocol's own schema (``ag-ui-protocol``'s models, camelCase names only) with one rule
    added: ``threadId`` is a session id.
    """
    core = _require()
    schema = core.RunAgentInput.model_json_schema(by_alias=True, ref_template="#/components/schemas/AgUi{model}")
    out = {f"AgUi{name}": definition for name, definition in schema.pop("$defs", {}).items()}
    schema["properties"]["threadId"] = {"type": "string", "pattern": SESSION_ID,
                                        "description": "The session id: " + RULES[SESSION_ID]}
    out["AgUiRunAgentInput"] = schema
    _require_tags(out, out)
    return out


def _require_tags(node: Any, schemas: dict[str, Any]) -> None:
    """Make each tag of a discriminated union required, as pydantic's validation needs it.

    pydantic leaves a tag with a default (``"role": "user"``) out of ``required``, so the schema
    alone would take a message without its role that validation refuses.
    """
    if isinstance(node, dict):
        discriminator = node.get("discriminator")
        if isinstance(discriminator, dict):
            for ref in discriminator["mapping"].values():
                target = schemas[ref.rsplit("/", 1)[1]]
                target["required"] = sorted({*target.get("required", ()), discriminator["propertyName"]})
        for value in node.values():
            _require_tags(value, schemas)
    elif isinstance(node, list):
        for value in node:
            _require_tags(value, schemas)


def agui_input(body: Any) -> Any:
    """Validate a ``RunAgentInput`` body strictly (`agui_schemas`) and return it (`agui_new` finds its input)."""
    core = _require()
    run_input = validate(core.RunAgentInput, body, strict=True, by_alias=True, by_name=False)
    if not re.fullmatch(SESSION_ID, run_input.thread_id):
        raise HTTPError(400, "BadRequest", f"invalid request: threadId: must be {RULES[SESSION_ID]}")
    return run_input


def _user(m: Any) -> Message:
    content = m.content
    if not isinstance(content, str):
        content = "".join(getattr(part, "text", "") or "" for part in content)
    return Message.user(content, id=m.id)


def _trailing_users(messages: list[Any]) -> list[Message]:
    new: list[Message] = []
    for m in reversed(messages):
        if getattr(m, "role", None) != "user":
            break
        new.append(_user(m))
    new.reverse()
    return new


async def agui_new(run_input: Any, known: Callable[[str], Awaitable[bool]]) -> list[Message]:
    """Return the user messages of ``run_input`` to run on, given which message ids the session holds.

    The messages after the last one the session knows are new: their user messages are the input
    (other roles there, such as the assistant messages the client names itself, are not stored).
    When nothing after it is a user message and the known one is a user message, that one is
    returned again, so the run is answered from the log (a retry, or a history that ends with a
    tool result) instead of answering twice. When the session knows none, the trailing user
    messages are the input.
    """
    messages = run_input.messages
    for i in range(len(messages) - 1, -1, -1):
        if await known(messages[i].id):
            new = [_user(m) for m in messages[i + 1:] if getattr(m, "role", None) == "user"]
            if not new and getattr(messages[i], "role", None) == "user":
                new = [_user(messages[i])]
            return new
    return _trailing_users(messages)


def agui_decisions(run_input: Any) -> dict[str, Decision] | None:
    """Return the decisions a ``resume`` carries on the calls awaiting approval (None: it carries none).

    Each entry answers the interrupt of one call (its ``interruptId`` is the call id):
    ``"resolved"`` with a payload ``{"approved": true}`` (``"always": true`` also allows the tool
    from now on in the session) runs the call; ``{"approved": false, "reason": "..."}`` or
    ``"cancelled"`` answers it as rejected, with the reason, for the model to read.
    """
    if not run_input.resume:
        return None
    out: dict[str, Decision] = {}
    for i, entry in enumerate(run_input.resume):
        if entry.interrupt_id in out:
            raise _unfit(f"resume[{i}]: interrupt {entry.interrupt_id!r} is answered twice: answer each once")
        payload = entry.payload if entry.payload is not None else {}
        if entry.status == "cancelled":
            out[entry.interrupt_id] = reject(_reason(payload, i) or "the user cancelled the call")
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
            raise _unfit(f"resume[{i}].payload: answer a tool approval with "
                            "{\"approved\": true} or {\"approved\": false, \"reason\": \"...\"}")
        digest = payload.get("digest")
        if digest is not None and not (isinstance(digest, str) and re.fullmatch(DIGEST, digest)):
            raise _unfit(f"resume[{i}].payload.digest: must be {RULES[DIGEST]}")
        always = payload.get("always", False)
        if not isinstance(always, bool):
            raise _unfit(f"resume[{i}].payload.always: must be true or false")
        out[entry.interrupt_id] = approve(digest=digest, always=always) if payload["approved"] else \
            reject(_reason(payload, i), digest=digest)
    return out


def _reason(payload: Any, i: int) -> str:
    reason = payload.get("reason", "") if isinstance(payload, dict) else ""
    if not isinstance(reason, str):
        raise _unfit(f"resume[{i}].payload.reason: must be text")
    return reason


def _unfit(problem: str) -> HTTPError:
    # A 409, as the request is well formed: the protocol lets a payload be any JSON value.
    return HTTPError(409, "ApprovalError", f"{problem}: nothing ran")


def _interrupts(core: Any, pending: list[dict[str, Any]]) -> Any:
    """Return the AG-UI interrupt outcome for the calls awaiting approval (`_runs.pending_to_json`)."""
    return core.RunFinishedInterruptOutcome(interrupts=[core.Interrupt(
        id=p["call_id"], reason="tool_approval", message=p["why"], tool_call_id=p["call_id"],
        response_schema=APPROVAL_ANSWER,
        metadata={"tool_name": p["tool_name"], "arguments": p["arguments"], "digest": p["digest"]})
        for p in pending])


APPROVAL_ANSWER: Final = {"type": "object", "required": ["approved"], "properties": {
    "approved": {"type": "boolean"}, "reason": {"type": "string"}, "always": {"type": "boolean"},
    "digest": {"type": "string", "pattern": DIGEST}}}
"""The payload a ``resume`` entry answers a tool approval with (see `agui_decisions`)."""


class _Stream:
    """The message being streamed: the answer's text (TEXT_MESSAGE_*) or the model's reasoning (REASONING_*)."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.kind: str | None = None
        self.id = ""

    def delta(self, kind: str, text: str) -> list[Any]:
        core, out = self.core, []
        if kind != self.kind:
            out = self.close()
            self.kind, self.id = kind, f"msg-{uuid.uuid4().hex}"
            if kind == "text_delta":
                out.append(core.TextMessageStartEvent(message_id=self.id, role="assistant"))
            else:
                out += [core.ReasoningStartEvent(message_id=self.id),
                        core.ReasoningMessageStartEvent(message_id=self.id, role="reasoning")]
        if text:  # the protocol refuses an empty delta
            content = core.TextMessageContentEvent if kind == "text_delta" else core.ReasoningMessageContentEvent
            out.append(content(message_id=self.id, delta=text))
        return out

    def close(self) -> list[Any]:
        core, kind, self.kind = self.core, self.kind, None
        if kind == "text_delta":
            return [core.TextMessageEndEvent(message_id=self.id)]
        if kind == "reasoning_delta":
            return [core.ReasoningMessageEndEvent(message_id=self.id), core.ReasoningEndEvent(message_id=self.id)]
        return []


async def agui_events(run_input: Any, events: AsyncIterator[tuple[str, dict[str, Any]]]) -> AsyncIterator[str]:
    """Translate contextpipe's ``(name, payload)`` run events into encoded AG-UI events."""
    core = _require()
    from ag_ui.encoder import EventEncoder

    encoder = EventEncoder()
    thread_id, run_id = run_input.thread_id, run_input.run_id
    yield encoder.encode(core.RunStartedEvent(thread_id=thread_id, run_id=run_id))
    stream = _Stream(core)
    async for name, payload in events:
        if name in ("text_delta", "reasoning_delta"):
            for event in stream.delta(name, payload["text"]):
                yield encoder.encode(event)
            continue
        for event in stream.close():
            yield encoder.encode(event)
        if name == "tool_call_started":
            call_id = payload["call_id"]
            yield encoder.encode(core.ToolCallStartEvent(tool_call_id=call_id, tool_call_name=payload["name"]))
            yield encoder.encode(core.ToolCallArgsEvent(tool_call_id=call_id, delta=payload["arguments"]))
            yield encoder.encode(core.ToolCallEndEvent(tool_call_id=call_id))
        elif name == "tool_call_finished":
            yield encoder.encode(core.ToolCallResultEvent(message_id=f"result-{payload['call_id']}",
                                                          tool_call_id=payload["call_id"], content=payload["result"],
                                                          role="tool"))
        elif name == "done":
            if payload.get("replayed") and payload["text"]:  # a retry answered from the log streamed nothing
                replay_id = f"msg-{uuid.uuid4().hex}"
                yield encoder.encode(core.TextMessageStartEvent(message_id=replay_id, role="assistant"))
                yield encoder.encode(core.TextMessageContentEvent(message_id=replay_id, delta=payload["text"]))
                yield encoder.encode(core.TextMessageEndEvent(message_id=replay_id))
            result = {"text": payload["text"], "stop_reason": payload["stop_reason"]}
            if "repaired" in payload:  # the answer held what JSON cannot carry (see `_json.clean`)
                result["repaired"] = payload["repaired"]
            pending = payload.get("pending_approvals") or []
            outcome = _interrupts(core, pending) if pending else None  # the calls wait for the user: an interrupt
            yield encoder.encode(core.RunFinishedEvent(thread_id=thread_id, run_id=run_id, result=result,
                                                       outcome=outcome))
        elif name == "error":
            error = payload["error"]
            yield encoder.encode(core.RunErrorEvent(message=error["message"], code=error["type"]))
