"""The full crash storm: ≥300 SIGKILLs on SQLite and ≥50 on PostgreSQL and on Redis, with cancellations,
sync tools that outlive their timeout and session TTLs shorter than those calls; then the counts.

Not a timing: a stress test whose figures are counts. Run from the repository root, after
``source scripts/services.sh`` for the servers (``CONTEXTPIPE_TEST_POSTGRES_DSN``,
``CONTEXTPIPE_TEST_REDIS_URL``; a backend without its address is skipped):

    python bench/crash_storm_bench.py --out bench/results/crash-storm.json
    python bench/crash_storm_bench.py --backends sqlite --sqlite-kills 300

Several worker processes, two on each session, run agents whose every step makes parallel tool
calls (``record`` and sometimes ``slow_record`` not idempotent, ``lookup`` idempotent); each worker
is SIGKILLed at its n-th progress report (n from the seed) and replaced, and cancels its own runs'
tasks at points from the seed; ``slow_record`` runs in a thread past its timeout and past the
session's TTL. Afterwards every session's log is checked against what the workers were told was
saved and what the tools themselves recorded: messages lost or duplicated, non-idempotent calls run
twice, completed calls reported interrupted, sessions stuck (not free within the lease TTL after
the storm). The engine is ``fixtures/storm/`` (the test suite runs it small,
``tests/stores/test_processes.py``). Exits non-zero when a check failed, after writing the counts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures" / "storm"))
import _harness as h
from crash_storm import StormConfig, StormReport, run_storm

ENV = {"postgres": "CONTEXTPIPE_TEST_POSTGRES_DSN", "redis": "CONTEXTPIPE_TEST_REDIS_URL"}
METRICS = [("kills", "SIGKILLs"), ("cancels", "task.cancel() reaching a run"),
           ("cancelled_runs", "runs ended cancelled"), ("lease_lost", "runs ended by a lost lease"),
           ("runs", "runs started"), ("slow_calls", "slow sync calls"),
           ("timed_out", "answered with a timeout"), ("late_results", "late results"),
           ("outlived_ttl", "completed after more than the session TTL"), ("calls", "calls checked"),
           ("completed_checked", "completed calls checked"), ("interrupted", "answered 'interrupted'"),
           ("lost", "lost"), ("duplicated", "duplicated"), ("run_twice", "run twice"),
           ("falsely_interrupted", "completed, reported interrupted"), ("stuck", "stuck")]
"""The counts written, in order: the report's field and the table's label. The last five must be 0."""


def spec_for(backend: str, workdir: Path) -> str | None:
    if backend == "sqlite":
        return f"sqlite|{workdir / 'storm.db'}"
    address = os.environ.get(ENV[backend])
    return f"{backend}|{address}" if address else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,postgres,redis")
    parser.add_argument("--sqlite-kills", type=int, default=300)
    parser.add_argument("--server-kills", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4, help="worker slots; two share each session")
    parser.add_argument("--lease-ttl", type=float, default=1.0)
    parser.add_argument("--session-ttl", type=float, default=3.0, help="shorter than --slow-seconds")
    parser.add_argument("--slow-seconds", type=float, default=3.6, help="how long a slow_record thread runs, at least")
    parser.add_argument("--cancels", type=float, default=0.5, help="the chance a run's task is cancelled")
    parser.add_argument("--slow", type=float, default=0.3, help="the chance a step calls slow_record")
    parser.add_argument("--save-wait", type=float, default=0.5,
                        help="how long a lookup waits for its sibling's result to be saved")
    parser.add_argument("--seed", type=int, default=20261129)
    h.out_argument(parser, "crash-storm")
    args = parser.parse_args()
    results = h.Results(
        "crash-storm", "The crash storm's counts per backend: faults made, what was checked, and what went wrong",
        notes=[f"{args.workers} workers, two per session, {args.lease_ttl:g} s leases, sessions with a "
               f"{args.session_ttl:g} s TTL, slow sync calls of {args.slow_seconds:g} s or more past a 0.05 s "
               f"timeout. Every row from lost to problems must be 0."])
    problems: dict[str, list[str]] = {}
    for backend in args.backends.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"cp-storm-{backend}-"))
        spec = spec_for(backend, workdir)
        if spec is None:
            print(f"{backend}: skipped, {ENV[backend]} is not set", flush=True)
            continue
        config = StormConfig(
            slots=args.workers, sessions=max(1, args.workers // 2), steps=3, runs=4, seed=args.seed,
            kills=args.sqlite_kills if backend == "sqlite" else args.server_kills, lease_ttl=args.lease_ttl,
            save_wait=args.save_wait, max_kill_line=5, cancels=args.cancels, slow=args.slow,
            slow_seconds=args.slow_seconds, session_ttl=args.session_ttl, stuck_after=60)
        started = time.monotonic()
        print(f"{backend}: storm of {config.kills} kills ...", flush=True)
        report = run_storm(spec, f"storm{uuid.uuid4().hex[:10]}", workdir, config, log=sys.stdout)
        print(f"{backend}: {report.summary()} ({time.monotonic() - started:.0f} s)")
        for problem in report.problems:
            print(f"  PROBLEM: {problem[:800]}")
        add(results, backend, report)
        problems[backend] = [p[:600] for p in report.problems]
    if problems:  # at least one backend ran
        results.doc["problems"] = problems
        results.doc["notes"].append("Problems: " + "; ".join(
            f"{backend} {len(ps)} ({_kinds(ps)})" for backend, ps in problems.items()) + "; the file lists each.")
        results.write(args.out)
    sys.exit(1 if any(problems.values()) else 0)


def add(results: h.Results, backend: str, report: StormReport) -> None:
    counts = report.counts()
    for field, label in METRICS:
        results.add("crash storm", backend, label, "", value=counts[field])
    results.add("crash storm", backend, "problems", "", value=len(report.problems))


def _kinds(problems: list[str]) -> str:
    """Name the problems' kinds, for the note under the table."""
    kinds = {"broken tool exchange": "broken exchanges", "answered 0 times": "calls never answered",
             "but the log answers": "completed calls without their result", "missing": "lost messages",
             "ran ": "calls run twice", "STUCK": "stuck sessions", "stuck": "stuck runs", "swallowed": "swallowed "
             "cancellations", "failed": "failed workers"}
    found = [name for key, name in kinds.items() if any(key in p for p in problems)]
    return ", ".join(found) or "none"


if __name__ == "__main__":
    main()
