"""``contextpipe serve`` and ``contextpipe ui`` as real processes: the example, SIGTERM, workers, CLI errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from contextpipe.serve import ApiKeys, hash_key
from contextpipe.stores import SQLiteStore
from stores.backends import server_address

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
KEY = "cp_process_key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "contextpipe.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=60, check=False)


def start(args: list[str], env: dict[str, str], cwd: Path, open_files: int | None = None) -> subprocess.Popen[str]:
    def limit() -> None:  # in the server process, before it starts: its open-files limit, soft and hard
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    return subprocess.Popen([sys.executable, "-m", "contextpipe.cli", *args], env={**os.environ, **env},
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=limit)


HANG = 120.0
"""Seconds after which a wait for a progress signal is taken to be a hang (never reached when things work)."""


def wait_ready(process: subprocess.Popen[str], base: str) -> None:
    give_up = time.monotonic() + HANG
    while True:  # progress signal: the health route answers (or the process died)
        assert time.monotonic() < give_up, "the server never answered /healthz"
        if process.poll() is not None:
            raise AssertionError(f"the server exited: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)


@pytest.fixture
def stop() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def test_serve_the_example_on_a_fresh_folder(tmp_path: Path, stop: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    env = {"CONTEXTPIPE_API_KEYS": "", "CONTEXTPIPE_STORE": str(tmp_path / "weather.db")}
    process = start(["serve", "examples.weather:agent", "--port", str(port), "--app-dir", str(ROOT),
                     "--log-level", "warning"], env, tmp_path)
    stop.append(process)
    assert process.stderr is not None
    key = None
    for line in process.stderr:  # the key made for this run is printed, with the inspector's URL
        found = re.search(r"/ui/#key=(cp_\w+)", line)
        if found:
            key = found.group(1)
            break
    assert key is not None
    base = f"http://127.0.0.1:{port}"
    wait_ready(process, base)
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.post(f"{base}/v1/sessions", json={"id": "me"}).status_code == 401
    assert httpx.post(f"{base}/v1/sessions", json={"id": "me"}, headers=headers).status_code == 201
    result = httpx.post(f"{base}/v1/sessions/me/runs", json={"input": "What should I wear in Suzhou?"},
                        headers=headers, timeout=30).json()
    assert result["text"].startswith("Today in Suzhou: Sunny, 25 °C")
    assert [m["parts"][0]["kind"] for m in result["messages"]] == ["function_call", "function_result",
                                                                    "function_call", "function_result", "text"]
    assert "Tokens by source" in httpx.get(f"{base}/ui/").text + httpx.get(f"{base}/ui/app.js").text
    assert httpx.get(f"{base}/openapi.json").json()["info"]["title"] == "contextpipe"
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


def stream_in_thread(base: str, sid: str, out: list[str]) -> threading.Thread:
    def read() -> None:
        try:
            with httpx.stream("POST", f"{base}/v1/sessions/{sid}/runs", json={"input": "hello", "stream": True},
                              headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as response:
                out.append(response.read().decode())
        except httpx.HTTPError as exc:
            out.append(f"transport error: {exc!r}")

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def wait_for(path: Path, process: subprocess.Popen[str]) -> None:
    give_up = time.monotonic() + HANG
    while not path.exists():  # progress signal from the server process
        assert time.monotonic() < give_up, f"{path.name} never appeared"
        assert process.poll() is None, "the server exited"
        time.sleep(0.02)


@pytest.mark.parametrize("gate_opens", [True, False], ids=["finishes", "deadline"])
def test_sigterm_drains_runs_in_flight(tmp_path: Path, stop: list[subprocess.Popen[str]], gate_opens: bool) -> None:
    port = free_port()
    env = {"GATE_DIR": str(tmp_path), "CONTEXTPIPE_API_KEYS": f"acme {hash_key(KEY)}"}
    process = start(["serve", f"{HERE / 'gate_agent.py'}:agent", "--port", str(port), "--log-level", "warning",
                     "--drain-timeout", "60" if gate_opens else "1"], env, tmp_path)
    stop.append(process)
    base = f"http://127.0.0.1:{port}"
    wait_ready(process, base)
    assert httpx.post(f"{base}/v1/sessions", json={"id": "s1"}, headers={"Authorization": f"Bearer {KEY}"}
                      ).status_code == 201
    out: list[str] = []
    thread = stream_in_thread(base, "s1", out)
    wait_for(tmp_path / "entered", process)
    process.send_signal(signal.SIGTERM)
    if gate_opens:  # while the run is in flight the server still listens, and refuses new work with 503
        give_up = time.monotonic() + HANG
        while httpx.get(f"{base}/healthz").status_code != 503:  # progress signal: the drain has begun
            assert time.monotonic() < give_up, "the server never began draining"
        refused = httpx.post(f"{base}/v1/sessions/s1/runs", json={"input": "too late"},
                             headers={"Authorization": f"Bearer {KEY}"})
        assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
        assert refused.json()["error"]["type"] == "ShuttingDown"
        assert not (tmp_path / "open").exists() and process.poll() is None  # the run is still in flight
        (tmp_path / "open").touch()
    process.wait(timeout=60)
    thread.join(timeout=60)

    async def check() -> tuple[list[str], bool]:
        async with SQLiteStore(tmp_path / "sessions.db") as store:
            texts = [m.text for m in (await store.load("acme", "s1")).messages]
            return texts, await store.try_acquire_lease("acme", "s1", "probe", 5) is not None

    texts, lease_free = asyncio.run(check())
    assert lease_free
    if gate_opens:
        assert "event: done" in out[0]
        assert texts == ["hello", "reply to hello"]
    else:
        assert "event: done" not in out[0]
        assert "reply to hello" not in texts


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_several_workers_on_a_shared_store_never_interleave(
        tmp_path: Path, stop: list[subprocess.Popen[str]], backend: str) -> None:
    address = server_address(backend)
    assert address is not None
    port = free_port()
    env = {"CONTEXTPIPE_STORE": address, "CONTEXTPIPE_API_KEYS": f"acme {hash_key(KEY)}"}
    process = start(["serve", "examples.weather:agent", "--port", str(port), "--workers", "2", "--app-dir", str(ROOT),
                     "--log-level", "warning"], env, tmp_path)
    stop.append(process)
    base = f"http://127.0.0.1:{port}"
    wait_ready(process, base)
    sid = f"workers-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {KEY}"}
    cities = ["Suzhou", "Beijing", "London", "Paris", "Suzhou", "Beijing"]

    async def runs() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            assert (await c.post("/v1/sessions", json={"id": sid}, headers=headers)).status_code == 201
            return list(await asyncio.gather(*(
                c.post(f"/v1/sessions/{sid}/runs", json={"input": f"Weather in {city}?", "wait": 30}, headers=headers)
                for city in cities)))

    responses = asyncio.run(runs())
    assert [r.status_code for r in responses] == [200] * len(cities)
    log = httpx.get(f"{base}/v1/sessions/{sid}/messages?limit=1000", headers=headers).json()["messages"]
    assert len(log) == 6 * len(cities)
    for turn in range(len(cities)):  # each run's six messages are together and in order
        chunk = log[turn * 6:(turn + 1) * 6]
        assert [m["role"] for m in chunk] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        city = chunk[0]["parts"][0]["text"].removeprefix("Weather in ").rstrip("?")
        assert chunk[5]["parts"][0]["text"].startswith(f"Today in {city}:")
    httpx.delete(f"{base}/v1/sessions/{sid}", headers=headers)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    cases = [
        (["serve"], "give the agent to serve"),
        (["serve", "no_such_module:agent"], "cannot import 'no_such_module'"),
        (["serve", "examples.weather:nothing", "--app-dir", str(ROOT)], "has no attribute 'nothing'"),
        (["serve", "examples.weather:agent", "--app-dir", str(ROOT), "--workers", "0"], "--workers"),
        (["serve", "examples.weather:agent", "--app-dir", str(ROOT), "--on-disconnect", "later"], "--on-disconnect"),
        (["serve", "x:y", "--keys", str(tmp_path / "missing.txt")], "cannot read the API keys file"),
        (["ui", "--db", str(tmp_path / "missing.db")], "no session database"),
        (["ui", "--db", str(tmp_path)], "it is a directory"),
    ]
    (tmp_path / "notes.txt").write_text("not a database\n", encoding="utf-8")
    memory_agent = tmp_path / "memory_agent.py"
    memory_agent.write_text("from contextpipe import Agent\nfrom contextpipe.testing import ScriptedModel\n"
                            "agent = Agent(ScriptedModel([]))\nnot_an_agent = 42\n", encoding="utf-8")
    cases.append((["serve", f"{memory_agent}:agent", "--workers", "2"], "--workers needs a store the workers share"))
    cases.append((["serve", f"{memory_agent}:not_an_agent"], "it is of type int"))
    cases.append((["serve", f"{memory_agent}:agent", "--log-level", "loud"], "--log-level must be one of"))
    cases.append((["serve", f"{memory_agent}:agent", "--body-timeout", "0"], "--body-timeout must be a number"))
    cases.append((["serve", f"{memory_agent}:agent", "--max-connections", "0"], "--max-connections must be at"))
    cases.append((["ui", "--db", str(tmp_path / "notes.txt")], "not a contextpipe session database"))
    newer = tmp_path / "newer.db"
    with sqlite3.connect(newer) as db:
        db.execute("CREATE TABLE cp_meta (key TEXT PRIMARY KEY, value TEXT)")
        db.execute("INSERT INTO cp_meta VALUES ('schema_version', '999')")
    db.close()
    cases.append((["ui", "--db", str(newer)], "written by a newer contextpipe (schema 999"))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    cases.append((["serve", f"{memory_agent}:agent", "--port", str(busy.getsockname()[1])], "cannot listen on"))
    from typer.testing import CliRunner

    from contextpipe.cli import app

    runner = CliRunner()
    for args, needle in cases:  # in this process, for speed: the same command code as the installed script
        done = runner.invoke(app, args, env={"CONTEXTPIPE_API_KEYS": ""})
        assert done.exit_code != 0, args
        assert done.exception is None or isinstance(done.exception, SystemExit), (args, done.exception)
        assert needle in " ".join(done.stderr.split()), (args, done.stderr)
    busy.close()


def test_new_key_appends_a_hash_the_server_accepts(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.txt"
    done = cli("serve", "--new-key", "acme", "--keys", str(keys_file))
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip().splitlines()[-1]
    assert key.startswith("cp_")
    assert key not in keys_file.read_text(encoding="utf-8")
    assert ApiKeys.load(keys_file, environ={}).tenant_for(key) == "acme"


def test_ui_serves_a_sqlite_file_read_only(tmp_path: Path, stop: list[subprocess.Popen[str]]) -> None:
    async def seed() -> None:
        async with SQLiteStore(tmp_path / "s.db") as store:
            from contextpipe import Message

            await store.append("default", "chat-1", [Message.user("hi"), Message.assistant("hello")])

    asyncio.run(seed())
    before = (tmp_path / "s.db").read_bytes()
    port = free_port()
    process = start(["ui", "--db", str(tmp_path / "s.db"), "--port", str(port)],
                    {"CONTEXTPIPE_API_KEYS": f"default {hash_key(KEY)}"}, tmp_path)
    stop.append(process)
    base = f"http://127.0.0.1:{port}"
    wait_ready(process, base)
    headers = {"Authorization": f"Bearer {KEY}"}
    page = httpx.get(f"{base}/v1/sessions/chat-1/messages", headers=headers).json()
    assert [m["parts"][0]["text"] for m in page["messages"]] == ["hi", "hello"]
    assert httpx.delete(f"{base}/v1/sessions/chat-1", headers=headers).status_code == 405
    assert json.loads(httpx.get(f"{base}/v1/info", headers=headers).text)["read_only"] is True
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    assert (tmp_path / "s.db").read_bytes() == before


def read_to_end(sock: socket.socket) -> bytes:
    """Return what the server sends until it closes the connection (a bounded wait: HANG)."""
    sock.settimeout(HANG)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def serve_gate(tmp_path: Path, stop: list[subprocess.Popen[str]], *options: str, port: int | None = None,
               open_files: int | None = None) -> tuple[subprocess.Popen[str], int]:
    port = port or free_port()
    env = {"GATE_DIR": str(tmp_path), "CONTEXTPIPE_API_KEYS": f"acme {hash_key(KEY)}"}
    process = start(["serve", f"{HERE / 'gate_agent.py'}:agent", "--port", str(port), "--log-level", "warning",
                     *options], env, tmp_path, open_files)
    stop.append(process)
    wait_ready(process, f"http://127.0.0.1:{port}")
    return process, port


def test_slow_and_idle_clients_are_cut(tmp_path: Path, stop: list[subprocess.Popen[str]]) -> None:
    _, port = serve_gate(tmp_path, stop, "--header-timeout", "0.5", "--body-timeout", "0.5",
                         "--keep-alive-timeout", "0.5")
    silent, half_head, half_body, kept = (socket.create_connection(("127.0.0.1", port)) for _ in range(4))
    half_head.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
    half_body.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + KEY.encode() +
                      b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\": ")
    kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
    assert read_to_end(silent) == b""
    assert read_to_end(half_head) == b""
    answer = read_to_end(half_body)
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"RequestTimeout"' in answer
    assert read_to_end(kept).startswith(b"HTTP/1.1 200 ")  # answered, then closed once idle
    for sock in (silent, half_head, half_body, kept):
        sock.close()
    assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200


def test_idle_connections_past_the_open_files_limit_leave_room(tmp_path: Path,
                                                               stop: list[subprocess.Popen[str]]) -> None:
    process, port = serve_gate(tmp_path, stop, "--header-timeout", "600", open_files=256)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]  # more than the server's 256 files
    for sock in idle[::2]:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # half a head
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=HANG).status_code == 200
        closed = 0
        for sock in idle[:100]:  # the oldest were closed to make room
            sock.settimeout(0)
            try:
                closed += sock.recv(1) == b""
            except ConnectionResetError:  # closed with its half head unread
                closed += 1
            except BlockingIOError:  # still open
                pass
        assert closed > 0
    finally:
        for sock in idle:
            sock.close()
    assert process.poll() is None


def test_with_every_connection_busy_a_new_one_is_answered_503(tmp_path: Path,
                                                              stop: list[subprocess.Popen[str]]) -> None:
    _, port = serve_gate(tmp_path, stop, "--max-connections", "2", "--body-timeout", "600")
    busy = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    for sock in busy:
        sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n")
        sock.settimeout(HANG)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")  # progress signal: the app awaits its body
    refused = httpx.get(f"http://127.0.0.1:{port}/healthz")
    assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
    assert refused.json()["error"]["type"] == "TooManyConnections"
    for sock in busy:
        sock.close()


def test_a_server_stopped_with_clients_connected_can_start_again_on_its_port(
        tmp_path: Path, stop: list[subprocess.Popen[str]]) -> None:
    first, port = serve_gate(tmp_path, stop)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    clients[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
    clients[0].settimeout(HANG)
    answer = b""
    while not answer.endswith(b"}"):  # the whole response: a keep-alive connection, now idle
        answer += clients[0].recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 ")
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=HANG)
    for sock in clients:  # the server closed them first: its side of each waits in TIME_WAIT
        assert read_to_end(sock) == b""
        sock.close()
    serve_gate(tmp_path, stop, port=port)  # binds at once


def one_response(sock: socket.socket, data: bytes = b"") -> tuple[bytes, bytes]:
    """Read one response with a Content-Length from `sock` (after `data`, already read); return it and what follows."""
    sock.settimeout(HANG)
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    found = re.search(rb"(?im)^content-length: *(\d+)", head)
    assert found is not None, head
    length = int(found.group(1))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed inside a body: {data + rest!r}"
        rest += chunk
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


def nothing_more(sock: socket.socket) -> bool:
    """Tell whether the server has written nothing more on `sock` for now (a read that would block)."""
    sock.settimeout(0)
    try:
        sock.recv(65536)
    except BlockingIOError:
        return True
    return False


def body_deadline_passed(port: int) -> None:
    """Return once a body deadline armed now has fired: one armed before it, for as long, has fired too
    (timers of one event loop with equal delays fire in the order they were armed)."""
    probe = socket.create_connection(("127.0.0.1", port))
    probe.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    assert read_to_end(probe).startswith(b"HTTP/1.1 408 ")
    probe.close()


RUN = (b"POST /v1/sessions/s1/runs HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + KEY.encode() +
       b"\r\nContent-Type: application/json\r\nContent-Length: 18\r\n\r\n{\"input\": \"hello\"}")
HALF_BODY = (b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer " + KEY.encode() +
             b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\": ")
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"


@pytest.mark.parametrize("ahead", [0, 1], ids=["after-a-run", "after-a-run-and-one-more"])
def test_a_pipelined_body_deadline_waits_for_the_requests_before_it(
        tmp_path: Path, stop: list[subprocess.Popen[str]], ahead: int) -> None:
    _, port = serve_gate(tmp_path, stop, "--body-timeout", "0.2")
    assert httpx.post(f"http://127.0.0.1:{port}/v1/sessions", json={"id": "s1"},
                      headers={"Authorization": f"Bearer {KEY}"}).status_code == 201
    sock = socket.create_connection(("127.0.0.1", port))
    # ahead=0: a run (held at the gate), then a request whose body stops half way.
    # ahead=1: a quick request, the run (started when the first is answered), then the half body.
    sock.sendall((HEALTH if ahead else b"") + RUN + HALF_BODY)  # one write: uvicorn reads them at once
    wait_for(tmp_path / "entered", stop[0])  # the run is in its model
    body_deadline_passed(port)  # a deadline armed for the half body by now (too early) has fired
    rest = b""
    if ahead:
        health, rest = one_response(sock)
        assert health.startswith(b"HTTP/1.1 200 ")
    assert rest == b"" and nothing_more(sock)  # the run is not answered yet: nothing else was written
    (tmp_path / "open").touch()
    run, rest = one_response(sock, rest)
    assert run.startswith(b"HTTP/1.1 200 ") and b"reply to hello" in run  # the run's response, whole
    rest += read_to_end(sock)
    assert rest.startswith(b"HTTP/1.1 408 ") and b'"RequestTimeout"' in rest  # then the half body's 408
    sock.close()


def test_a_request_answered_before_its_body_ended_leaves_the_next_head_a_deadline(
        tmp_path: Path, stop: list[subprocess.Popen[str]]) -> None:
    _, port = serve_gate(tmp_path, stop, "--header-timeout", "0.3", "--keep-alive-timeout", "600")
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 10\r\n\r\n{")  # no key: answered 401 before its body ends
    refused, rest = one_response(sock)
    assert refused.startswith(b"HTTP/1.1 401 ") and rest == b""
    sock.sendall(b"\"id\": 1}\r\nGET /healthz HTTP/1.1\r\n")  # the rest of the body, and half the next head
    assert read_to_end(sock) == b""  # closed: the half head had a deadline (keep-alive's is far off)
    sock.close()


def test_agui_rewinds_reaches_the_workers(tmp_path: Path, stop: list[subprocess.Popen[str]]) -> None:
    # Only with the setting on does the AG-UI route record a thread's runId in its state.
    (tmp_path / "open").touch()
    _, port = serve_gate(tmp_path, stop, "--agui-rewinds")
    headers = {"Authorization": f"Bearer {KEY}"}
    run = {"threadId": "t1", "runId": "r1", "state": None, "tools": [], "context": [], "forwardedProps": {},
           "messages": [{"id": "u1", "role": "user", "content": "hi"}]}
    assert "RUN_FINISHED" in httpx.post(f"http://127.0.0.1:{port}/v1/ag-ui", json=run, headers=headers).text
    state = httpx.get(f"http://127.0.0.1:{port}/v1/sessions/t1", headers=headers).json()["state"]
    assert state["ag-ui.run_id"] == "r1"
