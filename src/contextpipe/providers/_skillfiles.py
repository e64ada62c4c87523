"""Race-free file access inside a skill's folder (POSIX), and the private copy a script runs from.

Every path is opened one component at a time relative to the directory file descriptor of the level
above, with ``O_NOFOLLOW``: a symlink anywhere is refused, and swapping a file or directory for a
symlink between a check and a use changes nothing, because there is no separate check: the file that
was opened is the file that is examined (``fstat``) and read, at most ``limit + 1`` bytes of it.

A script runs from a `snapshot` of its skill's folder: every regular file read once, hashed and
written into a folder of the process's own, before the run is approved. What the approval is asked
about (the digests) is what runs, whatever happens to the skill's folder meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mimetypes
import os
import stat
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from .._media import attachment_note, magic, sniff
from ..messages import DataPart
from ..tools import ToolOutcome

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang the open
SNIFF_BYTES: Final = 8192


class Refused(Exception):
    """A path was refused or could not be opened; the message is written for the model."""


class Missing(Refused):
    """There is no regular file at the path (nothing there, or a directory, FIFO, device...)."""


def check_relative(rel: str) -> tuple[str, ...]:
    """Return the components of `rel`, or raise `Refused` saying why the path is not acceptable."""
    if not rel or len(rel) > 512:
        raise Refused("Error: the path must be 1-512 characters.")
    normalized = unicodedata.normalize("NFC", rel)
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in normalized):
        raise Refused("Error: the path contains control or invisible characters.")
    if "\\" in normalized:
        raise Refused("Error: use '/' in paths.")
    if normalized.startswith(("/", "~")):
        raise Refused("Error: the path must be relative to the skill's folder.")
    parts = tuple(p for p in PurePosixPath(normalized).parts if p != ".")
    if any(part == ".." for part in parts):
        raise Refused("Error: the path must stay inside the skill's folder ('..' is not allowed).")
    if not parts:
        raise Refused("Error: the path names the skill's folder itself, not a file in it.")
    return parts


def open_dir(path: Path, name: str, *, follow: bool = False) -> int:
    """Open directory `name` inside `path` (not following a symlink unless `follow`); return its fd."""
    parent = os.open(path, _DIR_FLAGS)
    try:
        return os.open(name, _DIR_FLAGS | (0 if follow else os.O_NOFOLLOW), dir_fd=parent)
    finally:
        os.close(parent)


def open_file(dir_fd: int, parts: tuple[str, ...], *, follow_last: bool = False) -> int:
    """Open the regular file at `parts` under `dir_fd`, refusing symlinks on the way; return its fd."""
    current = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            except OSError as exc:
                raise _refusal(exc, part) from None
            os.close(current)
            current = nxt
        try:
            fd = os.open(parts[-1], _FILE_FLAGS | (0 if follow_last else os.O_NOFOLLOW), dir_fd=current)
        except OSError as exc:
            raise _refusal(exc, parts[-1]) from None
    finally:
        os.close(current)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Missing("missing")
    return fd


def _refusal(exc: OSError, part: str) -> Refused:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return Refused(f"Error: {part!r} is a symbolic link; links are not followed inside a skill's folder.")
    return Missing("missing")


def read_limited(fd: int, limit: int) -> bytes:
    """Read at most `limit + 1` bytes from `fd` (one more than allowed tells that the file is too big)."""
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    """Close `fd` on leaving."""
    try:
        yield fd
    finally:
        os.close(fd)


def looks_like_text(head: bytes) -> bool:
    """Whether the first bytes of a file are UTF-8 text (an incomplete character at the cut is allowed)."""
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data" and exc.start >= len(head) - 3
    return True


def decode_text(data: bytes) -> str | None:
    """Decode UTF-8 text (a leading BOM dropped); None when the bytes are not UTF-8 text."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def resource(rel: str, data: bytes, size: int, max_text: int, max_media: int) -> ToolOutcome:
    """Return what ``read_skill_resource`` answers for a file's bytes: its text, an image or a PDF attached, or why not.

    `data` is at most one byte more than the larger limit; `size` is the file's size.
    """
    kind = sniff(data)
    if kind is None and len(data) > max_media and (len(data) > max_text or decode_text(data) is None):
        kind = magic(data)  # cut short at the larger limit, its end unread: it is over the media limit
    if kind is not None:
        if len(data) > max_media:
            return ToolOutcome(f"Error: {rel!r} is {kind}, {human_size(size)}, over the {human_size(max_media)} limit "
                               "for skill files sent as attachments.", is_error=True)
        part = DataPart(data, kind)
        return ToolOutcome(attachment_note(f"file {rel!r}", part), parts=(part,))
    if len(data) > max_text:
        return ToolOutcome(f"Error: {rel!r} is {size:,} bytes, over the {max_text:,}-byte limit for skill files.",
                           is_error=True)
    text = decode_text(data)
    if text is None:
        return ToolOutcome(f"Error: {rel!r} is a binary file ({media_type(rel, False)}, {human_size(size)}), not text "
                           "nor an image or a PDF; it cannot be read with read_skill_resource.", is_error=True)
    return ToolOutcome(text)


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What a skill's file is, as listed to the model."""

    path: str
    """Relative path inside the skill's folder."""
    size: int
    """Size in bytes."""
    media_type: str
    """Guessed media type (``application/octet-stream`` when unknown)."""
    is_text: bool
    """Whether the file is UTF-8 text that `read_skill_resource` can return."""
    attachable: bool = False
    """Whether the file is an image or a PDF (`sniff`, not its name) that `read_skill_resource` attaches."""

    def describe(self, limit: int, media_limit: int) -> str:
        """One listing line: path, type, size, and why it cannot be read when it cannot."""
        size = human_size(self.size)
        if self.attachable:
            if self.size > media_limit:
                return f"{self.path} ({self.media_type}, {size}; over the {human_size(media_limit)} limit for files)"
            return f"{self.path} ({self.media_type}, {size}; read_skill_resource attaches it)"
        if not self.is_text:
            return f"{self.path} ({self.media_type}, {size}; binary, not readable as text)"
        if self.size > limit:
            return f"{self.path} (text, {size}; over the {human_size(limit)} read limit)"
        return f"{self.path} (text, {size})"


def human_size(n: int) -> str:
    """``532 B``, ``12.3 KB``, ``1.2 MB``."""
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


def media_type(name: str, is_text: bool) -> str:
    """Media type guessed from the file name (``text/plain`` / ``application/octet-stream`` fallback)."""
    guessed, encoding = mimetypes.guess_type(name, strict=False)
    if encoding == "gzip":
        return "application/gzip"
    if encoding is not None:
        return f"application/x-{encoding}"
    return guessed or ("text/plain" if is_text else "application/octet-stream")


def list_files(dir_fd: int, *, max_files: int = 200, max_depth: int = 8) -> tuple[list[FileInfo], bool]:
    """List the regular files under `dir_fd` (symlinks and ``SKILL.md`` left out), sniffing text or binary.

    Returns the files and whether there were more than `max_files` (or folders deeper than `max_depth`).
    """
    found: list[FileInfo] = []
    more = False

    def walk(fd: int, prefix: str, depth: int) -> None:
        nonlocal more
        try:
            entries = sorted(os.listdir(fd))
        except OSError:
            return
        for name in entries:
            if len(found) >= max_files:
                more = True
                return
            rel = f"{prefix}{name}"
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth >= max_depth:
                more = True
            elif stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except OSError:
                    continue
                with opened(sub):
                    walk(sub, rel + "/", depth + 1)
            elif stat.S_ISREG(st.st_mode) and rel != "SKILL.md":
                try:
                    file_fd = open_file(fd, (name,))
                except (Refused, OSError):
                    continue
                with opened(file_fd):
                    size = os.fstat(file_fd).st_size
                    head = read_limited(file_fd, SNIFF_BYTES - 1)
                    kind = sniff(os.pread(file_fd, 1 << 16, 0), size=size,  # the first bytes may be text: check more
                                 tail=os.pread(file_fd, 1024, max(0, size - 1024))) if magic(head) else None
                text = looks_like_text(head)
                found.append(FileInfo(rel, size, kind or media_type(name, text), text and kind is None,
                                      attachable=kind is not None))

    walk(dir_fd, "", 0)
    return found, more


SNAPSHOT_MAX_FILES: Final = 2000
"""Most files a skill folder may hold for its scripts to run (each run copies the folder)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A private copy of a skill's folder, taken before a script of it is approved, and what it holds."""

    root: Path
    """The copy: a folder only this user may write, with the skill folder's regular files (read-only)."""
    digests: dict[str, str]
    """Each copied file's relative path and the SHA-256 of its content (hex)."""
    digest: str
    """SHA-256 (hex) of the whole copy: every file's path, content digest and executable bit, in path order."""


def snapshot(dir_fd: int, dest: Path, *, max_bytes: int, max_files: int = SNAPSHOT_MAX_FILES,
             max_depth: int = 8) -> Snapshot:
    """Copy the regular files under `dir_fd` into the new folder `dest`, each read once; return what was copied.

    Symbolic links (and FIFOs, devices...) are not copied: nothing in a skill's folder follows them.
    Raises `Refused` (written for the model) when the folder holds more than `max_files` files or
    `max_bytes` bytes, or folders deeper than `max_depth`: a script must not run without a sibling
    it may import.
    """
    digests: dict[str, str] = {}
    executable: set[str] = set()
    left = max_bytes

    def walk(fd: int, prefix: str, depth: int, out: Path) -> None:
        nonlocal left
        out.mkdir(mode=0o700)
        for name in sorted(os.listdir(fd)):
            rel = f"{prefix}{name}"
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth >= max_depth:
                    raise Refused(f"Error: the skill's folder nests folders more than {max_depth} deep ({rel!r}); "
                                  "its scripts cannot be run.")
                try:
                    sub = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except OSError:
                    continue  # (swapped for a link meanwhile: not followed)
                with opened(sub):
                    walk(sub, rel + "/", depth + 1, out / name)
            elif stat.S_ISREG(st.st_mode):
                if len(digests) >= max_files:
                    raise Refused(f"Error: the skill's folder holds more than {max_files} files; its scripts cannot "
                                  "be run.")
                try:
                    file_fd = open_file(fd, (name,))
                except (Refused, OSError):
                    continue
                with opened(file_fd):
                    data = read_limited(file_fd, left)
                    mode = os.fstat(file_fd).st_mode
                if len(data) > left:
                    raise Refused(f"Error: the skill's folder holds more than {human_size(max_bytes)}; its scripts "
                                  "cannot be run (the application's max_script_folder_bytes).")
                left -= len(data)
                _write_new(out / name, data, 0o500 if mode & 0o111 else 0o400)
                digests[rel] = hashlib.sha256(data).hexdigest()
                if mode & 0o111:
                    executable.add(rel)

    walk(dir_fd, "", 0, dest)
    whole = hashlib.sha256()
    for rel in sorted(digests):
        whole.update(f"{rel}\0{digests[rel]}\0{'x' if rel in executable else '-'}\0".encode(errors="surrogateescape"))
    return Snapshot(dest, digests, whole.hexdigest())


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with opened(fd):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    os.chmod(path, mode)
