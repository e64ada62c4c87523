"""The AG-UI event protocol (``ag-ui-protocol`` package) over a contextpipe run.

AG-UI clients post a ``RunAgentInput`` (thread id, run id, the conversation as they see it) and read
server-sent events. The thread id is the session id; the session keeps the history, so only the
user messages after the client's last non-user message are taken as the run's input.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from ..errors import UsageError
from ..messages import Message

__all__ = ["agui_events", "agui_input"]


def _require() -> Any:
    try:
        from ag_ui import core
    except ImportError:
        raise UsageError('the AG-UI protocol needs the ag-ui-protocol package: pip install "contextpipe[serve]"') \
            from None
    return core


def agui_input(body: dict[str, Any]) -> tuple[Any, list[Message]]:
    """Validate a ``RunAgentInput`` body; return it and the new user messages to run on."""
    core = _require()
    import pydantic

    try:
        run_input = core.RunAgentInput.model_validate(body)
    except pydantic.ValidationError as exc:
        raise UsageError(f"not a valid AG-UI RunAgentInput: {exc.errors(include_url=False)}") from None
    new: list[Message] = []
    for m in reversed(run_input.messages):
        if getattr(m, "role", None) != "user":
            break
        content = m.content
        if not isinstance(content, str):
            content = "".join(getattr(part, "text", "") or "" for part in content)
        new.append(Message.user(content, id=m.id))
    new.reverse()
    return run_input, new


async def agui_events(run_input: Any, events: AsyncIterator[tuple[str, dict[str, Any]]]) -> AsyncIterator[str]:
    """Translate contextpipe's ``(name, payload)`` run events into encoded AG-UI events."""
    core = _require()
    from ag_ui.encoder import EventEncoder

    encoder = EventEncoder()
    thread_id, run_id = run_input.thread_id, run_input.run_id
    yield encoder.encode(core.RunStartedEvent(thread_id=thread_id, run_id=run_id))
    text_id: str | None = None
    async for name, payload in events:
        if name == "text_delta":
            if text_id is None:
                text_id = f"msg-{uuid.uuid4().hex}"
                yield encoder.encode(core.TextMessageStartEvent(message_id=text_id, role="assistant"))
            if payload["text"]:
                yield encoder.encode(core.TextMessageContentEvent(message_id=text_id, delta=payload["text"]))
            continue
        if text_id is not None:
            yield encoder.encode(core.TextMessageEndEvent(message_id=text_id))
            text_id = None
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
            yield encoder.encode(core.RunFinishedEvent(thread_id=thread_id, run_id=run_id,
                                                       result={"text": payload["text"],
                                                               "stop_reason": payload["stop_reason"]}))
        elif name == "error":
            error = payload["error"]
            yield encoder.encode(core.RunErrorEvent(message=error["message"], code=error["type"]))
