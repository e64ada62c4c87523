"""Every error contextpipe raises, in one shallow tree.

```
ContextPipeError                 root: catch this to catch everything contextpipe raises
├── UsageError                   the API was used wrongly (bad configuration, clashing names, bad ids)
│   ├── InputConflict            a run's input reuses a message id the session holds for something else
│   ├── ApprovalError            a decision on a tool call awaiting approval cannot apply (other arguments,
│   │                            decided already), or new input came while calls await a decision
│   ├── ScriptExhausted          a ScriptedModel was called more often than it was scripted for
│   └── SkillError               a skill folder or SKILL.md is malformed (the message names the file)
├── McpError                     an MCP server could not be started or reached (names the server and the cause)
├── CodecError                   stored or received JSON could not be decoded into messages or sessions
├── RequestInvariantError        a request about to be sent to a model is broken (a bug upstream)
├── ToolMiddlewareError          a provider's tool middleware raised (the call was answered with an error)
├── ModelError                   a model call failed (provider, status code, body, retry hint)
│   ├── ModelAuthError           401 / 403: the key or deployment is wrong
│   ├── ModelRateLimited         429: wait `retry_after` seconds and try again
│   ├── ContextWindowExceeded    the request is larger than the model's context window
│   ├── ModelBadRequest          400 / 404 / 422: the provider rejected the request
│   ├── ModelServerError         5xx: the provider failed
│   ├── ModelTimeout             no answer within the timeout
│   ├── ModelConnectionError     the endpoint could not be reached
│   └── ModelResponseError       the answer was malformed or the stream was cut
├── StoreError                   a session store failed (backend, tenant, session, sequence)
│   ├── SessionBusy              another run holds the session's lease
│   ├── LeaseLost                this run's lease was taken over, or its session is gone; writes refused
│   ├── ConcurrentUpdate         session state changed since it was read (compare-and-swap failed)
│   └── CorruptRecord            a stored row could not be decoded
├── AfterRunError                one or more context providers failed in `after_run` (the run's
│                                result is kept on the error)
└── OutputValidationError        the model's answer did not match the run's `output_type`, however often
                                 it was sent back (the last answer, the errors and the result are kept)
```

Each adapter (model client, store backend) translates its library's errors into these in one place,
with ``raise ... from exc`` so the original stays attached. A message echoes an id or another value
the caller gave through `shorten` (the error's attributes keep it whole), and embeds another
error's text through `clause`, so that no message is 10,000 characters long or ends in ``.;``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol, Self

__all__ = [
    "AfterRunError",
    "ApprovalError",
    "CodecError",
    "ConcurrentUpdate",
    "ContextPipeError",
    "ContextWindowExceeded",
    "CorruptRecord",
    "InputConflict",
    "LeaseLost",
    "McpError",
    "ModelAuthError",
    "ModelBadRequest",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimited",
    "ModelResponseError",
    "ModelServerError",
    "ModelTimeout",
    "OutputValidationError",
    "SkillError",
    "RequestInvariantError",
    "ScriptExhausted",
    "SessionBusy",
    "StoreError",
    "ToolMiddlewareError",
    "UsageError",
]


SHORT: Final = 60
"""Characters of a value that `shorten` keeps."""


def shorten(value: object, limit: int = SHORT) -> str:
    """Return ``repr(value)`` for an error message, cut after `limit` characters (saying how long a text was).

    >>> shorten("chat-1")
    "'chat-1'"
    >>> shorten("x" * 10_000, limit=8)
    "'xxxxxxx…' (10000 characters)"
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        return f"{text[:limit]}…{text[0]} ({len(value)} characters)"
    if isinstance(value, bytes):
        return f"{text[:limit]}…{text[-1]} ({len(value)} bytes)"
    return f"{text[:limit]}…"


def clause(text: object) -> str:
    """Return another error's text for use inside a sentence: without the full stop or space it ends with.

    >>> clause("Connection error. ") + "; check the server"
    'Connection error; check the server'
    >>> clause("wait...")
    'wait...'
    """
    stripped = str(text).rstrip()
    if stripped.endswith(".") and not stripped.endswith(".."):
        return stripped[:-1]
    return stripped


class _Key(Protocol):
    """What the store errors need of a session key (`contextpipe.session.SessionKey`)."""

    @property
    def tenant(self) -> str: ...

    @property
    def id(self) -> str: ...


def _named(key: _Key) -> str:
    return f"session {shorten(key.id)} (tenant {shorten(key.tenant)})"


class ContextPipeError(Exception):
    """Root of every error contextpipe raises."""


class UsageError(ContextPipeError):
    """The API was used in a way that cannot work; the message says how to fix the call."""


class InputConflict(UsageError):
    """A run's input carries the id of a message already in the session, but not the same input.

    A retried input (same id, same content) is answered from the log instead; this is raised when
    the content differs, or when the earlier run under that id was interrupted and later runs
    followed it, so it can no longer be resumed. Send the input with a new message id.
    """


class ApprovalError(UsageError):
    """A decision on a tool call awaiting approval cannot apply, or the session cannot take new input yet.

    Raised before anything runs or is stored: for a decision on a call that is not awaiting one (it
    was answered already: another worker's decision won), a decision made for other arguments than
    the call's (its digest differs), and for new input sent while calls still await a decision
    (decide them first). The message names the calls and says what to send.
    """

    def __init__(self, message: str, *, call_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.call_ids = tuple(call_ids)
        """The calls concerned."""


class ScriptExhausted(UsageError):
    """A `ScriptedModel` was asked for more replies than it was given."""


class CodecError(ContextPipeError):
    """JSON could not be decoded into contextpipe objects (wrong shape, wrong version)."""


class RequestInvariantError(ContextPipeError):
    """A request about to reach a model is broken; a provider, middleware or compaction strategy broke it.

    Broken means: an unanswered call, an orphan result, no messages, or the caller's input missing.
    """


class ToolMiddlewareError(ContextPipeError):
    """A context provider's tool middleware raised instead of returning an outcome.

    Raised by the run after every tool call of the step has its result saved: the failed call is
    answered with an error result (saying whether the tool had run), so the session's log holds
    no call without a result and the next run goes on from it. The middleware's exception is the
    ``__cause__``.
    """

    def __init__(self, message: str, *, source_id: str, tool_name: str, call_id: str) -> None:
        super().__init__(message)
        self.source_id = source_id
        """The provider whose middleware raised."""
        self.tool_name = tool_name
        """The tool the call was for."""
        self.call_id = call_id
        """The call's id."""


class ModelError(ContextPipeError):
    """A model call failed.

    Attributes say which provider failed, with which HTTP status and body, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str | None = None,
        status_code: int | None = None,
        body: object | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status_code = status_code
        self.body = body


class ModelAuthError(ModelError):
    """The provider refused the credentials (HTTP 401 / 403)."""


class ModelRateLimited(ModelError):
    """The provider is rate limiting (HTTP 429); `retry_after` is its hint in seconds, if it gave one."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        provider: str | None = None,
        status_code: int | None = 429,
        body: object | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status_code=status_code, body=body)
        self.retry_after = retry_after


class ContextWindowExceeded(ModelError):
    """The request did not fit the model's context window; compact the context or use a larger model."""


class ModelBadRequest(ModelError):
    """The provider rejected the request as invalid (HTTP 400 / 404 / 422)."""


class ModelServerError(ModelError):
    """The provider failed on its side (HTTP 5xx)."""


class ModelTimeout(ModelError):
    """The model did not answer within the configured timeout."""


class ModelConnectionError(ModelError):
    """The model endpoint could not be reached."""


class ModelResponseError(ModelError):
    """The model's answer could not be understood: a malformed body or a stream cut short."""


class StoreError(ContextPipeError):
    """A session store operation failed; attributes name what it was working on."""

    def __init__(
        self,
        message: str,
        *,
        backend: str | None = None,
        tenant: str | None = None,
        session_id: str | None = None,
        sequence: int | None = None,
        server: str | None = None,
    ) -> None:
        super().__init__(message)
        self.backend = backend
        self.tenant = tenant
        self.session_id = session_id
        self.sequence = sequence
        self.server = server
        """The server that failed or did not answer (``host:port``), for server backends."""

    @classmethod
    def unreachable(cls, backend: str, server: str, seconds: float, doing: str) -> Self:
        """Say that the server did not answer within the configured timeout."""
        return cls(f"{backend} store: the server at {server} did not answer within {seconds:g} s while {doing}; "
                   "check the network and the server (timeouts are configurable on the store)",
                   backend=backend, server=server)

    @classmethod
    def pool_exhausted(cls, backend: str, server: str, size: int, seconds: float) -> Self:
        """Say that no pooled connection was free within the pool's timeout."""
        return cls(f"{backend} store ({server}): all {size} pooled connections stayed busy for {seconds:g} s; "
                   "raise the store's max_connections (or pool_timeout), or make fewer calls at once",
                   backend=backend, server=server)

    @classmethod
    def from_driver(cls, backend: str, server: str, exc: BaseException) -> Self:
        """Wrap a driver or network error, naming the server it came from."""
        try:
            detail = str(exc)
        except Exception:  # a driver error whose own __str__ fails must still be reported
            detail = repr(exc.args)
        return cls(f"{backend} store ({server}): {type(exc).__name__}: {detail}", backend=backend, server=server)


class SessionBusy(StoreError):
    """Another run holds the lease on this session; wait for it or pass a lease timeout."""

    @classmethod
    def held(cls, backend: str, key: _Key) -> Self:
        """Say that another run holds the session's lease."""
        return cls(f"{_named(key)} is busy: another run holds its lease; wait for "
                   "it to finish, or pass lease_wait=<seconds> to wait for it",
                   backend=backend, tenant=key.tenant, session_id=key.id)


class LeaseLost(StoreError):
    """The run's lease no longer holds (taken over, or its session is gone): the run stops, its writes refused."""

    gone: bool = False
    """Whether the session no longer exists (deleted, or expired after the lease lapsed), not taken over."""

    @classmethod
    def taken_over(cls, backend: str, key: _Key, token: int, current: int | None = None) -> Self:
        """Say that the lease with fencing `token` expired and another run took the session (now `current`)."""
        now = f" (current token {current})" if current is not None else ""
        return cls(f"{_named(key)}: this run's lease (token {token}) "
                   f"expired and was taken over{now}; its writes are refused so runs never interleave",
                   backend=backend, tenant=key.tenant, session_id=key.id)

    @classmethod
    def session_gone(cls, backend: str, key: _Key, token: int, *, lapsed: bool) -> Self:
        """Say that the session of the lease with fencing `token` no longer exists.

        A session never expires while its lease is live, so when the lease had not `lapsed` the
        session was deleted; when it had, its TTL may have passed too.
        """
        if lapsed:
            what = ("expired: this run's lease lapsed (it was not renewed in time, as in a paused process), then "
                    "the session's TTL passed and the session was deleted (or it was deleted after the lapse)")
        else:
            what = "was deleted while this run held its lease"
        error = cls(f"{_named(key)} {what}; the run (lease token {token}) stopped and nothing more is written to it",
                    backend=backend, tenant=key.tenant, session_id=key.id)
        error.gone = True
        return error

    @classmethod
    def session_ended(cls, backend: str, key: _Key, *, made_again: bool) -> Self:
        """Say that the session a run holds was deleted (or expired) before the run's lease was taken.

        `made_again`: a new session has been made since under the same id, which is not this run's.
        """
        again = " (a new session has been made since under the same id)" if made_again else ""
        error = cls(f"{_named(key)} no longer exists: it was deleted or it expired{again}; start a new one with "
                    "agent.session(...)", backend=backend, tenant=key.tenant, session_id=key.id)
        error.gone = True
        return error


class ConcurrentUpdate(StoreError):
    """The session changed since it was read; reload it and apply the change again."""

    @classmethod
    def stale(cls, backend: str, key: _Key, stored: int, mine: int) -> Self:
        """Say that the stored version is `stored` while the caller's copy has `mine`."""
        return cls(f"{_named(key)} was changed elsewhere (stored version {stored}, "
                   f"this copy has {mine}); reload it with agent.session(...) and apply the change again",
                   backend=backend, tenant=key.tenant, session_id=key.id)


class CorruptRecord(StoreError):
    """A stored record could not be decoded; nothing is skipped silently."""

    @classmethod
    def unreadable(cls, backend: str, key: _Key, what: str, problem: object, sequence: int | None = None) -> Self:
        """Say that `what` ("message 3", "the state", "a checkpoint") of the session cannot be read."""
        return cls(f"{backend} store: {what} of {_named(key)} cannot be read: {problem}",
                   backend=backend, tenant=key.tenant, session_id=key.id, sequence=sequence)


class AfterRunError(ContextPipeError):
    """Raised when context providers fail in `after_run`; all of them were still called.

    `errors` holds ``(source_id, exception)`` pairs in the order they happened; `result` holds the
    run's result when the run itself succeeded, so it is not lost.
    """

    def __init__(
        self, errors: Sequence[tuple[str, BaseException]], result: object | None = None
    ) -> None:
        names = ", ".join(f"{sid!r} ({type(exc).__name__}: {exc})" for sid, exc in errors)
        super().__init__(f"after_run failed in context provider(s): {names}")
        self.errors = list(errors)
        self.result = result


class OutputValidationError(ContextPipeError):
    """Raised when no answer of the model matched the run's ``output_type``, retries included.

    The run itself completed and was saved (every attempt is in the session's log). `raw` is the
    model's last answer, `errors` what was wrong with it (pydantic's message), `attempts` how many
    answers were validated, `result` the run's result (its `RunResult.output` is not available).
    Give the model more chances (``output_retries=``), a clearer schema, or handle the raw answer.
    """

    def __init__(self, raw: str, errors: str, attempts: int, result: object | None = None) -> None:
        super().__init__(f"the model's answer did not match the output type after {attempts} attempt(s): "
                         f"{clause(errors[:600])}; last answer: {shorten(raw, 300)}. Raise output_retries, "
                         "describe the fields better, or read the answer from the error's `raw`")
        self.raw = raw
        self.errors = errors
        self.attempts = attempts
        self.result = result


class SkillError(UsageError):
    """A skill could not be loaded (the message names the file and what is wrong with it)."""


class McpError(ContextPipeError):
    """An MCP server could not be started, reached or understood (the message names the server and the cause)."""
