"""The ``contextpipe`` command: chat, sessions, inspect, serve and the offline demo.

One module per command group: `demo`, `chat` (with the prompt it runs), `index`, `inspect`,
`serve` (``serve`` and ``ui``) and `sessions`; what they share is in `_shared`.

Sessions live in a SQLite file (``--db``, or ``$CONTEXTPIPE_DB``, default ``contextpipe.db``). The
model comes from flags or the usual environment variables (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``OPENAI_MODEL``; with ``--provider anthropic`` the ``ANTHROPIC_`` ones); any OpenAI-compatible server works.

Reading commands (``sessions list/show/export``, ``inspect``) open the file read-only and never
create it; a user error (bad id, missing or damaged file, any `ContextPipeError`) is one line on
stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from ..errors import ContextPipeError
from . import chat, demo, index, inspect, serve, sessions
from ._shared import err, error_text, out, shown

__all__ = ["app", "main"]

app = typer.Typer(
    name="contextpipe", help="LLM agents built around the context pipeline.", no_args_is_help=True,
    add_completion=True, pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"contextpipe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """LLM agents built around the context pipeline."""


# In the order ``contextpipe --help`` lists them.
app.command()(demo.demo)
app.command()(chat.chat)
app.command()(index.index)
app.command("inspect")(inspect.inspect_session)
app.command()(serve.serve)
app.command()(serve.ui)
app.add_typer(sessions.app, name="sessions")


def main() -> None:
    """Entry point of the ``contextpipe`` command: a `ContextPipeError` is one line on stderr, exit code 1."""
    try:
        app(prog_name="contextpipe")
    except ContextPipeError as exc:
        err.print(f"[red]error:[/red] {shown(error_text(exc))}")
        raise SystemExit(1) from None
