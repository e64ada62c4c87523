"""``contextpipe serve`` and ``contextpipe ui``: their options; what they do is in `contextpipe.serve._cli`."""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from ..errors import ContextPipeError
from ..session import DEFAULT_TENANT
from ._shared import DEFAULT_DB, DbOption, TenantOption, fail, out

__all__ = ["serve", "ui"]


def serve(
    target: Annotated[str | None, typer.Argument(help="The agent to serve, as MODULE:ATTRIBUTE (like "
                                                 "examples.weather:agent).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(help="Worker processes (use a PostgreSQL or Redis store for more "
                                         "than one machine).")] = 1,
    keys: Annotated[str | None, typer.Option("--keys", help="File of API keys ('TENANT sha256:HEX' lines); also "
                                             "read: $CONTEXTPIPE_API_KEYS. Without any, a key is made for this "
                                             "run.")] = None,
    tenant: Annotated[str, typer.Option(help="Tenant of the key made when none is configured.")] = DEFAULT_TENANT,
    on_disconnect: Annotated[str, typer.Option(help="When a client disconnects mid-run: 'finish' (run on and "
                                               "persist) or 'cancel'.")] = "finish",
    drain_timeout: Annotated[float, typer.Option(help="On SIGTERM, seconds runs in flight get to finish.")] = 30.0,
    max_body: Annotated[int, typer.Option(help="Largest request body, in bytes.")] = 1 << 20,
    app_dir: Annotated[str, typer.Option(help="Folder to import the module from.")] = ".",
    log_level: Annotated[str, typer.Option(help="uvicorn log level: debug, info (with access log), warning, "
                                           "error.")] = "info",
    cors_origin: Annotated[list[str] | None, typer.Option("--cors-origin", help="Browser origin allowed to call "
                                                          "the API (repeatable).")] = None,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection has to send a request's head; then "
                                                  "it is closed.")] = 10.0,
    body_timeout: Annotated[float, typer.Option(help="Seconds a request's body has to arrive whole after its head; "
                                                "then 408 and the connection is closed.")] = 60.0,
    keep_alive_timeout: Annotated[float, typer.Option(help="Seconds an idle keep-alive connection is kept.")] = 5.0,
    max_connections: Annotated[int | None, typer.Option(help="Connections open at once per worker (past it the one "
                                                        "idle the longest is closed; none idle: 503). Default: the "
                                                        "open-files limit less a tenth.", show_default=False)] = None,
    agui_rewinds: Annotated[bool, typer.Option("--agui-rewinds", help="Take an AG-UI history that drops the "
                                               "thread's last turn as a regenerate or edit (one client per "
                                               "thread; see the serving guide).")] = False,
    new_key: Annotated[str | None, typer.Option("--new-key", metavar="TENANT", help="Make an API key for TENANT "
                                                "(appended to --keys FILE when given) and exit.")] = None,
    show_traceback: Annotated[bool, typer.Option("--traceback", help="When your code raises (importing the "
                                                 "module, calling the factory), print its full traceback.")] = False,
) -> None:
    """Serve an agent over HTTP: sessions, runs (JSON or server-sent events), AG-UI and the /ui inspector."""
    try:
        from ..serve import _cli as serve_cli

        if new_key is not None:
            serve_cli.make_key(new_key, keys, say=lambda line: out.print(line, markup=False))
            return
        if target is None:
            raise fail("give the agent to serve, as MODULE:ATTRIBUTE (like examples.weather:agent)", code=2)
        serve_cli.run_server(target, host=host, port=port, workers=workers, keys_file=keys, tenant=tenant,
                             on_disconnect=on_disconnect, drain_timeout=drain_timeout, max_body_bytes=max_body,
                             app_dir=app_dir, log_level=log_level, cors_origins=tuple(cors_origin or ()),
                             header_timeout=header_timeout, body_timeout=body_timeout,
                             keep_alive_timeout=keep_alive_timeout, max_connections=max_connections,
                             agui_rewinds=agui_rewinds, say=lambda line: print(line, file=sys.stderr, flush=True))
    except ContextPipeError as exc:
        if exc.__cause__ is None:
            raise fail(str(exc)) from None
        if show_traceback:  # the user's code raised (importing the module, calling the factory): show where
            traceback.print_exception(exc.__cause__, file=sys.stderr)
            raise fail(str(exc)) from None
        raise fail(f"{exc}; run again with --traceback to see the full traceback") from None


def ui(
    db: DbOption = DEFAULT_DB,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8001,
    tenant: TenantOption = DEFAULT_TENANT,
    keys: Annotated[str | None, typer.Option("--keys", help="File of API keys (default: a key for this run).")]
    = None,
) -> None:
    """Open the web inspector on a SQLite session file, read-only."""
    try:
        from ..serve import _cli as serve_cli

        serve_cli.run_ui(str(db), host=host, port=port, tenant=tenant, keys_file=keys,
                         say=lambda line: print(line, file=sys.stderr, flush=True))
    except ContextPipeError as exc:
        raise fail(str(exc)) from None
