#!/usr/bin/env python3
"""The exactly-once crash storm: agents charging and shipping through a fake payment service, SIGKILLed
at chosen points, then a count of double and lost charges and shipments and of "interrupted" results.

    python bench/exactly_once_bench.py --out bench/results/exactly-once.json     # 300 kills SQLite, 50 PostgreSQL
    python bench/exactly_once_bench.py --backends sqlite --sqlite-kills 20

Worker processes (``exactly_once_worker.py``, one session each, ``--slots`` at a time) run agent runs
whose model orders one thing per run: ``charge`` (retry-with-key: the service records charges by
the call's idempotency key), ``ship`` (outbox: its entry commits with its result) and ``notify``
(plain). Every worker stops at each of its progress points until this script says go on, so each
SIGKILL lands exactly at the point drawn from the seed: before or after the charge is committed at
the service, with the outbox entry added but not committed, before the plain call's effect, after
a save, or between delivering a shipment and marking it delivered. A killed worker is replaced by
the next, which resumes the session; once the kills are done, a clean worker per slot finishes.

Then everything is checked against the session logs, the store's outbox and the service: every
charge call charged once under its key (none lost, none doubled, none unknown), every ship call's
entry committed with its result once and shipped once, no charge or ship call answered
"interrupted", no plain call run twice, no message lost or stored twice, every call answered once,
no model ever sent a broken tool exchange. PostgreSQL comes from ``CONTEXTPIPE_TEST_POSTGRES_DSN``
(``source scripts/services.sh``). The suite runs the same storm small (``tests/stores/test_exactly_once.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextpipe import Message
from contextpipe.outbox import OUTBOX_KEY
from contextpipe.stores import SessionStore
from contextpipe.tool_context import idempotency_key

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures" / "storm"))
from storm_worker import broken_exchange  # the crash storm's check of a log, shared

WORKER = Path(__file__).resolve().with_name("exactly_once_worker.py")
KINDS = ("charging", "charged", "shipping", "notifying", "saved", "relayed", "run")
LIVENESS = 600.0  # seconds without a line from any worker: a hang, not slowness


@dataclass
class Report:
    """What a storm did and what the check found (`problems` must be empty)."""

    backend: str
    kills: int = 0
    processes: int = 0
    kill_points: Counter[str] = field(default_factory=Counter)
    charge_calls: int = 0
    charges: int = 0
    charges_deduplicated: int = 0
    """Requests the service answered from its record of the key: a call run again after a kill."""
    ship_calls: int = 0
    ship_reruns: int = 0
    shipments: int = 0
    deliveries_deduplicated: int = 0
    notify_calls: int = 0
    notify_interrupted: int = 0
    double_charges: int = 0
    lost_charges: int = 0
    double_shipments: int = 0
    lost_shipments: int = 0
    interrupted: int = 0
    """Charge and ship calls answered "interrupted" (must be 0)."""
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.backend}: {self.kills} SIGKILLs over {self.processes} processes ({dict(self.kill_points)}); "
                f"{self.charge_calls} charge calls, {self.charges} charges, {self.charges_deduplicated} re-run charges "
                f"deduplicated by key; {self.ship_calls} ship calls ({self.ship_reruns} re-run), {self.shipments} "
                f"shipments, {self.deliveries_deduplicated} deliveries repeated and deduplicated; {self.notify_calls} "
                f"plain calls, {self.notify_interrupted} answered 'interrupted'. Double charges {self.double_charges}, "
                f"lost charges {self.lost_charges}, double shipments {self.double_shipments}, lost shipments "
                f"{self.lost_shipments}, retry-with-key and outbox calls answered 'interrupted' {self.interrupted}; "
                f"{len(self.problems)} problems")


@dataclass
class _Worker:
    slot: int
    popen: subprocess.Popen[str]
    kill_at: tuple[str, int] | None
    seen: Counter[str] = field(default_factory=Counter)
    killed: bool = False


def _read(worker: _Worker, lines: queue.Queue[tuple[_Worker, str | None]]) -> None:
    assert worker.popen.stdout is not None
    for line in worker.popen.stdout:
        if line.endswith("\n"):
            lines.put((worker, line[:-1]))
    lines.put((worker, None))


def run_storm(spec: str, tenant: str, workdir: Path, *, kills: int, slots: int = 2, runs: int = 3, seed: int = 1,
              lease_ttl: float = 60.0, clock_ahead: bool = False, cycle: bool = False, max_line: int = 3,
              log: Any = None) -> Report:
    """SIGKILL workers `kills` times, let a clean worker per slot finish, then check (see the module docstring).

    `cycle` takes the kill points' kinds in turn (a small storm then hits each kind) instead of drawing them.
    """
    rng = random.Random(seed)
    report = Report(spec.partition("|")[0])
    lines: queue.Queue[tuple[_Worker, str | None]] = queue.Queue()
    running: list[_Worker] = []
    generation, errors, acked = 0, [], set()

    def spawn(slot: int, kill: bool) -> None:
        nonlocal generation
        generation += 1
        env = {**os.environ, "CP_LEASE_TTL": str(lease_ttl), "PYTHONUNBUFFERED": "1"}
        if clock_ahead:  # one worker per session at a time: the next one's clock has the dead one's lease expired
            env["CP_CLOCK_OFFSET"] = str(generation * 10 * (lease_ttl + 1))
        popen = subprocess.Popen(
            [sys.executable, str(WORKER), spec, tenant, f"s{slot}", f"o{slot}-{generation}", str(runs if kill else 1),
             str(workdir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        kind = KINDS[report.processes % len(KINDS)] if cycle else rng.choice(KINDS)
        worker = _Worker(slot, popen, (kind, rng.randint(1, max_line)) if kill else None)
        report.processes += 1
        running.append(worker)
        threading.Thread(target=_read, args=(worker, lines), daemon=True).start()

    for slot in range(slots):
        spawn(slot, kill=True)
    while running:
        try:
            worker, line = lines.get(timeout=LIVENESS)
        except queue.Empty:
            raise AssertionError(f"no worker said anything for {LIVENESS:.0f} s: a hang") from None
        if line is not None:
            if line.startswith("p "):
                kind, *rest = line[2:].split()
                worker.seen[kind] += 1
                if kind == "saved":
                    acked.update(rest)  # an append returned: these messages must be in the log
                if not worker.killed and worker.kill_at == (kind, worker.seen[kind]):
                    os.kill(worker.popen.pid, signal.SIGKILL)
                    worker.killed = True
                    report.kills += 1
                    report.kill_points[kind] += 1
                    if log is not None and report.kills % 50 == 0:
                        print(f"  {report.kills} kills", file=log, flush=True)
                elif not worker.killed:
                    assert worker.popen.stdin is not None
                    try:
                        worker.popen.stdin.write("c\n")
                        worker.popen.stdin.flush()
                    except BrokenPipeError:
                        pass  # it died meanwhile: its end comes next
            continue
        running.remove(worker)
        _, err = worker.popen.communicate()
        if not worker.killed and worker.popen.returncode != 0:
            errors.append(f"worker {worker.popen.pid} failed ({worker.popen.returncode}): {err[-1500:]}")
        if report.kills < kills:
            spawn(worker.slot, kill=True)
        elif worker.killed or worker.popen.returncode != 0:
            spawn(worker.slot, kill=False)  # a clean last run answers what the kill left and relays the rest
    report.problems += errors
    asyncio.run(_check(spec, tenant, slots, workdir, acked, report))
    return report


def _open(spec: str) -> SessionStore:
    backend, _, address = spec.partition("|")
    if backend == "sqlite":
        from contextpipe.stores import SQLiteStore

        return SQLiteStore(address)
    from contextpipe.stores import PostgresStore

    return PostgresStore(address, max_size=4)


async def _check(spec: str, tenant: str, slots: int, workdir: Path, acked: set[str], report: Report) -> None:
    problems = report.problems
    if (workdir / "violations.txt").exists():
        problems.append("a model was sent a broken tool exchange:\n" + (workdir / "violations.txt").read_text()[:2000])
    store = _open(spec)
    try:
        logs = {f"s{s}": (await store.load(tenant, f"s{s}")).messages for s in range(slots)}
        if pending := await store.outbox(tenant, limit=10):
            problems.append(f"{len(pending)}+ outbox entries were never delivered, e.g. {pending[0]}")
    finally:
        await store.close()
    with sqlite3.connect(workdir / "payments.db") as conn:
        charges = dict(conn.execute("SELECT key, order_id FROM charges").fetchall())
        shipments = dict(conn.execute("SELECT key, order_id FROM shipments").fetchall())
        report.charges_deduplicated = conn.execute("SELECT count(*) FROM charge_requests").fetchone()[0] - len(charges)
        report.deliveries_deduplicated = (conn.execute("SELECT count(*) FROM shipment_requests").fetchone()[0]
                                          - len(shipments))
    effects = Counter(tuple(line.split()[:2]) for line in _lines(workdir / "effects.txt"))
    charge_keys: dict[str, str] = {}
    entry_keys: dict[str, str] = {}
    all_ids: set[str] = set()
    for sid, log in logs.items():
        _check_log(sid, log, problems)
        all_ids.update(m.id for m in log)
        answers = {r.call_id: (r, m) for m in log for r in m.function_results}
        for m in log:
            for call in m.function_calls:
                order = _order(call.arguments)
                result, carrier = answers.get(call.call_id, (None, None))
                key = idempotency_key(tenant, sid, m.id, call.call_id)
                if call.name == "charge":
                    report.charge_calls += 1
                    charge_keys[key] = order
                    if charges.get(key) != order:
                        report.lost_charges += 1
                elif call.name == "ship":
                    report.ship_calls += 1
                    report.ship_reruns += effects[("ship", call.call_id)] > 1
                    carried = carrier.metadata.get(OUTBOX_KEY, []) if carrier is not None else []
                    mine = [e for e in carried if e["call_id"] == call.call_id]
                    if len(mine) != 1 or mine[0]["key"] != f"{key}.0":
                        problems.append(f"ship call {call.call_id}: {len(mine)} outbox entries with its result")
                    entry_keys[f"{key}.0"] = order
                    if shipments.get(f"{key}.0") != order:
                        report.lost_shipments += 1
                elif call.name == "notify":
                    report.notify_calls += 1
                    report.notify_interrupted += bool(result is not None and "interrupted" in result.result)
                    if effects[("notify", call.call_id)] > 1:
                        problems.append(f"the plain call {call.call_id} ran twice")
                if call.name in ("charge", "ship") and result is not None and "interrupted" in result.result:
                    report.interrupted += 1
    report.charges, report.shipments = len(charges), len(shipments)
    report.double_charges = sum(n - 1 for n in Counter(charges.values()).values() if n > 1)
    report.double_shipments = sum(n - 1 for n in Counter(shipments.values()).values() if n > 1)
    unknown = [k for k in charges if k not in charge_keys] + [k for k in shipments if k not in entry_keys]
    if unknown:
        problems.append(f"{len(unknown)} charges or shipments under keys of no call in the logs, e.g. {unknown[:2]}")
    if lost := acked - all_ids:
        problems.append(f"{len(lost)} acknowledged messages are missing, e.g. {sorted(lost)[:3]}")
    for name in ("double_charges", "lost_charges", "double_shipments", "lost_shipments", "interrupted"):
        if getattr(report, name):
            problems.append(f"{name.replace('_', ' ')}: {getattr(report, name)}")


def _check_log(sid: str, log: Sequence[Message], problems: list[str]) -> None:
    if (problem := broken_exchange(log)) is not None:
        problems.append(f"session {sid}: {problem}")
    if len({m.id for m in log}) != len(log):
        problems.append(f"session {sid}: a message is stored twice")
    calls = Counter(c.call_id for m in log for c in m.function_calls)
    answered = Counter(r.call_id for m in log for r in m.function_results)
    if any(n != 1 for n in calls.values()) or answered != calls:
        problems.append(f"session {sid}: a call is stored or answered other than once")


def _order(arguments: str) -> str:
    import json

    return str(json.loads(arguments)["order"])


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def main() -> None:
    import _harness as h

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--sqlite-kills", type=int, default=300)
    parser.add_argument("--postgres-kills", type=int, default=50)
    parser.add_argument("--slots", type=int, default=2, help="workers at a time, one session each")
    parser.add_argument("--seed", type=int, default=20261201)
    h.out_argument(parser, "exactly-once")
    args = parser.parse_args()
    results = h.Results(
        "exactly-once", "The exactly-once crash storm: retry-with-key charges and outbox shipments under SIGKILLs",
        notes=["Each SIGKILL lands at a progress point drawn from the seed (the worker waits there for the "
               "storm's go-ahead): before or after the charge is committed at the service, with the outbox "
               "entry added but not committed, before a plain call's effect, after a save, or between "
               "delivering a shipment and marking it delivered."])
    failed = False
    for backend in args.backends.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"cp-exactly-once-{backend}-"))
        if backend == "sqlite":
            spec, kills, ttl = f"sqlite|{workdir / 'sessions.db'}", args.sqlite_kills, 60.0
        else:
            dsn = os.environ.get("CONTEXTPIPE_TEST_POSTGRES_DSN")
            if not dsn:
                raise SystemExit("CONTEXTPIPE_TEST_POSTGRES_DSN is not set: source scripts/services.sh first")
            spec, kills, ttl = f"postgres|{dsn}", args.postgres_kills, 2.0
        started = time.monotonic()
        print(f"{backend}: storm of {kills} kills ...", flush=True)
        report = run_storm(spec, f"eo{uuid.uuid4().hex[:10]}", workdir, kills=kills, slots=args.slots,
                           seed=args.seed, lease_ttl=ttl, clock_ahead=backend == "sqlite", log=sys.stdout)
        print(f"{report.summary()} ({time.monotonic() - started:.0f} s)")
        for problem in report.problems:
            print(f"  PROBLEM: {problem[:500]}")
        failed = failed or bool(report.problems)
        for name, value in [("SIGKILLs", report.kills), ("worker processes", report.processes),
                            ("charge calls (retry-with-key)", report.charge_calls),
                            ("charges run again, deduplicated by key", report.charges_deduplicated),
                            ("double charges", report.double_charges), ("lost charges", report.lost_charges),
                            ("ship calls (outbox)", report.ship_calls), ("ship calls run again", report.ship_reruns),
                            ("deliveries repeated, deduplicated by key", report.deliveries_deduplicated),
                            ("double shipments", report.double_shipments),
                            ("lost shipments", report.lost_shipments),
                            ("retry-with-key and outbox calls answered 'interrupted'", report.interrupted),
                            ("plain calls", report.notify_calls),
                            ("plain calls answered 'interrupted'", report.notify_interrupted),
                            ("problems found by the check", len(report.problems))]:
            results.add(name, backend, "count", "", value=value)
    results.write(args.out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
