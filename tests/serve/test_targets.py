"""``contextpipe serve TARGET`` with a target it cannot serve: one line naming the target, never a traceback.

Each case runs the real command in a subprocess; it fails before any server starts, so it exits at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = {
    "raises.py": "raise RuntimeError('no database configured')\n",
    "needs_dep.py": "import no_such_dependency\nagent = None\n",
    "broken.py": "def agent(:\n",
    "factories.py": (
        "from contextpipe import Agent\nfrom contextpipe.testing import ScriptedModel\n\n"
        "agent = Agent(ScriptedModel([]))\n\n\n"
        "def needs(model):\n    return agent\n\n\n"
        "async def later():\n    return agent\n\n\n"
        "def fails():\n    raise ValueError('bad settings')\n\n\n"
        "def invalid():\n    raise ValueError('2 errors in the settings:\\n  model: missing\\n  store: missing')\n\n\n"
        "def later_too():\n    return later()\n\n\n"
        "def number():\n    return 42\n\n\n"
        "class Builder:\n    pass\n\n\n"
        "class Holder:\n    agent = agent\n"
    ),
}

CASES = [  # target, what the one line must say (besides the target)
    ("json:dumps", "a function that needs arguments (obj)"),
    ("json:JSONDecoder", "it is the class JSONDecoder, not an instance"),
    ("os:abort", "it is of type builtin_function_or_method"),  # a builtin is never called (this one would abort)
    ("os.path:sep", "it is of type str"),
    ("json:nothing", "module 'json' has no attribute 'nothing'"),
    ("os:path.nothing", "module 'os' has no attribute 'path.nothing'"),
    ("factories:nothing", "has no attribute 'nothing' (its Agents: agent)"),
    ("no_such_module:agent", "cannot import 'no_such_module'"),
    ("raises:agent", "importing 'raises' failed: RuntimeError: no database configured (at "),
    ("raises.py:agent", "importing 'raises.py' failed: RuntimeError: no database configured"),
    ("needs_dep:agent", "ModuleNotFoundError: No module named 'no_such_dependency'"),
    ("broken:agent", "importing 'broken' failed: SyntaxError"),
    ("missing.py:agent", "no such file: missing.py"),
    ("factories:needs", "a function that needs arguments (model)"),
    ("factories:later", "it is an async function"),
    ("factories:fails", "calling it failed: ValueError: bad settings"),
    ("factories:invalid", "calling it failed: ValueError: 2 errors in the settings: (at "),  # its first line
    ("factories:later_too", "it returned a coroutine"),  # and no warning that it was never awaited
    ("factories:Agent", "it is a class that needs arguments (model)"),
    ("factories:number", "calling it returned an object of type int"),
    ("factories:Builder", "it is the class Builder"),
    ("json", "serve expects MODULE:ATTRIBUTE"),
    ("json:", "serve expects MODULE:ATTRIBUTE"),
    (":agent", "serve expects MODULE:ATTRIBUTE"),
    ("", "serve expects MODULE:ATTRIBUTE"),
    ("examples/weather:agent", "neither a module name (like examples.weather) nor a path to a .py file"),
    (".weather:agent", "neither a module name (like examples.weather) nor a path to a .py file"),
    ("examples..weather:agent", "neither a module name (like examples.weather) nor a path to a .py file"),
]

OK = """

import functools


def make():
    return agent


@functools.cache
def cached():
    return agent


class Factory:
    def __call__(self):
        return agent


factory = Factory()


class MyAgent(Agent):
    def __init__(self):
        super().__init__(ScriptedModel([]))
"""
"""Factories serve calls: a function, a cached one, a callable object and a subclass of Agent."""

RAISED_BY_USER_CODE = ("raises", "needs_dep", "broken", "factories:fails", "factories:invalid")


ENV = {**os.environ, "CONTEXTPIPE_API_KEYS": "", "COLUMNS": "80"}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "contextpipe.cli", "serve", *args, *([] if "--port" in args else ["--port", "0"])]


def serve(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(*args), capture_output=True, text=True, cwd=folder, env=ENV, timeout=60,
                          check=False)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name, source in MODULES.items():
        (tmp_path / name).write_text(source, encoding="utf-8")
    return tmp_path


def check(target: str, needle: str, stdout: str, stderr: str, returncode: int) -> None:
    assert returncode == 1, (target, stderr)
    assert "Traceback" not in stderr and stdout == "", (target, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1, (target, stderr)  # not wrapped at 80 columns either
    assert lines[0].startswith(f"error: cannot serve {target!r}: "), (target, stderr)
    assert needle in lines[0], (target, needle, stderr)
    if target.startswith(RAISED_BY_USER_CODE):
        assert lines[0].endswith("run again with --traceback to see the full traceback"), stderr


def test_every_bad_target_is_one_line_naming_it(folder: Path) -> None:
    started = {target: subprocess.Popen(command(target), cwd=folder, env=ENV, text=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE) for target, _ in CASES}  # at once: each fails fast
    try:
        for target, needle in CASES:
            check(target, needle, *started[target].communicate(timeout=60), started[target].returncode)
    finally:
        for process in started.values():
            if process.poll() is None:  # a check failed before its turn came
                process.kill()
                process.communicate()


def test_the_traceback_switch_shows_where_the_users_code_raised(folder: Path) -> None:
    done = serve(folder, "raises:agent", "--traceback")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert f"{folder / 'raises.py'}\", line 1, in <module>" in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: cannot serve 'raises:agent'") and "--traceback" not in last


def test_factories_dotted_attributes_and_the_target_checked_before_the_port(folder: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert "cannot serve 'json:dumps'" in serve(folder, "json:dumps", "--port", port).stderr
        assert "cannot listen on" in serve(folder, "factories:agent", "--port", port).stderr
    (folder / "ok.py").write_text(MODULES["factories.py"] + OK, encoding="utf-8")
    (folder / "my-app.py").write_text(MODULES["factories.py"], encoding="utf-8")  # importable, if not by `import`
    for target in ("ok:make", "ok:Holder.agent", "ok:cached", "ok:factory", "ok:MyAgent", "my-app:agent"):
        done = serve(folder, target, "--workers", "2")  # and the agent's store is checked
        assert done.returncode == 1 and "--workers needs a store the workers share" in done.stderr, target
