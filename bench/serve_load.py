"""Load test of ``contextpipe serve`` on 127.0.0.1: N concurrent sessions x M runs through uvicorn.

The server is a real ``contextpipe serve`` process (uvicorn) serving an agent with an instant fake
model, so the figures are the server's and the store's cost. Each session's runs are sequential;
sessions run concurrently. Afterwards every session's log is read back: it must hold exactly its
own turns, in order (nothing lost, nothing interleaved).

    .venv/bin/python bench/serve_load.py                       # 200 sessions x 5 runs, SQLite
    .venv/bin/python bench/serve_load.py --store postgresql://... --workers 2
    .venv/bin/python bench/serve_load.py --stream               # server-sent events instead of JSON
    .venv/bin/python bench/serve_load.py --matrix --out bench/results/serve.json   # the docs' five configurations

``--matrix`` runs JSON and server-sent events on one worker with SQLite, then JSON on two workers with
SQLite, PostgreSQL and Redis (``--postgres`` / ``--redis``, by default the test services' URLs from
``source scripts/services.sh``; a configuration without its URL is skipped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from contextpipe import Agent, Message, Usage
from contextpipe.models import ModelRequest, ModelResponse, ResponseComplete, TextDelta
from contextpipe.providers import History
from contextpipe.stores import SessionStore

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the server imports this file by its path
import _harness as h

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

    with h.Stopwatch() as watch:
        await asyncio.gather(*(session_runs(handle) for handle in handles))
    for handle in handles:
        await bench_agent.store.delete_session(handle.tenant, handle.id)
    await bench_agent.store.close()
    return sessions * runs / watch.wall


def start_server(env: dict[str, str], port: int, workers: int, log: Path) -> subprocess.Popen[bytes]:
    """Start ``contextpipe serve`` on the bench agent; its output goes to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "contextpipe.cli", "serve", TARGET, "--port", str(port),
                                 "--workers", str(workers), "--log-level", "warning"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


async def load_test(sessions: int, runs_per_session: int, workers: int, store_url: str | None,
                    stream: bool) -> dict[str, Any]:
    """One configuration: the server under load, then every session's log checked, then the same runs in process."""
    from contextpipe.serve import hash_key

    with tempfile.TemporaryDirectory(prefix="cp-serve-bench-") as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        prefix = f"bench-{os.getpid()}-"
        env = {**os.environ, "BENCH_STORE": store_url or str(Path(tmp) / "bench.db"),
               "CONTEXTPIPE_API_KEYS": f"bench {hash_key(KEY)}"}
        server = start_server(env, port, workers, Path(tmp) / "server.log")
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
            ids = [f"{prefix}{i}" for i in range(sessions)]
            for sid in ids:
                assert (await probe.request("POST", "/v1/sessions", {"id": sid}))[0] == 201
            latencies: list[float] = []
            failures: list[str] = []
            succeeded: dict[str, list[int]] = {sid: [] for sid in ids}

            async def session_runs(sid: str) -> None:
                conn = Connection(port)
                for r in range(runs_per_session):
                    body = {"input": f"{sid} turn {r}", "stream": stream}
                    with h.Stopwatch() as watch:
                        status, text = await conn.request("POST", f"/v1/sessions/{sid}/runs", body)
                    latencies.append(watch.wall)
                    if status != 200 or (stream and "event: done" not in text):
                        failures.append(f"{sid} run {r}: {status} {text[:200]}")
                    else:
                        succeeded[sid].append(r)
                await conn.close()

            with h.Stopwatch() as whole:
                await asyncio.gather(*(session_runs(sid) for sid in ids))

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
        direct = await in_process(sessions, runs_per_session, store_url or str(Path(tmp) / "direct.db"), stream)
    latencies.sort()
    return {"runs": len(latencies), "elapsed": whole.wall, "latencies": latencies, "direct": direct,
            "failures": failures, "lost": lost, "interleaved": interleaved, "server_log": server_log}


def label(workers: int, store_url: str | None, stream: bool) -> str:
    store = {"postgresql": "PostgreSQL", "redis": "Redis"}.get((store_url or "").split(":")[0], "SQLite")
    return f"{'server-sent events' if stream else 'JSON'}, {workers} worker{'s' if workers > 1 else ''}, {store}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--store", default=None, help="postgresql:// or redis:// URL (default: a new SQLite file)")
    parser.add_argument("--stream", action="store_true", help="stream every run as server-sent events")
    parser.add_argument("--matrix", action="store_true", help="the five configurations of the docs' table")
    parser.add_argument("--postgres", default=os.environ.get("CONTEXTPIPE_TEST_POSTGRES_DSN"))
    parser.add_argument("--redis", default=os.environ.get("CONTEXTPIPE_TEST_REDIS_URL"))
    h.out_argument(parser, "serve")
    args = parser.parse_args()
    configs = [(args.workers, args.store, args.stream)]
    if args.matrix:
        configs = [(1, None, False), (1, None, True), (2, None, False), (2, args.postgres, False),
                   (2, args.redis, False)]
        configs = [c for i, c in enumerate(configs) if i < 3 or c[1]]
    results = h.Results(
        "serve", f"A real `contextpipe serve` process (uvicorn) on 127.0.0.1 with a model that answers at once: "
        f"{args.sessions} sessions running {args.runs} runs each, all sessions at once; afterwards every "
        f"session's log is read back", layout={"rows": ["case", "side"], "columns": "metric"})
    broken = False
    for workers, store_url, stream in configs:
        r = await load_test(args.sessions, args.runs, workers, store_url, stream)
        case, runs, lat = label(workers, store_url, stream), r["runs"], r["latencies"]
        print(f"{case}: {runs} runs in {r['elapsed']:.2f} s; failed {len(r['failures'])}, lost {r['lost']}, "
              f"interleaved {r['interleaved']}", file=sys.stderr, flush=True)
        results.add(case, "contextpipe serve", "runs/s", "", value=runs / r["elapsed"])
        results.add(case, "contextpipe serve", "p50", "s", value=h.stats(lat)["median"])
        results.add(case, "contextpipe serve", "p99", "s", value=lat[min(runs - 1, int(runs * 0.99))])
        results.add(case, "contextpipe serve", "same runs on the agent, no HTTP", "runs/s", value=r["direct"])
        results.add(case, "contextpipe serve", "failed, lost or interleaved", "",
                    value=len(r["failures"]) + r["lost"] + r["interleaved"])
        for line in r["failures"][:5]:
            print("   ", line)
        if r["failures"]:
            print("  server log (end):", *r["server_log"].splitlines()[-30:], sep="\n    ")
        broken = broken or bool(r["failures"] or r["lost"] or r["interleaved"])
    print(h.table(results.write(args.out)))
    if broken:
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main())
