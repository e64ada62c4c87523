"""The full crash storm: ≥300 SIGKILLs on SQLite and ≥50 on PostgreSQL and on Redis, then the check.

Run from the repository root (a stress test, not collected by pytest; ``test_processes.py`` runs the
same storm small):

    python -m tests.stores.crash_storm                             # all three, servers from the env
    python -m tests.stores.crash_storm --backends sqlite --sqlite-kills 300

Several worker processes, some sharing a session, run agents whose every step makes two parallel
tool calls (one not idempotent); each worker is SIGKILLed at its n-th progress report (n from the
seed) and replaced. Afterwards every session's log is checked: nothing lost (every acknowledged
message is there) or duplicated, every call answered exactly once, no non-idempotent call run
twice, no completed call reported as interrupted, no model ever sent a broken tool exchange.
Prints the counts per backend; exits non-zero when a check failed. Servers come from
``CONTEXTPIPE_TEST_POSTGRES_DSN`` and ``CONTEXTPIPE_TEST_REDIS_URL`` (``source scripts/services.sh``).
The engine is ``storm.py`` beside it, with the store specs of ``backends.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from .backends import ENV, store_spec
from .storm import run_storm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,postgres,redis")
    parser.add_argument("--sqlite-kills", type=int, default=300)
    parser.add_argument("--server-kills", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4, help="worker slots; two share each session")
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--save-wait", type=float, default=0.5,
                        help="how long a slow call waits for its sibling's result to be saved")
    parser.add_argument("--seed", type=int, default=20261129)
    args = parser.parse_args()
    failed = False
    for backend in args.backends.split(","):
        if backend in ENV and not os.environ.get(ENV[backend]):
            print(f"{backend}: skipped, {ENV[backend]} is not set", flush=True)
            continue
        workdir = Path(tempfile.mkdtemp(prefix=f"cp-storm-{backend}-"))
        spec = store_spec(backend, workdir)
        kills = args.sqlite_kills if backend == "sqlite" else args.server_kills
        started = time.monotonic()
        print(f"{backend}: storm of {kills} kills ...", flush=True)
        report = run_storm(spec, f"storm{uuid.uuid4().hex[:10]}", workdir, slots=args.workers,
                           sessions=max(1, args.workers // 2), kills=kills, steps=3, runs=4, seed=args.seed,
                           lease_ttl=args.lease_ttl, save_wait=args.save_wait, max_kill_line=5, log=sys.stdout)
        print(f"{backend}: {report.summary()} ({time.monotonic() - started:.0f} s)")
        for problem in report.problems:
            print(f"  PROBLEM: {problem[:500]}")
        failed = failed or bool(report.problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
