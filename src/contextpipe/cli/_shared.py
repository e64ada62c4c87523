"""What the command groups share: the two consoles, the common options, one-line errors and opening a database.

The library's messages name the Python parameter that fixes a problem (``timeout=...``); the
command line shows them with its flags instead (`error_text`, with the `FLAGS` table).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ContextPipeError, shorten
from ..messages import Message
from ..session import DEFAULT_TENANT, Session
from ..stores.sqlite import SQLiteStore
from ..trace import preview

__all__ = [
    "CONTROL_CHARACTERS", "DEFAULT_DB", "FLAGS", "DbOption", "JsonOption", "SessionArgument", "TenantOption",
    "check_new_db", "complete_sessions", "err", "error_text", "existing_session", "fail", "message_line", "open_store",
    "out", "print_json", "shown",
]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_DB = Path("contextpipe.db")
DbOption = Annotated[Path, typer.Option("--db", envvar="CONTEXTPIPE_DB", help="SQLite file holding the sessions "
                                        "(another application's database is refused).")]
TenantOption = Annotated[str, typer.Option("--tenant", help="Tenant of the sessions.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]

CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters (escape sequences included) a model's text must not send to the terminal."""


def shown(text: str) -> str:
    r"""Return text from a model, a store or an error, safe to print as Rich markup on a terminal.

    >>> shown("[b]bold?[/b] \x1b[2Jcleared")
    '\\[b]bold?\\[/b] [2Jcleared'
    """
    return escape(CONTROL_CHARACTERS.sub("", text))


FLAGS: Final = (
    ("raise timeout=...", "raise --timeout"),
    ("check base_url / ", "check --base-url / "),
    (" / api_key and ", " / --api-key and "),
    ("History(store, max_messages=...), Compaction", "--max-input-tokens"),
    ("History(store, max_messages=...)", "--max-input-tokens"),
    ("or pass lease_wait=<seconds> to wait for it", "then send the message again"),
    ("use a new file, or pass allow_other_tables=True to add contextpipe's cp_* tables to this one",
     "pass a new file to --db"),
    ("reload it with agent.session(...) and apply the change again", "start the command again"),
    ("start a new one with agent.session(...)", "your next message starts a new one"),
)
"""What the library's messages say to a Python caller, and what the command line says instead."""


def error_text(exc: BaseException) -> str:
    """Return the message of `exc` as the command line shows it: its flags where the library names a parameter.

    >>> from contextpipe.errors import ModelTimeout
    >>> error_text(ModelTimeout("the model did not answer; raise timeout=... or retry later"))
    'the model did not answer; raise --timeout or retry later'
    """
    text = str(exc)
    for python, command_line in FLAGS:
        text = text.replace(python, command_line)
    return text


def message_line(seq: int, message: Message, *, tag: str = "") -> str:
    """One stored message as ``sessions show`` and the chat's ``/history`` print it: number, role, `tag`, `preview`."""
    text = shown(preview(message, width=None, one_line=False))
    return f"[dim]{seq:>5}[/dim] [bold]{message.role:<9}[/bold] {f'[dim]{tag}[/dim] ' if tag else ''}{text}"


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `message` as a one-line error and return the exit to raise."""
    err.print(f"[red]error:[/red] {shown(message)}")
    return typer.Exit(code)


def complete_sessions(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of session ids, read from the database given so far (or the default one)."""
    db = Path(ctx.params.get("db") or os.environ.get("CONTEXTPIPE_DB") or DEFAULT_DB)
    tenant = ctx.params.get("tenant") or DEFAULT_TENANT
    if not db.is_file():
        return []

    async def ids() -> list[str]:
        async with SQLiteStore(db, read_only=True) as store:
            return [i.session_id for i in (await store.list_sessions(tenant, limit=500)).sessions]

    try:
        return [i for i in asyncio.run(ids()) if i.startswith(incomplete)]
    except ContextPipeError:
        return []


SessionArgument = Annotated[str, typer.Argument(help="Session id.", autocompletion=complete_sessions)]


def open_store(db: Path, *, read_only: bool = True) -> SQLiteStore:
    """Open an existing session database (read-only unless the command writes); never create one."""
    if db.is_dir():
        raise fail(f"{db} is a folder, not a session database; pass the database file with --db")
    if not db.exists():
        raise fail(f"no session database at {db}; pass --db or set CONTEXTPIPE_DB")
    return SQLiteStore(db, read_only=read_only)


async def existing_session(store: SQLiteStore, db: Path, tenant: str, session: str) -> Session:
    """Return the stored session record, or stop with a clear error when there is no such session."""
    record = await store.get_session(tenant, session)
    if record is None:
        raise fail(f"no session {shorten(session)} (tenant {shorten(tenant)}) in {db}")
    return record


def check_new_db(db: Path) -> None:
    """Refuse a --db that cannot become a session database, without creating any folder."""
    if db.is_dir():
        raise fail(f"{db} is a folder; pass the session database file with --db (e.g. {db / 'contextpipe.db'})")
    folder = db.absolute().parent
    if not folder.is_dir():
        raise fail(f"no folder {folder} for the session database {db.name}; create it first "
                   f"(mkdir -p {shlex.quote(str(folder))}) or pass another --db")


def print_json(value: Any) -> None:
    """Write `value` to stdout as indented JSON (not through Rich, which would wrap it)."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
