"""Idle connections against ``contextpipe serve``: 25,000 held open, then a normal request must be answered.

Half the connections send nothing, half send half a request head (a slowloris client). The head
deadline is set to an hour (``--header-timeout 3600``), so that only the cap on connections can
make room. The clients are several processes (``--per-client`` connections each), so no process
needs more open files than the machine allows. Two cases, each a fresh ``contextpipe serve``
process on 127.0.0.1 with one worker:

- the server's open-files limit as high as the machine allows (``/proc/sys/fs/nr_open`` where the
  hard limit may be raised, else the hard limit): below 25,000, the server closes the connections
  idle the longest to make room; above, it holds them all;
- a limit of 1,024 (``--low-limit``; a common default).

Each case records whether the normal request (``POST /v1/sessions`` with a key) was answered and
how fast, how many idle connections were still open then, and the server's open files and memory.

    python bench/idle_connections_bench.py --out bench/results/idle-connections.json
    python bench/idle_connections_bench.py --connections 5000    # a smaller machine
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import multiprocessing
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from contextpipe import Agent
from contextpipe.testing import ScriptedModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h

KEY = "cp_bench_key"
TARGET = f"{Path(__file__).resolve()}:agent"
HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n"

agent = Agent(ScriptedModel())
"""What the server serves (the normal request only creates a session; no model call)."""


def highest_limit() -> int:
    """Raise this process's open-files limits as far as the machine allows (nr_open, where permitted); return it."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    try:
        nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
        resource.setrlimit(resource.RLIMIT_NOFILE, (nr_open, nr_open))
    except (OSError, ValueError):  # no such file, or not permitted (CAP_SYS_RESOURCE): the hard limit it is
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def request(port: int, method: str, path: str, timeout: float = 60.0) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=b"{}", headers={"Authorization": f"Bearer {KEY}",
                                                              "Content-Type": "application/json"})
        return connection.getresponse().status
    finally:
        connection.close()


def wait_ready(port: int, server: subprocess.Popen[bytes]) -> None:
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        if server.poll() is not None:
            raise RuntimeError("the server exited")
        try:
            if request(port, "GET", "/healthz", timeout=5) == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server never answered /healthz")


def still_open(sockets: list[socket.socket]) -> int:
    """Count the `sockets` the server has not closed (non-blocking reads: EOF or reset means closed)."""
    count = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            if sock.recv(1) != b"":
                count += 1
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def hold(port: int, count: int, first: int, pipe: Connection) -> None:
    """One client process: open `count` idle connections and report; on "check" report how many are open."""
    sockets: list[socket.socket] = []
    stopped = None
    for i in range(first, first + count):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            if i % 2:
                sock.sendall(HALF_HEAD)
        except OSError as exc:  # what this machine reached: its ephemeral ports or open files ran out
            stopped = f"connection {i + 1}: {exc}"
            break
        sockets.append(sock)
    pipe.send((len(sockets), stopped))
    pipe.recv()
    pipe.send(still_open(sockets))
    pipe.recv()  # then close them all, by exiting


def server_state(pid: int) -> tuple[int, float]:
    """The server process's open files and resident memory (MiB)."""
    files = len(os.listdir(f"/proc/{pid}/fd"))
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    return files, rss / 1024


def one_case(connections: int, open_files: int, per_client: int, tmp: Path) -> dict[str, Any]:
    """Hold `connections` idle against a server limited to `open_files`, then send the normal request."""
    from contextpipe.serve import hash_key

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    log = tmp / f"server-{open_files}.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "contextpipe.cli", "serve", TARGET, "--port", str(port),
                                   "--header-timeout", "3600", "--log-level", "warning"],
                                  env={**os.environ, "CONTEXTPIPE_API_KEYS": f"bench {hash_key(KEY)}"},
                                  stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit)
    clients: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    try:
        wait_ready(port, server)
        cap = next((line.split("at most ")[1].split()[0] for line in log.read_text().splitlines()
                    if line.startswith("connections: at most")), None)
        fork = multiprocessing.get_context("fork")
        with h.Stopwatch() as opening:
            for first in range(0, connections, per_client):
                ours, theirs = fork.Pipe()
                client = fork.Process(target=hold, args=(port, min(per_client, connections - first), first, theirs))
                client.start()
                clients.append((client, ours))
            reports = [ours.recv() for _, ours in clients]
        with h.Stopwatch() as answering:
            status = request(port, "POST", "/v1/sessions")
        files, rss = server_state(server.pid)
        for _, ours in clients:
            ours.send("check")
        held = sum(ours.recv() for _, ours in clients)
        return {"opened": sum(n for n, _ in reports), "stopped": next((s for _, s in reports if s), None),
                "open_seconds": opening.wall, "status": status, "latency_ms": answering.wall * 1000,
                "still_open": held, "server_files": files, "server_rss_mib": rss, "cap": int(cap) if cap else None}
    finally:
        for client, ours in clients:
            with contextlib.suppress(OSError):
                ours.send("close")
            client.join(timeout=120)
        server.terminate()
        server.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=25_000)
    parser.add_argument("--low-limit", type=int, default=1024, help="the second case's server open-files limit")
    parser.add_argument("--per-client", type=int, default=10_000, help="connections per client process")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    high = highest_limit()
    if args.per_client > high - 100:
        sys.exit(f"--per-client {args.per_client} needs more open files than a process may hold here ({high})")
    results = h.Results(
        "idle-connections", f"{args.connections:,} idle connections (half of them sending half a request head) held "
        "against a real `contextpipe serve` process on 127.0.0.1, then a normal request (POST /v1/sessions with a "
        "key); the head deadline set to an hour so that only the connection cap makes room",
        notes=[f"Clients: {args.per_client:,} connections per process. Server open-files limits: the highest this "
               f"machine allows ({high:,}), and {args.low_limit:,}.",
               "'still open' counts the idle connections the server had not closed when the normal request was "
               "answered: with the lower limit it closed those idle the longest to make room."])
    with tempfile.TemporaryDirectory(prefix="cp-idle-bench-") as tmp:
        for open_files in (high, args.low_limit):
            got = one_case(args.connections, open_files, args.per_client, Path(tmp))
            case = f"{got['opened']:,} idle, server limit {open_files:,}"
            print(case, got, file=sys.stderr)
            side = "contextpipe serve"
            results.add(case, side, "normal request status", "", value=got["status"])
            results.add(case, side, "normal request latency", "ms", value=round(got["latency_ms"], 1))
            results.add(case, side, "idle connections opened", "", value=got["opened"], stopped=got["stopped"])
            results.add(case, side, "idle connections still open", "", value=got["still_open"])
            results.add(case, side, "server connection cap", "", value=got["cap"] or 0)
            results.add(case, side, "server open files", "", value=got["server_files"])
            results.add(case, side, "server memory (RSS)", "MiB", value=round(got["server_rss_mib"], 1))
            results.add(case, side, "seconds to open them", "s", value=round(got["open_seconds"], 2))
    results.write(args.out)


if __name__ == "__main__":
    main()
