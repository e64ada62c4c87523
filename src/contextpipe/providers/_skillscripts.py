"""Running a skill script (POSIX): the private copy it runs from, and what ``run_skill_script`` does once approved.

Before the approval is asked, `copy_for_run` copies the skill's folder into a private folder; the
script runs from its descriptor in that copy, so a file rewritten or swapped on disk afterwards is
not what runs; in its own process group (killed whole on timeout); with a minimal environment
(``PATH``, ``LANG`` plus the skill's `script_env`: no API keys); and with its output (stdout and
stderr together) capped while it streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from ..tools import ToolOutcome
from . import _skillfiles as files

__all__ = ["copy_for_run", "environment", "note_files_left", "run_script"]


def copy_for_run(folder: Path, rel: str, *, follow_symlinks: bool, max_bytes: int) -> tuple[files.Snapshot, int]:
    """Copy the skill `folder` into a new private folder (`files.snapshot`); return it and its copy of `rel`, open.

    The caller runs the script from that descriptor, closes it, and removes the copy's parent folder
    when the run ends. Raises `files.Refused` (written for the model) when the folder cannot be
    copied, and `files.Missing` when `rel` is not among the files copied (taken away, or swapped
    for a link, since the caller checked it).
    """
    parts = files.check_relative(rel)
    private = Path(tempfile.mkdtemp(prefix="contextpipe-skill-"))
    try:
        try:
            dir_fd = files.open_dir(folder.parent, folder.name, follow=follow_symlinks)
            with files.opened(dir_fd):
                copy = files.snapshot(dir_fd, private / folder.name, max_bytes=max_bytes)
        except OSError as exc:
            raise files.Refused(f"Error: the folder of skill {folder.name!r} could not be copied to run its "
                                f"script ({exc.strerror}).") from None
        if "/".join(parts) not in copy.digests:
            raise files.Missing("missing")
        copied = files.open_dir(private, folder.name)
        with files.opened(copied):
            return copy, files.open_file(copied, parts)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise


def note_files_left(outcome: ToolOutcome, copy: files.Snapshot) -> ToolOutcome:
    """Return `outcome`, telling the model of the files the script wrote into its copy (removed after the run).

    A script that writes its results into its own folder writes them into the private copy, which
    is removed when the run ends: such files are named, so that their loss is never silent.
    (``__pycache__`` folders, which Python writes beside the modules a script imports, are left out.)
    """
    left: list[str] = []
    for top, dirs, names in os.walk(copy.root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = Path(top).relative_to(copy.root)
        left += sorted(p for p in (str(rel / n) if rel.parts else n for n in names) if p not in copy.digests)
    if not left:
        return outcome
    shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
    return ToolOutcome(f"{outcome.result}\n[the script wrote {len(left)} file(s) into its skill's folder ({shown}); "
                       "a script runs in a private copy of that folder, removed after the run, so they are gone: "
                       "have it write where an argument says]", outcome.is_error, outcome.parts)


def environment(extra: Mapping[str, str]) -> dict[str, str]:
    """Return a script's environment: ``PATH``, ``LANG`` and UTF-8 Python I/O, plus `extra`."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
    env.update(extra)
    return env


async def run_script(cwd: Path, rel: str, fd: int, argv: list[str], *, env: dict[str, str], time_limit: float,
                     max_output_bytes: int) -> ToolOutcome:
    """Run the opened script `fd` (``rel`` inside the skill folder `cwd`) with `argv`; its output is the outcome."""
    name = Path(rel).name
    if rel.endswith(".py"):
        command = [sys.executable, "-c", _PY_BOOT, str(fd), rel, *argv]
    elif rel.endswith(".sh"):
        command = ["bash", "-c", f'. /dev/fd/{fd} "$@"', rel, *argv]
    elif os.fstat(fd).st_mode & 0o111:
        command = [f"/dev/fd/{fd}", *argv]
    else:
        return ToolOutcome(f"Error: {name!r} is not a .py or .sh file nor executable.", is_error=True)
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, pass_fds=(fd,), start_new_session=True,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    kept = bytearray()
    dropped = 0

    async def drain() -> None:
        nonlocal dropped
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            room = max_output_bytes - len(kept)
            kept.extend(chunk[:max(room, 0)])
            dropped += max(len(chunk) - max(room, 0), 0)
        await process.wait()

    try:
        await asyncio.wait_for(drain(), timeout=time_limit)
    except TimeoutError:
        _kill_group(process.pid)
        await process.wait()
        return ToolOutcome(f"Error: {name!r} did not finish within {time_limit:g} s and was stopped.", is_error=True)
    text = kept.decode(errors="replace")
    if dropped:
        text += f"\n[output truncated: {dropped} more bytes]"
    return ToolOutcome(f"exit code {process.returncode}\n{text}", is_error=process.returncode != 0)


# Runs a Python script from an inherited file descriptor, with __file__, sys.argv and sys.path[0] as if
# it had been started by its path inside the skill's folder.
_PY_BOOT: Final = (
    "import os, sys\n"
    "fd, path = int(sys.argv[1]), sys.argv[2]\n"
    "with os.fdopen(fd, 'rb') as f:\n"
    "    code = compile(f.read(), path, 'exec')\n"
    "sys.argv = [path, *sys.argv[3:]]\n"
    "sys.path[0] = os.path.dirname(os.path.abspath(path))\n"
    "exec(code, {'__name__': '__main__', '__file__': path, '__builtins__': __builtins__})\n"
)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
