"""`contextpipe chat --provider ...` with each model API, in a pseudo-terminal against the fake servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from contextpipe.testing import AnthropicReply, FakeAnthropicServer, FakeOpenAIServer, FakeReply

CLI = [sys.executable, "-m", "contextpipe.cli"]
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_"))}


def chat(db: Path, env: dict[str, str], *args: str, turns: list[tuple[str, str]]) -> None:
    child = pexpect.spawn(CLI[0], [*CLI[1:], "chat", "--session", "s1", "--db", str(db), *args],
                          env={**CLEAN, **env, "COLUMNS": "200"}, encoding="utf-8", timeout=30)
    try:
        for said, answer in turns:
            child.expect("you> ")
            child.sendline(said)
            child.expect(answer)
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


def test_chat_with_claude_from_anthropic_environment_and_inspect_shows_cache(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    with FakeAnthropicServer() as fake:
        fake.enqueue(AnthropicReply("Hello Alice."), AnthropicReply("Your name is Alice."))
        env = {"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "k", "ANTHROPIC_MODEL": "claude-fake"}
        chat(db, env, "--provider", "anthropic", turns=[("Hi, I am Alice.", "Hello Alice."),
                                                        ("What is my name?", "Your name is Alice.")])
        second = fake.requests[1]
    assert second["model"] == "claude-fake" and second["stream"] is True
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    inspected = subprocess.run([*CLI, "inspect", "s1", "--db", str(db), "--call", "2"], capture_output=True,
                               text=True, env={**CLEAN, "COLUMNS": "200"}, check=True).stdout
    assert "to claude-fake" in inspected
    assert "read /" in inspected and "written)" in inspected


def test_chat_over_the_responses_api(tmp_path: Path) -> None:
    with FakeOpenAIServer() as fake:
        fake.enqueue(FakeReply("Hi there.", reasoning="greet"))
        env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "OPENAI_MODEL": "gpt-fake"}
        chat(tmp_path / "c.db", env, "--provider", "openai-responses", turns=[("Hello", "Hi there.")])
        assert fake.requests[0]["store"] is False and fake.requests[0]["input"][0]["role"] == "user"


@pytest.mark.parametrize(("args", "message"), [(["--provider", "gemini"], "unknown --provider 'gemini'"),
                                               (["--provider", "anthropic"], "ANTHROPIC_API_KEY")])
def test_bad_provider_or_missing_claude_configuration(args: list[str], message: str, tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "chat", "--db", str(tmp_path / "x.db"), *args], capture_output=True, text=True,
                          env={**CLEAN, "COLUMNS": "200"}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert message in proc.stderr
