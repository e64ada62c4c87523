"""Tools the model can call.

`@tool` turns a sync or async function into a `Tool`: the name is the function's, the description
its docstring's first paragraph, and the JSON schema of the arguments comes from the signature's
type hints (pydantic), with per-argument descriptions from the docstring (Google ``Args:``, Sphinx
``:param x:`` or NumPy ``Parameters`` sections, read by `docstring_parser`) or
``Annotated[..., Field(description=...)]``.

A tool returns text (anything else but bytes is turned into JSON text), bytes or a `DataPart` /
`UriPart` (an image or a PDF goes to the model as one; the Tools guide says how bytes are read), or
a `ToolOutcome` to send images, audio or files to the model along with the text.

A parameter annotated with `ToolContext` (``ctx: ToolContext[Deps]``) is not an argument the model
sends: the run fills it in with the call's context (session, user, idempotency key, deps, state;
see `contextpipe.tool_context`), and it is left out of the schema.

A tool marked ``needs_approval`` (True, or a function of the call's context and arguments deciding
per call) is not run when the model asks for it: the run stops until a person decides
(`contextpipe.approvals`).

A tool never crashes a run: arguments are validated before the call, and invalid arguments, an
exception inside the tool or a timeout all become an error result the model can read and act on.

A sync tool runs in a worker thread, which nothing can stop from outside: when its caller stops
waiting (a timeout, a cancelled run) the thread goes on, and `ToolThread` is how the caller keeps
hold of what it will produce (a run keeps its session until then; see `contextpipe._run.threads`).

>>> @tool
... def lookup_location_code(city: str) -> str:
...     '''Return the location code for a city name.
...
...     Args:
...         city: The city's name, for example "Suzhou".
...     '''
...     return {"Suzhou": "SZ"}.get(city, "unknown")
>>> lookup_location_code.name
'lookup_location_code'
>>> print(lookup_location_code.parameters["properties"]["city"]["description"])
The city's name, for example "Suzhou".
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import re
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, get_args, get_origin, overload

from ._tool_spec import ToolSpec
from .errors import UsageError
from .messages import DataPart, UriPart
from .outbox import Outbox, returning
from .tool_context import DepsCheck, ToolContext

if TYPE_CHECKING:
    import pydantic

    from .approvals import ApprovalCheck

__all__ = ["CallTool", "ContextHandler", "Handler", "Tool", "ToolInvocation", "ToolMiddleware", "ToolOutcome",
           "ToolSpec", "tool"]

_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What running a tool produced: the text shown to the model, any images or files, and whether it failed.

    A tool function may return one to send an image (or audio, a PDF) along with its text:

    >>> from contextpipe.messages import DataPart
    >>> @tool
    ... def chart(metric: str) -> ToolOutcome:
    ...     '''Draw a chart of a metric.'''
    ...     png = b"..."  # the bytes of a PNG file the function rendered
    ...     return ToolOutcome(f"A chart of {metric} over the last week.", parts=(DataPart(png, "image/png"),))
    >>> import asyncio
    >>> asyncio.run(chart.invoke('{"metric": "sales"}')).parts[0].media_type
    'image/png'
    """

    result: str
    """The tool's return value as text, or an error message that says what went wrong."""
    is_error: bool = False
    """True when the arguments were invalid, the tool raised, or it timed out."""
    parts: tuple[DataPart | UriPart, ...] = ()
    """Images, audio or files the tool returned besides its text (an MCP tool's image, for example)."""


@dataclass(slots=True, eq=False)
class ToolThread:
    """A sync tool's call running in a worker thread: what it will produce, and whether its caller gave up waiting.

    A thread cannot be stopped from outside. When the wait for it ends early (the tool's timeout,
    a cancelled task) the thread goes on, and `outcome` is still set when it returns: a caller that
    keeps the `ToolThread` (a run does) learns what the call really did.
    """

    outcome: asyncio.Future[ToolOutcome]
    """Set when the thread returns: the tool's outcome (an exception it raised becomes an error outcome)."""
    timed_out: bool = False
    """True when the caller was given a timeout error instead of `outcome` (the thread was still running)."""


OnThread = Callable[[ToolThread], None]
"""Told about each thread a sync tool starts, before anything waits for it (see `Tool._invoke`)."""

Handler: TypeAlias = Callable[[dict[str, Any]], Awaitable[ToolOutcome | str]]
"""What `Tool.from_schema` runs: an async function of the parsed arguments."""

ContextHandler: TypeAlias = Callable[[dict[str, Any], ToolContext[Any] | None], Awaitable[ToolOutcome | str]]
"""A `Handler` that is given the call's `ToolContext` too (None when the tool is invoked outside a run)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolInvocation:
    """One call of a tool on its way through tool middleware (`RunContext.add_tool_middleware`).

    The model's call itself is a `FunctionCall` part of its message, and stays as the model made it;
    this is what the tool will be invoked with: the same tool name and call id, and the arguments
    as the middleware so far passed them on. A middleware passes it on (`with_arguments` to change
    what the tool gets), or answers it itself without running the tool.

    >>> call = ToolInvocation(name="lookup_location_code", call_id="call_1", arguments='{"city": "suzhou"}')
    >>> call.with_arguments({"city": "Suzhou"}).arguments
    '{"city": "Suzhou"}'
    >>> ToolInvocation(name="lookup", call_id="call_2", arguments="not json").parsed_arguments() is None
    True
    """

    name: str
    """The tool the model called."""
    call_id: str
    """The model's id for this call (its result carries it)."""
    arguments: str
    """The arguments, as JSON text (the model's, or as an outer middleware changed them)."""
    resumed: bool = False
    """True when the call is an idempotent tool's call that an interrupted run left without a result,
    run again before the run's first model call (the middleware runs around the re-run too); False
    for a call a person approved, which runs then for the first time."""
    context: ToolContext[Any] | None = None
    """The call's run context (session, user, idempotency key, deps): what the tool is given, whatever
    a middleware passes on. None only for an invocation built outside a run."""

    def with_arguments(self, arguments: str | Mapping[str, Any]) -> ToolInvocation:
        """Return this call with other arguments: JSON text, or a mapping to encode as JSON."""
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return ToolInvocation(name=self.name, call_id=self.call_id, arguments=text, resumed=self.resumed,
                              context=self.context)

    def parsed_arguments(self) -> dict[str, Any] | None:
        """Return the arguments as a dict; None when the model sent something else than a JSON object.

        No arguments (empty text or ``null``) are an empty dict. A call whose arguments are not an
        object is best passed on unchanged: the tool answers it with an error the model can act on.
        """
        if self.arguments.strip() in ("", "null"):
            return {}
        try:
            parsed = json.loads(self.arguments)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None


CallTool: TypeAlias = Callable[[ToolInvocation], Awaitable[ToolOutcome]]
"""The next step of a tool middleware chain: call it to go on to the tool."""

ToolMiddleware: TypeAlias = Callable[[ToolInvocation, CallTool], Awaitable[ToolOutcome]]
"""Wraps one tool call: ``async def mw(call, call_next) -> ToolOutcome``.

It may pass the call on with other arguments (``call_next(call.with_arguments(...))``), answer it
without running the tool (return its own `ToolOutcome`), or replace or post-process the outcome
``call_next`` returned. What it returns is the result the model sees and the session stores.
"""


class Tool:
    """A function the model can call, with its schema, validation, timeout and idempotency flag.

    Build tools with `@tool`; construct `Tool` directly only to wrap a function under another name.
    """

    __slots__ = ("_args_model", "_context", "_fn", "_handler", "_is_async", "description", "idempotent",
                 "name", "needs_approval", "outbox", "parameters", "retry_with_key", "run_in_thread", "spec", "timeout")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        idempotent: bool = False,
        timeout: float | None = None,
        run_in_thread: bool = True,
        needs_approval: bool | ApprovalCheck = False,
        retry_with_key: bool = False,
        outbox: bool = False,
    ) -> None:
        self._fn = fn
        self.name: str = name or fn.__name__
        """Name the model calls the tool by."""
        if not _NAME_RE.match(self.name):
            raise UsageError(
                f"tool name {self.name!r} is not allowed: use 1-64 letters, digits, '_' or '-' "
                "(pass name=... to @tool)"
            )
        summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
        self.description: str = description if description is not None else summary
        """What the tool does, for the model."""
        self.idempotent: bool = idempotent
        """True when running the tool twice with the same arguments is safe (crash recovery re-runs it)."""
        self.retry_with_key: bool = retry_with_key
        """True when the tool's effect is deduplicated by ``ctx.idempotency_key`` (crash recovery re-runs it)."""
        self.outbox: bool = outbox
        """True when the tool's only effects are the ``ctx.outbox`` entries committed with its result (crash
        recovery re-runs it: nothing of a call cut short was committed)."""
        self.timeout: float | None = timeout
        """Seconds the tool may run before its result becomes a timeout error; None for no limit.

        An async tool is cancelled then; a sync tool's thread cannot be, and goes on (a run waits for
        it before it gives its session back, and records what it returns as a late result)."""
        self.run_in_thread: bool = run_in_thread
        """For sync functions: run in a worker thread (the default) so a slow tool never blocks the loop."""
        self.needs_approval: bool | ApprovalCheck = needs_approval
        """True when a person must approve every call before it runs; or a check deciding per call
        (`contextpipe.approvals.ApprovalCheck`). False runs calls as the model makes them."""
        self._is_async = inspect.iscoroutinefunction(fn)
        self._handler: ContextHandler | None = None
        self._args_model, self._context = _arguments_model(fn, self.name, arg_docs)
        schema = self._args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        self.parameters: dict[str, Any] = schema
        """JSON schema of the arguments."""
        self.spec: ToolSpec = ToolSpec(self.name, self.description, schema)
        """What a model is told about this tool."""

    @overload
    @classmethod
    def from_schema(cls, name: str, description: str, parameters: dict[str, Any], handler: Handler, *,
                    idempotent: bool = False, timeout: float | None = None, with_context: Literal[False] = False,
                    needs_approval: bool | ApprovalCheck = False) -> Tool: ...

    @overload
    @classmethod
    def from_schema(cls, name: str, description: str, parameters: dict[str, Any], handler: ContextHandler, *,
                    idempotent: bool = False, timeout: float | None = None, with_context: Literal[True],
                    needs_approval: bool | ApprovalCheck = False) -> Tool: ...

    @classmethod
    def from_schema(
        cls,
        name: str,
        description: str,
        parameters: dict[str, Any],
        handler: Handler | ContextHandler,
        *,
        idempotent: bool = False,
        timeout: float | None = None,
        with_context: bool = False,
        needs_approval: bool | ApprovalCheck = False,
    ) -> Tool:
        """Return a tool defined by a JSON schema and a handler taking the parsed arguments.

        For tools that live elsewhere (an MCP server, a remote API): the arguments must be a JSON
        object; checking them against the schema is the handler's (or the remote side's) job.
        ``with_context=True``: the handler takes the call's `ToolContext` as its second argument.
        `needs_approval` is as for `tool`.
        """
        if not _NAME_RE.match(name):
            raise UsageError(f"tool name {name!r} is not allowed: use 1-64 letters, digits, '_' or '-'")
        self = cls.__new__(cls)
        self._fn = handler
        if with_context:
            self._handler = handler  # type: ignore[assignment]
        else:
            plain: Handler = handler  # type: ignore[assignment]
            self._handler = lambda arguments, _context: plain(arguments)
        self._is_async = True
        self._args_model, self._context = None, None  # type: ignore[assignment]
        self.name, self.description, self.parameters = name, description, parameters
        self.idempotent, self.timeout, self.run_in_thread = idempotent, timeout, False
        self.needs_approval = needs_approval
        self.retry_with_key = self.outbox = False
        self.spec = ToolSpec(name, description, parameters)
        return self

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    @property
    def runs_again(self) -> bool:
        """True when a call cut by a crash is run again by the next run: `idempotent`, `retry_with_key` or `outbox`."""
        return self.idempotent or self.retry_with_key or self.outbox

    async def __call__(self, **kwargs: Any) -> Any:
        """Call the underlying function directly with keyword arguments (no validation)."""
        if self._is_async:
            return await self._fn(**kwargs)
        return self._fn(**kwargs)

    async def invoke(self, arguments: str, *, context: ToolContext[Any] | None = None) -> ToolOutcome:
        """Validate `arguments` (JSON text from the model), run the tool, and return its outcome.

        `context` is what a `ToolContext` parameter of the tool is given (a run passes each call's
        own); a tool that declares one and is invoked without it gets an error outcome. Never raises
        for the tool's own failures: they are returned as error outcomes. A sync tool that times out
        goes on in its thread, and what it returns then is discarded (a run keeps it: see the Tools guide).
        """
        return await self._invoke(arguments, None, context)

    async def _invoke(self, arguments: str, on_thread: OnThread | None,
                      context: ToolContext[Any] | None = None) -> ToolOutcome:
        """`invoke`, telling `on_thread` about the worker thread of a sync tool (so a run can keep it)."""
        if self._handler is not None:
            return await self._invoke_handler(self._handler, arguments, context)
        if self._context is not None:
            problem = (f"Error: tool {self.name!r} takes a ToolContext, and was invoked without one; run it through "
                       "an agent, or pass invoke(arguments, context=ToolContext.for_call(...))."
                       if context is None else context._deps_problem(self._context[1]))
            if problem is not None:
                return ToolOutcome(problem, is_error=True)
        import pydantic  # loaded with the first tool (imports of contextpipe stay fast)

        try:
            if arguments.strip() in ("", "null"):
                arguments = "{}"
            parsed = self._args_model.model_validate_json(arguments)
        except pydantic.ValidationError as exc:
            return ToolOutcome(_describe_validation_error(self.name, arguments, exc), is_error=True)
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        if self._context is not None:
            kwargs[self._context[0]] = context
        outbox: Outbox | None = getattr(context, "outbox", None)  # (no branch: _invoke is complex enough)
        if not self._is_async and self.run_in_thread:
            return await self._invoke_in_thread(kwargs, on_thread, outbox)
        try:
            if self.timeout is None:
                value = await self._run(kwargs, outbox)
            else:
                async with asyncio.timeout(self.timeout):
                    value = await self._run(kwargs, outbox)
        except TimeoutError:
            return ToolOutcome(
                f"Error: tool {self.name!r} did not finish within {self.timeout:g} s and was abandoned.",
                is_error=True,
            )
        except Exception as exc:
            return ToolOutcome(f"Error: tool {self.name!r} raised {type(exc).__name__}: {exc}", is_error=True)
        return _outcome(value)

    async def _invoke_handler(self, handler: ContextHandler, arguments: str,
                              context: ToolContext[Any] | None) -> ToolOutcome:
        try:
            parsed = json.loads(arguments) if arguments.strip() not in ("", "null") else {}
        except ValueError as exc:
            return ToolOutcome(
                f"Error: the arguments for tool {self.name!r} are not valid JSON ({exc}). Received: "
                f"{arguments[:200]!r}. Send a JSON object matching the tool's schema.", is_error=True)
        if not isinstance(parsed, dict):
            return ToolOutcome(f"Error: the arguments for tool {self.name!r} must be a JSON object, got "
                               f"{type(parsed).__name__}.", is_error=True)
        try:
            if self.timeout is None:
                outcome = await handler(parsed, context)
            else:
                async with asyncio.timeout(self.timeout):
                    outcome = await handler(parsed, context)
            if context is not None:
                context.outbox._returned_now()
        except TimeoutError:
            return ToolOutcome(
                f"Error: tool {self.name!r} did not finish within {self.timeout:g} s and was abandoned.",
                is_error=True)
        except Exception as exc:
            return ToolOutcome(f"Error: tool {self.name!r} raised {type(exc).__name__}: {exc}", is_error=True)
        return _outcome(outcome)

    async def _run(self, kwargs: dict[str, Any], outbox: Outbox | None) -> Any:
        if not self._is_async:
            return returning(self._fn, kwargs, outbox)
        value = await self._fn(**kwargs)
        if outbox is not None:  # it returned: what it added to the outbox counts (`contextpipe.outbox`)
            outbox._returned_now()
        return value

    async def _invoke_in_thread(self, kwargs: dict[str, Any], on_thread: OnThread | None,
                                outbox: Outbox | None) -> ToolOutcome:
        """Run a sync tool in a worker thread (as `asyncio.to_thread` does) and wait for it, up to the timeout.

        The thread's outcome is a future of its own, awaited through `asyncio.shield`: a timeout or a
        cancellation ends the wait, never the future, so whoever `on_thread` gave it to still gets it.
        """
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, returning, self._fn, kwargs, outbox)
        running = loop.run_in_executor(None, call)
        thread = ToolThread(loop.create_future())
        running.add_done_callback(functools.partial(self._set_outcome, thread.outcome))
        if on_thread is not None:
            on_thread(thread)
        try:
            async with asyncio.timeout(self.timeout):
                return await asyncio.shield(thread.outcome)
        except TimeoutError:
            thread.timed_out = True
            still = ("; it is still running, and what it returns will be added to the conversation when it "
                     "finishes (check that before calling it again)." if on_thread is not None else
                     " and was abandoned.")
            return ToolOutcome(f"Error: tool {self.name!r} did not finish within {self.timeout:g} s{still}",
                               is_error=True)

    def _set_outcome(self, outcome: asyncio.Future[ToolOutcome], done: asyncio.Future[Any]) -> None:
        """Set `outcome` from the thread's return value or exception (`done`), in the tool's terms."""
        if outcome.done():
            return
        if done.cancelled():  # only a closing event loop cancels it
            outcome.cancel()
            return
        try:
            value = done.result()
            outcome.set_result(_outcome(value))
        except Exception as exc:
            outcome.set_result(ToolOutcome(f"Error: tool {self.name!r} raised {type(exc).__name__}: {exc}",
                                           is_error=True))
        except BaseException as exc:  # a KeyboardInterrupt or SystemExit raised in the thread: the caller's to see
            outcome.set_exception(exc)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    timeout: float | None = None,
    run_in_thread: bool = True,
    needs_approval: bool | ApprovalCheck = False,
    retry_with_key: bool = False,
    outbox: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    timeout: float | None = None,
    run_in_thread: bool = True,
    needs_approval: bool | ApprovalCheck = False,
    retry_with_key: bool = False,
    outbox: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` from a sync or async function; use bare (``@tool``) or with options.

    A call cut by a crash is run again when the tool is marked `idempotent=True` (safe to run
    twice), `retry_with_key=True` (what it calls dedupes by ``ctx.idempotency_key``) or
    `outbox=True` (its only effects are ``ctx.outbox`` entries); any other is answered
    "interrupted" (the side-effects guide has the table). `timeout` bounds its
    run time in seconds; `run_in_thread=False` runs a sync function on the event loop (only for
    functions that return at once). `needs_approval=True` makes every call wait for a person's
    decision (the run stops with ``stop_reason="approval_required"``); a function of the call's
    `ToolContext` and arguments (`contextpipe.approvals.ApprovalCheck`) decides per call.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f, name=name, description=description, idempotent=idempotent, timeout=timeout,
            run_in_thread=run_in_thread, needs_approval=needs_approval, retry_with_key=retry_with_key, outbox=outbox,
        )

    return wrap(fn) if fn is not None else wrap


def as_tool(value: Tool | Callable[..., Any]) -> Tool:
    """Return `value` if it is a `Tool`, else wrap the plain function with `@tool` defaults."""
    return value if isinstance(value, Tool) else Tool(value)


# --- helpers -----------------------------------------------------------------------------------------

def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google, Sphinx (reST) or NumPy docstring into its description and per-argument descriptions.

    The style is detected by `docstring_parser`; a docstring it cannot parse is kept whole as the description.
    """
    if not doc.strip():
        return "", {}
    import docstring_parser

    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return doc.strip(), {}
    text = "\n\n".join(p for p in (parsed.short_description, parsed.long_description) if p).strip()
    args = {p.arg_name.lstrip("*"): " ".join(p.description.split()) for p in parsed.params if p.description}
    return text, args


def _arguments_model(fn: Callable[..., Any], tool_name: str,
                     arg_docs: dict[str, str]) -> tuple[type[pydantic.BaseModel], tuple[str, DepsCheck | None] | None]:
    """Return the model of the arguments the model sends, and the `ToolContext` parameter with its deps type, if any."""
    import pydantic  # loaded with the first tool (imports of contextpipe stay fast)

    sig = inspect.signature(fn)
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception as exc:
        raise UsageError(f"tool {tool_name!r}: cannot resolve its type hints ({exc})") from exc
    fields: dict[str, Any] = {}
    context: tuple[str, DepsCheck | None] | None = None
    for pname, param in sig.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise UsageError(f"tool {tool_name!r}: *args / **kwargs are not supported; name each argument")
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise UsageError(f"tool {tool_name!r}: positional-only argument {pname!r} is not supported")
        annotation: object = hints.get(pname, Any)
        if annotation is ToolContext or get_origin(annotation) is ToolContext:
            if context is not None:
                raise UsageError(f"tool {tool_name!r}: parameters {context[0]!r} and {pname!r} both take the "
                                 "ToolContext; declare one")
            try:
                context = (pname, DepsCheck.for_annotation((get_args(annotation) or (object,))[0],
                                                           getattr(inspect.unwrap(fn), "__globals__", {})))
            except UsageError as exc:
                raise UsageError(f"tool {tool_name!r}: {exc}") from exc
            continue
        if _mentions_context(annotation):
            raise UsageError(f"tool {tool_name!r}: parameter {pname!r} must be annotated ToolContext or "
                             "ToolContext[Deps] alone (not Optional or in a union): a run always gives one, and a "
                             "test passes one with tool.invoke(arguments, context=ToolContext.for_call(...))")
        default: Any = ... if param.default is inspect.Parameter.empty else param.default
        doc = arg_docs.get(pname)
        fields[pname] = (annotation, pydantic.Field(default, description=doc) if doc else default)
    model_name = "".join(part.capitalize() for part in re.split(r"[_-]", tool_name)) + "Arguments"
    return pydantic.create_model(model_name, __config__=pydantic.ConfigDict(extra="forbid"), **fields), context


def _mentions_context(annotation: object) -> bool:
    return any(arg is ToolContext or get_origin(arg) is ToolContext or _mentions_context(arg)
               for arg in get_args(annotation))


def _describe_validation_error(name: str, arguments: str, exc: pydantic.ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err["loc"]) or "(arguments)"
        kind: Literal["json_invalid"] | str = err["type"]
        if kind == "json_invalid":
            return (
                f"Error: the arguments for tool {name!r} are not valid JSON ({err['msg']}). "
                f"Received: {arguments[:200]!r}. Send a JSON object matching the tool's schema."
            )
        problems.append(f"{loc}: {err['msg']}")
    return f"Error: invalid arguments for tool {name!r}: " + "; ".join(problems) + ". Fix them and call again."


def _outcome(value: Any) -> ToolOutcome:
    """Return what a tool function returned as its outcome: bytes and media parts as attachments, the rest as text."""
    if isinstance(value, ToolOutcome):
        return value
    if isinstance(value, bytes | bytearray | memoryview | DataPart | UriPart):
        from ._media import returned

        text, parts = returned(value)
        return ToolOutcome(text, parts=parts)
    return ToolOutcome(_to_text(value))


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    pydantic = sys.modules.get("pydantic")  # a pydantic model can exist only once pydantic is imported
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return str(value.model_dump_json())
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)

