"""Find the processes a test run left running, name them, stop them, and exit 1 if there were any.

    python3 scripts/leftovers.py marked NAME=VALUE
        every process whose environment holds NAME=VALUE, other than this one and its parent
        (scripts/test.sh exports such a variable, so everything it starts inherits it)
    python3 scripts/leftovers.py snapshot
        print the processes running now (a line of JSON, for `since`)
    python3 scripts/leftovers.py since SNAPSHOT
        every process started after SNAPSHOT that runs a test server or tool (PostgreSQL,
        Redis, uvicorn, Chromium, Playwright's driver, Python) in a tree of such processes that init
        inherited: what is left of a finished run even where the variable above was dropped. For a
        machine of its own, as CI's is: on a shared one, a server someone else starts meanwhile counts.

Linux only (reads /proc). A process on its way out gets up to 10 seconds; what still runs is listed,
sent SIGTERM, and SIGKILL 5 seconds later. Standard library only: runs before any venv exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable

SERVICES = re.compile(r"postgres|redis-server|uvicorn|chrom|playwright|python|node\b")
"""The programs a test run starts, matched against a process's command line."""

Process = tuple[int, int]
"""A process as (pid, start time in clock ticks since boot): a pid alone may be reused."""


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or another user's
        return None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """Return a running process's (state, parent pid, start time), None if it is gone or a zombie."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (command) "
    state = fields[0].decode()
    return None if state in "ZX" else (state, int(fields[1]), int(fields[19]))


def _command(pid: int) -> str:
    return (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()


def running() -> dict[int, tuple[int, int]]:
    """Return every live process: pid -> (parent pid, start time)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            found[int(entry)] = (stat[1], stat[2])
    return found


def marked(variable: str) -> list[int]:
    """Return the processes whose environment holds `variable` (NAME=VALUE), but this one and its parent."""
    needle = b"\0" + variable.encode() + b"\0"
    mine = {os.getpid(), os.getppid()}
    return [pid for pid in running() if pid not in mine
            and needle in b"\0" + (_read(f"/proc/{pid}/environ") or b"") + b"\0"]


def since(snapshot: set[Process]) -> list[int]:
    """Return the test servers and tools started after `snapshot` that belong to no process older than it.

    That is: the process, and the oldest of its ancestors started after `snapshot`, both run a test server
    or tool (`SERVICES`), and that ancestor's parent is the init process (left there when its own parent
    ended) -- not a new command of someone else's under a new shell, nor one under an old process.
    """
    processes = running()
    old = {pid for pid, (_, start) in processes.items() if (pid, start) in snapshot}
    left = []
    for pid in processes:
        if pid in old or pid == os.getpid() or not SERVICES.search(_command(pid)):
            continue
        top = pid
        while processes[top][0] in processes and processes[top][0] not in old:
            top = processes[top][0]
        if processes[top][0] <= 1 and SERVICES.search(_command(top)):
            left.append(pid)
    return left


def settle(find: Callable[[], list[int]], wait: float = 10.0) -> int:
    """Give leftovers `wait` seconds to exit, then name and stop those still running; 1 if there were any."""
    deadline = time.monotonic() + wait
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return 0
    print("leftovers: the test run left these processes running (now stopped):", file=sys.stderr)
    for pid in left:
        print(f"  {pid}: {_command(pid)[:300]}", file=sys.stderr)
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while (left := [pid for pid in left if _stat(pid) is not None]) and time.monotonic() < deadline:
            time.sleep(0.1)
    return 1


def main(argv: list[str]) -> int:
    """Run the command `argv` names (see the module's docstring); return the exit status."""
    match argv:
        case ["marked", variable] if "=" in variable:
            return settle(lambda: marked(variable))
        case ["snapshot"]:
            print(json.dumps([[pid, start] for pid, (_, start) in running().items()]))
            return 0
        case ["since", printed]:
            snapshot = {(pid, start) for pid, start in json.loads(printed)}
            return settle(lambda: since(snapshot))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
