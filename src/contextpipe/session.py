"""Sessions and typed per-provider session state.

A `Session` is the durable identity of a conversation: id, tenant, free-form JSON state and a version
used for compare-and-swap. Its messages live in a session store, not in the object.

Providers keep no per-session data in themselves; they use `ProviderState[T]`, a typed view of one
key of ``session.state``:

>>> from pydantic import BaseModel
>>> class Prefs(BaseModel):
...     favourite_food: str | None = None
>>> prefs = ProviderState("prefs", Prefs)
>>> session = Session("chat-1")
>>> prefs.get(session).favourite_food is None
True
>>> prefs.set(session, Prefs(favourite_food="noodles"))
>>> Session.from_dict(session.to_dict()).state["prefs"]
{'favourite_food': 'noodles'}
>>> prefs.get(Session.from_dict(session.to_dict())).favourite_food
'noodles'

A `ProviderState` a provider holds as an attribute is registered by itself: when an agent is
built, its key is checked against every other provider's (one key per provider, no state shared
by accident) and against the keys the session keeps for itself (`RESERVED_STATE_KEYS`).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from .errors import CodecError, UsageError, shorten

if TYPE_CHECKING:
    import pydantic

__all__ = [
    "AGUI_RUN_KEY",
    "DEFAULT_TENANT",
    "RESERVED_STATE_KEYS",
    "REWINDS_KEY",
    "USER_ID_KEY",
    "USER_NAME_KEY",
    "ProviderState",
    "Session",
    "SessionKey",
    "set_user_id",
    "user_id",
    "validate_session_id",
    "validate_tenant",
]

DEFAULT_TENANT: Final = "default"
"""Tenant used when none is given."""

_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/=+-]{0,199}")
_TENANT_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

T = TypeVar("T", bound="pydantic.BaseModel")


def validate_session_id(session_id: str) -> str:
    """Return `session_id` if it is valid, else raise `UsageError` saying what is allowed."""
    if isinstance(session_id, str) and _ID_RE.fullmatch(session_id):  # inline: every store call checks ids
        return session_id
    raise _invalid(session_id, "session id", "1-200 characters", ". _ : @ / = + -")


def validate_tenant(tenant: str) -> str:
    """Return `tenant` if it is valid, else raise `UsageError` saying what is allowed."""
    if isinstance(tenant, str) and _TENANT_RE.fullmatch(tenant):
        return tenant
    raise _invalid(tenant, "tenant", "1-64 characters", ". _ -")


def _invalid(value: object, what: str, length: str, punctuation: str) -> UsageError:
    return UsageError(f"invalid {what} {shorten(value)}: use {length}, starting with a letter or digit, "
                      f"made of letters, digits and {punctuation}")


@dataclass(frozen=True, slots=True)
class SessionKey:
    r"""Where a session lives: its tenant and its id, validated when the key is made.

    >>> SessionKey("acme", "chat-1")
    SessionKey(tenant='acme', id='chat-1')
    >>> SessionKey("acme", "chat-1\n")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    contextpipe.errors.UsageError: invalid session id 'chat-1\n': use 1-200 characters, ...
    """

    tenant: str
    """Tenant (isolation boundary)."""
    id: str
    """Session id, unique within its tenant."""

    def __post_init__(self) -> None:
        validate_tenant(self.tenant)
        validate_session_id(self.id)

    def __str__(self) -> str:
        return f"session {shorten(self.id)} (tenant {shorten(self.tenant)})"


@dataclass
class Session:
    """A conversation's identity and state; JSON serialisable with `to_dict` / `from_dict`."""

    id: str
    """Session id, unique within its tenant."""
    tenant: str = DEFAULT_TENANT
    """Tenant (isolation boundary): no store call crosses tenants."""
    state: dict[str, Any] = field(default_factory=dict)
    """Per-provider state, one key per provider (see `ProviderState`)."""
    version: int = 0
    """Version of the stored state; 0 before the first save. Saves compare-and-swap on it."""
    created_at: float = field(default_factory=time.time)
    """When the session was created (seconds since the epoch)."""
    ttl: float | None = None
    """Seconds of inactivity after which the store may delete the session; None keeps it.

    On an object made by hand (version 0) for a stored session, None takes the stored ttl: to make
    a stored session permanent, load it (``agent.session(...)``) and set ``ttl = None``.
    """

    def __post_init__(self) -> None:
        validate_session_id(self.id)
        validate_tenant(self.tenant)

    @property
    def key(self) -> SessionKey:
        """The session's `SessionKey` (tenant and id)."""
        return SessionKey(self.tenant, self.id)

    def state_to_json(self) -> dict[str, Any]:
        """Return `state` as plain JSON data (pydantic models dumped)."""
        out: dict[str, Any] = {}
        # A pydantic model can be in the state only once pydantic is imported (it is loaded lazily).
        model_type = getattr(sys.modules.get("pydantic"), "BaseModel", None)
        for key, value in self.state.items():
            out[key] = value.model_dump(mode="json") if model_type is not None and isinstance(value, model_type) \
                else value
        return out

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict of the session."""
        return {
            "id": self.id, "tenant": self.tenant, "state": self.state_to_json(), "version": self.version,
            "created_at": self.created_at, "ttl": self.ttl,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        """Rebuild a session from `to_dict` output; raises `CodecError` on malformed data."""
        try:
            state = data.get("state") or {}
            if not isinstance(state, dict):
                raise CodecError(f"session state must be a JSON object, got {type(state).__name__}")
            return cls(
                id=data["id"], tenant=data.get("tenant", DEFAULT_TENANT), state=dict(state),
                version=int(data.get("version", 0)), created_at=float(data.get("created_at", time.time())),
                ttl=data.get("ttl"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"not a valid session: {type(exc).__name__}: {exc}") from exc

    def to_json(self) -> str:
        """Return the session as JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Session:
        """Rebuild a session from `to_json` output."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CodecError(f"session is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise CodecError("session JSON must be an object")
        return cls.from_dict(data)


class ProviderState(Generic[T]):
    """Typed access to one provider's entry in ``session.state``.

    `key` must be unique among an agent's providers: a provider that holds its `ProviderState` as an
    attribute (set in ``__init__`` or on its class) has the key checked when the agent is built,
    with nothing to declare. `default` builds the initial value when the session has none (by
    default ``model()``).
    """

    __slots__ = ("default", "key", "model")

    def __init__(self, key: str, model: type[T], default: Callable[[Session | None], T] | None = None) -> None:
        self.key = key
        """Key in ``session.state``."""
        self.model = model
        """The pydantic model of the state."""
        self.default = default
        """Builds the initial state; ``model()`` when None."""

    def _initial(self, session: Session | None) -> T:
        return self.default(session) if self.default is not None else self.model()

    def get(self, session: Session | None) -> T:
        """Return the state for `session`, creating (and storing) the initial value if absent.

        With no session (a run without one) a fresh initial value is returned and not stored.
        Stored JSON is validated into the model once and kept as the live object afterwards.
        """
        if session is None:
            return self._initial(None)
        raw = session.state.get(self.key)
        if isinstance(raw, self.model):
            return raw
        if raw is None:
            value = self._initial(session)
        else:
            import pydantic  # already imported: `model` is a pydantic model

            try:
                value = self.model.model_validate(raw)
            except pydantic.ValidationError as exc:
                raise CodecError(
                    f"session {shorten(session.id)}: state under key {shorten(self.key)} does not match "
                    f"{self.model.__name__}: {exc}"
                ) from exc
        session.state[self.key] = value
        return value

    def set(self, session: Session, value: T) -> None:
        """Store `value` as the state for `session`."""
        session.state[self.key] = value

    @staticmethod
    def held_by(owner: object) -> list[ProviderState[Any]]:
        """Return the `ProviderState` objects `owner` holds as attributes: its own, then its classes'.

        >>> from pydantic import BaseModel
        >>> class Prefs(BaseModel):
        ...     food: str | None = None
        >>> class Provider:
        ...     def __init__(self):
        ...         self.prefs = ProviderState("prefs", Prefs)
        >>> [state.key for state in ProviderState.held_by(Provider())]
        ['prefs']
        """
        values: list[object] = list(getattr(owner, "__dict__", {}).values())
        for cls in type(owner).__mro__:
            slots = vars(cls).get("__slots__", ())
            values.extend(getattr(owner, slot, None) for slot in ((slots,) if isinstance(slots, str) else slots))
            values.extend(vars(cls).values())
        found: dict[int, ProviderState[Any]] = {}
        for value in values:
            if isinstance(value, ProviderState):
                found.setdefault(id(value), value)
        return list(found.values())


USER_ID_KEY: Final = "user_id"
"""Session state key naming the user a session belongs to (memories and facts are kept per user)."""

USER_NAME_KEY: Final = "user_name"
"""Session state key holding the user's display name (`SemanticMemory` attributes messages by it)."""

REWINDS_KEY: Final = "rewinds"
"""Session state key counting the session's rewinds (`contextpipe.rewind`): a session without it was never
rewound, so loading its history looks for no rewind marker."""

AGUI_RUN_KEY: Final = "ag-ui.run_id"
"""Session state key holding the ``runId`` of an AG-UI thread's last run (``contextpipe serve``): a
request with that ``runId`` again is a retry of that run, never a regenerate or an edit."""

RESERVED_STATE_KEYS: Final = {
    USER_ID_KEY: "the user the session belongs to",
    USER_NAME_KEY: "the user's name",
    REWINDS_KEY: "the session's rewinds (contextpipe.rewind)",
    AGUI_RUN_KEY: "the runId of the AG-UI thread's last run (contextpipe serve)",
}
"""Keys of ``session.state`` the session keeps for itself, with what each holds; no provider may use them."""


def user_id(session: Session | None) -> str | None:
    """Return the user a session belongs to (``session.state["user_id"]``), or None when unknown."""
    if session is None:
        return None
    value = session.state.get(USER_ID_KEY)
    return str(value) if value is not None else None


def set_user_id(session: Session, user: str) -> None:
    """Record that `session` belongs to `user`; `SemanticMemory` and `FactMemory` scope by it.

    It is saved with the session's state at the end of the next run (or with ``store.save_session``).
    """
    if not user or not isinstance(user, str):
        raise UsageError(f"a user id must be a non-empty string, got {shorten(user)}")
    session.state[USER_ID_KEY] = user
