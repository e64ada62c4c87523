"""``contextpipe inspect``: where every token of a session's stored model calls came from.

`show_trace` renders one stored trace; the chat's ``/inspect`` uses it too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..errors import CorruptRecord
from ..session import DEFAULT_TENANT
from ._facts import show_facts
from ._shared import (
    DEFAULT_DB,
    DbOption,
    JsonOption,
    SessionArgument,
    TenantOption,
    existing_session,
    fail,
    open_store,
    out,
    print_json,
    shown,
)

__all__ = ["inspect_session", "show_trace"]


def inspect_session(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                    call: Annotated[int | None, typer.Option("--call", help="Only the Nth stored model call "
                                                             "(from 1).")] = None,
                    facts: Annotated[bool, typer.Option("--facts", help="Show the facts kept about the session's "
                                                        "user instead: each one's versions, when each was true "
                                                        "and the messages it came from.")] = False,
                    collection: Annotated[str, typer.Option(help="Collection the facts are in (with --facts).")]
                    = "facts",
                    as_json: JsonOption = False) -> None:
    """Show where every token of a session's model calls came from, and what compaction did.

    With --facts: the history of every fact kept about the session's user instead.
    """
    if facts:
        if call is not None:
            raise fail("--call shows a model call and --facts the user's facts: give one of them")
        show_facts(db, tenant, session, collection, as_json)
        return

    async def run() -> list[dict[str, Any]]:
        async with open_store(db) as store:
            await existing_session(store, db, tenant, session)
            return await store.load_traces(tenant, session)

    traces = asyncio.run(run())
    if not traces:
        raise fail(f"session {session!r} has no stored traces; traces are stored by `contextpipe chat` and by "
                   "agents made with Agent(durability=Durability(store_traces=True))")
    if call is not None:
        if not 1 <= call <= len(traces):
            raise fail(f"--call must be between 1 and {len(traces)}")
        selected = [(call, traces[call - 1])]
    else:
        selected = list(enumerate(traces, 1))
    if as_json:
        print_json({"session_id": session, "tenant": tenant,
                    "calls": [{"call": number, **trace} for number, trace in selected]})
        return
    for number, trace in selected:
        show_trace(number, trace, session, tenant, db)


def show_trace(number: int, trace: dict[str, Any], session: str, tenant: str, db: Path) -> None:
    """Render a stored trace; one whose shape is not a trace's is a `CorruptRecord`, not a traceback."""
    try:
        _render_trace(number, trace)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptRecord(f"stored trace {number} of session {session!r} (tenant {tenant!r}) in {db} has an "
                            f"unexpected shape ({type(exc).__name__}: {exc}); `contextpipe sessions export` "
                            "shows it as stored", backend="sqlite", tenant=tenant, session_id=session) from exc


def _render_trace(number: int, trace: dict[str, Any]) -> None:
    usage = trace.get("usage") or {}
    header = (f"[bold]call {number}[/bold] (step {trace['step']}) to {trace['model']}: "
              f"{trace['total_tokens']} tokens ({trace['tokenizer']} count)")
    if usage:
        header += f", model reported {usage['input_tokens']} in / {usage['output_tokens']} out"
        if usage.get("cache_read_tokens") or usage.get("cache_write_tokens"):
            header += (f" (cache {usage.get('cache_read_tokens', 0)} read / "
                       f"{usage.get('cache_write_tokens', 0)} written)")
    header += f", {trace['latency_s'] * 1000:.1f} ms"
    out.print(header)
    table = Table("source", "tokens", "share", title="tokens by source", title_justify="left")
    total = max(1, trace["total_tokens"])
    for source, tokens in sorted(trace["tokens_by_source"].items(), key=lambda kv: -kv[1]):
        table.add_row(source, str(tokens), f"{100 * tokens / total:.0f}%")
    out.print(table)
    messages = Table("#", "role", "source", "tokens", "content", title="messages", title_justify="left")
    for m in trace["messages"]:
        source = f"{m['source_kind']}:{m['source_id']}" if m.get("source_id") else m["source_kind"]
        role = m["role"] if not m.get("run") else f"{m['count']} messages"
        messages.add_row(str(m["index"]), role, source, str(m["tokens"]), shown(m.get("preview", "")))
    out.print(messages)
    for d in trace.get("compaction", []):
        out.print(f"  compaction: {d['strategy']} {d['action']} {len(d['message_ids'])} message(s): "
                  f"{shown(d['reason'])} ({d['tokens_before']} -> {d['tokens_after']} tokens)")
    for change in trace.get("changes", []):
        out.print(f"  {shown(change['source_id'])} {change['action'].replace('_', ' ')}: "
                  f"{shown(', '.join(change['items']))}")
    _show_tool_middleware(trace.get("tool_calls", []))
    out.print()


def _show_tool_middleware(calls: list[dict[str, Any]]) -> None:
    """Print a line per tool call that providers' tool middleware saw: each one, outermost first, and what it did."""
    for call in calls:
        if call["middleware"]:
            done = "; ".join(f"{m['source_id']} {', '.join(a.replace('_', ' ') for a in m['actions']) or 'passed'}"
                             for m in call["middleware"])
            out.print(f"  tool call {shown(call['name'])} ({shown(call['call_id'])}): {shown(done)}")
