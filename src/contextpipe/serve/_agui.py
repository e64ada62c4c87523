"""The AG-UI event protocol (``ag-ui-protocol`` package) over a contextpipe run.

AG-UI clients post a ``RunAgentInput`` (thread id, run id, the conversation as they see it) and read
server-sent events. The thread id is the session id; the session keeps the history. Clients resend
the whole history each turn, so messages the session already holds are recognised by id (`agui_new`)
and only the user messages after them are the run's input.

The request's part in its run is an `AgUiRun`, one of the run's own providers: it puts the client's
shared state into the session (under `STATE_KEY`, for the tools) and its context entries into the
prompt. The stream tells the client the state the run starts from (``STATE_SNAPSHOT``) and, once
the run is over, what its tools changed (``STATE_DELTA``, `json_patch`).
"""

from __future__ import annotations

import base64
import copy
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from .._run.hooks import BeforeInput
from ..approvals import Decision, approve, reject
from ..errors import UsageError
from ..messages import DataPart, Message, Part, TextPart, UriPart
from ..providers.base import ContextProvider
from ._agui_rewind import INPUT_KEY, AgUiRewind, settle
from ._agui_tools import TOOL_NAME, client_call_events
from ._json import HTTPError
from ._openai_requests import image_part
from ._requests import BASE64, DIGEST, RULES, SESSION_ID, URI, validate

if TYPE_CHECKING:
    from .._run.writer import StepWriter
    from ..agent import Agent
    from ..pipeline import RunContext
    from ..session import Session

__all__ = ["MAX_STATE_BYTES", "STATE_KEY", "AgUiRun", "agui_decisions", "agui_events", "agui_input", "agui_known",
           "agui_new", "agui_schemas", "check_state_key", "json_patch"]

STATE_KEY: Final = "ag-ui.state"
"""The session state key the AG-UI client's shared state is kept under; a tool reads and changes it
with ``ctx.state(ProviderState(STATE_KEY, Model))``."""
MAX_STATE_BYTES: Final = 256 * 1024
"""The largest shared state a request may send, in bytes of compact UTF-8 JSON."""
IMAGE_TYPE: Final = r"^image/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$"
"""An image's media type (``image/png``)."""


def _require() -> Any:
    try:
        from ag_ui import core
    except ImportError:
        raise UsageError('the AG-UI protocol needs the ag-ui-protocol package: pip install "contextpipe[serve]"') \
            from None
    return core


def agui_schemas() -> dict[str, Any]:
    """Return the JSON Schemas of ``RunAgentInput`` and its parts (``AgUi...``), as `agui_input` validates it.

    It is the protocol's own schema (``ag-ui-protocol``'s models, camelCase names only) with the rules
    `agui_input` adds: ``threadId`` is a session id, ``state`` an object, and a user message holds
    text and images (``AgUiUserImagePart``: base64 bytes, or a URL) only, and a front-end tool has a
    tool's name and the schema of an object (or none) as its parameters.
    """
    core = _require()
    schema = core.RunAgentInput.model_json_schema(by_alias=True, ref_template="#/components/schemas/AgUi{model}")
    out = {f"AgUi{name}": definition for name, definition in schema.pop("$defs", {}).items()}
    schema["properties"]["threadId"] = {"type": "string", "pattern": SESSION_ID,
                                        "description": "The session id: " + RULES[SESSION_ID]}
    schema["properties"]["state"] = {"anyOf": [{"type": "object"}, {"type": "null"}], "default": None, "description":
                                     f"The shared state the run starts from (at most {MAX_STATE_BYTES} bytes of JSON); "
                                     "absent or null: the session's."}
    out["AgUiRunAgentInput"] = schema
    out["AgUiTool"]["properties"]["name"] |= {"pattern": TOOL_NAME, "description": "1-64 letters, digits, _ or -."}
    out["AgUiTool"]["properties"]["parameters"] = {"anyOf": [
        {"type": "object", "properties": {"type": {"const": "object"}}}, {"type": "null"}], "default": None,
        "description": "The JSON schema of the arguments: an object's (or null: none)."}
    _user_images(out)
    _require_tags(out, out)
    return out


def _user_images(schemas: dict[str, Any]) -> None:
    """Narrow the parts of a user message to text and ``AgUiUserImagePart`` (tool messages keep the protocol's)."""
    ref = "#/components/schemas/AgUi{}".format
    data, url = copy.deepcopy(schemas["AgUiDataSource"]), copy.deepcopy(schemas["AgUiUrlSource"])
    data["properties"]["value"] |= {"pattern": BASE64, "minLength": 1}
    data["properties"]["mimeType"] |= {"pattern": IMAGE_TYPE}
    url["properties"]["value"] |= {"pattern": URI}
    url["properties"]["mimeType"]["anyOf"][0] |= {"pattern": IMAGE_TYPE}
    image = copy.deepcopy(schemas["AgUiImagePart"])
    image["description"] = "An image of a user message: its bytes (standard base64) or its URL."
    image["properties"]["source"] = {"oneOf": [{"$ref": ref("UserImageData")}, {"$ref": ref("UserImageUrl")}],
                                     "discriminator": {"propertyName": "type", "mapping": {
                                         "data": ref("UserImageData"), "url": ref("UserImageUrl")}}}
    schemas.update(AgUiUserImagePart=image, AgUiUserImageData=data, AgUiUserImageUrl=url)
    schemas["AgUiUserMessage"]["properties"]["content"]["anyOf"][1]["items"] = {
        "oneOf": [{"$ref": ref("TextPart")}, {"$ref": ref("UserImagePart")}],
        "discriminator": {"propertyName": "type", "mapping": {"text": ref("TextPart"), "image": ref("UserImagePart")}}}


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
    """Validate a ``RunAgentInput`` body strictly (`agui_schemas`) and return it (`agui_new` finds its input).

    Beyond the protocol's schema: its state is a JSON object (or absent) of at most `MAX_STATE_BYTES`,
    and its user messages hold text and images (bytes in base64, or a URL) only.
    """
    core = _require()
    run_input = validate(core.RunAgentInput, body, strict=True, by_alias=True, by_name=False)
    if not re.fullmatch(SESSION_ID, run_input.thread_id):
        raise HTTPError(400, "BadRequest", f"invalid request: threadId: must be {RULES[SESSION_ID]}")
    _check_state(run_input.state)
    for i, m in enumerate(run_input.messages):  # the held ones too: what passes is what the schema says
        if getattr(m, "role", None) == "user" and not isinstance(m.content, str):
            for j, part in enumerate(m.content):
                _check_part(part, f"messages[{i}].content[{j}]")
    return run_input


def _check_state(state: Any) -> None:
    """Raise a 400 `HTTPError` for a shared state that is not a JSON object (or null), or is over `MAX_STATE_BYTES`."""
    if state is None:
        return
    if not isinstance(state, dict):
        kind = "an array" if isinstance(state, list) else "a string" if isinstance(state, str) else "a scalar"
        raise _bad(f"state: must be a JSON object (or left out: the session's state is kept), not {kind}")
    size = len(json.dumps(state, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_STATE_BYTES:
        raise _bad(f"state: {size} bytes of JSON, over the {MAX_STATE_BYTES} the session keeps: keep bulky data "
                   "out of the shared state")


def _check_part(part: Any, where: str) -> None:
    """Raise a 400 `HTTPError` for a part of a user message no run can read: only text and images are read."""
    if part.type == "text":
        return
    if part.type != "image":
        raise _bad(f"{where}: {part.type} parts are not read here: send text and image parts")
    source = part.source
    if source.type not in ("data", "url"):
        raise _bad(f"{where}.source: a {source.type} source (a handle at a model provider) cannot be read here: "
                   "send the image's bytes (a data source) or its URL")
    if source.mime_type is not None and not re.fullmatch(IMAGE_TYPE, source.mime_type):
        raise _bad(f"{where}.source.mimeType: must be an image's media type, like image/png")
    if source.type == "url" and not re.fullmatch(URI, source.value):
        raise _bad(f"{where}.source.value: must be {RULES[URI]}")
    if source.type == "data" and not (source.value and re.fullmatch(BASE64, source.value)):
        raise _bad(f"{where}.source.value: must be the image's bytes in {RULES[BASE64]}")


def _bad(problem: str) -> HTTPError:
    return HTTPError(400, "BadRequest", f"invalid request: {problem}")


def _user(m: Any) -> Message:
    """Return the contextpipe message of a user message (checked by `agui_input`): its text and images, in order.

    It is marked as AG-UI input (`INPUT_KEY`): only such a message may be regenerated or edited (`serve._agui_rewind`).
    """
    content = m.content
    if isinstance(content, str):
        return Message.user(content, id=m.id, metadata={INPUT_KEY: True})
    parts: list[Part] = []
    for part in content:
        if part.type == "image":
            parts.append(_image(part.source))
        elif parts and isinstance(parts[-1], TextPart):  # text after text is one part, as it was before images
            parts[-1] = TextPart(parts[-1].text + part.text)
        else:
            parts.append(TextPart(part.text))
    return Message("user", tuple(parts) or (TextPart(""),), id=m.id, metadata={INPUT_KEY: True})


def _image(source: Any) -> DataPart | UriPart:
    if source.type == "data":
        return DataPart(base64.b64decode(source.value), source.mime_type)
    return UriPart(source.value, source.mime_type) if source.mime_type is not None else image_part(source.value)


def _trailing_users(messages: list[Any]) -> list[Message]:
    new: list[Message] = []
    for m in reversed(messages):
        if getattr(m, "role", None) != "user":
            break
        new.append(_user(m))
    new.reverse()
    return new


async def agui_known(run_input: Any, known: Callable[[str], Awaitable[bool]]) -> int:
    """Return the index of the last message of ``run_input`` the session holds (`known` by id); -1 for none."""
    messages = run_input.messages
    for i in range(len(messages) - 1, -1, -1):
        if await known(messages[i].id):
            return i
    return -1


def agui_new(run_input: Any, at: int, *, answering: bool = False) -> list[Message]:
    """Return the user messages of ``run_input`` to run on, given the last message the session holds (`agui_known`).

    The messages after it are new: their user messages are the input (other roles there, such as
    the assistant messages the client names itself, are not stored). When nothing after it is a
    user message, the last user message up to the known one is returned again, so the run is
    answered from the log (a retry) instead of answering twice; not when the request is `answering`
    client tools' calls (`serve._agui_tools`). When the session knows none, the trailing user
    messages are the input.
    """
    messages = run_input.messages
    if at < 0:
        return _trailing_users(messages)
    new = [_user(m) for m in messages[at + 1:] if getattr(m, "role", None) == "user"]
    if not new and not answering:  # the last user message up to the known one (a stored call's message is known)
        new = _trailing_users([m for m in messages[:at + 1] if getattr(m, "role", None) == "user"])[-1:]
    return new


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


class AgUiRun(ContextProvider, BeforeInput):
    """One AG-UI request's part in its run, given to it as one of the run's own providers (``Agent.run(providers=)``).

    Once the run holds the session's lease, before its input is looked up, it records the run's
    ``runId`` and regenerates or edits when the request does (`rewind`; `serve._agui_rewind.settle`;
    only with ``ServeSettings.agui_rewinds``).
    Before the run, under the lease, it stores the client's shared `state` in the session
    (under `STATE_KEY`; None keeps the session's) and adds the request's `context` entries to the
    prompt, as context from source ``ag-ui`` (for this run only: they are not stored).
    """

    kind = "ag-ui"

    def __init__(self, run_input: Any, stored: Session, rewind: AgUiRewind | None = None, *,
                 rewinds: bool = False) -> None:
        super().__init__("ag-ui")
        self.run_id: str = run_input.run_id
        self.rewinds = rewinds
        """``ServeSettings.agui_rewinds``: off, the run's ``runId`` is not recorded and nothing is rewound."""
        self.rewind = rewind
        """What the request may regenerate or edit (`serve._agui_rewind.agui_plan`); None: neither."""
        state = run_input.state
        self.state: dict[str, Any] | None = state
        """The state the client sent; None when it sent none."""
        self.snapshot = copy.deepcopy(state if state is not None else _shared(stored))
        """The state the client is told the run starts from (``STATE_SNAPSHOT``)."""
        self.context = [Message.user(f"Context from the application ({c.description}):\n{c.value}")
                        for c in run_input.context or ()]
        """The request's context entries, one message each."""
        self.session: Session | None = None
        """The session of the run, once it started (a retry answered from the log never does)."""

    async def before_input(self, writer: StepWriter, input: list[Message]) -> list[Message]:
        """Record the run's ``runId`` and regenerate or edit when the request does; return the run's input."""
        return await settle(writer, self.run_id, self.rewind, input) if self.rewinds else input

    async def before_run(self, ctx: RunContext) -> None:
        """Store the client's state in the run's session, and add the context entries."""
        self.session = ctx.session
        if ctx.session is not None and self.state is not None:
            ctx.session.state[STATE_KEY] = self.state
        ctx.add_messages(self.context)

    def delta(self) -> list[dict[str, Any]]:
        """Return what the run changed in the shared state, against `snapshot` (empty: nothing, or it never started).

        Read once the run is over: tools change the state from worker threads while it runs.
        """
        return json_patch(self.snapshot, _shared(self.session)) if self.session is not None else []


def _shared(session: Session) -> Any:
    return session.state_to_json().get(STATE_KEY, {})


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """Return a JSON Patch (RFC 6902) turning JSON value `old` into `new`: objects key by key, other values whole.

    >>> for op in json_patch({"a": 1, "b": [1], "c": {"d": 0}}, {"b": [1, 2], "c": {"d": 0, "e/f": None}}):
    ...     print(op)
    {'op': 'remove', 'path': '/a'}
    {'op': 'replace', 'path': '/b', 'value': [1, 2]}
    {'op': 'add', 'path': '/c/e~1f', 'value': None}
    """
    if not (isinstance(old, dict) and isinstance(new, dict)):
        same = json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)  # 1 == True, but not in JSON
        return [] if same else [{"op": "replace", "path": path, "value": new}]
    ops: list[dict[str, Any]] = [{"op": "remove", "path": _pointer(path, key)} for key in old if key not in new]
    for key, value in new.items():
        ops += json_patch(old[key], value, _pointer(path, key)) if key in old else \
            [{"op": "add", "path": _pointer(path, key), "value": value}]
    return ops


def _pointer(path: str, key: str) -> str:
    return f"{path}/{key.replace('~', '~0').replace('/', '~1')}"


def check_state_key(agent: Agent) -> None:
    """Raise `UsageError` when a provider of `agent` keeps its own state under `STATE_KEY` (the client's)."""
    from ..session import ProviderState

    for p in agent.providers:
        if STATE_KEY in p.state_keys or any(state.key == STATE_KEY for state in ProviderState.held_by(p)):
            raise UsageError(f"{p!r} uses session state key {STATE_KEY!r}, which the AG-UI route keeps the "
                             "client's shared state under; give the provider a key of its own")


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


async def agui_events(run_input: Any, events: AsyncIterator[tuple[str, dict[str, Any]]],
                      run: AgUiRun) -> AsyncIterator[str]:
    """Translate contextpipe's ``(name, payload)`` run events into encoded AG-UI events.

    The state the run starts from is sent after ``RUN_STARTED``; what its tools changed, before the
    run's last event (``RUN_FINISHED`` or ``RUN_ERROR``).
    """
    core = _require()
    from ag_ui.encoder import EventEncoder

    encoder = EventEncoder()
    thread_id, run_id = run_input.thread_id, run_input.run_id
    yield encoder.encode(core.RunStartedEvent(thread_id=thread_id, run_id=run_id))
    yield encoder.encode(core.StateSnapshotEvent(snapshot=run.snapshot))
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
        elif name in ("done", "error"):
            delta = run.delta()
            if delta:
                yield encoder.encode(core.StateDeltaEvent(delta=delta))
            for event in _finished(core, run_input, payload) if name == "done" else \
                    [core.RunErrorEvent(message=payload["error"]["message"], code=payload["error"]["type"])]:
                yield encoder.encode(event)


def _finished(core: Any, run_input: Any, payload: dict[str, Any]) -> list[Any]:
    """Return the events that end a finished run: its answer when it was answered from the log, ``RUN_FINISHED``."""
    out = []
    if payload.get("replayed") and payload["text"]:  # a retry answered from the log streamed nothing
        replay_id = f"msg-{uuid.uuid4().hex}"
        out = [core.TextMessageStartEvent(message_id=replay_id, role="assistant"),
               core.TextMessageContentEvent(message_id=replay_id, delta=payload["text"]),
               core.TextMessageEndEvent(message_id=replay_id)]
    result = {"text": payload["text"], "stop_reason": payload["stop_reason"]}
    if "repaired" in payload:  # the answer held what JSON cannot carry (see `_json.clean`)
        result["repaired"] = payload["repaired"]
    pending = payload.get("pending_approvals") or []
    out += client_call_events(core, pending)  # the client runs those: it gets them as calls
    asked = [p for p in pending if not p.get("client")]
    outcome = _interrupts(core, asked) if asked else core.RunFinishedSuccessOutcome(
        pending_tool_call_ids=[p["call_id"] for p in pending]) if pending else None  # asked: an interrupt
    out.append(core.RunFinishedEvent(thread_id=run_input.thread_id, run_id=run_input.run_id, result=result,
                                     outcome=outcome))
    return out
