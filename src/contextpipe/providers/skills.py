"""`Skills`: domain packages of instructions, reference files and scripts, loaded by the model on demand.

Skills follow the Agent Skills specification (agentskills.io): a folder per skill holding
``SKILL.md``, whose YAML front matter has ``name`` (the folder's name) and ``description`` and may
have ``license``, ``compatibility``, ``metadata`` (a map of strings) and ``allowed-tools``, and whose
Markdown body is the skill itself, plus resource files and scripts. Before each run the provider
lists the skills (name and description) in the instructions and offers ``load_skill(name)`` and
``read_skill_resource(skill, path)``; with scripts enabled, ``run_skill_script(skill, path, args)``
too, each run approved by the application first.

One bad skill never takes the others down: a skill that breaks a rule of the specification is
skipped, or loaded with the offending field trimmed or dropped where that is safe (a description
over 1,024 characters, a ``compatibility`` over 500), and each case is logged as a warning and listed
in `Skills.problems`. ``load_skill`` lists the skill's files with their type and size, and says which
are binary or too big, so the model is never offered a read that fails. An image (PNG, JPEG, GIF,
WebP) or a PDF of at most `max_media_bytes` is read as a file attached to the result, which the
model client sends as a media part where its API takes one (and names as left out where not).

Safety (POSIX): files are opened relative to the skill folder's directory handle one path component
at a time without following symlinks, then checked (``fstat``) and read at most ``limit + 1`` bytes,
so there is no gap between a check and a use for a file swapped on disk to slip through. A skill
folder or ``SKILL.md`` that is a symlink is skipped unless ``follow_symlinks=True``. Before a script
run is approved, the skill's folder is copied (each file read once) into a private folder, and the
approval is asked with the script's digest and the folder's (`ScriptRequest`): what runs is that
copy, so a script or a sibling it imports rewritten after the approval is not what runs, and the
next run asks with the new digests. It runs with a minimal environment (``PATH``, ``LANG`` plus
`script_env`: no API keys), in its own process group, and with its output capped while it streams.
Folders are re-scanned before each run (unchanged files are not re-read).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import shutil
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .._media import MAX_MEDIA_BYTES
from ..errors import SkillError, UsageError
from ..tool_context import ToolContext
from ..tools import Tool, ToolOutcome
from . import _skillfiles as files
from . import _skillscripts as scripts
from .base import ContextProvider

if TYPE_CHECKING:
    from ..pipeline import RunContext

__all__ = ["ScriptRequest", "Skill", "SkillError", "SkillProblem", "Skills"]

MAX_NAME: Final = 64
MAX_DESCRIPTION: Final = 1024
MAX_COMPATIBILITY: Final = 500
SPEC_FIELDS: Final = frozenset(("name", "description", "license", "compatibility", "metadata", "allowed-tools"))

logger = logging.getLogger("contextpipe.skills")

_FRONT_RE: Final = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Skill:
    """One skill: its name and description (advertised to the model) and its body (loaded on demand).

    Skills from folders have a `path`; skills defined in code carry their `resources` as text.
    """

    name: str
    """The skill's name: lowercase letters, digits and single hyphens, at most 64 characters."""
    description: str
    """What the skill does and when to use it (at most 1,024 characters), listed to the model."""
    body: str
    """The Markdown instructions the model reads with ``load_skill``."""
    path: Path | None = None
    """The skill's folder, for skills read from disk."""
    resources: dict[str, str] = field(default_factory=dict)
    """Resource files of a skill defined in code: relative path -> text."""
    license: str | None = None
    """The ``license`` field: a license name or the name of a bundled license file."""
    compatibility: str | None = None
    """The ``compatibility`` field: environment requirements (at most 500 characters)."""
    allowed_tools: tuple[str, ...] = ()
    """The ``allowed-tools`` field, split into tool names (experimental in the specification)."""
    metadata: dict[str, str] = field(default_factory=dict)
    """The ``metadata`` field: a map from string keys to string values."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Front-matter fields the specification does not define, as parsed."""


@dataclass(frozen=True)
class SkillProblem:
    """A rule a skill on disk breaks, and what was done about it."""

    path: Path
    """The ``SKILL.md`` file (or the skill's folder) concerned."""
    message: str
    """What is wrong and how to fix it."""
    skipped: bool
    """True when the skill is not offered at all; False when it is loaded with the field trimmed or dropped."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message} ({'skill skipped' if self.skipped else 'skill loaded'})"


@dataclass(frozen=True)
class ScriptRequest:
    """What the approval callback is asked about before a skill script runs."""

    skill: str
    """The skill's name."""
    script: Path
    """The script's path in the skill's folder (what runs is the copy taken before asking, not the path)."""
    args: list[str]
    """The arguments the model asked for."""
    digest: str
    """SHA-256 (hex) of the script's content: exactly what runs if the run is approved."""
    folder_digest: str
    """SHA-256 (hex) of the skill's whole folder as copied (every file's path, content and executable bit):
    the script runs in that copy, so the siblings it imports or reads are the ones approved too. An
    application that remembers approvals keys them by both digests, so that any change asks again."""
    context: ToolContext[Any] | None = None
    """The call's run context (session, tenant, user, call id, deps), to decide per user or session; None
    when the tool was invoked outside a run."""


Approver = Callable[[ScriptRequest], bool | Awaitable[bool]]


class _Skip(Exception):
    """Internal: the skill cannot be loaded; the message says why."""


def name_problem(name: str) -> str | None:
    """Return why `name` is not a valid skill name, or None when it is."""
    if not 0 < len(name) <= MAX_NAME:
        return f"the name {name!r} must be 1-{MAX_NAME} characters"
    if not all((c.isalnum() and (c.islower() or not c.isalpha())) or c == "-" for c in name):
        return f"the name {name!r} may only use lowercase letters, digits and hyphens"
    if name.startswith("-") or name.endswith("-"):
        return f"the name {name!r} must not start or end with a hyphen"
    if "--" in name:
        return f"the name {name!r} must not contain consecutive hyphens"
    return None


def parse_skill(text: str, path: Path, folder: str | None = None) -> tuple[Skill, list[SkillProblem]]:
    """Parse the text of ``SKILL.md`` at `path`; return the skill and the problems it was loaded with.

    Raises `SkillError` (naming the file) when the skill cannot be loaded at all. `folder` is the
    name the skill's ``name`` must match (the folder's name).
    """
    problems: list[SkillProblem] = []
    try:
        skill = _parse(text, path, folder, problems)
    except _Skip as exc:
        raise SkillError(f"{path}: {exc}") from None
    return skill, problems


def _parse(text: str, path: Path, folder: str | None, problems: list[SkillProblem]) -> Skill:
    front, body = _front_matter(text.removeprefix("\ufeff"))
    name, description = _identity(front, folder)

    def note(message: str) -> None:
        problems.append(SkillProblem(path, message, skipped=False))

    description = _limited(description, "the description", MAX_DESCRIPTION, note)
    compatibility = _optional_text(front, "compatibility", note)
    if compatibility is not None:
        compatibility = _limited(compatibility, "'compatibility'", MAX_COMPATIBILITY, note)
    extra = {k: v for k, v in front.items() if k not in SPEC_FIELDS}
    return Skill(name, description, body, path.parent, {}, _optional_text(front, "license", note), compatibility,
                 _allowed_tools(front.get("allowed-tools"), note), _metadata(front.get("metadata"), note), extra)


def _front_matter(text: str) -> tuple[dict[Any, Any], str]:
    """Split ``SKILL.md`` into its YAML front matter (a mapping) and its body."""
    import yaml

    match = _FRONT_RE.match(text)
    if match is None:
        if not text.startswith("---"):
            raise _Skip("missing YAML front matter (the file must start with '---')")
        raise _Skip("the YAML front matter is not closed with '---'")
    try:
        front = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise _Skip(f"the YAML front matter is invalid: {_yaml_problem(exc)}") from None
    if not isinstance(front, dict):
        raise _Skip("the front matter must be a YAML mapping with 'name' and 'description'")
    return front, text[match.end():].lstrip("\r\n")


def _yaml_problem(exc: Exception) -> str:
    """One line saying what is wrong in the YAML and where (file line numbers: the front matter starts at 2)."""
    context, problem = getattr(exc, "context", None), getattr(exc, "problem", None)
    mark = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 2}, column {mark.column + 1}" if mark is not None else ""
    if problem is None:
        return str(exc).splitlines()[0]
    return f"{context}{where}: {problem}" if context else f"{problem}{where}"


def _identity(front: dict[Any, Any], folder: str | None) -> tuple[str, str]:
    """Return the required ``name`` (valid, and the folder's name) and ``description``."""
    name, description = front.get("name"), front.get("description")
    if not isinstance(name, str) or not name.strip() or not isinstance(description, str) or not description.strip():
        missing = [k for k, v in (("name", name), ("description", description))
                   if not isinstance(v, str) or not v.strip()]
        raise _Skip(f"front matter needs {' and '.join(repr(m) for m in missing)} as non-empty text")
    if (why := name_problem(name)) is not None:
        raise _Skip(why)
    if folder is not None and name != folder:
        raise _Skip(f"the name {name!r} must be the name of the skill's folder ({folder!r}): rename one of them")
    return name, description.strip()


def _limited(text: str, what: str, limit: int, note: Callable[[str], None]) -> str:
    if len(text) <= limit:
        return text
    note(f"{what} is {len(text)} characters, over the {limit} allowed; it was cut to {limit}")
    return _cut(text, limit)


def _metadata(raw: Any, note: Callable[[str], None]) -> dict[str, str]:
    """Return the spec's ``metadata``: a map of strings (numbers and booleans as text; anything else left out)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        note(f"'metadata' must be a map of strings to strings, not a {type(raw).__name__}; it was left out")
        return {}
    metadata: dict[str, str] = {}
    for key, value in raw.items():
        if isinstance(value, bool):
            metadata[str(key)] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            metadata[str(key)] = str(value)
        else:
            note(f"'metadata.{key}' must be a string, not a {type(value).__name__}; it was left out")
    return metadata


def _allowed_tools(raw: Any, note: Callable[[str], None]) -> tuple[str, ...]:
    """Return the spec's ``allowed-tools``: a space-separated string (a YAML list of strings is accepted too)."""
    if isinstance(raw, str):
        return tuple(raw.split())
    if isinstance(raw, list) and all(isinstance(t, str) for t in raw):
        return tuple(raw)
    if raw is not None:
        note(f"'allowed-tools' must be a space-separated string of tool names, not a {type(raw).__name__}; "
             "it was left out")
    return ()


def _optional_text(front: dict[Any, Any], key: str, note: Callable[[str], None]) -> str | None:
    value = front.get(key)
    if value is None or isinstance(value, str):
        return value.strip() if isinstance(value, str) and value.strip() else None
    if isinstance(value, int | float):
        return str(value)
    note(f"'{key}' must be text, not a {type(value).__name__}; it was left out")
    return None


def _cut(text: str, limit: int) -> str:
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit * 0.8:
        cut = cut[:space]
    return cut.rstrip() + "…"


class Skills(ContextProvider):
    """Offers skills from folders (each subfolder with a ``SKILL.md``) and from code.

    >>> skills = Skills(skills=[Skill("haiku", "Write haiku.", "Use 5-7-5 syllables.")])
    >>> [s.name for s in skills.catalog()]
    ['haiku']
    >>> skills.problems
    []

    Scripts are off unless `allow_scripts` is set, and then each run needs `approve` to return True;
    they run with a `script_timeout`, a minimal environment (``PATH``, ``LANG`` and `script_env`), and
    their output (stdout and stderr, at most `max_output_bytes`) goes back to the model. Each run
    copies the skill's folder first (at most `max_script_folder_bytes`, 2,000 files) and runs the
    copy, whose digests the approval is asked with.

    It takes none of the seeds' message filters: it lists every skill whatever the request says,
    and stores nothing, so a filter would have nothing to choose.
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
        script_env: Mapping[str, str] | None = None,
        max_resource_bytes: int = 256_000,
        max_skill_bytes: int = 512_000,
        max_output_bytes: int = 64_000,
        max_script_folder_bytes: int = 32_000_000,
        max_media_bytes: int = MAX_MEDIA_BYTES,
        follow_symlinks: bool = False,
    ) -> None:
        super().__init__(source_id)
        limits = {"max_resource_bytes": max_resource_bytes, "max_skill_bytes": max_skill_bytes,
                  "max_output_bytes": max_output_bytes, "max_script_folder_bytes": max_script_folder_bytes,
                  "max_media_bytes": max_media_bytes}
        if bad := {k: v for k, v in limits.items() if v < 0}:
            raise UsageError(f"Skills needs byte limits >= 0, got {', '.join(f'{k}={v}' for k, v in bad.items())}")
        if allow_scripts and approve is None:
            raise UsageError("allow_scripts=True needs approve=<callback> deciding which script runs may go ahead")
        self.paths = [Path(p) for p in paths]
        for root in self.paths:
            if not root.is_dir():
                raise SkillError(f"{root}: skills folder does not exist")
        self.allow_scripts = allow_scripts
        self.approve = approve
        self.script_timeout = script_timeout
        self.script_env = dict(script_env or {})
        self.max_resource_bytes = max_resource_bytes
        self.max_skill_bytes = max_skill_bytes
        self.max_output_bytes = max_output_bytes
        self.max_script_folder_bytes = max_script_folder_bytes
        self.max_media_bytes = max_media_bytes
        self.follow_symlinks = follow_symlinks
        self._code_skills = list(skills)
        names: set[str] = set()
        for skill in self._code_skills:
            if (why := name_problem(skill.name)) is not None:
                raise SkillError(f"skill defined in code: {why}")
            if skill.name in names:
                raise SkillError(f"two skills defined in code are named {skill.name!r}: give each its own name")
            names.add(skill.name)
        self._parsed: dict[Path, tuple[tuple[int, int, int], Skill | None, list[SkillProblem]]] = {}
        self._problems: list[SkillProblem] = []
        self._logged: set[str] = set()
        self._lock = threading.Lock()  # runs in parallel scan from worker threads
        self.catalog()

    @property
    def problems(self) -> list[SkillProblem]:
        """The problems found by the latest scan: skills skipped, and skills loaded with a field trimmed."""
        return list(self._problems)

    def catalog(self) -> list[Skill]:
        """Return the available skills, re-reading only the ``SKILL.md`` files that changed.

        Skills that cannot be loaded are left out and reported in `problems` (and logged once).
        """
        with self._lock:
            return self._scan()

    def _scan(self) -> list[Skill]:
        found: list[Skill] = list(self._code_skills)
        seen: dict[str, object] = {s.name: "a skill defined in code" for s in found}
        problems: list[SkillProblem] = []
        live: set[Path] = set()
        for root in self.paths:
            try:
                entries = sorted(os.scandir(root), key=lambda e: e.name)
            except OSError as exc:
                problems.append(SkillProblem(root, f"the skills folder cannot be read ({exc.strerror})", True))
                continue
            for entry in entries:
                skill = self._entry(root, entry, problems, live)
                if skill is None:
                    continue
                if skill.name in seen:
                    problems.append(SkillProblem(root / entry.name / "SKILL.md", f"the name {skill.name!r} is "
                                                 f"already used by {seen[skill.name]}", True))
                    continue
                seen[skill.name] = root / entry.name / "SKILL.md"
                found.append(skill)
        for gone in set(self._parsed) - live:
            del self._parsed[gone]
        self._problems = problems
        for problem in problems:
            if str(problem) not in self._logged:
                logger.warning("%s", problem)
        self._logged = {str(p) for p in problems}
        return found

    def _entry(self, root: Path, entry: os.DirEntry[str], problems: list[SkillProblem],
               live: set[Path]) -> Skill | None:
        """Load the skill in one entry of a skills folder (None: not a skill, or reported in `problems`)."""
        if entry.is_symlink() and not self.follow_symlinks:
            if entry.is_dir():
                problems.append(SkillProblem(root / entry.name, "the skill folder is a symbolic link, which is not "
                                             "followed (pass follow_symlinks=True to allow it)", True))
            return None
        if not entry.is_dir():
            return None
        skill, found_problems = self._load(root, entry.name)
        if skill is not None or found_problems:  # a folder without SKILL.md is not a skill
            live.add(root / entry.name / "SKILL.md")
        problems.extend(found_problems)
        return skill

    def _load(self, root: Path, name: str) -> tuple[Skill | None, list[SkillProblem]]:
        """Read and parse ``root/name/SKILL.md`` (cached by inode, size and mtime)."""
        skill_md = root / name / "SKILL.md"
        try:
            dir_fd = files.open_dir(root, name, follow=self.follow_symlinks)
        except OSError:
            return None, []
        with files.opened(dir_fd):
            try:
                fd = files.open_file(dir_fd, ("SKILL.md",), follow_last=self.follow_symlinks)
            except files.Missing:
                return None, []
            except files.Refused:
                return None, [SkillProblem(skill_md, "SKILL.md is a symbolic link, which is not followed (pass "
                                                     "follow_symlinks=True to allow it)", True)]
            with files.opened(fd):
                st = os.fstat(fd)
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                cached = self._parsed.get(skill_md)
                if cached is not None and cached[0] == key:
                    return cached[1], cached[2]
                data = files.read_limited(fd, self.max_skill_bytes)
        skill: Skill | None = None
        problems: list[SkillProblem]
        if len(data) > self.max_skill_bytes:
            problems = [SkillProblem(skill_md, f"SKILL.md is over the {files.human_size(self.max_skill_bytes)} "
                                               "limit (max_skill_bytes)", True)]
        elif (text := files.decode_text(data)) is None:
            problems = [SkillProblem(skill_md, "SKILL.md is not UTF-8 text", True)]
        else:
            try:
                skill, problems = parse_skill(text, skill_md, name)
            except SkillError as exc:
                problems = [SkillProblem(skill_md, str(exc).removeprefix(f"{skill_md}: "), True)]
        self._parsed[skill_md] = (key, skill, problems)
        return skill, problems

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
            listing = await asyncio.to_thread(self._listing, skill)
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

        return Tool.from_schema("read_skill_resource", "Read a file that belongs to a skill (an image or a PDF "
                                "comes attached).", {
            "type": "object", "properties": {
                "skill": {"type": "string", "description": "The skill's name."},
                "path": {"type": "string", "description": "The file's path inside the skill's folder."}},
            "required": ["skill", "path"], "additionalProperties": False}, read, idempotent=True)

    def _script_tool(self, skills: dict[str, Skill]) -> Tool:
        async def run(args: dict[str, Any], context: ToolContext[Any] | None) -> ToolOutcome:
            skill = skills.get(str(args.get("skill", "")))
            if skill is None or skill.path is None:
                return ToolOutcome(f"Error: there is no skill folder named {args.get('skill')!r}.", is_error=True)
            rel, argv = args.get("path"), args.get("args") or []
            if not isinstance(rel, str) or not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                return ToolOutcome("Error: 'path' must be a string and 'args' a list of strings.", is_error=True)
            try:
                copy, fd = await asyncio.to_thread(self._copy_for_run, skill, rel)
            except files.Missing:
                return ToolOutcome(f"Error: skill {skill.name!r} has no script {rel!r}.", is_error=True)
            except files.Refused as exc:
                return ToolOutcome(str(exc), is_error=True)
            try:
                assert self.approve is not None
                request = ScriptRequest(skill.name, skill.path / rel, list(argv),
                                        copy.digests["/".join(files.check_relative(rel))], copy.digest, context)
                decision = self.approve(request)
                if inspect.isawaitable(decision):
                    decision = await decision
                if not decision:
                    return ToolOutcome(f"Error: running {rel!r} of skill {skill.name!r} was not approved.",
                                       is_error=True)
                outcome = await scripts.run_script(copy.root, rel, fd, argv, env=scripts.environment(self.script_env),
                                                   time_limit=self.script_timeout,
                                                   max_output_bytes=self.max_output_bytes)
                return await asyncio.to_thread(scripts.note_files_left, outcome, copy)
            finally:
                os.close(fd)
                shutil.rmtree(copy.root.parent, ignore_errors=True)

        return Tool.from_schema("run_skill_script", "Run a script that belongs to a skill (needs approval).", {
            "type": "object", "properties": {
                "skill": {"type": "string"}, "path": {"type": "string", "description": "The script's path."},
                "args": {"type": "array", "items": {"type": "string"}}},
            "required": ["skill", "path"], "additionalProperties": False}, run, with_context=True)

    # --- files -------------------------------------------------------------------------------------

    def _open(self, skill: Skill, rel: str) -> int:
        """Open the regular file `rel` of a folder skill without following any symlink; return its fd."""
        assert skill.path is not None
        parts = files.check_relative(rel)
        try:
            dir_fd = files.open_dir(skill.path.parent, skill.path.name, follow=self.follow_symlinks)
        except OSError:
            raise files.Refused(f"Error: the folder of skill {skill.name!r} cannot be opened.") from None
        with files.opened(dir_fd):
            return files.open_file(dir_fd, parts)

    def _copy_for_run(self, skill: Skill, rel: str) -> tuple[files.Snapshot, int]:
        """Copy the skill's folder for a run of its script `rel`; return the copy and the copied script's fd.

        The script is opened in the skill's folder first, so that a path that is refused (outside the
        folder, a symbolic link) or missing says so; what runs is then the copy of it.
        """
        assert skill.path is not None
        os.close(self._open(skill, rel))
        return scripts.copy_for_run(skill.path, rel, follow_symlinks=self.follow_symlinks,
                                    max_bytes=self.max_script_folder_bytes)

    def _listing(self, skill: Skill) -> str:
        if skill.path is None:
            names = sorted(skill.resources)
            return ("\n\nFiles of this skill: " + ", ".join(names)) if names else ""
        try:
            dir_fd = files.open_dir(skill.path.parent, skill.path.name, follow=self.follow_symlinks)
        except OSError:
            return ""
        with files.opened(dir_fd):
            found, more = files.list_files(dir_fd)
        if not found:
            return ""
        lines = [f"- {f.describe(self.max_resource_bytes, self.max_media_bytes)}" for f in found]
        if more:
            lines.append(f"- (more files not listed: only the first {len(found)} are shown)")
        return ("\n\nFiles of this skill (read_skill_resource reads text, and attaches images and PDFs):\n"
                + "\n".join(lines))

    def _read_file(self, skill: Skill, rel: str) -> ToolOutcome:
        try:
            fd = self._open(skill, rel)
        except files.Missing:
            return ToolOutcome(f"Error: skill {skill.name!r} has no file {rel!r}.", is_error=True)
        except files.Refused as exc:
            return ToolOutcome(str(exc), is_error=True)
        with files.opened(fd):
            data = files.read_limited(fd, max(self.max_resource_bytes, self.max_media_bytes))
            size = max(os.fstat(fd).st_size, len(data))
        return files.resource(rel, data, size, self.max_resource_bytes, self.max_media_bytes)
