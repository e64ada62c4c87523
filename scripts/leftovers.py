"""Run a command, then name and stop the processes it left running, and fail if there were any.

    python3 scripts/leftovers.py COMMAND [ARG...]

scripts/test.sh runs its servers and pytest this way. COMMAND runs as a child of this process, which
first makes itself a subreaper (Linux's PR_SET_CHILD_SUBREAPER): a process whose parent ends before it
-- a daemon such as `redis-server --daemonize yes`, the server `pg_ctl start` leaves behind, a child a
test forgot -- becomes a child of this process instead of init's. So what COMMAND started is still
among this process's descendants when COMMAND ends, whatever it did to its name or its environment
(Redis, PostgreSQL's workers and Chromium's overwrite the environment /proc shows), and no other
process is: one of someone else's cannot be taken for one of the run's.

SIGINT, SIGTERM and SIGHUP are passed on to COMMAND. When COMMAND ends, the processes it left get
CONTEXTPIPE_TEST_LEFTOVER_WAIT seconds (default 10) to exit; those still running are named, sent
SIGTERM, and SIGKILL 5 seconds later. The exit status is COMMAND's (128 + N when signal N ended it),
or 1 when it exited with 0 but left processes running.

Linux only (reads /proc). Standard library only: runs before any venv exists.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone
        return None


def _parent(pid: int) -> int | None:
    """Return a running process's parent pid, None if it is gone or a zombie."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    state, parent = raw[raw.rindex(b")") + 2:].split()[:2]  # after "pid (command) "
    return None if state in (b"Z", b"X") else int(parent)


def _command(pid: int) -> str:
    return (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()


def descendants(root: int) -> list[int]:
    """Return the running processes below `root` (its children, theirs, ...), zombies left out."""
    parents = {pid: parent for entry in os.listdir("/proc")
               if entry.isdigit() and (parent := _parent(pid := int(entry))) is not None}
    found: list[int] = []
    for pid in parents:
        up = parents[pid]
        while up in parents and up != root:
            up = parents[up]
        if up == root:
            found.append(pid)
    return found


def reap() -> None:
    """Collect the exit status of every child that has ended (the orphans adopted end as children of ours)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def settle(find: Callable[[], list[int]], wait: float) -> int:
    """Give the processes `find` returns `wait` seconds to exit, then name and stop those left; 1 if any were."""
    deadline = time.monotonic() + wait
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
        reap()
    if not left:
        return 0
    print("leftovers: the test run left these processes running (now stopped):", file=sys.stderr)
    for pid in left:
        print(f"  {pid}: {_command(pid)[:300]}", file=sys.stderr)
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while (left := [pid for pid in left if _parent(pid) is not None]) and time.monotonic() < deadline:
            time.sleep(0.1)
            reap()
    reap()
    return 1


def run(command: list[str]) -> int:
    """Run `command` as this subreaper's child, passing signals on; return its exit status (128 + N for signal N)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "leftovers: prctl(PR_SET_CHILD_SUBREAPER) failed")
    child: int | None = None

    def forward(signum: int, frame: object) -> None:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        child = os.posix_spawnp(command[0], command, os.environ | {"CONTEXTPIPE_TEST_SUPERVISOR": str(os.getpid())})
    except OSError as exc:
        print(f"leftovers: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    while True:
        ended, status = os.wait()  # any child: adopted orphans that end are collected too
        if ended == child:
            break
    child = None
    for sig in FORWARDED:  # what is left is stopped here, in at most 15 seconds: a Ctrl-C does not cut it short
        signal.signal(sig, signal.SIG_IGN)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    """Run the command `argv` names (see the module's docstring); return the exit status."""
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    status = run(argv)
    wait = float(os.environ.get("CONTEXTPIPE_TEST_LEFTOVER_WAIT", "10"))
    left = settle(lambda: descendants(os.getpid()), wait)
    return status or left


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
