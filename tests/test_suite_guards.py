"""The root conftest's guards: vendor variables are cleared, only loopback connections are allowed, tests
needing an extra skip (fail under CI), no module leaves a process running, SIGTERM tears the run down;
and scripts/leftovers.py, which finds what a whole run left."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REFUSED = "tests must not connect to other machines"


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                                  "ANTHROPIC_VERTEX_PROJECT_ID", "CLOUD_ML_REGION", "AWS_BEARER_TOKEN_BEDROCK"])
def test_no_vendor_variable_reaches_a_test(name: str) -> None:
    assert name not in os.environ


@pytest.mark.parametrize(("family", "address"), [
    (socket.AF_INET, ("192.0.2.1", 443)), (socket.AF_INET, ("api.openai.com", 443)),
    (socket.AF_INET6, ("2001:db8::1", 443, 0, 0)),
])
def test_a_connection_to_another_machine_is_refused(family: int, address: tuple[object, ...]) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        with pytest.raises(RuntimeError, match=REFUSED):
            sock.connect(address)
        with pytest.raises(RuntimeError, match=REFUSED):
            sock.connect_ex(address)


async def test_asyncio_connections_are_guarded_too() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        await asyncio.open_connection("192.0.2.1", 443)


def test_loopback_and_unix_sockets_still_connect(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as client:
        assert client.getpeername() == server.getsockname()
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as client:
        listener.bind(path)
        listener.listen()
        client.connect(path)


def test_bench_imports_nothing_from_tests() -> None:
    """The benchmarks stand alone: no import of ``tests``, no path into it (shared data is in fixtures/)."""
    root = Path(__file__).resolve().parents[1]
    reaching = []
    for path in sorted((root / "bench").rglob("*.py")):
        if any(part.startswith(".venv") for part in path.relative_to(root).parts):
            continue  # the peers' virtualenvs (bench/peers/setup.sh) are installed packages, not benchmarks
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "tests" or n.startswith("tests.") for n in names) or \
                    (isinstance(node, ast.Constant) and node.value == "tests"):
                reaching.append(f"{path.relative_to(root)}:{node.lineno}")
    assert reaching == []


ROOT = Path(__file__).resolve().parents[1]


def inner_suite(folder: Path, files: dict[str, str]) -> Path:
    """A folder of tests under a copy of this suite's conftest.py, to run in a pytest of its own."""
    shutil.copyfile(ROOT / "tests" / "conftest.py", folder / "conftest.py")
    (folder / "pytest.ini").write_text("[pytest]\nmarkers = extra: optional test dependencies\n"
                                       "asyncio_default_fixture_loop_scope = function\n")
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def run_inner(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "CONTEXTPIPE_TEST_EXTRAS")} | env
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", str(folder)],
                          capture_output=True, text=True, cwd=folder, env=environment, timeout=120)


NEEDS_TORCH = """
import pytest

@pytest.mark.extra("torch")
def test_needs_torch():
    pass
"""

NEEDS_MPNET_AND_TORCH = """
import pytest

@pytest.mark.extra("mpnet", "torch")
def test_needs_both():
    pass
"""

LEAVES_A_PROCESS = """
import subprocess, sys

def test_starts_a_server_and_forgets_it():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
"""


def test_a_test_whose_extra_is_not_asked_for_skips_saying_how_and_fails_under_ci(tmp_path: Path) -> None:
    folder = inner_suite(tmp_path, {"test_torch.py": NEEDS_TORCH})
    skipped = run_inner(folder, CONTEXTPIPE_TEST_EXTRAS="mpnet,browser")
    assert "1 skipped" in skipped.stdout, skipped.stdout
    assert "NEEDS EXTRA TORCH" in skipped.stdout
    assert "CONTEXTPIPE_TEST_EXTRAS=torch bash scripts/test.sh" in skipped.stdout
    failed = run_inner(folder, CONTEXTPIPE_TEST_EXTRAS="", CI="true")
    assert failed.returncode == 1 and "1 error" in failed.stdout, failed.stdout
    assert "CI must run every test" in failed.stdout


def test_the_command_a_skip_suggests_asks_for_every_extra_the_test_needs(tmp_path: Path) -> None:
    folder = inner_suite(tmp_path, {"test_both.py": NEEDS_MPNET_AND_TORCH})
    with (folder / "conftest.py").open("a") as conftest:
        conftest.write('\nEXTRAS["mpnet"] = lambda: True  # as where the weights are installed\n')
    skipped = run_inner(folder, CONTEXTPIPE_TEST_EXTRAS="mpnet")
    assert "1 skipped" in skipped.stdout and "TORCH (not asked for)" in skipped.stdout, skipped.stdout
    assert "CONTEXTPIPE_TEST_EXTRAS=mpnet,torch bash scripts/test.sh" in skipped.stdout


def test_a_module_that_leaves_a_process_running_fails_and_the_process_is_stopped(tmp_path: Path) -> None:
    folder = inner_suite(tmp_path, {"test_leak.py": LEAVES_A_PROCESS})
    proc = run_inner(folder, CONTEXTPIPE_TEST_LEFTOVER_WAIT="0")
    assert proc.returncode == 1 and "1 passed, 1 error" in proc.stdout, proc.stdout
    left = re.search(r"left processes running \(now killed\): (\d+): \S+ -c import time", proc.stdout)
    assert left is not None, proc.stdout
    assert gone(int(left[1]))


WAITS_FOR_A_SIGNAL = """
import pytest, subprocess, sys, time
from pathlib import Path

@pytest.fixture
def server():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield child
    child.kill()
    child.wait()
    Path("torn-down").write_text(str(child.pid))

def test_waits(server):
    Path("started").write_text("")
    time.sleep(600)
"""


def test_sigterm_stops_the_run_as_ctrl_c_does_tearing_fixtures_down(tmp_path: Path) -> None:
    folder = inner_suite(tmp_path, {"test_wait.py": WAITS_FOR_A_SIGNAL})
    environment = {k: v for k, v in os.environ.items() if k != "CI"}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder, env=environment)
    try:
        while not (folder / "started").exists():
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED and "KeyboardInterrupt" in out, out
    assert (folder / "torn-down").read_text().isdigit()  # the fixture stopped its server


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


LEFTOVERS = str(ROOT / "scripts" / "leftovers.py")

DAEMON = """
import os, sys
read, write = os.pipe()  # closed on exec: read to its end, the daemon runs its program
if os.fork():
    os.close(write)
    os.wait()
    print(b"".join(iter(lambda: os.read(read, 100), b"")).decode(), flush=True)
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
os.write(write, str(os.getpid()).encode())
os.dup2(os.open(os.devnull, os.O_RDWR), 1)
os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"], {})
"""
"""A daemon as Redis makes itself one (forked twice, in a session of its own), without the environment it got;
the command ends once the daemon runs, printing its pid."""


def leftovers(*command: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, LEFTOVERS, *command], capture_output=True, text=True,
                          env=os.environ | env, timeout=120)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="scripts/leftovers.py reads /proc")
def test_leftovers_names_and_stops_a_daemon_the_command_left_whatever_its_environment() -> None:
    proc = leftovers(sys.executable, "-c", DAEMON, CONTEXTPIPE_TEST_LEFTOVER_WAIT="0")
    pid = int(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    assert f"  {pid}: {sys.executable} -c import time; time.sleep(600)" in proc.stderr
    assert gone(pid)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="scripts/leftovers.py reads /proc")
@pytest.mark.parametrize(("code", "status"), [("pass", 0), ("raise SystemExit(3)", 3),
                                              ("import os; os.kill(os.getpid(), 9)", 128 + 9)])
def test_leftovers_exits_as_the_command_did_when_it_left_nothing(code: str, status: int) -> None:
    proc = leftovers(sys.executable, "-c", code)
    assert (proc.returncode, proc.stderr) == (status, "")


WAITS_FOR_SIGTERM = """
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("ready", flush=True)
signal.pause()
"""


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="scripts/leftovers.py reads /proc")
def test_leftovers_passes_sigterm_on_to_the_command() -> None:
    proc = subprocess.Popen([sys.executable, LEFTOVERS, sys.executable, "-c", WAITS_FOR_SIGTERM],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 7, err
