"""The fake vendor servers on a port of one's choosing, and on their own (``python -m``) behind the real chat."""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx2 as httpx
import pytest

from contextpipe.errors import UsageError
from contextpipe.testing import FakeAnthropicServer, FakeOpenAIServer, FakeReply

HANG = 60.0
"""Seconds after which a wait for the fake's next line is taken to be a hang (never reached when things work)."""


@pytest.mark.parametrize("server_class", [FakeOpenAIServer, FakeAnthropicServer])
def test_a_chosen_port_and_a_busy_one(server_class: type[FakeOpenAIServer]) -> None:
    with server_class() as first:
        port = int(first.base_url.split(":")[2].split("/")[0])
        with pytest.raises(UsageError, match=rf"cannot listen on 127.0.0.1:{port}: .*pick another port, or port 0"):
            server_class(port=port).start()
    with server_class(port=port) as again:  # the port the first one had, free again
        assert f"127.0.0.1:{port}" in again.base_url
    with pytest.raises(UsageError, match="port must be 0"):
        server_class(port=70000)
    with pytest.raises(UsageError, match=r"cannot listen on 192.0.2.1:0: .*; give an address of this machine"):
        server_class(host="192.0.2.1").start()  # TEST-NET-1, on no machine: the host is wrong, not the port


def test_an_ipv6_host_and_a_default_reply() -> None:
    with FakeOpenAIServer(host="::1") as server:
        server.default_reply = FakeReply("always this")
        assert server.base_url.startswith("http://[::1]:")
        for _ in range(2):
            answer = httpx.post(f"{server.base_url}/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}]}).json()
            assert answer["choices"][0]["message"]["content"] == "always this"


class Lines:
    """The lines a process prints, read in a thread so that a hung process fails the test instead of hanging it."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        assert process.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stdout: IO[str]) -> None:
        with stdout:  # closed at the end of the output (the process exited)
            for line in stdout:
                self._lines.put(line)
        self._lines.put("")  # the end, as readline() says it

    def next(self) -> str:
        return self._lines.get(timeout=HANG)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()


@pytest.mark.parametrize(("module", "env_prefix"), [("fake_openai", "OPENAI"), ("fake_anthropic", "ANTHROPIC")])
def test_a_fake_on_its_own_answers_contextpipe_chat_until_sigterm(
        module: str, env_prefix: str, tmp_path: Path, started: list[subprocess.Popen[str]]) -> None:
    fake = subprocess.Popen([sys.executable, "-m", f"contextpipe.testing.{module}", "--reply", "Hello from the fake",
                             "--reply", "And once more"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started.append(fake)
    lines = Lines(fake)
    first = lines.next()  # printed once the server listens
    match = re.search(r"API at (http://\S+) ", first)
    assert match, first
    printed = [lines.next() for _ in range(4)]
    export = shlex.split(next(line for line in printed if line.lstrip().startswith("export ")))
    env = dict(item.split("=", 1) for item in export[1:])
    assert env == {f"{env_prefix}_BASE_URL": match[1], f"{env_prefix}_API_KEY": "fake-key",
                   f"{env_prefix}_MODEL": env[f"{env_prefix}_MODEL"]}
    command = shlex.split(printed[-1])
    assert command[:2] == ["contextpipe", "chat"], printed
    chat = subprocess.run([sys.executable, "-m", "contextpipe.cli", *command[1:], "--db", str(tmp_path / "c.db")],
                          input="Hi\nAgain\nAnd again\n", capture_output=True, text=True, timeout=HANG,
                          env={**os.environ, **env, "COLUMNS": "200"}, check=False)  # no vendor variables of ours
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.count("Hello from the fake") == 1 and chat.stdout.count("And once more") == 2, chat.stdout
    fake.send_signal(signal.SIGTERM)
    assert fake.wait(timeout=HANG) == 0
    assert "stopped after 3 request(s)" in lines.next()
    assert fake.stderr is not None and fake.stderr.read() == ""  # no warning, no traceback


def test_a_busy_port_on_the_command_line_is_one_line() -> None:
    with FakeOpenAIServer() as busy:
        port = busy.base_url.split(":")[2].split("/")[0]
        done = subprocess.run([sys.executable, "-m", "contextpipe.testing.fake_openai", "--port", port],
                              capture_output=True, text=True, timeout=HANG, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"error: the fake server cannot listen on 127.0.0.1:{port}") and \
        len(done.stderr.splitlines()) == 1
