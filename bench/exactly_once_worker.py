#!/usr/bin/env python3
"""One worker process of the exactly-once crash storm (``exactly_once_bench.py`` starts and SIGKILLs it).

    python bench/exactly_once_worker.py SPEC TENANT SESSION ORDER_PREFIX RUNS WORKDIR

``SPEC`` is ``sqlite|PATH`` or ``postgres|DSN``. The worker runs ``RUNS`` agent runs on its session;
in each, the model orders one thing: three parallel calls, ``charge`` (``retry_with_key=True``: the fake
payment service, a SQLite file of its own in ``WORKDIR``, records charges by idempotency key),
``ship`` (``outbox=True``: it only adds an outbox entry) and ``notify`` (plain: it may never run
twice). After each run it relays the store's pending outbox entries to the service's shipments (by
entry key) and marks them delivered.

Every progress line (``p KIND ...`` on stdout) waits for the parent's ``c`` on stdin before the
worker goes on, so a SIGKILL lands exactly there: ``run`` (a run starts), ``charging`` / ``charged``
(before and after the charge is committed at the service, before its result is saved),
``shipping`` (the entry added, the call not returned), ``notifying`` (before the plain call's
effect), ``saved`` (an append returned) and ``relayed`` (a shipment delivered, not yet marked).
Tool runs are appended to ``WORKDIR/effects.txt``; a model sent a broken tool exchange to
``WORKDIR/violations.txt``. Environment: ``CP_LEASE_TTL`` (seconds) and ``CP_CLOCK_OFFSET`` (a SQLite
store's clock runs that far ahead, so a killed predecessor's lease has expired at once).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from contextpipe import Agent, Durability, Message, RunLimits, ToolContext, tool
from contextpipe.exchanges import is_late_result
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from exactly_once_bench import broken_exchange

_GATE = threading.Lock()


def gate(*words: str) -> None:
    """Tell the parent where the worker is, and wait until it says go on (or kills the worker here)."""
    with _GATE:
        sys.stdout.write(" ".join(("p", *words)) + "\n")
        sys.stdout.flush()
        if sys.stdin.readline().strip() != "c":
            raise SystemExit("the parent closed the gate")


async def agate(*words: str) -> None:
    await asyncio.to_thread(gate, *words)


def open_spec(spec: str) -> SessionStore:
    """The store named by `spec` (``sqlite|PATH`` or ``postgres|DSN``)."""
    backend, _, address = spec.partition("|")
    if backend == "sqlite":
        from contextpipe.stores import SQLiteStore

        offset = float(os.environ.get("CP_CLOCK_OFFSET", "0"))
        return SQLiteStore(address, clock=lambda: time.time() + offset)
    if backend == "postgres":
        from contextpipe.stores import PostgresStore

        return PostgresStore(address, max_size=4)
    raise SystemExit(f"unknown store spec {spec!r}")


def service(workdir: Path) -> sqlite3.Connection:
    """A connection to the fake payment service's database (charges and shipments, deduplicated by key)."""
    conn = sqlite3.connect(workdir / "payments.db", timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript("""
        CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, order_id TEXT NOT NULL, amount INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS charge_requests (key TEXT NOT NULL, order_id TEXT NOT NULL, pid INTEGER NOT NULL);
        CREATE TABLE IF NOT EXISTS shipments (key TEXT PRIMARY KEY, order_id TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS shipment_requests (key TEXT NOT NULL, order_id TEXT NOT NULL, pid INTEGER NOT NULL);
    """)
    return conn


def request(workdir: Path, kind: str, key: str, order: str, amount: int | None = None) -> bool:
    """Send one charge or shipment to the service; True when it is new (False: deduplicated by `key`)."""
    conn = service(workdir)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(f"INSERT INTO {kind}_requests VALUES (?, ?, ?)", (key, order, os.getpid()))
        if kind == "charge":
            new = conn.execute("INSERT OR IGNORE INTO charges VALUES (?, ?, ?)", (key, order, amount)).rowcount
        else:
            new = conn.execute("INSERT OR IGNORE INTO shipments VALUES (?, ?)", (key, order)).rowcount
        conn.execute("COMMIT")
        return bool(new)
    finally:
        conn.close()


async def relay(store: SessionStore, tenant: str, workdir: Path) -> None:
    """Deliver the pending shipments to the service (by entry key), marking each delivered after."""
    while pending := await store.outbox(tenant, topic="shipments", limit=20):
        for entry in pending:
            await asyncio.to_thread(request, workdir, "shipment", entry.key, entry.payload["order"])
            await agate("relayed", entry.key)
            await store.mark_delivered(tenant, [entry.key])


async def main(spec: str, tenant: str, session_id: str, prefix: str, runs: int, workdir: Path) -> None:
    effects = workdir / "effects.txt"

    def effect(*words: str) -> None:
        with effects.open("a") as f:
            f.write(" ".join((*words, str(os.getpid()))) + "\n")

    @tool(retry_with_key=True)
    def charge(order: str, amount: int, ctx: ToolContext[None]) -> str:
        """Charge the customer for an order (the payment service deduplicates by the idempotency key)."""
        effect("charge", ctx.call_id)
        gate("charging", ctx.call_id)
        new = request(workdir, "charge", ctx.idempotency_key, order, amount)
        gate("charged", ctx.call_id)
        return f"charged {amount} for {order}" + ("" if new else " (the service had it already)")

    @tool(outbox=True)
    def ship(order: str, ctx: ToolContext[None]) -> str:
        """Queue the order's shipment (the relay delivers it)."""
        effect("ship", ctx.call_id)
        ctx.outbox.add("shipments", {"order": order})
        gate("shipping", ctx.call_id)
        return f"shipment of {order} queued"

    @tool
    def notify(order: str, ctx: ToolContext[None]) -> str:
        """Tell the customer (not deduplicated: never run twice)."""
        gate("notifying", ctx.call_id)
        effect("notify", ctx.call_id)
        return f"told the customer about {order}"

    def plan(request_: ModelRequest) -> Turn | str:
        messages = request_.messages
        problem = broken_exchange(messages)
        if problem is not None:
            with (workdir / "violations.txt").open("a") as f:
                f.write(f"pid {os.getpid()}: {problem}\n")
            raise RuntimeError(problem)
        users = [i for i, m in enumerate(messages) if m.role == "user" and not is_late_result(m)]
        order = messages[users[-1]].text
        if any(m.function_calls for m in messages[users[-1] + 1:]):
            return f"done {order}"
        uid = uuid.uuid4().hex[:12]  # unique across processes, like a real model's call ids
        return (tool_call("charge", order=order, amount=5, call_id=f"ch_{uid}")
                + tool_call("ship", order=order, call_id=f"sh_{uid}")
                + tool_call("notify", order=order, call_id=f"no_{uid}"))

    store = open_spec(spec)
    original = store.append

    async def append(tenant_: str, session_id_: str, messages: Sequence[Message], **kwargs: Any) -> int:
        last = await original(tenant_, session_id_, messages, **kwargs)
        await agate("saved", *(m.id for m in messages))
        return last

    store.append = append  # type: ignore[method-assign,assignment]
    try:
        agent = Agent(ScriptedModel([plan] * (runs * 3 + 10)), tools=[charge, ship, notify],
                      providers=[History(store)], limits=RunLimits(max_steps=4),
                      durability=Durability(lease_ttl=float(os.environ.get("CP_LEASE_TTL", "60"))))
        session = await agent.session(session_id, tenant=tenant)
        for r in range(runs):
            order = f"{prefix}-{r}"
            await agate("run", order)
            await agent.run(order, session=session, lease_wait=600)
            print(f"i finished {order}", flush=True)
            await relay(store, tenant, workdir)
    finally:
        await store.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], args[3], int(args[4]), Path(args[5])))
