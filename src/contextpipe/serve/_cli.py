"""What ``contextpipe serve`` and ``contextpipe ui`` do (cli.py only declares their options).

The server runs under uvicorn. Its configuration travels to the app factory (`app_from_env`) in one
environment variable, so ``--workers N`` processes each build the same app; each worker imports the
user's module and so opens its own store connection.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import os
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from .. import Agent
from ..agent import DEFAULT_HISTORY_ID
from ..errors import UsageError
from ..session import validate_tenant
from ._keys import ApiKeys, Grant, hash_key, new_key
from ._worker_config import read_config, write_config

__all__ = ["app_from_env", "history_line", "load_agent", "run_server", "run_ui"]


_EXPECTED: Final = "serve expects MODULE:ATTRIBUTE naming an Agent in the module (like examples.weather:agent)"
_EXPECTED_OBJECT: Final = "serve expects a contextpipe Agent, or a function without arguments returning one"
_NOT_AWAITED: Final = "serve calls a factory without awaiting it, so make it a plain function returning the Agent"


def _cause(exc: BaseException) -> str:
    """`exc` in one line: its type, its message's first line and where it was raised (deepest frame outside importlib).

    The rest of a message of several lines (a validation error's) is for ``--traceback`` to show.
    """
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    if isinstance(exc, SyntaxError) or not frames:  # a SyntaxError's text says where already
        return text
    return f"{text} (at {frames[-1].filename}, line {frames[-1].lineno})"


def _import(target: str, module_name: str) -> ModuleType:
    """Import a dotted module name, or a ``.py`` file by its path; any failure is a `UsageError` naming it."""
    path = Path(module_name)
    if module_name.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"cannot serve {target!r}: no such file: {module_name}")
    elif "/" in module_name or "\\" in module_name or not all(module_name.split(".")):  # my-app.py imports as my-app
        raise UsageError(f"cannot serve {target!r}: {module_name!r} is neither a module name (like "
                         f"examples.weather) nor a path to a .py file; {_EXPECTED}")
    try:
        if not module_name.endswith(".py"):
            return importlib.import_module(module_name)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as exc:
        name = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if name and (module_name == name or module_name.startswith(name + ".")):  # not the module's own import
            raise UsageError(f"cannot serve {target!r}: cannot import {module_name!r}, there is no module named "
                             f"{name!r} (run from the folder that holds it, or pass --app-dir)") from None
        raise UsageError(f"cannot serve {target!r}: importing {module_name!r} failed: {_cause(exc)}") from exc


def _attribute(target: str, module: ModuleType, attribute: str) -> Any:
    """Return ``module.attribute`` (dotted: ``module.a.b``), or say which agents the module has."""
    obj: Any = module
    for name in attribute.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            agents = sorted(n for n, v in vars(module).items() if isinstance(v, Agent))
            has = f" (its Agents: {', '.join(agents)})" if agents else ""
            raise UsageError(f"cannot serve {target!r}: module {module.__name__!r} has no attribute "
                             f"{attribute!r}{has}") from None
    return obj


def _is_factory(obj: object) -> bool:
    """Whether serve calls `obj` for the agent: any callable but a builtin, and of classes only `Agent` and its own.

    A cached function or an object with ``__call__`` is called; a builtin is not (``os:abort`` would abort).
    """
    if inspect.isclass(obj):
        return issubclass(obj, Agent)
    return callable(obj) and not inspect.isbuiltin(obj)


def _kind(obj: object) -> str:
    if inspect.isclass(obj):
        return f"it is the class {obj.__qualname__}, not an instance"
    return f"it is of type {type(obj).__name__}"


def _call_factory(target: str, factory: Callable[..., Any]) -> Any:
    """Call the factory `target` names, which takes no arguments, to get the agent."""
    if inspect.iscoroutinefunction(factory):
        raise UsageError(f"cannot serve {target!r}: it is an async function; {_NOT_AWAITED}")
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (ValueError, TypeError):  # no signature to read: the call will say
        parameters = []
    needed = [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if needed:
        what = "a class" if inspect.isclass(factory) else "a function"
        raise UsageError(f"cannot serve {target!r}: it is {what} that needs arguments ({', '.join(needed)}); "
                         f"{_EXPECTED_OBJECT}")
    try:
        made = factory()
    except Exception as exc:
        raise UsageError(f"cannot serve {target!r}: calling it failed: {_cause(exc)}") from exc
    if inspect.iscoroutine(made):
        made.close()  # never awaited, and closed so that Python does not warn about it on exit
        raise UsageError(f"cannot serve {target!r}: it returned a coroutine; {_NOT_AWAITED}")
    return made


def load_agent(target: str, *, app_dir: str | None = ".") -> Agent:
    """Import ``module:attribute`` (or ``path/to/file.py:attribute``) and return the `Agent` it names.

    The attribute may be an `Agent` or a callable without arguments returning one (a function, a cached
    one, an object with ``__call__``, a subclass of `Agent`; never a builtin). Every way this can
    fail (bad form, no module, an import that raises, no attribute, not an agent) is one `UsageError`
    naming `target`; when the user's code raised, that exception is its ``__cause__``.
    """
    module_name, sep, attribute = target.strip().rpartition(":")  # a Windows drive's colon stays in the path
    if not sep or not module_name or not attribute:
        raise UsageError(f"cannot serve {target!r}: {_EXPECTED}")
    if app_dir is not None and str(Path(app_dir).resolve()) not in sys.path:
        sys.path.insert(0, str(Path(app_dir).resolve()))
    obj = _attribute(target, _import(target, module_name), attribute)
    if _is_factory(obj):
        made = _call_factory(target, obj)
        if not isinstance(made, Agent):
            raise UsageError(f"cannot serve {target!r}: calling it returned an object of type "
                             f"{type(made).__name__}; {_EXPECTED_OBJECT}")
        return made
    if not isinstance(obj, Agent):
        raise UsageError(f"cannot serve {target!r}: {_kind(obj)}; {_EXPECTED_OBJECT}")
    return obj


def history_line(agent: Agent) -> str:
    """Say which history the served agent keeps its sessions' conversations with (printed at start)."""
    loader = next((p for p in agent.history_providers if p.policy.load_messages), None)
    if loader is None:
        return "history: none (each run sees only its own input; add History(store) to keep conversations)"
    where = f"{agent.store.backend} store" + (", lost when the server stops" if agent.store.backend == "memory"
                                              else "")
    if loader.source_id == DEFAULT_HISTORY_ID:
        return f"history: the agent's default ({DEFAULT_HISTORY_ID!r}, in the agent's {where})"
    return f"history: {loader!r}"


def app_from_env() -> Any:
    """Build the app from the configuration `run_server` / `run_ui` left in the environment (uvicorn factory)."""
    from . import ServeSettings, create_app

    config = read_config()
    keys = ApiKeys.load(config.get("keys_file"))
    for tenant, hashed in config.get("hashes", []):
        keys.add_hashed(hashed, Grant(tenant))
    if not len(keys):
        raise UsageError("no API keys: pass --keys FILE or set CONTEXTPIPE_API_KEYS")
    settings = ServeSettings(**{**config["settings"], "cors_origins": tuple(config["settings"]["cors_origins"])})
    if config["mode"] == "ui":
        from ..stores.sqlite import SQLiteStore

        return create_app(None, keys=keys, store=SQLiteStore(config["db"], read_only=True), settings=settings,
                          close_store=True)
    agent = load_agent(config["target"], app_dir=config.get("app_dir"))
    return create_app(agent, keys=keys, settings=settings, close_store=True)


def _free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As uvicorn binds: the connections of a server just stopped (in TIME_WAIT) do not hold the port,
        # while a process listening on it still does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port") from None


def _run(config: dict[str, Any], *, host: str, port: int, workers: int, say: Callable[[str], None],
         tenant: str, drain_timeout: float, log_level: str) -> None:
    import uvicorn

    from ._connections import default_max_connections, raise_open_files

    if workers < 1:
        raise UsageError(f"--workers must be at least 1, got {workers}")
    if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise UsageError(f"--log-level must be one of critical, error, warning, info, debug, trace; got {log_level!r}")
    keys = ApiKeys.load(config.get("keys_file"))
    ephemeral = None
    if not len(keys):
        validate_tenant(tenant)
        ephemeral = "cp_" + os.urandom(24).hex()
        config["hashes"] = [[tenant, hash_key(ephemeral)]]
    if config["mode"] == "serve":
        agent = load_agent(config["target"], app_dir=config.get("app_dir"))  # fail here, not in every worker
        if workers > 1 and agent.store.backend == "memory":
            raise UsageError("--workers needs a store the workers share (SQLite file, PostgreSQL or Redis); "
                             f"{config['target']} keeps its sessions in memory, in each worker apart")
        say(history_line(agent))
    _free(host, port)
    open_files = raise_open_files()
    cap = config["settings"]["max_connections"] or default_max_connections(open_files)
    say(f"connections: at most {cap} open per process (open-files limit {open_files}); idle ones closed first"
        if cap is not None else "connections: no cap (no open-files limit to read)")
    write_config(config)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}"
    say(f"contextpipe on {url}  (API docs: {url}/docs)")
    if ephemeral is not None:
        say(f"no API keys configured: this run's key for tenant {tenant!r} is {ephemeral}")
        say(f"inspector: {url}/ui/#key={ephemeral}")
    else:
        say(f"inspector: {url}/ui/")
    # The protocol holds the connections to `ServeSettings`' deadlines and cap (`_connections`); the app
    # serves no WebSocket, so an upgrade request is an HTTP request like any other.
    uvicorn.run("contextpipe.serve._cli:app_from_env", factory=True, host=host, port=port, workers=workers,
                http="contextpipe.serve._connections:GuardedProtocol", ws="none",
                timeout_graceful_shutdown=max(1, int(drain_timeout)), log_level=log_level, lifespan="on")


def run_server(target: str, *, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
               keys_file: str | None = None, tenant: str = "default", on_disconnect: str = "finish",
               drain_timeout: float = 30.0, max_body_bytes: int = 1 << 20, app_dir: str = ".",
               log_level: str = "info", cors_origins: tuple[str, ...] = (), header_timeout: float = 10.0,
               body_timeout: float = 60.0, keep_alive_timeout: float = 5.0, max_connections: int | None = None,
               agui_rewinds: bool = False, say: Callable[[str], None] = print) -> None:
    """Serve the agent `target` (``module:attribute``) until SIGTERM or Ctrl-C."""
    from . import ServeSettings

    for option, seconds in (("header", header_timeout), ("body", body_timeout), ("keep-alive", keep_alive_timeout)):
        if not seconds > 0:
            raise UsageError(f"--{option}-timeout must be a number of seconds above 0, got {seconds}")
    if max_connections is not None and max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, got {max_connections}")
    if on_disconnect not in ("finish", "cancel"):
        raise UsageError(f"--on-disconnect must be 'finish' or 'cancel', got {on_disconnect!r}")
    if max_body_bytes < 1024:
        raise UsageError("--max-body must be at least 1024 bytes")
    for origin in cors_origins:
        if not origin.startswith(("http://", "https://")) and origin != "*":
            raise UsageError(f"--cors-origin must be an origin like https://app.example.com, got {origin!r}")
    settings = ServeSettings(max_body_bytes=max_body_bytes, on_disconnect=on_disconnect,  # type: ignore[arg-type]
                             drain_timeout=drain_timeout, cors_origins=tuple(cors_origins),
                             header_timeout=header_timeout, body_timeout=body_timeout,
                             keep_alive_timeout=keep_alive_timeout, max_connections=max_connections,
                             agui_rewinds=agui_rewinds)
    config = {"mode": "serve", "target": target, "app_dir": str(Path(app_dir).resolve()), "keys_file": keys_file,
              "settings": asdict(settings)}
    _run(config, host=host, port=port, workers=workers, say=say, tenant=tenant, drain_timeout=drain_timeout,
         log_level=log_level)


def run_ui(db: str, *, host: str = "127.0.0.1", port: int = 8001, tenant: str = "default",
           keys_file: str | None = None, log_level: str = "warning", say: Callable[[str], None] = print) -> None:
    """Serve the inspector over the SQLite file `db`, read-only."""
    from . import ServeSettings

    path = Path(db)
    if not path.is_file():
        raise UsageError(f"no session database at {db}" + (" (it is a directory)" if path.is_dir() else ""))
    asyncio.run(_check_readable(path))
    config = {"mode": "ui", "db": str(path.resolve()), "keys_file": keys_file,
              "settings": asdict(ServeSettings(read_only=True))}
    _run(config, host=host, port=port, workers=1, say=say, tenant=tenant, drain_timeout=1, log_level=log_level)


async def _check_readable(path: Path) -> None:
    """Raise `StoreError` saying what is wrong unless `path` is a session database this release can read."""
    from ..stores.sqlite import SQLiteStore

    async with SQLiteStore(path, read_only=True) as store:
        await store.list_sessions("default", limit=1)


def make_key(tenant: str, keys_file: str | None, say: Callable[[str], None] = print) -> None:
    """Make an API key for `tenant`; append its hash to `keys_file` (or print the line to add)."""
    key, line = new_key(tenant)
    if keys_file:
        with open(keys_file, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        say(f"added a key for tenant {tenant!r} to {keys_file} (only its hash is stored there):")
    else:
        say(f"add this line to your keys file (or to $CONTEXTPIPE_API_KEYS): {line}")
        say("the key itself (give it to the client; it is not stored anywhere):")
    say(key)
