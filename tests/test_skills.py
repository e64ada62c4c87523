"""Skills: Agent Skills folders and skills in code, spec validation, real-world material, and race safety."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import Agent, UsageError
from contextpipe.messages import DataPart
from contextpipe.models import ModelRequest
from contextpipe.providers.skills import ScriptRequest, Skill, SkillError, Skills, name_problem
from contextpipe.testing import ScriptedModel, tool_call

FIXTURES = Path(__file__).parent / "fixtures" / "skills"


def write_skill(root: Path, folder: str, front: str, body: str = "Body.", files: dict[str, str] | None = None) -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "SKILL.md").write_text(f"---\n{front}\n---\n{body}\n", encoding="utf-8")
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    write_skill(root, "weather-advice", "name: weather-advice\ndescription: Turn a forecast into clothing advice.",
                "# Weather advice\nAbove 24 C suggest light clothes. See references/table.md.",
                {"references/table.md": "| temp | clothes |\n| 25 | T-shirt |", "scripts/feels.py":
                 "import sys\nprint('feels like', int(sys.argv[1]) - 2)\n"})
    write_skill(root, "haiku", "name: haiku\ndescription: Write haiku.\nlicense: MIT", "Use 5-7-5 syllables.")
    (tmp_path / "secret.txt").write_text("TOP SECRET", encoding="utf-8")
    os.symlink(tmp_path / "secret.txt", root / "weather-advice" / "link-out.txt")
    (root / "weather-advice" / "big.txt").write_text("x" * 5000, encoding="utf-8")
    return root


async def invoke(skills: Skills, tool_name: str, **arguments: Any) -> Any:
    catalog = {s.name: s for s in skills.catalog()}
    tools = {t.name: t for t in [skills._load_tool(catalog), skills._resource_tool(catalog)]}
    if skills.allow_scripts:
        tools["run_skill_script"] = skills._script_tool(catalog)
    return await tools[tool_name].invoke(json.dumps(arguments))


async def test_end_to_end_model_lists_loads_reads_and_answers(skills_dir: Path) -> None:
    def answer(request: ModelRequest) -> str:
        body = request.messages[-3].function_results[0].result
        table = request.messages[-1].function_results[0].result
        assert "Above 24 C" in body and "T-shirt" in table
        return "Wear a T-shirt (per the weather-advice skill)."

    model = ScriptedModel([tool_call("load_skill", name="weather-advice"),
                           tool_call("read_skill_resource", skill="weather-advice", path="references/table.md"),
                           answer])
    agent = Agent(model, instructions="Be helpful.", providers=[Skills(skills_dir)])
    result = await agent.run("25 C today, what should I wear?")
    assert result.text == "Wear a T-shirt (per the weather-advice skill)."
    instructions = model.requests[0].instructions or ""
    assert "- weather-advice: Turn a forecast into clothing advice." in instructions
    assert "- haiku: Write haiku." in instructions
    assert [t.name for t in model.requests[0].tools] == ["load_skill", "read_skill_resource"]
    loaded = model.requests[1].messages[-1].function_results[0].result
    assert "- references/table.md (text, 35 B)" in loaded and "- big.txt (text, 5.0 KB)" in loaded
    assert "link-out.txt" not in loaded
    sources = result.traces[0]
    assert {t.source_id for t in sources.tools} == {"skills"}


# --- the real-world collection (tests/fixtures/skills) -------------------------------------------------

LOADED = {"bom-skill", "canvas-design", "claude-api", "list-metadata", "long-compat", "nested-metadata",
          "release-notes", "tools-number"}
SKIPPED = {
    "Upper-Case": "may only use lowercase letters",
    "a--b": "must not contain consecutive hyphens",
    "broken-yaml": ("the YAML front matter is invalid: while parsing a flow sequence at line 3, column 14: "
                    "expected ',' or ']', but got '<stream end>'"),
    "latin1": "not UTF-8 text",
    "no-description": "front matter needs 'description' as non-empty text",
    "pdf-tools": "must be the name of the skill's folder ('pdf-tools')",
    "plain-markdown": "missing YAML front matter",
    "x" * 65: "must be 1-64 characters",
}
TRIMMED = {
    "claude-api": "the description is 1068 characters, over the 1024 allowed; it was cut to 1024",
    "long-compat": "'compatibility' is 8",
    "list-metadata": "'metadata' must be a map of strings to strings, not a list",
    "nested-metadata": "'metadata.owners' must be a string, not a dict",
    "tools-number": "'allowed-tools' must be a space-separated string of tool names, not a int",
}


@pytest.fixture
def collection(tmp_path: Path) -> Path:
    root = tmp_path / "collection"
    shutil.copytree(FIXTURES, root, symlinks=True)
    return root


def test_every_skill_of_the_collection_is_loaded_or_reported(collection: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="contextpipe.skills"):
        skills = Skills(collection)
    loaded = {s.name: s for s in skills.catalog()}
    assert set(loaded) == LOADED
    problems = {p.path.parent.name: p for p in skills.problems}
    folders = {p.name for p in collection.iterdir() if (p / "SKILL.md").exists()}
    assert folders == set(loaded) | {name for name, p in problems.items() if p.skipped}  # nothing silently lost
    for folder, fragment in SKIPPED.items():
        assert problems[folder].skipped and fragment in problems[folder].message, problems[folder]
    for folder, fragment in TRIMMED.items():
        assert not problems[folder].skipped and fragment in problems[folder].message, problems[folder]
    assert len(skills.problems) == len(SKIPPED) + len(TRIMMED)
    assert "templates" not in problems  # a folder without SKILL.md is not a skill
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == len(skills.problems) and any("a--b" in m and "skill skipped" in m for m in logged)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="contextpipe.skills"):
        skills.catalog()
    assert caplog.records == []  # each problem is logged once, not at every run

    claude = loaded["claude-api"]
    assert 1000 <= len(claude.description) <= 1024 and claude.description.endswith("…")
    assert claude.license == "Complete terms in LICENSE.txt"
    assert 450 <= len(loaded["long-compat"].compatibility or "") <= 500
    notes = loaded["release-notes"]
    assert notes.metadata == {"author": "docs-team", "version": "1.2", "internal": "true"}
    assert notes.allowed_tools == ("Bash(git:*)", "Read")
    assert notes.license == "Apache-2.0" and notes.compatibility and notes.compatibility.startswith("Needs git")
    assert loaded["list-metadata"].metadata == {} and loaded["nested-metadata"].metadata == {"author": "me"}
    bom = loaded["bom-skill"]
    assert bom.description == "Written on Windows, saved with a BOM." and bom.body.startswith("# Notes")


async def test_binary_resources_are_listed_as_what_they_are(collection: Path) -> None:
    skills = Skills(collection)
    listing = (await invoke(skills, "load_skill", name="canvas-design")).result
    assert "- canvas-fonts/WorkSans-Regular.ttf (font/ttf, 588 B; binary, not readable as text)" in listing
    assert "- assets/sample.pdf (application/pdf, 148 B; read_skill_resource attaches it)" in listing
    assert "- assets/palettes.json.gz (application/gzip, " in listing
    assert "- assets/notes.md (text, 23 B)" in listing and "- canvas-fonts/OFL.txt (text, " in listing
    pdf = await invoke(skills, "read_skill_resource", skill="canvas-design", path="assets/sample.pdf")
    data = (collection / "canvas-design" / "assets" / "sample.pdf").read_bytes()
    assert not pdf.is_error and pdf.parts == (DataPart(data, "application/pdf"),)
    assert pdf.result == "[file 'assets/sample.pdf': application/pdf, 148 bytes, attached]"
    font = await invoke(skills, "read_skill_resource", skill="canvas-design", path="canvas-fonts/WorkSans-Regular.ttf")
    assert font.is_error and "binary file (font/ttf, 588 B), not text nor an image or a PDF" in font.result
    small = Skills(collection, max_media_bytes=100)
    assert "- assets/sample.pdf (application/pdf, 148 B; over the 100 B limit for files)" in (
        await invoke(small, "load_skill", name="canvas-design")).result
    too_big = await invoke(small, "read_skill_resource", skill="canvas-design", path="assets/sample.pdf")
    assert too_big.is_error and too_big.parts == () and "over the 100 B limit" in too_big.result
    notes = await invoke(skills, "read_skill_resource", skill="canvas-design", path="assets/notes.md")
    assert notes.result == "Keep margins generous.\n"


async def test_a_file_named_like_an_image_that_is_not_one_is_not_offered_as_an_attachment(collection: Path) -> None:
    (collection / "canvas-design" / "assets" / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))  # no IHDR
    skills = Skills(collection)
    listing = (await invoke(skills, "load_skill", name="canvas-design")).result
    assert "- assets/photo.png (image/png, 48 B; binary, not readable as text)" in listing
    read = await invoke(skills, "read_skill_resource", skill="canvas-design", path="assets/photo.png")
    assert read.is_error and read.parts == () and "binary file (image/png, 48 B)" in read.result


async def test_nested_resources_are_listed_and_read(collection: Path) -> None:
    skills = Skills(collection)
    listing = (await invoke(skills, "load_skill", name="claude-api")).result
    for path in ("python/claude-api/README.md", "python/claude-api/streaming.md", "typescript/claude-api/README.md",
                 "shared/tool-use-concepts.md", "LICENSE.txt"):
        assert f"- {path} (text, " in listing
    read = await invoke(skills, "read_skill_resource", skill="claude-api", path="python/claude-api/streaming.md")
    assert read.result == "# Streaming\n\nUse `client.messages.stream(...)`.\n"
    read = await invoke(skills, "read_skill_resource", skill="claude-api", path="./shared/tool-use-concepts.md")
    assert read.result.startswith("# Tool use")


async def test_a_broken_skill_does_not_stop_the_agent(collection: Path) -> None:
    model = ScriptedModel([tool_call("load_skill", name="claude-api"), "Use anthropic.Anthropic()."])
    result = await Agent(model, providers=[Skills(collection)]).run("How do I call Claude from Python?")
    assert result.text == "Use anthropic.Anthropic()."
    instructions = model.requests[0].instructions or ""
    assert "- claude-api: Build apps with the Claude API" in instructions and "a--b" not in instructions


def test_symlinked_skill_folder_and_skill_md_are_not_followed_unless_allowed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    write_skill(elsewhere, "linked", "name: linked\ndescription: Lives elsewhere.")
    write_skill(elsewhere, "target", "name: md-link\ndescription: SKILL.md points outside.")
    root = tmp_path / "skills"
    root.mkdir()
    os.symlink(elsewhere / "linked", root / "linked")
    (root / "md-link").mkdir()
    os.symlink(elsewhere / "target" / "SKILL.md", root / "md-link" / "SKILL.md")
    strict = Skills(root)
    assert strict.catalog() == []
    messages = sorted(str(p) for p in strict.problems)
    assert len(messages) == 2 and all("symbolic link" in m and "follow_symlinks=True" in m for m in messages)
    relaxed = Skills(root, follow_symlinks=True)
    assert sorted(s.name for s in relaxed.catalog()) == ["linked", "md-link"] and relaxed.problems == []


def test_skill_md_size_limit(tmp_path: Path) -> None:
    write_skill(tmp_path, "huge", "name: huge\ndescription: Very long.", "x" * 200_000)
    write_skill(tmp_path, "small", "name: small\ndescription: Fine.")
    skills = Skills(tmp_path, max_skill_bytes=100_000)
    assert [s.name for s in skills.catalog()] == ["small"]
    [problem] = skills.problems
    assert problem.skipped and "over the 100.0 KB limit (max_skill_bytes)" in problem.message


# --- paths and limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    "../haiku/SKILL.md", "../../secret.txt", "references/../../haiku/SKILL.md", "/etc/passwd", "~/secret",
    "link-out.txt", "references\\..\\..\\secret.txt", "refer\x00ences/table.md", "references/\u202etable.md",
    "", "a" * 600, ".",
])
async def test_unsafe_resource_paths_are_refused(skills_dir: Path, path: str) -> None:
    outcome = await invoke(Skills(skills_dir), "read_skill_resource", skill="weather-advice", path=path)
    assert outcome.is_error
    assert "TOP SECRET" not in outcome.result and "Write haiku" not in outcome.result


async def test_odd_but_harmless_paths_just_miss(skills_dir: Path) -> None:
    for path in ("%2e%2e/%2e%2e/secret.txt", "\uff0e\uff0e/secret.txt", "references/missing.md", "references"):
        outcome = await invoke(Skills(skills_dir), "read_skill_resource", skill="weather-advice", path=path)
        assert outcome.is_error and "has no file" in outcome.result


async def test_size_limits_and_unknown_skills(skills_dir: Path) -> None:
    small = Skills(skills_dir, max_resource_bytes=1000)
    outcome = await invoke(small, "read_skill_resource", skill="weather-advice", path="big.txt")
    assert outcome.is_error and "5,000 bytes, over the 1,000-byte limit" in outcome.result
    listing = (await invoke(small, "load_skill", name="weather-advice")).result
    assert "- big.txt (text, 5.0 KB; over the 1.0 KB read limit)" in listing
    outcome = await invoke(small, "load_skill", name="nope")
    assert outcome.is_error and "Available: haiku, weather-advice" in outcome.result


def test_skill_names_follow_the_specification(tmp_path: Path) -> None:
    for name in ("a", "pdf-processing", "data2", "x" * 64, "über-tool"):
        write_skill(tmp_path, name, f"name: {name}\ndescription: ok")
    for name in ("-lead", "trail-", "a--b", "Caps", "under_score", "x" * 65):
        write_skill(tmp_path, name, f"name: {name}\ndescription: bad")
    skills = Skills(tmp_path)
    assert sorted(s.name for s in skills.catalog()) == sorted(["a", "pdf-processing", "data2", "x" * 64, "über-tool"])
    assert len(skills.problems) == 6 and all(p.skipped for p in skills.problems)


def test_duplicate_names_across_folders_keep_the_first(tmp_path: Path) -> None:
    write_skill(tmp_path / "one", "same", "name: same\ndescription: first")
    write_skill(tmp_path / "two", "same", "name: same\ndescription: second")
    skills = Skills(tmp_path / "one", tmp_path / "two")
    assert [s.description for s in skills.catalog()] == ["first"]
    [problem] = skills.problems
    assert problem.skipped and "'same' is already used by" in problem.message
    with pytest.raises(SkillError, match="does not exist"):
        Skills(tmp_path / "missing")


async def test_changes_on_disk_are_picked_up_without_restart(skills_dir: Path) -> None:
    skills = Skills(skills_dir)
    assert sorted(s.name for s in skills.catalog()) == ["haiku", "weather-advice"]
    write_skill(skills_dir, "new-one", "name: new-one\ndescription: Added later.")
    haiku = skills_dir / "haiku" / "SKILL.md"
    haiku.write_text("---\nname: haiku\ndescription: Write tanka now.\n---\nx\n")
    os.utime(haiku, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a clearly newer mtime
    names = {s.name: s.description for s in skills.catalog()}
    assert names == {"haiku": "Write tanka now.", "new-one": "Added later.",
                     "weather-advice": "Turn a forecast into clothing advice."}


async def test_skills_defined_in_code(tmp_path: Path) -> None:
    skills = Skills(skills=[Skill("refunds", "How to process refunds.", "Check the order first.",
                                  resources={"policy.md": "30 days."})])
    assert (await invoke(skills, "load_skill", name="refunds")).result.startswith("Check the order first.")
    assert (await invoke(skills, "read_skill_resource", skill="refunds", path="policy.md")).result == "30 days."
    with pytest.raises(SkillError):
        Skills(skills=[Skill("Bad Name", "d", "b")])
    with pytest.raises(SkillError, match="two skills defined in code are named 'refunds'"):
        Skills(skills=[Skill("refunds", "Old.", "a"), Skill("refunds", "New.", "b")])


# --- scripts -------------------------------------------------------------------------------------------


async def test_scripts_are_off_by_default_and_need_approval(skills_dir: Path) -> None:
    agent_model = ScriptedModel(["ok"])
    await Agent(agent_model, providers=[Skills(skills_dir)]).run("hi")
    assert "run_skill_script" not in [t.name for t in agent_model.requests[0].tools]
    with pytest.raises(UsageError, match="approve"):
        Skills(skills_dir, allow_scripts=True)
    with pytest.raises(UsageError, match="max_media_bytes=-1"):
        Skills(skills_dir, max_media_bytes=-1)
    asked: list[ScriptRequest] = []

    def approve(request: ScriptRequest) -> bool:
        asked.append(request)
        return request.args != ["0"]

    skills = Skills(skills_dir, allow_scripts=True, approve=approve, script_timeout=20)
    ran = await invoke(skills, "run_skill_script", skill="weather-advice", path="scripts/feels.py", args=["25"])
    assert ran.result == "exit code 0\nfeels like 23\n" and not ran.is_error
    refused = await invoke(skills, "run_skill_script", skill="weather-advice", path="scripts/feels.py", args=["0"])
    assert refused.is_error and "not approved" in refused.result
    escape = await invoke(skills, "run_skill_script", skill="weather-advice", path="../../secret.txt")
    assert escape.is_error and "inside the skill" in escape.result
    link = await invoke(skills, "run_skill_script", skill="weather-advice", path="link-out.txt")
    assert link.is_error and "symbolic link" in link.result
    assert [r.args for r in asked] == [["25"], ["0"]]


async def test_script_timeout(tmp_path: Path) -> None:
    write_skill(tmp_path, "slow", "name: slow\ndescription: Sleeps.", files={"scripts/wait.py":
                                                                          "import time\ntime.sleep(30)\n"})
    skills = Skills(tmp_path, allow_scripts=True, approve=lambda r: True, script_timeout=0.5)
    outcome = await invoke(skills, "run_skill_script", skill="slow", path="scripts/wait.py")
    assert outcome.is_error and "did not finish within 0.5 s" in outcome.result


async def test_scripts_get_a_minimal_environment_and_their_own_path(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    write_skill(tmp_path, "env", "name: env\ndescription: Prints its environment.", files={
        "scripts/env.py": "import os, sys\nfrom helper import X\nprint(sorted(os.environ), X, __file__, sys.argv)\n",
        "scripts/helper.py": "X = 'helper imported'\n",
        "scripts/env.sh": "echo \"$0 $1 ${GREETING:-none} ${OPENAI_API_KEY:-no key}\"\n"})
    skills = Skills(tmp_path, allow_scripts=True, approve=lambda r: True, script_env={"GREETING": "hello"},
                    script_timeout=20)
    py = await invoke(skills, "run_skill_script", skill="env", path="scripts/env.py", args=["a"])
    assert not py.is_error, py.result
    assert "OPENAI_API_KEY" not in py.result and "sk-should" not in py.result
    assert "'GREETING', 'LANG', 'PATH'" in py.result and "helper imported" in py.result
    assert "scripts/env.py ['scripts/env.py', 'a']" in py.result
    sh = await invoke(skills, "run_skill_script", skill="env", path="scripts/env.sh", args=["b"])
    assert sh.result == "exit code 0\nscripts/env.sh b hello no key\n"


async def test_script_output_is_capped_while_it_streams(tmp_path: Path) -> None:
    write_skill(tmp_path, "loud", "name: loud\ndescription: Prints a lot.", files={
        "scripts/loud.py": "import sys\nfor _ in range(2000):\n    sys.stdout.write('y' * 10000 + '\\n')\n"})
    skills = Skills(tmp_path, allow_scripts=True, approve=lambda r: True, max_output_bytes=1000, script_timeout=60)
    outcome = await invoke(skills, "run_skill_script", skill="loud", path="scripts/loud.py")
    head, _, tail = outcome.result.partition("\n[output truncated: ")
    assert head == "exit code 0\n" + "y" * 1000
    assert tail == f"{2000 * 10001 - 1000} more bytes]"


async def test_an_approved_script_swapped_for_a_link_does_not_run_the_outside_script(tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("print('OUTSIDE RAN')\n")
    root = tmp_path / "skills"
    write_skill(root, "tool", "name: tool\ndescription: Has a script.", files={"scripts/run.py": "print('inside')\n"})
    script = root / "tool" / "scripts" / "run.py"

    def approve_then_swap(request: ScriptRequest) -> bool:
        script.unlink()
        os.symlink(outside, script)  # the attack: swapped between the approval and the run
        return True

    skills = Skills(root, allow_scripts=True, approve=approve_then_swap, script_timeout=20)
    outcome = await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.py")
    assert outcome.result == "exit code 0\ninside\n"


def rewrite_in_place(path: Path, text: str) -> None:
    """Rewrite `path`'s content keeping its inode (what an editor saving in place, or ``>`` in a shell, does)."""
    with path.open("r+b") as f:
        f.truncate(0)
        f.write(text.encode())


async def test_a_script_rewritten_after_its_approval_runs_as_approved_and_the_next_run_asks_with_the_new_digest(
        tmp_path: Path) -> None:
    write_skill(tmp_path, "tool", "name: tool\ndescription: Has a script.",
                files={"scripts/run.py": "print('approved')\n"})
    script = tmp_path / "tool" / "scripts" / "run.py"
    asked: list[ScriptRequest] = []

    def approve_then_rewrite(request: ScriptRequest) -> bool:
        asked.append(request)
        if len(asked) == 1:  # the attack: rewritten in place while the approval was being given
            rewrite_in_place(script, "print('REWRITTEN')\n")
        return True

    skills = Skills(tmp_path, allow_scripts=True, approve=approve_then_rewrite, script_timeout=20)
    first = await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.py")
    assert first.result == "exit code 0\napproved\n"
    assert asked[0].digest == hashlib.sha256(b"print('approved')\n").hexdigest()
    second = await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.py")
    assert second.result == "exit code 0\nREWRITTEN\n"
    assert asked[1].digest == hashlib.sha256(b"print('REWRITTEN')\n").hexdigest()
    assert asked[1].folder_digest != asked[0].folder_digest


async def test_a_sibling_rewritten_after_the_approval_is_not_what_the_script_imports(tmp_path: Path) -> None:
    write_skill(tmp_path, "tool", "name: tool\ndescription: Has a script and a helper.", files={
        "scripts/run.py": "import os\nfrom helper import WORD\nprint(WORD, os.getcwd())\n",
        "scripts/helper.py": "WORD = 'approved'\n", "scripts/run.sh": ". scripts/lib.sh\necho \"$WORD\"\n",
        "scripts/lib.sh": "WORD=approved\n"})
    folder = tmp_path / "tool" / "scripts"
    asked: list[ScriptRequest] = []

    def approve_then_rewrite(request: ScriptRequest) -> bool:
        asked.append(request)
        if request.script.name == "run.py":
            rewrite_in_place(folder / "helper.py", "WORD = 'REWRITTEN'\n")
        else:
            rewrite_in_place(folder / "lib.sh", "WORD=REWRITTEN\n")
        return True

    skills = Skills(tmp_path, allow_scripts=True, approve=approve_then_rewrite, script_timeout=20)
    py = await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.py")
    word, cwd = py.result.removeprefix("exit code 0\n").split()
    assert word == "approved"
    assert not await asyncio.to_thread(os.path.lexists, cwd)  # the private copy it ran in is removed after the run
    assert (await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.sh")).result == \
        "exit code 0\napproved\n"
    assert asked[1].folder_digest != asked[0].folder_digest  # the sibling changed: the folder's digest says so


async def test_approvals_remembered_by_digest_are_asked_again_after_any_change(tmp_path: Path) -> None:
    write_skill(tmp_path, "tool", "name: tool\ndescription: Has a script.",
                files={"scripts/run.py": "print('v1')\n", "data.txt": "one"})
    person: list[ScriptRequest] = []  # the approvals a person was asked for
    remembered: set[tuple[str, str]] = set()

    def approve(request: ScriptRequest) -> bool:
        if (request.digest, request.folder_digest) not in remembered:
            person.append(request)
            remembered.add((request.digest, request.folder_digest))
        return True

    skills = Skills(tmp_path, allow_scripts=True, approve=approve, script_timeout=20)
    for _ in range(2):
        await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.py")
    assert len(person) == 1
    rewrite_in_place(tmp_path / "tool" / "data.txt", "two")  # not the script: a file beside it
    await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.py")
    assert len(person) == 2 and person[0].digest == person[1].digest


async def test_files_a_script_writes_into_its_folder_are_named_to_the_model_not_lost_silently(tmp_path: Path) -> None:
    write_skill(tmp_path, "tool", "name: tool\ndescription: Writes a report.", files={
        "scripts/helper.py": "WORD = 'done'\n",  # (imported: Python's __pycache__ beside it is not named)
        "scripts/run.py": "from helper import WORD\nopen('report.md', 'w').write(WORD)\nprint(WORD)\n"})
    skills = Skills(tmp_path, allow_scripts=True, approve=lambda r: True, script_timeout=20)
    outcome = await invoke(skills, "run_skill_script", skill="tool", path="scripts/run.py")
    assert outcome.result.startswith("exit code 0\ndone\n") and not outcome.is_error
    assert "wrote 1 file(s) into its skill's folder (report.md)" in outcome.result and "gone" in outcome.result
    assert not (tmp_path / "tool" / "report.md").exists()


async def test_a_skill_folder_too_big_to_copy_is_refused_before_the_approval(tmp_path: Path) -> None:
    write_skill(tmp_path, "big", "name: big\ndescription: Holds data.",
                files={"scripts/run.py": "print('ran')\n", "data/blob.txt": "x" * 5000})
    asked: list[ScriptRequest] = []
    skills = Skills(tmp_path, allow_scripts=True, approve=lambda r: asked.append(r) is None,
                    max_script_folder_bytes=4000, script_timeout=20)
    outcome = await invoke(skills, "run_skill_script", skill="big", path="scripts/run.py")
    assert outcome.is_error and "max_script_folder_bytes" in outcome.result and asked == []


# --- adversarial swap races (bounded loops; they pass only if no read ever leaks) ------------------------


@pytest.fixture
def racing() -> Iterator[Callable[[Callable[[], None]], None]]:
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(swap: Callable[[], None]) -> None:
        def loop() -> None:
            while not stop.is_set():
                swap()

        thread = threading.Thread(target=loop, daemon=True)
        threads.append(thread)
        thread.start()

    yield start
    stop.set()
    for thread in threads:
        thread.join()


def test_file_swapped_for_an_outside_symlink_never_leaks(tmp_path: Path,
                                                         racing: Callable[[Callable[[], None]], None]) -> None:
    (tmp_path / "secret.txt").write_text("TOP SECRET")
    root = tmp_path / "skills"
    folder = write_skill(root, "race", "name: race\ndescription: Raced.", files={"notes.md": "public notes"})
    skills = Skills(root)
    skill = skills.catalog()[0]
    real, link = folder / "real.tmp", folder / "link.tmp"

    def swap() -> None:
        real.write_text("public notes")
        os.replace(real, folder / "notes.md")
        os.symlink(tmp_path / "secret.txt", link)
        os.replace(link, folder / "notes.md")

    racing(swap)
    outcomes = [skills._read_file(skill, "notes.md") for _ in range(3000)]
    assert not any("SECRET" in o.result for o in outcomes)
    assert {o.result for o in outcomes if not o.is_error} <= {"public notes"}


def test_directory_swapped_for_an_outside_symlink_never_leaks(tmp_path: Path,
                                                              racing: Callable[[Callable[[], None]], None]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "table.md").write_text("TOP SECRET")
    root = tmp_path / "skills"
    folder = write_skill(root, "race", "name: race\ndescription: Raced.", files={"references/table.md": "public"})
    skills = Skills(root)
    skill = skills.catalog()[0]
    parked, link = folder / "parked", folder / "link.tmp"

    def swap() -> None:
        os.rename(folder / "references", parked)
        os.symlink(outside, link)
        os.replace(link, folder / "references")
        os.unlink(folder / "references")
        os.rename(parked, folder / "references")

    racing(swap)
    outcomes = [skills._read_file(skill, "references/table.md") for _ in range(3000)]
    assert not any("SECRET" in o.result for o in outcomes)


def test_skill_md_swapped_for_an_outside_symlink_never_leaks(tmp_path: Path,
                                                             racing: Callable[[Callable[[], None]], None]) -> None:
    write_skill(tmp_path / "outside", "race", "name: race\ndescription: TOP SECRET description.")
    root = tmp_path / "skills"
    folder = write_skill(root, "race", "name: race\ndescription: Public.")
    skills = Skills(root)
    real, link = folder / "real.tmp", folder / "link.tmp"

    def swap() -> None:
        real.write_text("---\nname: race\ndescription: Public.\n---\nBody.\n")
        os.replace(real, folder / "SKILL.md")
        os.symlink(tmp_path / "outside" / "race" / "SKILL.md", link)
        os.replace(link, folder / "SKILL.md")

    racing(swap)
    for _ in range(1500):
        assert all("SECRET" not in s.description for s in skills.catalog())


def test_a_file_growing_after_the_check_is_never_served_over_the_limit(
        tmp_path: Path, racing: Callable[[Callable[[], None]], None]) -> None:
    root = tmp_path / "skills"
    folder = write_skill(root, "race", "name: race\ndescription: Raced.", files={"log.txt": "small"})
    skills = Skills(root, max_resource_bytes=10_000)
    skill = skills.catalog()[0]
    target = folder / "log.txt"

    def grow() -> None:
        target.write_text("small")
        with target.open("a") as f:
            for _ in range(50):
                f.write("z" * 1000)
                f.flush()

    racing(grow)
    outcomes = [skills._read_file(skill, "log.txt") for _ in range(2000)]
    assert all(len(o.result) <= 10_000 for o in outcomes if not o.is_error)


async def test_executable_scripts_run_from_their_handle_and_long_listings_say_so(tmp_path: Path) -> None:
    folder = write_skill(tmp_path, "tools", "name: tools\ndescription: Many files.",
                         files={f"data/{i:03}.txt": "x" for i in range(205)})
    (folder / "scripts").mkdir()
    (folder / "scripts" / "hello").write_text("#!/bin/sh\necho \"hello $1\"\n")
    (folder / "scripts" / "hello").chmod(0o755)
    skills = Skills(tmp_path, allow_scripts=True, approve=lambda r: True, script_timeout=20)
    ran = await invoke(skills, "run_skill_script", skill="tools", path="scripts/hello", args=["there"])
    assert ran.result == "exit code 0\nhello there\n"
    listing = (await invoke(skills, "load_skill", name="tools")).result
    assert listing.count("\n- data/") == 200 and "(more files not listed: only the first 200 are shown)" in listing


@given(st.text(alphabet="abcXYZ019-_ .", max_size=70))
def test_ascii_names_are_valid_exactly_when_the_spec_pattern_matches(name: str) -> None:
    valid = re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name) is not None and len(name) <= 64
    assert (name_problem(name) is None) == valid
