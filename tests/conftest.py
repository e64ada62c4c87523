"""Guards for the whole suite: no vendor credentials from the environment, no connection off this machine."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
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


def pytest_configure(config: pytest.Config) -> None:
    """Refuse non-loopback connections and drop vendor credentials for the whole session (collection included)."""
    for name in list(os.environ):  # modules build clients while they are collected, before any fixture runs
        if name.startswith(VENDOR_PREFIXES) or name in VENDOR_NAMES:
            del os.environ[name]
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _real_connect_ex  # type: ignore[method-assign]


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server
