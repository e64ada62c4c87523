"""``contextpipe sessions``: list, show, export and delete the sessions stored in a SQLite file.

Reading commands open the file read-only and never create it; ``delete`` opens it to write.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..codec import message_to_dict
from ..rewind import MARKER_KEY, LogEntry, is_marker, read_log
from ..session import DEFAULT_TENANT, Session
from ..stores.base import SessionListing
from ._shared import (
    DEFAULT_DB,
    DbOption,
    JsonOption,
    SessionArgument,
    TenantOption,
    err,
    existing_session,
    fail,
    open_store,
    out,
    print_json,
)
from ._undo import log_line

__all__ = ["app"]

app = typer.Typer(help="List, show, export and delete stored sessions.", no_args_is_help=True)


def _timestamp(value: object) -> str:
    from datetime import datetime

    if not isinstance(value, int | float):
        return "?"
    return datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


@app.command("list")
def sessions_list(db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                  limit: Annotated[int, typer.Option(min=1, help="Sessions per page.")] = 50,
                  cursor: Annotated[str | None, typer.Option(help="Continue after a page (its next_cursor).")]
                  = None,
                  as_json: JsonOption = False) -> None:
    """List the tenant's sessions, most recently updated first."""

    async def run() -> SessionListing:
        async with open_store(db) as store:
            return await store.list_sessions(tenant, limit=limit, cursor=cursor)

    listing = asyncio.run(run())
    if as_json:
        print_json({"sessions": [{"session_id": i.session_id, "tenant": i.tenant, "message_count": i.message_count,
                                  "version": i.version, "created_at": i.created_at, "updated_at": i.updated_at}
                                 for i in listing.sessions], "next_cursor": listing.next_cursor})
        return
    table = Table("session", "messages", "version", "updated")
    for info in listing.sessions:
        table.add_row(escape(str(info.session_id)), str(info.message_count), str(info.version),
                      _timestamp(info.updated_at))
    out.print(table)
    if listing.next_cursor:
        out.print(f"[dim]more sessions exist; showing {limit}; next page: --cursor {listing.next_cursor}[/dim]")


@app.command("show")
def sessions_show(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                  last: Annotated[int | None, typer.Option(min=1, help="Only the newest N messages.")] = None,
                  as_json: JsonOption = False) -> None:
    """Show a session's messages, rewound ones (undone or retried) and rewind markers marked."""

    async def run() -> tuple[Session, list[LogEntry]]:
        async with open_store(db) as store:
            record = await existing_session(store, db, tenant, session)
            return record, await read_log(store, tenant, session, limit=last)

    record, entries = asyncio.run(run())
    if as_json:
        print_json({"session": record.to_dict(), "messages": [_entry_json(e) for e in entries]})
        return
    for entry in entries:
        out.print(log_line(entry))


def _entry_json(entry: LogEntry) -> dict[str, object]:
    """One log entry as ``--json`` lists it: marked as ``GET .../messages`` marks it (``rewound``, ``rewind_to``)."""
    item: dict[str, object] = {"seq": entry.seq, "message": message_to_dict(entry.message)}
    if entry.rewound:
        item["rewound"] = True
    if is_marker(entry.message):
        item["rewind_to"] = entry.message.metadata[MARKER_KEY]["to"]
    return item


@app.command("export")
def sessions_export(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                    output: Annotated[Path | None, typer.Option("--output", "-o", help="File (default: stdout).")]
                    = None) -> None:
    """Export a session as JSON lines: the session record, every message, then the stored traces."""

    async def run() -> list[str]:
        async with open_store(db) as store:
            record = await existing_session(store, db, tenant, session)
            page = await store.load(tenant, session)
            traces = await store.load_traces(tenant, session)
        lines = [json.dumps({"type": "session", **record.to_dict()}, ensure_ascii=False)]
        lines += [json.dumps({"type": "message", "seq": seq, "message": message_to_dict(m)}, ensure_ascii=False)
                  for seq, m in enumerate(page.messages, page.first_seq)]
        lines += [json.dumps({"type": "trace", **t}, ensure_ascii=False) for t in traces]
        return lines

    lines = asyncio.run(run())
    text = "\n".join(lines) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise fail(f"cannot write {output}: {exc.strerror or exc}") from None
        err.print(f"exported {len(lines)} line(s) to {output}")


@app.command("delete")
def sessions_delete(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False
                    ) -> None:
    """Delete a session with everything stored for it (messages, state, checkpoints, traces)."""

    async def check() -> None:
        async with open_store(db) as store:
            await existing_session(store, db, tenant, session)

    asyncio.run(check())
    if not yes and not typer.confirm(f"Delete session {session!r} and everything stored for it?", err=True):
        raise typer.Exit(1)

    async def run() -> bool:
        async with open_store(db, read_only=False) as store:
            await store.vectors().close()  # registers the cascade: the session's memories go with it
            return await store.delete_session(tenant, session)

    if not asyncio.run(run()):
        raise fail(f"no session {session!r} (tenant {tenant!r}) in {db}")
    out.print(f"deleted session {session!r}")
