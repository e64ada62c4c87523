"""``/v1/sessions/{session_id}/cancel`` and ``.../export``: stop a session's run; take a whole session away.

``POST .../cancel`` stops the run in flight on the session in this server process
(`RunManager.cancel`): 202 ``{"cancelled": true, "run_id": ...}``. The run stops at its next safe
point, as on a disconnect with ``on_disconnect="cancel"``; its stream (or awaited answer) ends with a
``Cancelled`` error whose ``reason`` is ``request``. A run is a task of the process that started it:
with ``serve --workers N`` a cancel reaches only the runs of the worker that answers it. When none
runs here the session's lease tells the rest: held (a run on another worker or server) is a 409
``RunElsewhere``, free is a 404 ``NoRunInFlight``. Telling them apart takes the lease for an instant.

``GET .../export?format=json|markdown`` returns the session whole: as JSON, the session, every
message and every trace, each in the shape its own route returns, repaired per message where the
store holds what JSON cannot carry (`_json`); as Markdown, a transcript to read.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from starlette.requests import Request
from starlette.responses import Response

from ..codec import message_to_dict
from ..messages import DataPart, FunctionCall, FunctionResult, Message, ReasoningPart, TextPart, UnknownPart, UriPart
from ._json import HTTPError, clean, json_response

if TYPE_CHECKING:
    from ..session import Session
    from ..stores import Checkpoint, SessionStore
    from ._runs import RunManager

__all__ = ["FORMATS", "cancel_run", "export_session", "session_json", "transcript"]

FORMATS: Final = ("json", "markdown")
"""The formats ``GET .../export`` writes (``format=``; json when none is given)."""

PAGE: Final = 1000
"""Messages read from the store at a time by an export."""

_PROBE: Final = "contextpipe-serve-cancel-probe"
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_RUNS_ON: Final = re.compile(r"^[ \t]*(```|~~~|<)|^ {0,3}#{1,6}[ \t]+(system|user|assistant|tool) · seq", re.M)
"""A line that could make a message's text run on past its end (an unclosed fence or HTML block) or pass for
a message's heading: such text is quoted, and a quote ends where the text does."""


class _Api(Protocol):
    """What the routes need of the API (`serve._app._Api`)."""

    store: SessionStore

    def _writable(self) -> RunManager: ...

    async def _existing(self, request: Request, tenant: str, session_id: str) -> Any: ...


def session_json(session: Session, checkpoint: Checkpoint | None) -> dict[str, Any]:
    """Return the JSON form of a session (``GET /v1/sessions/{id}``) with its latest summary checkpoint."""
    data: dict[str, Any] = {"id": session.id, "version": session.version, "created_at": session.created_at,
                            "ttl": session.ttl, "state": session.state_to_json(), "checkpoint": None}
    if checkpoint is not None:
        data["checkpoint"] = {"seq": checkpoint.seq, "summary": message_to_dict(checkpoint.summary),
                              "created_at": checkpoint.created_at}
    return data


async def cancel_run(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Cancel the run in flight on the session in this process: 202, or 409 (it runs elsewhere) or 404 (idle)."""
    runs = api._writable()
    session = await api._existing(request, tenant, params[0])
    run = runs.cancel(tenant, session.id)
    if run is None:
        lease = await api.store.try_acquire_lease(tenant, session.id, _PROBE, ttl=10)
        if lease is not None:
            await api.store.release_lease(lease)
            raise HTTPError(404, "NoRunInFlight", f"nothing runs on session {session.id!r} in this server process, "
                            "and no other process holds the session: there is no run to cancel (it may have ended "
                            "just now). With several workers (serve --workers N), a cancel stops only the runs of "
                            "the worker that answers it; a run held by another one is answered 409 RunElsewhere")
        run = runs.cancel(tenant, session.id)  # it may have started here meanwhile
    if run is None:
        raise HTTPError(409, "RunElsewhere", f"a run holds session {session.id!r}, but not in this server process: "
                        "with several workers (serve --workers N) or servers, a cancel stops only the runs of the "
                        "process that answers it. Retry (each request may go to another worker), or wait for the "
                        "run to end", {"Retry-After": "1"})
    return json_response({"cancelled": True, "run_id": run.id}, 202)


async def export_session(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Return the whole session as JSON, or as a Markdown transcript (``format=markdown``)."""
    kind = request.query_params.get("format", "json")
    if kind not in FORMATS:
        raise HTTPError(400, "BadRequest", f"format must be one of {', '.join(FORMATS)}, got {kind[:40]!r}: send "
                        "format=json (the session, its messages and traces) or format=markdown (a transcript)")
    session = await api._existing(request, tenant, params[0])
    store = api.store
    checkpoint = await store.latest_checkpoint(tenant, session.id)
    messages = await _all_messages(store, tenant, session.id)
    name = f"{session.id}.{'json' if kind == 'json' else 'md'}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    if kind == "markdown":
        return Response(transcript(session, messages, checkpoint).encode("utf-8"), headers=headers,
                        media_type="text/markdown")
    traces = await store.load_traces(tenant, session.id)
    return json_response({"session": clean(session_json(session, checkpoint)),
                          "messages": [{"seq": seq, **message_to_dict(m)} for seq, m in messages],
                          "traces": traces}, headers=headers, items=("messages", "traces"))


async def _all_messages(store: SessionStore, tenant: str, session_id: str) -> list[tuple[int, Message]]:
    """Return every message of the session's log with its sequence, oldest first, read `PAGE` at a time."""
    pages: list[list[tuple[int, Message]]] = []
    before: int | None = None
    while True:
        page = await store.load(tenant, session_id, limit=PAGE, before=before)
        pages.append(list(enumerate(page.messages, page.first_seq)))
        if not page.has_more or not page.messages:
            break
        before = page.first_seq
    return [item for page_items in reversed(pages) for item in page_items]


# --- Markdown ----------------------------------------------------------------------------------------


def transcript(session: Session, messages: Sequence[tuple[int, Message]], checkpoint: Checkpoint | None) -> str:
    """Return a Markdown transcript of `messages` (sequence and message) of `session`.

    A header names the session, then each message is a ``### role · seq N`` section: its text, its
    tool calls' arguments and tool results in fences, images and files named (not inlined). It always
    renders: text that is not Unicode (a lone surrogate) is shown as U+FFFD, with a note.
    """
    head = [f"# Session {_code(session.id)}", "", f"- id: {_code(session.id)}",
            f"- created: {_when(session.created_at)}", f"- version: {session.version}", f"- messages: {len(messages)}"]
    if checkpoint is not None:
        head.append(f"- latest summary checkpoint: after seq {checkpoint.seq}")
    body: list[str] = []
    for seq, message in messages:
        body += ["", f"### {message.role} · seq {seq}", ""]
        if message.author_name is not None:
            body += [f"*{_plain(message.author_name)}:*", ""]
        body.append("\n\n".join([_part(part) for part in message.parts] or ["*(no content)*"]))
    text = "\n".join(body) + "\n"
    if _SURROGATE.search(text):
        head += ["", "> Some stored text is not Unicode (lone surrogates): each such character is shown as U+FFFD."]
        text = _SURROGATE.sub("\ufffd", text)
    return "\n".join(head) + "\n" + text


def _part(part: object) -> str:
    if isinstance(part, TextPart):
        return _text(part.text)
    if isinstance(part, FunctionCall):
        return f"Tool call {_code(part.name)} (call {_code(part.call_id)}):\n\n{_arguments(part.arguments)}"
    if isinstance(part, FunctionResult):
        head = f"Tool result for call {_code(part.call_id)}{' (error)' if part.is_error else ''}:"
        return "\n\n".join([head, _fenced(part.result, ""), *(_part(p) for p in part.parts)])
    if isinstance(part, DataPart):
        return f"*[{_code(part.media_type)} data, {len(part.data)} bytes, not inlined]*"
    if isinstance(part, UriPart):
        where = f"a data: URI of {len(part.uri)} characters" if part.uri.startswith("data:") else _code(part.uri)
        return f"*[{_code(part.media_type)} at {where}, not inlined]*"
    if isinstance(part, ReasoningPart):
        if not part.text:
            return "*[reasoning, encrypted by the provider]*"
        return "\n".join("> " + line for line in ["*reasoning:*", *part.text.splitlines()])
    assert isinstance(part, UnknownPart)
    return f"*[a {_code(part.kind)} part, of a newer contextpipe: not shown]*"


def _text(text: str) -> str:
    """Return a message's text as it is, or quoted (`_RUNS_ON`): either way it ends where it ends."""
    if _RUNS_ON.search(text.replace("\r", "\n")) is None:
        return text
    return "\n".join(">" + (" " + line if line else "") for line in re.split(r"\r\n|\r|\n", text))


def _arguments(arguments: str) -> str:
    """Fence a call's arguments: as indented JSON, or as they are (with a note) when they are not JSON."""
    try:
        return _fenced(json.dumps(json.loads(arguments), indent=2, ensure_ascii=False), "json")
    except (ValueError, RecursionError):
        return _fenced(arguments, "") + "\n\n*(the arguments are not valid JSON)*"


def _fenced(text: str, info: str) -> str:
    r"""Return `text` in a code fence longer than any run of backticks in it (so nothing in it closes the fence).

    Its line ends are written ``\n``, as a reader of Markdown reads them (a ``\r`` before the fence's
    own line end would merge with it).
    """
    text = re.sub("\r\n?", "\n", text)
    fence = "`" * max(3, _longest_ticks(text) + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def _code(text: str) -> str:
    """Return `text` as an inline code span on one line, whatever backticks it holds."""
    text = re.sub(r"[\r\n]+", " ", text)
    ticks = "`" * (_longest_ticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _longest_ticks(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


def _plain(text: str) -> str:
    """Return `text` on one line, with the characters that would start Markdown emphasis or markup escaped."""
    return re.sub(r"([\\`*_\[\]<>#&!|~])", r"\\\1", re.sub(r"[\r\n]+", " ", text))


def _when(seconds: float) -> str:
    """Return a time as ISO 8601 in UTC (``unknown`` for a stored time no calendar holds)."""
    try:
        if not math.isfinite(seconds):
            return "unknown"
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return "unknown"
