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
- ``<!-- docs-test: peer=NAME -->`` before a Python block: the block is another framework's code
  (``NAME`` is one of `PEERS`, such as ``openai-agents``) and runs with the interpreter of a
  virtualenv holding the pinned `PEER_REQUIREMENTS`, built once under ``.venv-peers/`` (about 40 s
  and 140 MB the first time; rebuilt when the pins change; a second test process waits for the
  first's build) and never skipped. It gets the same fakes, and ``OPENAI_AGENTS_DISABLE_TRACING=1``
  so the Agents SDK sends no traces to OpenAI.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
SIDE_EFFECTS = {"install_completion", "show_completion"}
"""Root options whose callbacks act on the machine when parsed (typer's shell completion): parsed, never run."""
PEER_REQUIREMENTS = ("openai-agents==0.24.0", "agent-framework-core==1.23.0", "agent-framework-openai==1.17.0")
"""What the peer frameworks' blocks run on (the versions bench/peers/setup.sh pins)."""
PEERS = {"openai-agents", "agent-framework"}
"""The names a ``peer=`` marker may give: the OpenAI Agents SDK and Microsoft Agent Framework."""
PEER_VENV = ROOT / ".venv-peers"
PEER_LOCK = ROOT / ".venv-peers.lock"
"""Held while the peer virtualenv is checked or built, so a second test process waits for the first's build."""
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


@pytest.fixture(scope="session")
def peer_python() -> Path:
    """The interpreter of the virtualenv the peer blocks run in (made on first use, kept while its pins hold)."""
    python, stamp = PEER_VENV / "bin" / "python", PEER_VENV / "docs-test-requirements.txt"
    wanted = "\n".join(PEER_REQUIREMENTS) + "\n"
    with PEER_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when a build fails
        if python.exists() and stamp.exists() and stamp.read_text(encoding="utf-8") == wanted:
            return python
        for command in ([sys.executable, "-m", "venv", "--clear", str(PEER_VENV)],
                        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                         *PEER_REQUIREMENTS]):
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            assert done.returncode == 0, f"cannot build {PEER_VENV} for the peer examples: {shlex.join(command)}\n" \
                                         f"{done.stdout}{done.stderr}"
        stamp.write_text(wanted, encoding="utf-8")
    return python


def _interpreter(block: Block, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """The interpreter that runs `block` and what it adds to the environment (a peer's, for a ``peer=`` block)."""
    if not block.marker.startswith("peer="):
        return sys.executable, {}
    peer = block.marker.removeprefix("peer=").strip()
    assert peer in PEERS, f"{block.id}: unknown peer {peer!r}; known: {', '.join(sorted(PEERS))}"
    return str(request.getfixturevalue("peer_python")), {"OPENAI_AGENTS_DISABLE_TRACING": "1"}


def _run(block: Block, python: str, extra: dict[str, str], fakes: dict[str, str],
         folder: Path) -> subprocess.CompletedProcess[str]:
    """Run `block` as a script in `folder` (with the page's ``file=`` blocks above it written there)."""
    for name, text in _files_before(block).items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    script = folder / "docs_example.py"
    script.write_text(block.code, encoding="utf-8")
    env = {**os.environ, **fakes, **extra, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder),
                                                                                      os.environ.get("PYTHONPATH")]))}
    return subprocess.run([python, script.name], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT, check=False)


def _shares_a_server(block: Block) -> bool:
    """Whether `block` uses the test's database servers (such blocks run one at a time, in page order)."""
    return "DATABASE_URL" in block.code or "REDIS_URL" in block.code


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, fakes: dict[str, str],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Block, Future[subprocess.CompletedProcess[str]]]]:
    """Every selected Python block, started at once on as many workers as the machine has cores.

    Each block has its own folder and the fakes are stateless, so blocks cannot see each other; the
    few that use the database servers run in one lane, one after another. Each test then waits for
    its own block: the run is the same as running the blocks one by one, only sooner.
    """
    selected = [item.callspec.params["block"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_python_block_runs" and hasattr(item, "callspec")]
    interpreters = {block: _interpreter(block, request) for block in selected}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool, ThreadPoolExecutor(max_workers=1) as lane:
        started = {block: (lane if _shares_a_server(block) else pool).submit(
            _run, block, *interpreters[block], fakes, tmp_path_factory.mktemp("docs-example"))
            for block in selected}
        yield started
        for future in started.values():
            future.cancel()


@pytest.mark.parametrize("block", SCRIPTS, ids=[b.id for b in SCRIPTS])
def test_python_block_runs(block: Block, runs: dict[Block, Future[subprocess.CompletedProcess[str]]]) -> None:
    done = runs[block].result()
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

    command = typer.main.get_command(app)  # a new command tree each call: changing it here changes nothing else
    for param in command.params:
        if param.name in SIDE_EFFECTS:
            param.callback = None  # parse the flag, do not install or print shell completion
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


def test_peer_markers_name_known_peers_on_python_blocks() -> None:
    marked = [b for b in ALL if b.marker.startswith("peer=")]
    for block in marked:
        assert block.lang in PYTHON, f"{block.id}: a peer= marker belongs before a python block"
        assert block.marker.removeprefix("peer=").strip() in PEERS, f"{block.id}: unknown peer in {block.marker!r}"


def test_a_bad_command_fails_to_parse() -> None:
    with pytest.raises(click_errors.UsageError):
        parse_command(["chat", "--no-such-flag"])
    with pytest.raises((click_errors.UsageError, AssertionError)):
        parse_command(["no-such-command"])
    parse_command(["sessions", "list", "--help"])


def test_parsing_a_command_changes_nothing_on_the_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SHELL", "/bin/bash")
    parse_command(["--install-completion"])
    assert list(tmp_path.iterdir()) == [], "parsing --install-completion installed shell completion"
