r"""JSON at the HTTP edge: request bodies read strictly, and responses that always render.

**In** (`read_json`), a body is JSON as RFC 8259 has it and nothing more, on every route alike:

- no ``NaN``, ``Infinity`` or ``-Infinity`` (Python's ``json`` reads and writes them by default) and
  no number too large for a 64-bit float (``1e400``);
- no text holding a lone surrogate: ``"\\ud800"`` is valid JSON (a browser sends it when it cuts an
  emoji in half) but not Unicode, so it could be neither stored everywhere nor sent back;
- nothing nested more than `MAX_DEPTH` levels deep.

Each is refused with a 400 whose message names the field (``input[0].parts[0].text``): type
``InvalidJSON``, or ``InvalidText`` for a lone surrogate. Text is never changed behind the client's back.

**Out** (`json_response`), a store may still hold such values (written through the Python API, or
before this check existed). A response never fails on them: lone surrogates become U+FFFD and
non-finite numbers ``null``, and the object that held them says so in a ``repaired`` field, per
message (or trace) where a route returns a list of them, so one bad message does not hide the others.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from starlette.responses import Response

__all__ = ["MAX_DEPTH", "HTTPError", "clean", "dumps", "json_response", "read_json", "where"]

MAX_DEPTH: Final = 64
"""Deepest nesting of arrays and objects a request body may have."""

_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
"""How a surrogate is written in JSON text: UTF-8 cannot encode one, so it comes as an escape or not at all."""


class HTTPError(Exception):
    """An answer other than success: its status, ``type``, a message saying what to do, and headers."""

    def __init__(self, status: int, kind: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, dict(headers or {})

    def response(self) -> Response:
        """Return the JSON error response: ``{"error": {"type": ..., "message": ...}}``."""
        return json_response({"error": {"type": self.kind, "message": self.message}}, self.status, self.headers)


# --- in --------------------------------------------------------------------------------------------


class _NotJSON:
    """What the parser read in place of a value JSON does not have (NaN, an infinity, 1e400)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_WALKED: Final = frozenset({list, dict, _NotJSON})
_WALKED_WITH_TEXT: Final = _WALKED | {str}


def read_json(raw: bytes) -> Any:
    """Parse a request body strictly (see the module docstring); raise `HTTPError` (400) naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(400, "InvalidJSON", f"the body is not UTF-8 (byte {exc.start} is not): send JSON text "
                        "encoded in UTF-8") from None
    refused: list[_NotJSON] = []

    def constant(name: str) -> _NotJSON:
        refused.append(_NotJSON(name))
        return refused[-1]

    def number(digits: str) -> float | _NotJSON:
        value = float(digits)
        return value if math.isfinite(value) else constant(digits)

    try:
        value = json.loads(text, parse_constant=constant, parse_float=number)
    except RecursionError:
        raise _too_deep([]) from None
    except ValueError as exc:
        raise HTTPError(400, "InvalidJSON", f"the body is not valid JSON ({exc}): send a JSON object") from None
    # The value is walked (in Python) only where the text (searched in C) may hold what is refused:
    # most bodies are shallow, and their text holds no surrogate escape.
    strings = _SURROGATE_ESCAPE.search(text) is not None
    if strings or refused or text.count("[") + text.count("{") > MAX_DEPTH:
        problem = _scan(value, [], 0, strings)
        if problem is not None:
            raise problem
    return value


def where(path: Iterable[str | int]) -> str:
    """Name a place in a JSON value the way a client writes it: ``input[0].parts[0].text`` (``body`` for the root)."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif step.isidentifier():
            out += f".{step}" if out else step
        else:
            out += f"[{json.dumps(step)}]"
    return out or "body"


def _scan(value: Any, path: list[str | int], depth: int, strings: bool) -> HTTPError | None:
    """Return the error for the first thing in `value` that `read_json` refuses (None when there is none).

    Text (keys and values) is looked at only when `strings`: when the body's text may hold a surrogate.
    """
    kind = type(value)
    if kind is str:
        return _lone_surrogate(value, path, "the text")
    if kind is _NotJSON:
        return _not_json(value.text, path)
    if kind is not list and kind is not dict:
        return None
    if depth >= MAX_DEPTH:
        return _too_deep(path)
    items: Iterable[tuple[str | int, Any]] = enumerate(value) if kind is list else value.items()
    walked = _WALKED_WITH_TEXT if strings else _WALKED
    for key, item in items:
        problem = _lone_surrogate(key, path, "a key") if strings and type(key) is str else None
        if problem is None and type(item) in walked:
            path.append(key)
            problem = _scan(item, path, depth + 1, strings)
            path.pop()
        if problem is not None:
            return problem
    return None


def _lone_surrogate(text: str, path: list[str | int], what: str) -> HTTPError | None:
    """Return the error for `text` (a key or a value at `path`) when it holds a lone surrogate."""
    found = None if text.isascii() else _SURROGATE.search(text)
    if found is None:
        return None
    return HTTPError(400, "InvalidText", f"{where(path)}: {what} holds a lone surrogate (U+{ord(found[0]):04X} "
                     f"at character {found.start()}), which is not Unicode and cannot be stored: send valid UTF-8 "
                     "text (both halves of a surrogate pair, or U+FFFD in place of the broken character)")


def _not_json(text: str, path: list[str | int]) -> HTTPError:
    if text in ("NaN", "Infinity", "-Infinity"):
        message = f"{text} is not JSON (Python's json.dumps writes it for nan and inf): send a finite number"
    else:
        message = f"the number {text[:40]} is too large for a 64-bit float: send a smaller one"
    return HTTPError(400, "InvalidJSON", f"{where(path)}: {message}")


def _too_deep(path: list[str | int]) -> HTTPError:
    return HTTPError(400, "InvalidJSON", f"{where(path)}: nested more than {MAX_DEPTH} levels deep: send flatter JSON")


# --- out -------------------------------------------------------------------------------------------


def dumps(data: Any, *, items: Iterable[str] = ()) -> str:
    """Return `data` as JSON text, repairing what JSON cannot carry (see the module docstring and `clean`)."""
    try:
        return _strict(data)
    except ValueError:  # (UnicodeEncodeError is one)
        return _strict(_repaired(data, items))


def clean(data: Any, *, items: Iterable[str] = ()) -> Any:
    """Return `data` itself when it renders as JSON, else a copy repaired as the module docstring says.

    `items` names top-level keys holding lists of records (messages, traces): each record that
    needs repair carries its own ``repaired`` note; anything else repaired is noted at the top.
    """
    try:
        _strict(data)
        return data
    except ValueError:
        return _repaired(data, items)


def _repaired(data: Any, items: Iterable[str]) -> Any:
    listed = set(items)
    if isinstance(data, dict):
        data = {key: [_record(r) for r in value] if key in listed and isinstance(value, list) else value
                for key, value in data.items()}
    return _record(data)


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None, *,
                  items: Iterable[str] = ()) -> Response:
    """Return a JSON response of `data` that always renders (`dumps`)."""
    return Response(dumps(data, items=items).encode("utf-8"), status, dict(headers or {}),
                    media_type="application/json")


def _strict(data: Any) -> str:
    text = _ENCODER.encode(data)
    if not text.isascii():
        text.encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate
    return text


def _record(record: Any) -> Any:
    """`record` itself when it renders, else a repaired copy (with its ``repaired`` note when it is an object)."""
    try:
        _strict(record)
        return record
    except ValueError:  # (UnicodeEncodeError is one)
        pass
    found: set[str] = set()
    repaired = _repair(record, found)
    if isinstance(repaired, dict):
        repaired["repaired"] = ("this holds what JSON cannot carry, shown repaired: "
                                + " and ".join(sorted(found)))
    return repaired


def _repair(value: Any, found: set[str]) -> Any:
    if isinstance(value, str):
        if value.isascii() or not _SURROGATE.search(value):
            return value
        found.add("lone surrogates in text (each shown as U+FFFD)")
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        found.add("NaN or infinite numbers (shown as null)")
        return None
    if isinstance(value, list | tuple):
        return [_repair(v, found) for v in value]
    if isinstance(value, dict):
        return {_repair(k, found) if isinstance(k, str) else k: _repair(v, found) for k, v in value.items()}
    return value
