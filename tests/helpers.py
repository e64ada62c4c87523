"""Shared pieces for the agent tests: the seed's weather tools, a history that records saves, a provider
that adds tool middleware, vector stores, what a fact extraction model answers, and the chat driven
line by line (`chat`)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

from contextpipe import Agent, ContextProvider, Message, RunContext, tool
from contextpipe.models import ModelMiddleware, ModelRequest
from contextpipe.providers import History
from contextpipe.session import Session
from contextpipe.stores import Lease
from contextpipe.stores.base import SessionStore
from contextpipe.testing import ScriptedModel
from contextpipe.tools import ToolMiddleware
from contextpipe.vectors import HashEmbedder, MemoryVectorStore, SQLiteVectorStore, VectorStore

CODES = {"Suzhou": "SZ", "Beijing": "BJ"}
FORECASTS = {"SZ": "Sunny, 25 C, NW wind 4.", "BJ": "Cloudy, 22 C, E wind 3."}


@tool
def lookup_location_code(city: str) -> str:
    """Return the location code for a city name."""
    return CODES[city]


@tool
def get_weather_forecast(location_code: str) -> str:
    """Return the weather forecast for a location code."""
    return FORECASTS[location_code]


class RecordingHistory(History):
    """History that remembers each batch it was asked to save."""

    saves: list[list[Message]]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.saves = []

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        self.saves.append(list(messages))
        await super().save(session, messages, lease=lease, durable=durable)


def describe(messages: Sequence[Message]) -> list[str]:
    """Compact text form of messages: role plus call names / results / text."""
    out = []
    for m in messages:
        if m.function_calls:
            out.append(f"{m.role}:call:" + ",".join(c.name for c in m.function_calls))
        elif m.function_results:
            out.append(f"{m.role}:result:" + ",".join(r.result for r in m.function_results))
        else:
            out.append(f"{m.role}:{m.text}")
    return out


class MiddlewareProvider(ContextProvider):
    """A provider whose ``before_run`` adds one tool middleware (and, when given, one model middleware)."""

    def __init__(self, source_id: str, middleware: ToolMiddleware,
                 model_middleware: ModelMiddleware | None = None) -> None:
        super().__init__(source_id)
        self.middleware = middleware
        self.model_middleware = model_middleware

    async def before_run(self, ctx: RunContext) -> None:
        ctx.add_tool_middleware(self.middleware)
        if self.model_middleware is not None:
            ctx.add_middleware(self.model_middleware)


def results(messages: list[Message]) -> list[tuple[str, str, bool]]:
    """Each function result in `messages` as (call id, result text, is_error)."""
    return [(r.call_id, r.result, r.is_error) for m in messages for r in m.function_results]


async def stored(store: SessionStore, session_id: str) -> list[tuple[str, str, bool]]:
    """The results the session's log holds, read by a fresh agent (what a resumed run would see)."""
    reader = Agent(ScriptedModel(), providers=[History(store)])
    return results(await reader.history(await reader.session(session_id)))


class CountingEmbedder(HashEmbedder):
    """Records every `embed` call (texts per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return await super().embed(texts)


def vector_store(kind: str, tmp_path: Path, table: str = "t") -> VectorStore:
    """A new vector store of `kind`: ``memory``, ``sqlite`` (a file in `tmp_path`) or ``pgvector`` (its own table)."""
    if kind == "pgvector":
        from contextpipe.vectors.pgvector import PgVectorStore
        from stores.backends import server_address

        dsn = server_address("pgvector")  # skips loudly, or fails under CI, when the server is absent
        assert dsn is not None
        return PgVectorStore(dsn, table=f"{table}{uuid.uuid4().hex[:10]}")
    return MemoryVectorStore() if kind == "memory" else SQLiteVectorStore(tmp_path / "v.db")


class Clock:
    """The time FactMemory reads, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def changes(add: tuple[str, ...] = (), update: dict[str, str] | None = None, delete: tuple[str, ...] = ()) -> str:
    """What the extraction model answers."""
    return json.dumps({"add": list(add), "update": [{"id": i, "text": t} for i, t in (update or {}).items()],
                       "delete": list(delete)})


def known_ids(request: ModelRequest) -> dict[str, str]:
    """The facts the extraction model is shown, text by id."""
    return dict(re.findall(r"^\[(\S+)\] (.*)$", request.messages[0].text, re.MULTILINE))


PAID: list[str] = []
"""The invoices `pay` paid (the approval tests clear it before each test)."""


@tool(needs_approval=True)
def pay(invoice: str, amount: int) -> str:
    """Pay an invoice."""
    PAID.append(invoice)
    return f"paid {invoice}"


@tool
def balance() -> str:
    """Return the account's balance."""
    return "1200 EUR"


def chat(agent: Agent, typed: list[str], session: str = "s", *, code: int = 0) -> tuple[list[str], str, str]:
    """Run the CLI's chat on `typed` lines (then end of input), checking it exits with `code`.

    Returns the screen's lines (each prompt with the line typed at it), the error console's text and
    the id of the session the chat ended in.
    """
    import asyncio
    import io
    from collections.abc import Iterator

    from rich.console import Console

    from contextpipe.cli._lines import LineReader  # here: most tests importing this module drive no chat
    from contextpipe.cli._repl import COMMANDS, ChatRepl

    screen, errors = io.StringIO(), io.StringIO()
    out = Console(file=screen, width=200, highlight=False, soft_wrap=True)
    err = Console(file=errors, width=200, highlight=False, soft_wrap=True)
    lines: Iterator[str] = iter(typed)

    def read(prompt: str) -> str:
        line = next(lines, None)
        if line is None:
            raise EOFError
        screen.write(f"{prompt}{line}\n")
        return line

    with asyncio.Runner() as runner:
        repl = ChatRepl(runner, agent, runner.run(agent.session(session)), "memory", out, err,
                        render_trace=lambda number, trace: None, wait_notice_after=60)
        repl.lines = LineReader(err, COMMANDS, read=read)
        assert repl.run() == code, errors.getvalue()
    shown = [line.rstrip() for line in screen.getvalue().splitlines() if line.strip()]
    return shown, errors.getvalue(), repl.session.id
