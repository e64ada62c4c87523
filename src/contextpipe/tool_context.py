"""`ToolContext`: what a tool is told about the call it is running for, besides its arguments.

A tool function that declares a parameter annotated with `ToolContext` (or ``ToolContext[Deps]``) is
given the context of its call there; the parameter is not part of the schema the model sees. The
context says whom the call serves (session, tenant, user), which call it is (call id, tool name, a
stable idempotency key), which agent runs it, and carries the application's dependencies passed per
run (``agent.run(..., deps=...)``) and typed access to the session's state:

>>> import asyncio
>>> from contextpipe import tool
>>> @tool
... def whoami(ctx: ToolContext[str]) -> str:
...     '''Say whom this call serves.'''
...     return f"{ctx.user_id} via {ctx.deps}"
>>> whoami.parameters["properties"]
{}
>>> ctx = ToolContext.for_call("call_1", "whoami", deps="the test", user_id="alice")
>>> asyncio.run(whoami.invoke("{}", context=ctx)).result
'alice via the test'

The idempotency key (`idempotency_key`) is the same every time the same call runs (a resumed run
re-running it after a crash, a retry) and different for every other call: the SHA-256 of the
tenant, the session id, the id of the model message that made the call and the call id. The
message id is part of it because some models number their calls anew in every answer (``call_0``):
two calls of one session never share a key. A tool passes it to an external system that
deduplicates by it (an ``Idempotency-Key`` header) so its effect happens once. For an effect kept in the
session's own database, `outbox` takes it instead: it is committed with the call's result
(`contextpipe.outbox`).
"""

from __future__ import annotations

import functools
import json
import re
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Final, ForwardRef, Generic, TypeVar, Union, get_args, get_origin

from .errors import UsageError, shorten
from .outbox import Outbox
from .session import RESERVED_STATE_KEYS, ProviderState
from .session import user_id as session_user

if TYPE_CHECKING:
    import pydantic

    from .session import Session

__all__ = ["IDEMPOTENCY_KEY_VERSION", "DepsCheck", "ToolContext", "idempotency_key"]

DepsT = TypeVar("DepsT")
S = TypeVar("S", bound="pydantic.BaseModel")

IDEMPOTENCY_KEY_VERSION: Final = "contextpipe.tool-call.v1"
"""The first item of what `idempotency_key` hashes: a later derivation would change it, never reuse it."""

_BUILT_DIRECTLY: Final = "its ToolContext was built directly, without a call's key; use ToolContext.for_call(...)"

_STATE_LOCK = threading.Lock()
"""Makes reading a state key the first time (building and storing its value) one step for every thread:
sync tools run in worker threads, and parallel calls may read the same key at once."""


def idempotency_key(tenant: str | None, session_id: str | None, message_id: str, call_id: str) -> str:
    """Return the idempotency key of a tool call: 64 hex digits, the same whenever the same call runs.

    It is the SHA-256 of the JSON array ``[IDEMPOTENCY_KEY_VERSION, tenant, session_id, message_id,
    call_id]`` (compact, ``null`` for a run without a session), so no two different calls share it:

    >>> key = idempotency_key("acme", "chat-1", "m-7", "call_1")
    >>> key == idempotency_key("acme", "chat-1", "m-7", "call_1"), len(key)
    (True, 64)
    >>> key == idempotency_key("acme", "chat-2", "m-7", "call_1")
    False
    """
    import hashlib  # here: importing contextpipe stays fast

    text = json.dumps([IDEMPOTENCY_KEY_VERSION, tenant, session_id, message_id, call_id], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext(Generic[DepsT]):
    """The run context of one tool call, given to a tool parameter annotated with `ToolContext`.

    `DepsT` is the type of the application's dependencies (``agent.run(..., deps=...)``): a tool that
    declares ``ctx: ToolContext[Shop]`` is refused the call, with an error saying so, when the run
    was given deps of another type. Built by the run for every call (`for_call`); build one yourself
    to call a tool in a test (``tool.invoke(arguments, context=ToolContext.for_call(...))``).
    """

    call_id: str
    """The model's id for this call (its result carries it)."""
    tool_name: str
    """The name the model called the tool by."""
    deps: DepsT
    """The application's dependencies, as passed to this run (``agent.run(..., deps=...)``); None if none were."""
    session_id: str | None = None
    """The id of the run's session; None for a run without one."""
    tenant: str | None = None
    """The session's tenant; None for a run without a session."""
    user_id: str | None = None
    """The user the session belongs to (``contextpipe.session.set_user_id``); None when unknown."""
    message_id: str = ""
    """The id of the model message that made the call (in the session's log)."""
    agent: Any = None
    """The running agent (a `contextpipe.Agent`: its `name`, `instructions`, `tools` and `model`, as
    `contextpipe.AgentInfo` describes); None for a context built outside a run."""
    outbox: Outbox = field(default_factory=lambda: Outbox("", str, _BUILT_DIRECTLY), repr=False, compare=False)
    """Where the tool writes effects that must commit with its result (``ctx.outbox.add(topic, payload)``;
    see `contextpipe.outbox`). Outside a run it only collects them (``ctx.outbox.entries``)."""
    _session: Session | None = field(default=None, repr=False, compare=False)
    _owners: Mapping[str, str] = field(default_factory=lambda: RESERVED_STATE_KEYS, repr=False, compare=False)
    """State keys the tool may not use, with what each holds (the session's own, the agent's providers')."""

    @classmethod
    def for_call(cls, call_id: str, tool_name: str, *, deps: Any = None, session: Session | None = None,
                 message_id: str = "", user_id: str | None = None, agent: Any = None,
                 state_owners: Mapping[str, str] | None = None, outbox_problem: str | None = None) -> ToolContext[Any]:
        """Return the context of call `call_id` to `tool_name`, made by model message `message_id`, in `session`.

        `user_id` defaults to the session's user. `state_owners` maps the state keys tools must leave
        alone to what each holds (the run passes its agent's providers' keys); the session's own keys
        (`contextpipe.session.RESERVED_STATE_KEYS`) are always refused. `outbox_problem` says why the
        run cannot keep outbox entries (`Outbox.add` raises it); None: they are kept (or, outside a
        run, collected in `outbox`).
        """
        tenant, session_id = (session.tenant, session.id) if session is not None else (None, None)
        owners = {**RESERVED_STATE_KEYS, **state_owners} if state_owners else RESERVED_STATE_KEYS
        outbox = Outbox(call_id, functools.partial(idempotency_key, tenant, session_id, message_id, call_id),
                        outbox_problem)
        return cls(call_id=call_id, tool_name=tool_name, deps=deps, session_id=session_id, tenant=tenant,
                   user_id=user_id if user_id is not None else session_user(session), message_id=message_id,
                   agent=agent, outbox=outbox, _session=session, _owners=owners)

    @property
    def idempotency_key(self) -> str:
        """The stable key of this call (see `idempotency_key`): the same on every re-run, different for every call.

        Computed when read (a SHA-256 of the call's tenant, session, message and call ids).
        """
        return idempotency_key(self.tenant, self.session_id, self.message_id, self.call_id)

    def state(self, state: ProviderState[S]) -> S:
        """Return the session's state under ``state.key``, typed as ``state.model`` (its default when absent).

        The value is the live object kept in the session: change it in place, or replace it with
        `set_state`. Either way it is saved with the session's state when the run ends (as the
        providers' state is), not when the tool returns: see the guide for what that means after a
        crash. In a run without a session it is a fresh default value, kept nowhere.
        """
        self._check_key(state)
        with _STATE_LOCK:
            return state.get(self._session)

    def set_state(self, state: ProviderState[S], value: S) -> None:
        """Replace the session's state under ``state.key`` with `value` (saved when the run ends)."""
        self._check_key(state)
        if self._session is None:
            raise UsageError(f"tool {shorten(self.tool_name)} sets session state {shorten(state.key)}, but its run "
                             "has no session to keep it in; run the agent with session=...")
        with _STATE_LOCK:
            state.set(self._session, value)

    def _check_key(self, state: ProviderState[Any]) -> None:
        owner = self._owners.get(state.key)
        if owner is not None:
            raise UsageError(f"tool {shorten(self.tool_name)} uses session state key {shorten(state.key)}, which holds "
                             f"{owner}; give the tool's ProviderState a key of its own (the user is ctx.user_id)")

    def _deps_problem(self, expected: DepsCheck | None) -> str | None:
        """Say why this context cannot serve a tool whose deps must pass `expected`; None when it can."""
        if expected is None or isinstance(self.deps, expected.classes):
            return None
        given = "no deps" if self.deps is None else f"deps of type {type(self.deps).__name__}"
        wanted = " or ".join("None" if c is type(None) else c.__name__ for c in expected.classes)
        build = next(c.__name__ for c in expected.classes if c is not type(None))
        return (f"Error: tool {self.tool_name!r} needs deps of type {wanted} (ToolContext[{expected.declared}]), "
                f"but its run was given {given}; the application must run the agent with deps={build}(...). "
                "The tool was not run.")


@dataclass(frozen=True, slots=True)
class DepsCheck:
    """What the deps of a tool declaring ``ToolContext[X]`` must be: an instance of one of `classes`.

    Made once, when the tool is defined (`for_annotation`), and checked before each call.
    """

    classes: tuple[type, ...]
    """The classes ``isinstance`` checks (a parametrised generic's origin: ``dict`` for ``dict[str, int]``)."""
    declared: str
    """``X`` as the tool wrote it, for error messages."""

    @classmethod
    def for_annotation(cls, annotation: object, namespace: dict[str, Any]) -> DepsCheck | None:
        """Return the check of ``ToolContext[annotation]``; None when nothing can be checked.

        A class, a parametrised generic (its origin is checked) and a union of these (``Shop | None``)
        are checked. ``None`` alone, ``object``, ``Any``, a type variable, a protocol that is not
        runtime-checkable and other annotations ``isinstance`` cannot take are not: such a tool runs
        whatever its run was given. A string (a forward reference) is resolved in `namespace` (the
        tool function's globals); a name that cannot be resolved raises `UsageError`.
        """
        if annotation is None or annotation is type(None):
            return None
        classes = _classes(annotation, namespace)
        if not classes:
            return None
        return cls(classes, _shown(annotation))


def _classes(annotation: object, namespace: dict[str, Any]) -> tuple[type, ...] | None:
    """Return the classes `annotation` stands for; None when one part of it cannot be checked."""
    if isinstance(annotation, str | ForwardRef):
        text = annotation if isinstance(annotation, str) else annotation.__forward_arg__
        try:
            annotation = eval(text, namespace)  # as inspect.get_annotations(eval_str=True) does
        except Exception as exc:
            raise UsageError(f"cannot resolve the deps type {text!r} of ToolContext[{text!r}] ({exc}); "
                             "define or import it at module level") from exc
    origin = get_origin(annotation)
    if origin is Annotated:
        return _classes(get_args(annotation)[0], namespace)
    if origin is Union or origin is types.UnionType:
        found: list[type] = []
        for arg in get_args(annotation):
            part = (type(None),) if arg is type(None) else _classes(arg, namespace)
            if part is None:
                return None
            found.extend(part)
        return tuple(found)
    if isinstance(origin, type):
        annotation = origin
    if not isinstance(annotation, type) or annotation is object:
        return None
    try:
        isinstance(None, annotation)
    except TypeError:  # Any, a protocol that is not runtime-checkable, a TypedDict: isinstance cannot tell
        return None
    return (annotation,)


def _shown(annotation: object) -> str:
    """`annotation` as written, without module paths: ``Optional[Shop]``, not ``typing.Optional[app.Shop]``."""
    if isinstance(annotation, type):
        return annotation.__qualname__
    text = re.sub(r"ForwardRef\('([^']*)'.*?\)", r"\1", str(annotation))
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", text)
