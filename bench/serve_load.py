"""Load test of ``contextpipe serve`` on 127.0.0.1: N concurrent sessions x M runs through uvicorn.

The server is a real ``contextpipe serve`` process (uvicorn) serving an agent with an instant fake
model, so the figures are the server's and the store's cost. Each session's runs are sequential;
sessions run concurrently. Afterwards every session's log is read back: it must hold exactly its
own turns, in order (nothing lost, nothing interleaved).

    .venv/bin/python bench/serve_load.py                       # 200 sessions x 5 runs, SQLite
    .venv/bin/python bench/serve_load.py --store postgresql://... --workers 2
    .venv/bin/python bench/serve_load.py --stream               # server-sent events instead of JSON
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from contextpipe import Agent, Message, Usage
from contextpipe.models import ModelRequest, ModelResponse, ResponseComplete, TextDelta
from contextpipe.providers import History
from contextpipe.stores import SessionStore

KEY = "cp_bench_key"
TARGET = f"{Path(__file__).resolve()}:agent"


class EchoModel:
    """Answers at once: ``reply to <the last user text>``."""

    name = "echo"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        last = next(m.text for m in reversed(request.messages) if m.role == "user")
        return ModelResponse([Message.assistant(f"reply to {last}")], Usage(len(request.messages), 3), "stop", "echo")

    async def stream(self, request: ModelRequest) -> Any:
        response = await self.complete(request)
        for word in response.text.split(" "):
            yield TextDelta(word + " ")
        yield ResponseComplete(response)


def _store() -> SessionStore:
    where = os.environ.get("BENCH_STORE", "bench-serve.db")
    if where.startswith("postgresql://"):
        from contextpipe.stores import PostgresStore

        return PostgresStore(where)
    if where.startswith("redis://"):
        from contextpipe.stores import RedisStore

        # Its blocking pool: a burst of runs waits for one of the 64 connections.
        return RedisStore(where, max_connections=64, pool_timeout=60)
    from contextpipe.stores import SQLiteStore

    return SQLiteStore(where)


def agent() -> Agent:
    """The served agent (built in each worker)."""
    return Agent(EchoModel(), instructions="Echo.", providers=[History(_store())])


class Connection:
    """A minimal HTTP/1.1 keep-alive client (one per session), so the figures are the server's, not a client's."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
        try:
            return await self._request(method, path, body)
        except (ConnectionError, IndexError):  # the server closed an idle keep-alive connection: reconnect
            await self.close()
            return await self._request(method, path, body)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, str]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
        self.writer.write(head.encode() + data)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length, chunked = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding" and "chunked" in value:
                chunked = True
        if not chunked:
            return status, (await self.reader.readexactly(length)).decode()
        parts = []
        while (size := int((await self.reader.readline()).strip(), 16)) > 0:
            parts.append(await self.reader.readexactly(size))
            await self.reader.readline()
        await self.reader.readline()
        return status, b"".join(parts).decode()

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()
            self.reader = self.writer = None


async def in_process(sessions: int, runs: int, store_env: str, stream: bool) -> float:
    """Run the same workload on the agent directly (no HTTP); return runs per second."""
    os.environ["BENCH_STORE"] = store_env
    bench_agent = agent()
    prefix = f"direct-{os.getpid()}-"
    handles = [await bench_agent.session(f"{prefix}{i}") for i in range(sessions)]

    async def session_runs(handle: Any) -> None:
        for r in range(runs):
            if not stream:
                await bench_agent.run(f"{handle.id} turn {r}", session=handle)
                continue
            async with bench_agent.stream(f"{handle.id} turn {r}", session=handle) as events:
                async for _ in events:
                    pass

    began = time.perf_counter()
    await asyncio.gather(*(session_runs(h) for h in handles))
    elapsed = time.perf_counter() - began
    for h in handles:
        await bench_agent.store.delete_session(h.tenant, h.id)
    await bench_agent.store.close()
    return sessions * runs / elapsed


def start_server(env: dict[str, str], port: int, workers: int, log: Path) -> subprocess.Popen[bytes]:
    """Start ``contextpipe serve`` on the bench agent; its output goes to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "contextpipe.cli", "serve", TARGET, "--port", str(port),
                                 "--workers", str(workers), "--log-level", "warning"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--store", default=None, help="postgresql:// or redis:// URL (default: a new SQLite file)")
    parser.add_argument("--stream", action="store_true", help="stream every run as server-sent events")
    args = parser.parse_args()

    from contextpipe.serve import hash_key

    with tempfile.TemporaryDirectory(prefix="cp-serve-bench-") as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        prefix = f"bench-{os.getpid()}-"
        env = {**os.environ, "BENCH_STORE": args.store or str(Path(tmp) / "bench.db"),
               "CONTEXTPIPE_API_KEYS": f"bench {hash_key(KEY)}"}
        server = start_server(env, port, args.workers, Path(tmp) / "server.log")
        try:
            probe = Connection(port)
            for _ in range(600):
                try:
                    if (await probe.request("GET", "/healthz"))[0] == 200:
                        break
                except OSError:
                    probe = Connection(port)
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError("the server did not start")
            ids = [f"{prefix}{i}" for i in range(args.sessions)]
            for sid in ids:
                assert (await probe.request("POST", "/v1/sessions", {"id": sid}))[0] == 201
            latencies: list[float] = []
            failures: list[str] = []
            succeeded: dict[str, list[int]] = {sid: [] for sid in ids}

            async def session_runs(sid: str) -> None:
                conn = Connection(port)
                for r in range(args.runs):
                    start = time.perf_counter()
                    body = {"input": f"{sid} turn {r}", "stream": args.stream}
                    status, text = await conn.request("POST", f"/v1/sessions/{sid}/runs", body)
                    latencies.append(time.perf_counter() - start)
                    if status != 200 or (args.stream and "event: done" not in text):
                        failures.append(f"{sid} run {r}: {status} {text[:200]}")
                    else:
                        succeeded[sid].append(r)
                await conn.close()

            began = time.perf_counter()
            await asyncio.gather(*(session_runs(sid) for sid in ids))
            elapsed = time.perf_counter() - began

            lost = interleaved = 0
            for sid in ids:
                page = json.loads((await probe.request("GET", f"/v1/sessions/{sid}/messages?limit=1000"))[1])
                texts = [m["parts"][0]["text"] for m in page["messages"]]
                want = [t for r in succeeded[sid] for t in (f"{sid} turn {r}", f"reply to {sid} turn {r}")]
                if any(t not in texts for t in want):
                    lost += 1
                elif texts != want:
                    interleaved += 1
                await probe.request("DELETE", f"/v1/sessions/{sid}")
            await probe.close()
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
            server_log = (Path(tmp) / "server.log").read_text(encoding="utf-8", errors="replace")
        direct = await in_process(args.sessions, args.runs, args.store or str(Path(tmp) / "direct.db"), args.stream)

    latencies.sort()
    runs = len(latencies)
    store = "SQLite" if not args.store else args.store.split(":")[0]
    print(f"{args.sessions} sessions x {args.runs} runs ({'SSE' if args.stream else 'JSON'}), {args.workers} "
          f"worker(s), {store} store, on {os.cpu_count()} CPUs")
    print(f"  runs: {runs} in {elapsed:.2f} s = {runs / elapsed:.0f} runs/s through HTTP; the same runs on the "
          f"agent directly, in one process: {direct:.0f} runs/s")
    print(f"  latency per run: p50 {1000 * statistics.median(latencies):.1f} ms, "
          f"p99 {1000 * latencies[min(runs - 1, int(runs * 0.99))]:.1f} ms, max {1000 * latencies[-1]:.1f} ms")
    print(f"  failed requests: {len(failures)}; sessions missing a successful run's messages: {lost}; "
          f"interleaved or extra: {interleaved}")
    for line in failures[:5]:
        print("   ", line)
    if failures:
        print("  server log (end):", *server_log.splitlines()[-30:], sep="\n    ")
    if failures or lost or interleaved:
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main())
