"""Every code block of README.md and docs/ runs as written, offline.

- A ``python`` block is a whole script: it runs in a new interpreter, in a folder of its own, with
  an environment that points the model clients at local fakes (``OPENAI_BASE_URL`` /
  ``OPENAI_API_KEY`` at a `FakeOpenAIServer`, ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` at a
  `FakeAnthropicServer`; both answer "ok") and ``DATABASE_URL`` / ``REDIS_URL`` at the test servers.
  It must exit 0. A block that cannot run is a failure, never a skip.
- A shell block (``bash``, ``sh``, ``console``): every ``contextpipe ...`` command in it must parse
  with the real command line (its subcommands, flags and arguments exist). They are not run: some
  serve until stopped.
- Other fences (``text``, ``json``, ``yaml``, ``toml``, ``pycon`` ...) are not code.

Markers, as an HTML comment on the line before a fence:

- ``<!-- docs-test: file=PATH -->``: the block is a file that later blocks of the same page use
  (a module, a ``SKILL.md``); it is written to PATH in each later block's folder, not run.
- ``<!-- docs-test: output -->`` before a ``text`` fence that follows a Python block: that block's
  standard output must be exactly this text.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main

try:  # typer >= 0.29 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]

from contextpipe.testing import FakeAnthropicServer, FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<what>[^>]*?)\s*-->")
BLOCK_TIMEOUT = 300
"""Seconds a block may take before it counts as hung (a guard against a stuck example, not a timing check)."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    code: str
    marker: str
    """What the ``docs-test`` comment before it says ("" when there is none)."""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, in order (nested fences inside a longer fence stay its text)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        ticks, indent = opening["ticks"], opening["indent"]
        lang = (opening["info"].strip().split() or [""])[0].strip("{}.").lower()
        before = lines[i - 1] if i > 0 else ""
        mark = MARKER.search(before)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(ticks[0] * len(ticks))
                                      and lines[j].strip().strip(ticks[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: a code fence is never closed")
        found.append(Block(page, i + 1, lang, "\n".join(body) + "\n", mark["what"] if mark else ""))
        i = j + 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]
SCRIPTS = [b for b in ALL if b.lang in PYTHON and not b.marker.startswith("file=")]
COMMANDS = [b for b in ALL if b.lang in SHELL]


def _files_before(block: Block) -> dict[str, str]:
    """The ``file=`` blocks of `block`'s page above it, by path."""
    return {b.marker.removeprefix("file=").strip(): b.code for b in ALL
            if b.page == block.page and b.line < block.line and b.marker.startswith("file=")}


def _expected_output(block: Block) -> str | None:
    """The ``output`` block right after `block` on its page, if there is one."""
    later = [b for b in ALL if b.page == block.page and b.line > block.line]
    if later and later[0].marker == "output":
        return later[0].code
    return None


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, str]]:
    """The environment a Python block runs with: the vendor fakes, the test stores' servers."""
    with FakeOpenAIServer() as openai, FakeAnthropicServer() as anthropic:
        env = {
            "OPENAI_BASE_URL": openai.base_url, "OPENAI_API_KEY": "sk-docs-example",
            "ANTHROPIC_BASE_URL": anthropic.base_url, "ANTHROPIC_API_KEY": "sk-ant-docs-example",
        }
        dsn = os.environ.get("CONTEXTPIPE_TEST_PGVECTOR_DSN") or os.environ.get("CONTEXTPIPE_TEST_POSTGRES_DSN")
        if dsn:
            env["DATABASE_URL"] = dsn
        if os.environ.get("CONTEXTPIPE_TEST_REDIS_URL"):
            env["REDIS_URL"] = os.environ["CONTEXTPIPE_TEST_REDIS_URL"]
        yield env


@pytest.mark.parametrize("block", SCRIPTS, ids=[b.id for b in SCRIPTS])
def test_python_block_runs(block: Block, fakes: dict[str, str], tmp_path: Path) -> None:
    for name, text in _files_before(block).items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    script = tmp_path / "docs_example.py"
    script.write_text(block.code, encoding="utf-8")
    env = {**os.environ, **fakes, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                                            os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT, check=False)
    assert done.returncode == 0, (
        f"{block.id}: the example exits {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    expected = _expected_output(block)
    if expected is not None:
        assert done.stdout == expected, f"{block.id}: the example prints something else than the page shows"


def _commands(code: str) -> Iterator[list[str]]:
    """The ``contextpipe`` command lines of a shell block, as argument lists (after the program name)."""
    joined = re.sub(r"\\\n", " ", code)
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
            words = shlex.split(part, comments=True)
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                words = words[1:]  # VAR=value before the command
            if words and Path(words[0]).name == "contextpipe":
                yield words[1:]
            elif words[:3] == [Path(sys.executable).name, "-m", "contextpipe"] or words[1:3] == ["-m", "contextpipe"]:
                yield words[3:]


def parse_command(args: list[str]) -> None:
    """Parse a ``contextpipe`` command line as the real command would, without running it."""
    from contextpipe.cli import app

    command = typer.main.get_command(app)
    name = "contextpipe"
    parent = None
    while True:
        try:
            ctx = command.make_context(name, list(args), parent=parent)
        except typer.Exit:
            return  # --help, --version
        if not hasattr(command, "resolve_command"):  # a command, not a group
            return
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args  # click < 8.2
        rest = [*protected, *ctx.args]
        if not rest:
            return
        found, command, args = command.resolve_command(ctx, rest)
        assert command is not None, f"no command {found!r}"
        name, parent = found or "", ctx


@pytest.mark.parametrize("block", COMMANDS, ids=[b.id for b in COMMANDS])
def test_shell_block_commands_parse(block: Block) -> None:
    for args in _commands(block.code):
        try:
            parse_command(args)
        except click_errors.UsageError as exc:
            pytest.fail(f"{block.id}: `contextpipe {shlex.join(args)}` does not parse: {exc.format_message()}")


def test_the_collector_finds_the_readme_example() -> None:
    readme = [b for b in SCRIPTS if b.page.name == "README.md"]
    assert readme, "README.md has no Python example (the README must show one complete example that runs)"


def test_a_bad_command_fails_to_parse() -> None:
    with pytest.raises(click_errors.UsageError):
        parse_command(["chat", "--no-such-flag"])
    with pytest.raises((click_errors.UsageError, AssertionError)):
        parse_command(["no-such-command"])
    parse_command(["sessions", "list", "--help"])
