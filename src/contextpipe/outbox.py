"""The transactional outbox: effects a tool writes through its context, committed with the tool's result.

A tool that declares a `contextpipe.ToolContext` adds entries with ``ctx.outbox.add(topic, payload)``
instead of acting itself (sending the e-mail, booking the slot). The run puts what the call added in
the metadata of the message that carries the call's result (under `OUTBOX_KEY`), and the session
store writes them, in the same transaction as that message, to its outbox: the entries exist
exactly when the result does, once, whatever crashes when. The application reads them with
``store.outbox(tenant)``, acts on each and marks it done with ``store.mark_delivered(tenant, keys)``
(see the side-effects guide). SQLite, PostgreSQL and the memory store keep an outbox; Redis does not.

Entries count only once the tool *returned*: a tool that raises, is cancelled or times out commits
none of them (a sync tool whose thread returns after its timeout commits them with its late result).

>>> outbox = Outbox("call_1", lambda: "k" * 64)
>>> outbox.add("emails", {"to": "ann@example.com", "text": "Your order shipped."})
'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk.0'
>>> [(e["topic"], e["payload"]["to"]) for e in outbox.entries]
[('emails', 'ann@example.com')]
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .errors import UsageError, shorten

if TYPE_CHECKING:
    from .messages import Message

__all__ = ["OUTBOX_KEY", "Outbox", "OutboxEntry", "outbox_rows", "returning"]

OUTBOX_KEY: Final = "contextpipe.outbox"
"""Metadata key of a message carrying outbox entries: a list of ``{"key", "call_id", "topic", "payload"}``."""

_MAX_TOPIC: Final = 200


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One entry of a store's outbox, as `SessionStore.outbox` lists it."""

    key: str
    """Unique and stable: the call's idempotency key, a dot and the entry's place among the call's entries
    (``"<64 hex digits>.0"``). Pass it on to whatever the entry is delivered to, so that a delivery
    made again (a relay that died before it marked the entry) happens once."""
    tenant: str
    """The tenant of the session the entry belongs to."""
    session_id: str
    """The session whose tool call added it."""
    seq: int
    """The sequence, in the session's log, of the message carrying the call's result (and the entry)."""
    call_id: str
    """The tool call that added it."""
    topic: str
    """What the tool named as the entry's destination (a queue, a table, a kind of effect)."""
    payload: Any
    """The JSON value the tool gave."""


class Outbox:
    """What one tool call adds to its session store's outbox (``ctx.outbox``); kept with the call's result.

    Made by the run for every call; a tool only calls `add`. Entries are committed in the same
    store transaction as the call's result, and only if the tool returned (see the module docstring).
    """

    __slots__ = ("_call_id", "_entries", "_key", "_lock", "_problem", "_returned", "_taken")

    def __init__(self, call_id: str, key: Callable[[], str], problem: str | None = None) -> None:
        self._call_id = call_id
        self._key = key  # the call's idempotency key, computed on the first add
        self._problem = problem
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # sync tools add from their worker thread
        self._returned = False
        self._taken = False

    @property
    def entries(self) -> tuple[Mapping[str, Any], ...]:
        """What the call added so far, in order (each with its ``key``, ``call_id``, ``topic`` and ``payload``)."""
        return tuple(self._entries)

    def add(self, topic: str, payload: Any) -> str:
        """Add an entry for `topic` with a JSON `payload`; return its key (see `OutboxEntry.key`).

        The payload is copied as JSON now (later changes to the object do not count). A call run
        again after a crash gets the same keys for the same adds in the same order. Raises
        `UsageError` when the run cannot keep entries (no session, a store without an outbox, no
        History storing tool results in the session's store), when `payload` is not JSON, and after
        the tool returned.
        """
        if self._problem is not None:
            raise UsageError(f"the call {shorten(self._call_id)} cannot add to the outbox: {self._problem}")
        if not _printable(topic) or len(topic) > _MAX_TOPIC:
            raise UsageError(f"an outbox topic must be a non-empty printable string of at most {_MAX_TOPIC} "
                             f"characters, got {shorten(repr(topic))}")
        try:
            copied = json.loads(json.dumps(payload, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"the outbox payload for topic {shorten(topic)} is not JSON ({exc}); pass dicts, lists, "
                             "strings, finite numbers, booleans and None") from exc
        with self._lock:
            if self._returned:
                raise UsageError(f"the call {shorten(self._call_id)} has returned: add outbox entries before the tool "
                                 "returns (they are committed with its result)")
            key = f"{self._key()}.{len(self._entries)}"
            self._entries.append({"key": key, "call_id": self._call_id, "topic": topic, "payload": copied})
        return key

    def _returned_now(self) -> None:
        """Note that the tool returned: what it added is committed with the message that carries its result."""
        with self._lock:
            self._returned = True

    def _take(self) -> list[dict[str, Any]]:
        """Return the entries to commit with the call's result, once: none unless the tool returned."""
        with self._lock:
            if not self._returned or self._taken:
                return []
            self._taken = True
            return list(self._entries)


def returning(fn: Callable[..., Any], kwargs: dict[str, Any], outbox: Outbox | None) -> Any:
    """Call a sync tool's function `fn`; once it returned (not raised), what it added to `outbox` counts."""
    value = fn(**kwargs)
    if outbox is not None:
        outbox._returned_now()
    return value


def outbox_rows(messages: Sequence[Message]) -> list[tuple[str, str, str, str]]:
    """Return ``(message_id, key, topic, body)`` of every outbox entry the `messages` carry.

    `body` is the JSON of the entry's ``call_id`` and ``payload``, ASCII only (any string, a lone
    surrogate or a NUL too, is escaped: every store can keep it as text); key and topic are checked to
    be printable. For the stores, as they append: an empty list (one metadata lookup per message) in the
    common case. Raises `UsageError` when a message's entries are not what the run writes (a message
    built by hand).
    """
    rows: list[tuple[str, str, str, str]] = []
    for message in messages:
        entries = message.metadata.get(OUTBOX_KEY) if message.metadata else None
        if entries is None:
            continue
        try:
            for entry in entries:
                key, topic = entry["key"], entry["topic"]
                if not (_printable(key) and _printable(topic)):
                    raise ValueError(f"key {shorten(repr(key))} or topic {shorten(repr(topic))} is not printable text")
                body = json.dumps({"call_id": entry["call_id"], "payload": entry["payload"]}, allow_nan=False)
                rows.append((message.id, key, topic, body))
        except (TypeError, KeyError, ValueError) as exc:
            raise UsageError(f"message {shorten(message.id)} has malformed outbox entries under metadata key "
                             f"{OUTBOX_KEY!r} ({type(exc).__name__}: {exc}); that key is contextpipe's: each entry is "
                             "a dict with key, call_id, topic and payload") from exc
    return rows


def _printable(text: object) -> bool:
    """Whether `text` is a non-empty string any store keeps as text (no control character, no lone surrogate)."""
    return isinstance(text, str) and bool(text) and text.isprintable()
