"""The real `contextpipe` command, run in subprocesses (chat under a pseudo-terminal) against the fake server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from contextpipe.testing import FakeOpenAIServer, FakeReply

CLI = [sys.executable, "-m", "contextpipe.cli"]


def run(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})
    if check:
        assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def model_env(server: FakeOpenAIServer) -> dict[str, str]:
    return {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key", "OPENAI_MODEL": "fake-model"}


def test_two_turn_chat_persists_then_sessions_inspect_export_delete(
    fake_openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    db = tmp_path / "chat.db"
    fake_openai.enqueue(FakeReply("Hello Alice, nice to meet you.", usage=(31, 8)),
                        FakeReply("You told me your name is Alice.", usage=(52, 9)))
    child = pexpect.spawn(CLI[0], [*CLI[1:], "chat", "--session", "alice-1", "--db", str(db)],
                          env={**os.environ, **model_env(fake_openai), "COLUMNS": "200"}, encoding="utf-8",
                          timeout=30)
    try:
        child.expect("you> ")
        child.sendline("Hi, I am Alice.")
        child.expect("Hello Alice, nice to meet you.")
        child.expect("you> ")
        child.sendline("What is my name?")
        child.expect("You told me your name is Alice.")
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    # The second request carried the first turn: the session persisted between turns.
    second = fake_openai.requests[1]
    assert [m["content"] for m in second["messages"][1:]] == [
        "Hi, I am Alice.", "Hello Alice, nice to meet you.", "What is my name?"]
    assert second["stream"] is True

    listing = run("sessions", "list", "--db", str(db)).stdout
    assert "alice-1" in listing and "4" in listing

    shown = run("sessions", "show", "alice-1", "--db", str(db)).stdout
    assert "Hi, I am Alice." in shown and "You told me your name is Alice." in shown

    inspected = run("inspect", "alice-1", "--db", str(db), "--call", "2").stdout
    assert "call 2" in inspected and "model reported 52 in / 9 out" in inspected
    assert "history:history" in inspected and "input" in inspected and "tokens by source" in inspected

    exported = run("sessions", "export", "alice-1", "--db", str(db)).stdout.splitlines()
    records = [json.loads(line) for line in exported]
    assert [r["type"] for r in records] == ["session", "message", "message", "message", "message", "trace", "trace"]
    assert records[1]["message"]["parts"][0]["text"] == "Hi, I am Alice."
    assert records[-1]["usage"] == {"input_tokens": 52, "output_tokens": 9}

    run("sessions", "delete", "alice-1", "--db", str(db), "--yes")
    assert "alice-1" not in run("sessions", "list", "--db", str(db)).stdout
    gone = run("inspect", "alice-1", "--db", str(db), check=False)
    assert gone.returncode == 1 and "no session 'alice-1'" in gone.stderr


def test_chat_without_a_model_says_how_to_configure_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    proc = subprocess.run([*CLI, "chat", "--db", str(tmp_path / "x.db")], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "OPENAI_API_KEY" in proc.stderr and "--base-url" in proc.stderr and "--demo-model" in proc.stderr


def test_chat_with_the_demo_model(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "chat", "--demo-model", "--db", str(tmp_path / "d.db"), "--session", "d"],
                          input="hello there\nsecond line\n", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "You said 'hello there'" in proc.stdout and "I can see 2 earlier message(s)" in proc.stdout


def test_errors_are_clear(tmp_path: Path) -> None:
    missing = run("sessions", "list", "--db", str(tmp_path / "none.db"), check=False)
    assert missing.returncode == 1 and "no session database" in missing.stderr
    assert run("--version").stdout.startswith("contextpipe ")


@pytest.mark.parametrize("command", [["demo"]])
def test_demo_runs_offline(command: list[str]) -> None:
    output = run(*command).stdout
    assert "step 3 stored" in output
    assert "killed the worker (exit -9)" in output and "repair stored" in output
    assert "token_budget: dropped" in output and "tokens by source" in output


def test_demo_runs_again_on_the_same_file_beside_the_first_run(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    first = run("demo", "--db", str(db)).stdout
    exported = {name: run("sessions", "export", name, "--db", str(db)).stdout
                for name in ("demo-weather", "demo-crash", "alice-friday")}
    again = run("demo", "--db", str(db))
    assert "Traceback" not in again.stderr
    assert "It holds 1 earlier run(s) of this demo, kept as they are; this run's sessions end in -2" in again.stdout
    # The same story, from fresh sessions: the memory recalled is this run's, the crash log holds one run.
    assert "session alice-monday-2] user: Please remember that I only eat vegetarian food." in again.stdout
    for line in ("the log holds 4 messages", "token_budget: dropped 12 of the oldest messages",
                 "answer: How about a vegetarian mapo tofu tonight?"):
        assert line in first and line in again.stdout, line
    # The first run's sessions are as it left them.
    assert {name: run("sessions", "export", name, "--db", str(db)).stdout for name in exported} == exported
    listing = json.loads(run("sessions", "list", "--db", str(db), "--json").stdout)
    listed = {s["session_id"] for s in listing["sessions"]}
    assert {"demo-weather", "demo-weather-2", "alice-friday", "alice-friday-2", "demo-claude-2"} <= listed


def test_index_with_progress_then_chat_with_memory_and_search(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tea.md").write_text("# Tea\nGreen tea is brewed at 80 degrees for two minutes.")
    (docs / "coffee.txt").write_text("Espresso is brewed at 93 degrees under pressure.")
    db = tmp_path / "k.db"
    indexed = run("index", str(docs), "--db", str(db))
    assert "indexed 2 chunk(s)" in indexed.stdout
    first = subprocess.run([*CLI, "chat", "--demo-model", "--memory", "--search", "--db", str(db), "--session", "a",
                            "--user", "ann"], input="I love green tea in the morning.\n", capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([*CLI, "chat", "--demo-model", "--memory", "--db", str(db), "--session", "b",
                             "--user", "ann"], input="green tea\n", capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    # A new session, yet the model sees a message beyond the input: the recalled memory.
    assert "I can see 1 earlier message(s)" in second.stdout
