"""The root conftest's guards: vendor variables are cleared, and only loopback connections are allowed."""

from __future__ import annotations

import ast
import asyncio
import os
import socket
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
