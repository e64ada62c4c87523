"""`Skills`: domain packages of instructions, reference files and scripts, loaded by the model on demand.

Skills follow the Agent Skills format: a folder per skill holding ``SKILL.md``, whose YAML front
matter has at least ``name`` and ``description`` and whose Markdown body is the skill itself, plus
any resource files (``references/``, ``assets/``) and scripts (``scripts/``). Before each run the
provider lists the available skills (name and description) in the instructions and offers the
tools ``load_skill(name)`` and ``read_skill_resource(skill, path)``; with scripts enabled,
``run_skill_script(skill, path, args)`` too, each run approved by the application first.

Safety: resource and script paths are resolved inside the skill's folder (no ``..``, no absolute
paths, no symlink leading out, no control characters), reads are size-limited, and a malformed
``SKILL.md`` raises `SkillError` naming the file. Folders are re-scanned before each run (unchanged
files are not re-read), so edits on disk are picked up without a restart.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SkillError, UsageError
from ..tools import Tool, ToolOutcome
from .base import ContextProvider

if TYPE_CHECKING:
    from ..pipeline import RunContext

__all__ = ["ScriptRequest", "Skill", "SkillError", "Skills"]

MAX_NAME = 64
MAX_DESCRIPTION = 1024


@dataclass(frozen=True)
class Skill:
    """One skill: its name and description (advertised to the model) and its body (loaded on demand).

    Skills from folders have a `path`; skills defined in code carry their `resources` as text.
    """

    name: str
    description: str
    body: str
    path: Path | None = None
    """The skill's folder, for skills read from disk."""
    resources: dict[str, str] = field(default_factory=dict)
    """Resource files of a skill defined in code: relative path -> text."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Other front-matter fields (license, allowed-tools, ...)."""


@dataclass(frozen=True)
class ScriptRequest:
    """What the approval callback is asked about before a skill script runs."""

    skill: str
    script: Path
    args: list[str]


Approver = Callable[[ScriptRequest], bool | Awaitable[bool]]


def parse_skill(path: Path) -> Skill:
    """Read ``SKILL.md`` at `path`; raise `SkillError` naming the file on any problem."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SkillError(f"{path}: cannot be read: {exc}") from exc
    if not text.startswith("---"):
        raise SkillError(f"{path}: missing YAML front matter (the file must start with '---')")
    end = text.find("\n---", 3)
    if end < 0:
        raise SkillError(f"{path}: the YAML front matter is not closed with '---'")
    try:
        front = yaml.safe_load(text[3:end])
    except yaml.YAMLError as exc:
        raise SkillError(f"{path}: the YAML front matter is invalid: {exc}") from exc
    if not isinstance(front, dict):
        raise SkillError(f"{path}: the front matter must be a YAML mapping with 'name' and 'description'")
    name, description = front.get("name"), front.get("description")
    if not isinstance(name, str) or not name or not isinstance(description, str) or not description:
        missing = [k for k, v in (("name", name), ("description", description)) if not isinstance(v, str) or not v]
        raise SkillError(f"{path}: front matter needs a non-empty {' and '.join(repr(m) for m in missing)}")
    _check_name(name, path)
    if len(description) > MAX_DESCRIPTION:
        raise SkillError(f"{path}: the description is longer than {MAX_DESCRIPTION} characters")
    body = text[end + 4:].lstrip("\n")
    extra = {k: v for k, v in front.items() if k not in ("name", "description")}
    return Skill(name, description.strip(), body, path.parent, {}, extra)


def _check_name(name: str, where: object) -> None:
    if not (0 < len(name) <= MAX_NAME) or not all(c.islower() or c.isdigit() or c == "-" for c in name) \
            or name.startswith("-") or name.endswith("-"):
        raise SkillError(f"{where}: skill name {name!r} must be 1-{MAX_NAME} lowercase letters, digits and "
                         "hyphens, not starting or ending with a hyphen")


class Skills(ContextProvider):
    """Offers skills from folders (each subfolder with a ``SKILL.md``) and from code.

    >>> skills = Skills(skills=[Skill("haiku", "Write haiku.", "Use 5-7-5 syllables.")])
    >>> [s.name for s in skills.catalog()]
    ['haiku']

    Scripts are off unless `allow_scripts` is set, and then each run needs `approve` to return True;
    they run with a `script_timeout` and their output (stdout and stderr, at most `max_output_bytes`)
    goes back to the model.
    """

    kind = "skills"

    def __init__(
        self,
        *paths: str | Path,
        skills: Sequence[Skill] = (),
        source_id: str = "skills",
        allow_scripts: bool = False,
        approve: Approver | None = None,
        script_timeout: float = 30.0,
        max_resource_bytes: int = 256_000,
        max_output_bytes: int = 64_000,
    ) -> None:
        super().__init__(source_id)
        if allow_scripts and approve is None:
            raise UsageError("allow_scripts=True needs approve=<callback> deciding which script runs may go ahead")
        self.paths = [Path(p) for p in paths]
        self.allow_scripts = allow_scripts
        self.approve = approve
        self.script_timeout = script_timeout
        self.max_resource_bytes = max_resource_bytes
        self.max_output_bytes = max_output_bytes
        self._code_skills = list(skills)
        for skill in self._code_skills:
            _check_name(skill.name, "skill defined in code")
        self._parsed: dict[Path, tuple[int, int, Skill]] = {}
        self.catalog()  # fail at construction on a malformed skill

    def catalog(self) -> list[Skill]:
        """Return the available skills, re-reading only the ``SKILL.md`` files that changed."""
        found: list[Skill] = list(self._code_skills)
        seen: dict[str, object] = {s.name: "code" for s in found}
        live: set[Path] = set()
        for root in self.paths:
            if not root.is_dir():
                raise SkillError(f"{root}: skills folder does not exist")
            for folder in sorted(p for p in root.iterdir() if p.is_dir()):
                skill_md = folder / "SKILL.md"
                try:
                    stat = skill_md.stat()
                except FileNotFoundError:
                    continue
                live.add(skill_md)
                cached = self._parsed.get(skill_md)
                if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
                    skill = cached[2]
                else:
                    skill = parse_skill(skill_md)
                    self._parsed[skill_md] = (stat.st_mtime_ns, stat.st_size, skill)
                if skill.name in seen:
                    raise SkillError(f"{skill_md}: skill name {skill.name!r} is already used by {seen[skill.name]}")
                seen[skill.name] = skill_md
                found.append(skill)
        for gone in set(self._parsed) - live:
            del self._parsed[gone]
        return found

    async def before_run(self, ctx: RunContext) -> None:
        """List the skills in the instructions and offer the skill tools."""
        skills = {s.name: s for s in await asyncio.to_thread(self.catalog)}
        if not skills:
            return
        lines = ["## Skills", "These skills are available. When one fits the task, call load_skill(name) to read "
                 "it before acting, and read_skill_resource(skill, path) for the files it mentions."]
        lines += [f"- {s.name}: {s.description}" for s in skills.values()]
        ctx.add_instructions("\n".join(lines))
        tools = [self._load_tool(skills), self._resource_tool(skills)]
        if self.allow_scripts:
            tools.append(self._script_tool(skills))
        ctx.add_tools(tools)

    # --- tools -------------------------------------------------------------------------------------

    def _load_tool(self, skills: dict[str, Skill]) -> Tool:
        async def load(args: dict[str, Any]) -> ToolOutcome:
            skill = skills.get(str(args.get("name", "")))
            if skill is None:
                return ToolOutcome(f"Error: there is no skill named {args.get('name')!r}. Available: "
                                   f"{', '.join(sorted(skills))}.", is_error=True)
            body = skill.body
            if len(body.encode()) > self.max_resource_bytes:
                body = body.encode()[: self.max_resource_bytes].decode(errors="ignore") + "\n[truncated]"
            files = self._resource_names(skill)
            listing = ("\n\nFiles of this skill: " + ", ".join(files)) if files else ""
            return ToolOutcome(body + listing)

        return Tool.from_schema("load_skill", "Load the full instructions of a skill by name.", {
            "type": "object", "properties": {"name": {"type": "string", "description": "The skill's name."}},
            "required": ["name"], "additionalProperties": False}, load, idempotent=True)

    def _resource_tool(self, skills: dict[str, Skill]) -> Tool:
        async def read(args: dict[str, Any]) -> ToolOutcome:
            skill = skills.get(str(args.get("skill", "")))
            if skill is None:
                return ToolOutcome(f"Error: there is no skill named {args.get('skill')!r}.", is_error=True)
            rel = args.get("path")
            if not isinstance(rel, str):
                return ToolOutcome("Error: 'path' must be a string.", is_error=True)
            if skill.path is None:
                if rel in skill.resources:
                    return ToolOutcome(skill.resources[rel][: self.max_resource_bytes])
                return ToolOutcome(f"Error: skill {skill.name!r} has no file {rel!r}.", is_error=True)
            return await asyncio.to_thread(self._read_file, skill, rel)

        return Tool.from_schema("read_skill_resource", "Read a file that belongs to a skill.", {
            "type": "object", "properties": {
                "skill": {"type": "string", "description": "The skill's name."},
                "path": {"type": "string", "description": "The file's path inside the skill's folder."}},
            "required": ["skill", "path"], "additionalProperties": False}, read, idempotent=True)

    def _script_tool(self, skills: dict[str, Skill]) -> Tool:
        async def run(args: dict[str, Any]) -> ToolOutcome:
            skill = skills.get(str(args.get("skill", "")))
            if skill is None or skill.path is None:
                return ToolOutcome(f"Error: there is no skill folder named {args.get('skill')!r}.", is_error=True)
            rel, argv = args.get("path"), args.get("args") or []
            if not isinstance(rel, str) or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                return ToolOutcome("Error: 'path' must be a string and 'args' a list of strings.", is_error=True)
            target = _resolve_inside(skill.path, rel)
            if isinstance(target, str):
                return ToolOutcome(target, is_error=True)
            if not target.is_file():
                return ToolOutcome(f"Error: skill {skill.name!r} has no script {rel!r}.", is_error=True)
            assert self.approve is not None
            decision = self.approve(ScriptRequest(skill.name, target, list(argv)))
            if inspect.isawaitable(decision):
                decision = await decision
            if not decision:
                return ToolOutcome(f"Error: running {rel!r} of skill {skill.name!r} was not approved.", is_error=True)
            return await self._run_script(skill.path, target, argv)

        return Tool.from_schema("run_skill_script", "Run a script that belongs to a skill (needs approval).", {
            "type": "object", "properties": {
                "skill": {"type": "string"}, "path": {"type": "string", "description": "The script's path."},
                "args": {"type": "array", "items": {"type": "string"}}},
            "required": ["skill", "path"], "additionalProperties": False}, run)

    # --- files -------------------------------------------------------------------------------------

    def _resource_names(self, skill: Skill) -> list[str]:
        if skill.path is None:
            return sorted(skill.resources)
        names = []
        for base, _, files in os.walk(skill.path):
            for name in files:
                full = Path(base, name)
                if full.name != "SKILL.md" and not isinstance(_resolve_inside(skill.path, str(full.relative_to(
                        skill.path))), str):
                    names.append(str(full.relative_to(skill.path)))
        return sorted(names)[:200]

    def _read_file(self, skill: Skill, rel: str) -> ToolOutcome:
        assert skill.path is not None
        target = _resolve_inside(skill.path, rel)
        if isinstance(target, str):
            return ToolOutcome(target, is_error=True)
        if not target.is_file():
            return ToolOutcome(f"Error: skill {skill.name!r} has no file {rel!r}.", is_error=True)
        size = target.stat().st_size
        if size > self.max_resource_bytes:
            return ToolOutcome(f"Error: {rel!r} is {size} bytes, over the {self.max_resource_bytes}-byte limit for "
                               "skill files.", is_error=True)
        try:
            return ToolOutcome(target.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            return ToolOutcome(f"Error: {rel!r} is not a UTF-8 text file.", is_error=True)

    async def _run_script(self, cwd: Path, script: Path, argv: list[str]) -> ToolOutcome:
        if script.suffix == ".py":
            command = [sys.executable, str(script), *argv]
        elif script.suffix == ".sh":
            command = ["bash", str(script), *argv]
        elif os.access(script, os.X_OK):
            command = [str(script), *argv]
        else:
            return ToolOutcome(f"Error: {script.name!r} is not a .py or .sh file nor executable.", is_error=True)
        process = await asyncio.create_subprocess_exec(
            *command, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout=self.script_timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            return ToolOutcome(f"Error: {script.name!r} did not finish within {self.script_timeout:g} s and was "
                               "stopped.", is_error=True)
        text = output[: self.max_output_bytes].decode(errors="replace")
        if len(output) > self.max_output_bytes:
            text += "\n[output truncated]"
        return ToolOutcome(f"exit code {process.returncode}\n{text}", is_error=process.returncode != 0)


def _resolve_inside(root: Path, rel: str) -> Path | str:
    """Resolve `rel` inside `root`, or return an error message saying why it is refused."""
    if not rel or len(rel) > 512:
        return "Error: the path must be 1-512 characters."
    normalized = unicodedata.normalize("NFC", rel)
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in normalized):
        return "Error: the path contains control or invisible characters."
    if "\\" in normalized:
        return "Error: use '/' in paths."
    candidate = Path(normalized)
    if candidate.is_absolute() or normalized.startswith("~"):
        return "Error: the path must be relative to the skill's folder."
    if any(part == ".." for part in candidate.parts):
        return "Error: the path must stay inside the skill's folder ('..' is not allowed)."
    base = root.resolve()
    try:
        target = (base / candidate).resolve(strict=False)
    except (OSError, RuntimeError):
        return "Error: the path cannot be resolved."
    if not target.is_relative_to(base):
        return "Error: the path leads outside the skill's folder."
    return target
