"""`Artifacts`: a tool result too big to send whole is stored beside the session and read back by range.

Without it, a tool that returns 50 MB puts 50 MB into the session's log and into every later model
call. With `Artifacts(store)` among the providers, a tool result whose text is longer than `limit`
characters is stored whole as an artifact of the session (`contextpipe.artifacts`, in the same
store as the log), and the result the model sees and the log keeps holds its first `head` and last
`tail` characters, its size, its handle and the byte offsets where the head ends and the tail
starts. A result that looks binary (undecodable bytes a tool kept with
``errors="surrogateescape"``, and a NUL or more than 10% of its bytes undecodable) is stored whole
as binary whatever its size, and the model is told its size and media type, not shown garbage; in
a result that is mostly text, the model sees each undecodable byte as U+FFFD (the artifact keeps
the bytes). The model reads text by range with the ``read_artifact``
tool (at most `max_read` bytes a call), which the provider offers in every run that has a session,
spill or not, so the tools a model is offered do not change part way (which would also break a
prompt cache).

The artifact is written before the tool's result is returned to the loop, so before the step's
messages are saved: a stored result never names an artifact that is not there. The write is fenced
by the run's lease (`RunContext.lease_for`): a run that lost it (its session erased meanwhile) gets
`LeaseLost` and stores nothing. Its id is the call's id (its letters, digits, ``_``, ``.`` and
``-``) and a digest of the id and the text, so a call run again after a crash with the same result
stores nothing twice (one with another result gets an artifact of its own; the first, named by no
stored message, goes with the session). Spilling sees the result as the tool middleware of providers
registered before it returned it (the first provider's middleware is outermost): register
`Artifacts` first to spill what the model would otherwise have been sent.

Images and files a tool returns (``ToolOutcome.parts``, bytes) stay in its result, and so in the
log and in every later request that holds the result, up to `max_media_bytes` each; a bigger one,
or one of a type no model client takes in a tool result (`contextpipe._media.SENT`), is stored as
an artifact instead and named after the result's text. ``read_artifact`` on an image or a PDF (PNG,
JPEG, GIF, WebP; by its media type, or its structure for ``application/octet-stream``) attaches it whole, up to
`max_media_bytes`, for the model client to send as a media part (or name as left out, for a model
that does not take it).

Not yet: compaction, traces and the inspector do not know artifacts (a spilled result is an
ordinary message to them).
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from .._media import (
    ATTACHABLE,
    BINARY,
    MAX_MEDIA_BYTES,
    UNKNOWN_TEXT,
    attachment_note,
    describe,
    returned_note,
    sent,
    sniff,
)
from ..errors import UsageError
from ..messages import DataPart
from ..session import SessionKey
from ..stores._artifacts import MAX_ARTIFACT_BYTES
from ..tools import Tool, ToolOutcome  # the reader's hints are resolved at run time; every run offers it
from .base import ContextProvider

if TYPE_CHECKING:
    from ..messages import UriPart
    from ..pipeline import RunContext
    from ..stores._artifacts import Artifact
    from ..stores.base import Lease, SessionStore
    from ..tools import CallTool, ToolInvocation

__all__ = ["BINARY", "READ_TOOL", "TEXT", "Artifacts"]

READ_TOOL: Final = "read_artifact"
"""The name of the tool the model reads artifacts with."""
TEXT: Final = "text/plain; charset=utf-8"
"""The media type of a spilled tool result."""


logger = logging.getLogger("contextpipe.artifacts")


class Artifacts(ContextProvider):
    """Spills tool results longer than `limit` characters to artifacts in `store`; offers ``read_artifact``.

    `store` is where the artifacts are kept: the agent's store, so they go with its sessions (erased,
    expired, forgotten). The model sees the first `head` and the last `tail` characters of a spilled
    result; ``read_artifact`` returns at most `max_read` bytes of text a call, and attaches an image
    or a PDF of at most `max_media_bytes` whole (a result's file bigger than that is spilled).
    """

    kind = "tools"

    def __init__(self, store: SessionStore, *, limit: int = 20_000, head: int = 2_000, tail: int = 2_000,
                 max_read: int = 10_000, max_media_bytes: int = MAX_MEDIA_BYTES,
                 source_id: str = "artifacts") -> None:
        super().__init__(source_id)
        if head < 0 or tail < 0 or limit < head + tail or max_read < 1 or max_media_bytes < 0:
            raise UsageError(f"Artifacts needs head >= 0, tail >= 0, limit >= head + tail, max_read >= 1 and "
                             f"max_media_bytes >= 0, got limit={limit}, head={head}, tail={tail}, max_read={max_read}, "
                             f"max_media_bytes={max_media_bytes}")
        self.store = store
        """Where the artifacts are kept."""
        self.limit = limit
        """A tool result longer than this many characters is spilled."""
        self.head = head
        """Characters of a spilled result's start the model sees."""
        self.tail = tail
        """Characters of a spilled result's end the model sees."""
        self.max_read = max_read
        """Bytes of text one ``read_artifact`` call returns at most."""
        self.max_media_bytes = max_media_bytes
        """Bytes of one image or file a result keeps (a bigger one is spilled) and ``read_artifact`` attaches."""

    async def before_run(self, ctx: RunContext) -> None:
        """With a session: add the spilling tool middleware and the ``read_artifact`` tool."""
        if ctx.session is None:
            return  # nowhere to keep an artifact: results pass whole
        run = _Run(self, SessionKey(ctx.session.tenant, ctx.session.id), ctx.lease_for(self.store))
        ctx.add_tool_middleware(run.spill)
        ctx.add_tools([Tool(run.read_artifact, name=READ_TOOL, idempotent=True, run_in_thread=False)])


@dataclass(slots=True)
class _Run:
    """One run's spilling and reading, on its session."""

    artifacts: Artifacts
    key: SessionKey
    lease: Lease | None  # the run's, when `artifacts.store` holds it: a run that lost it writes nothing

    async def spill(self, call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        outcome = await call_next(call)
        if call.name == READ_TOOL:  # a read is bounded by max_read and max_media_bytes
            return outcome
        notes: list[str] = []
        exact: tuple[bytes, str] | None = None
        if outcome.parts:
            outcome, notes, exact = await self._spill_parts(call, outcome)
        outcome = await self._spill_text(call, outcome, exact)
        if not notes:  # each stored (or lost) file is named after the text, so a preview cannot cut its note
            return outcome
        return replace(outcome, result="\n".join([outcome.result, *notes] if outcome.result else notes))

    async def _spill_text(self, call: ToolInvocation, outcome: ToolOutcome,
                          exact: tuple[bytes, str] | None) -> ToolOutcome:
        """Spill the text of `outcome` if it is too long or binary; `exact`: the stored bytes it shows, their handle."""
        text = outcome.result
        data, bad = _bytes_of(text), len(_SURROGATE.findall(text))  # bad: the bytes that are not UTF-8
        if bad and (b"\0" in data or bad * 10 > len(data)):  # looks binary: stored whole whatever its size
            return await self._binary(call, outcome, data)
        if len(text) <= self.artifacts.limit:
            return replace(outcome, result=_readable(data)) if bad else outcome
        if exact is not None:  # the text shows bytes already stored (`returned`): preview them, by their offsets
            data, handle = exact
            text = data.decode("utf-8", "surrogateescape")
            return replace(outcome, result=self._preview(text, len(data), handle, len(_SURROGATE.findall(text))))
        if len(data) > MAX_ARTIFACT_BYTES:  # the preview, as an error: not a run failed and the result lost
            return replace(outcome, result=self._preview(text, len(data), None, bad), is_error=True)
        return replace(outcome, result=self._preview(text, len(data), await self._put(call, data, TEXT), bad))

    async def _spill_parts(self, call: ToolInvocation,
                           outcome: ToolOutcome) -> tuple[ToolOutcome, list[str], tuple[bytes, str] | None]:
        """Store each file of `outcome` over `max_media_bytes` (or no model reads) as an artifact.

        Returns the outcome without them, the notes naming them (the caller adds them after the text),
        and the bytes and handle of the stored part the text shows (`returned`'s mostly-text bytes).
        """
        kept: list[DataPart | UriPart] = []
        notes: list[str] = []
        said: set[str] = set()  # what `returned` wrote of a part that is not attached after all
        lost = False  # a part neither kept nor stored: the result is an error
        exact: tuple[bytes, str] | None = None
        most = self.artifacts.max_media_bytes
        for part in outcome.parts:
            if not isinstance(part, DataPart) or (len(part.data) <= most and sent(part.media_type)):
                kept.append(part)
                continue
            if part.media_type != UNKNOWN_TEXT:  # its note says how much is not UTF-8: kept
                said.add(returned_note(part))
            note, handle = await self._store(call, part)
            notes.append(note)
            lost = lost or handle is None
            if handle is not None and part.media_type == UNKNOWN_TEXT and outcome.result == (
                    f"{part.data.decode('utf-8', 'replace')}\n{returned_note(part)}"):
                exact = (part.data, handle)
        if not notes:
            return outcome, notes, None
        lines = [line for line in outcome.result.split("\n") if line not in said] if outcome.result else []
        return (replace(outcome, result="\n".join(lines), parts=tuple(kept), is_error=outcome.is_error or lost),
                notes, exact)

    async def _store(self, call: ToolInvocation, part: DataPart) -> tuple[str, str | None]:
        """Store a result's file as an artifact: the note naming it, and its handle (None: too big, lost)."""
        if len(part.data) > MAX_ARTIFACT_BYTES:
            logger.warning("tool %r returned %s, %s: it is dropped from the result (call %s)", call.name,
                           describe(part), _over(), call.call_id)
            return f"[{describe(part)}: {_over()}; nothing is stored and it is not attached]", None
        media_type = part.media_type if _MEDIA_TYPE.fullmatch(part.media_type) else BINARY
        handle = await self._put(call, part.data, media_type)
        most = self.artifacts.max_media_bytes
        why = (f"it is over the {most:,}-byte limit for attached files" if sent(part.media_type) else
               f"no model client takes {part.media_type} in a tool result"
               + (f"; {READ_TOOL} shows it by range" if part.media_type.startswith("text/") else ""))
        return f"[{describe(part)} is stored as artifact {handle!r}, not attached: {why}]", handle

    async def _binary(self, call: ToolInvocation, outcome: ToolOutcome, data: bytes) -> ToolOutcome:
        if len(data) > MAX_ARTIFACT_BYTES:
            return replace(outcome, is_error=True, result=f"[This tool result is not UTF-8 text: {len(data):,} "
                           f"bytes of {BINARY}, {_over()}: nothing is stored and it cannot be shown as text.]")
        handle = await self._put(call, data, BINARY)
        kind, most = sniff(data), self.artifacts.max_media_bytes
        read = (f"{READ_TOOL} cannot show it either (it is not an image or a PDF)" if kind is None else
                f"it is {kind}, over the {most:,}-byte limit for attached files, so {READ_TOOL} cannot attach it"
                if len(data) > most else f"it is {kind}: {READ_TOOL}(handle={handle!r}) attaches it")
        return replace(outcome, result=f"[This tool result is not UTF-8 text: {len(data):,} bytes of {BINARY}. "
                                       f"It is stored as artifact {handle!r}, whole; it cannot be shown as text, "
                                       f"and {read}.]")

    async def _put(self, call: ToolInvocation, data: bytes, media_type: str) -> str:
        """Store `data` as the call's artifact (lease-fenced); return its handle."""
        from ..artifacts import put_artifact

        handle = _handle(call.call_id, data)
        await put_artifact(self.artifacts.store, self.key.tenant, self.key.id, handle, data, media_type,
                           lease=self.lease)
        return handle

    def _preview(self, text: str, size: int, handle: str | None, bad: int) -> str:
        """Return the head and tail of a spilled result, where they are, and how to read the rest (if `handle`)."""
        a = self.artifacts
        head, tail = text[:a.head], text[len(text) - a.tail:] if a.tail else ""
        head_end, tail_at = len(_bytes_of(head)), size - len(_bytes_of(tail))
        head, tail = _readable(_bytes_of(head)), _readable(_bytes_of(tail))
        kept, read = (f"It is stored as artifact {handle!r}.", f" Read any part with {READ_TOOL}(handle={handle!r}, "
                      f"offset=<byte>, length=<bytes, at most {a.max_read:,}>).") if handle is not None else (
                      f"It is {_over()}: only the head and tail are shown, nothing is stored.", "")
        if bad:
            kept += f" {bad:,} of its bytes are not UTF-8: they are shown as \N{REPLACEMENT CHARACTER}."
        return (f"[This tool result is {len(text):,} characters ({size:,} bytes), too long to show whole. {kept} "
                f"Shown: its first {len(head):,} characters (bytes 0 to {head_end:,}) "
                f"and its last {len(tail):,} (bytes {tail_at:,} to {size:,}); not shown: bytes {head_end:,} to "
                f"{tail_at:,}.{read}]\n"
                f"--- first {len(head):,} characters, bytes 0 to {head_end:,} ---\n{head}\n"
                f"--- last {len(tail):,} characters, from byte {tail_at:,} ---\n{tail}")

    async def read_artifact(self, handle: str, offset: int = 0, length: int = 4_000) -> ToolOutcome:
        """Read part of a stored artifact (a tool result too long to show whole), by byte range.

        An image or a PDF comes back whole, attached, with offset 0 (length is not used).

        Args:
            handle: The artifact's handle, as the spilled tool result gave it.
            offset: The first byte to read (0 is the start).
            length: How many bytes to read (fewer come back at the end, or above the limit).
        """
        from ..artifacts import artifact_info, read_artifact

        store, key, most = self.artifacts.store, self.key, self.artifacts.max_read
        found = await artifact_info(store, key.tenant, key.id, handle)
        if found is None:
            return ToolOutcome(f"Error: this session has no artifact {handle!r}; use the handle a spilled tool "
                               "result gave.", is_error=True)
        if not found.media_type.startswith("text/"):
            return await self._attach(handle, found, offset)
        if offset < 0 or offset >= max(found.size, 1) or length < 1:
            return ToolOutcome(f"Error: artifact {handle!r} has {found.size:,} bytes; give an offset from 0 to "
                               f"{max(found.size - 1, 0):,} and a length of at least 1.", is_error=True)
        data = await read_artifact(store, key.tenant, key.id, handle, offset=offset, length=min(length, most) + 6)
        start, end, text = _utf8_window(data or b"", offset, min(length, most), found.size)
        more = f"; {found.size - end:,} more after it" if end < found.size else "; the end"
        text = _SURROGATE.sub("\N{REPLACEMENT CHARACTER}", text)  # bytes that are not UTF-8 text
        return ToolOutcome(f"[artifact {handle!r}, bytes {start:,} to {end:,} of {found.size:,}{more}]\n{text}")

    async def _attach(self, handle: str, found: Artifact, offset: int) -> ToolOutcome:
        """Return an image or PDF artifact whole, as a media part; an error for other binary or a bigger one.

        Only from `offset` 0: a model paging through a PDF would get (and the log keep) a copy a call.
        """
        from ..artifacts import read_artifact

        store, key, most = self.artifacts.store, self.key, self.artifacts.max_media_bytes
        media_type = found.media_type.split(";", 1)[0].strip().lower()
        data = None
        if media_type == BINARY:  # a result stored as bytes of no known type: are they an image or a PDF?
            first = max(1, found.size if found.size <= most else min(found.size, 1 << 16))  # all, if attachable
            data = await read_artifact(store, key.tenant, key.id, handle, length=first)
            tail = await read_artifact(store, key.tenant, key.id, handle, offset=max(0, found.size - 1024),
                                       length=1024) if data is not None and len(data) < found.size else data
            media_type = sniff(data or b"", size=found.size, tail=(tail or b"")[-1024:]) or BINARY
        if media_type not in ATTACHABLE:
            return ToolOutcome(f"Error: artifact {handle!r} is binary ({found.media_type}, {found.size:,} bytes), "
                               f"neither text nor an image or a PDF: {READ_TOOL} cannot show it.", is_error=True)
        if found.size > most:
            return ToolOutcome(f"Error: artifact {handle!r} ({media_type}, {found.size:,} bytes) is over the {most:,}-"
                               "byte limit for attached files, so it cannot be attached.", is_error=True)
        if offset != 0:
            return ToolOutcome(f"Error: artifact {handle!r} is {media_type} ({found.size:,} bytes): {READ_TOOL} "
                               "attaches it whole with offset 0 (offset and length apply to text), and a result "
                               "that attached it already has it all.", is_error=True)
        if data is None or len(data) < found.size:
            data = await read_artifact(store, key.tenant, key.id, handle, length=max(found.size, 1))
        if data is None or len(data) != found.size:  # erased (or changed) since artifact_info
            return ToolOutcome(f"Error: artifact {handle!r} could not be read whole: it is no longer in this "
                               "session.", is_error=True)
        part = DataPart(data, media_type)
        return ToolOutcome(attachment_note(f"artifact {handle!r}", part), parts=(part,))


def _over() -> str:
    """Say what an artifact may hold at most (`MAX_ARTIFACT_BYTES`), for a result over it."""
    mib = f" ({MAX_ARTIFACT_BYTES // 2**20:,} MiB)" if MAX_ARTIFACT_BYTES % 2**20 == 0 else ""
    return f"over the {MAX_ARTIFACT_BYTES:,} bytes{mib} an artifact may hold"


def _handle(call_id: str, data: bytes) -> str:
    """Return the artifact id of a call's result: the call id in a safe alphabet and a digest of both.

    A model sends any call id (NUL, lone surrogates, quotes, newlines): the handle keeps only letters,
    digits, ``_``, ``.`` and ``-`` of it, so it is a valid artifact id the model can repeat exactly,
    and the digest keeps call ids that differ only in what was replaced apart. The same call and
    result give the same handle, so a call run again after a crash stores nothing twice.
    """
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass") + b"\0" + data).hexdigest()[:16]
    return f"{_UNSAFE.sub('_', call_id)[:100]}-{digest}"


_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.-]")
_MEDIA_TYPE: Final = re.compile(r"(?=.*/)[ -~]{1,200}")  # a media type an artifact may have (`check_artifact`)


def _bytes_of(text: str) -> bytes:
    """Return the bytes of a result, character by character.

    Undecodable bytes a tool kept with ``errors="surrogateescape"`` (how Python keeps them in a str)
    come back exactly; other lone surrogates are kept as they are (3 bytes each).
    """
    return text.encode("utf-8", "contextpipe.bytes")


def _readable(data: bytes) -> str:
    """Return `data` as text a model can be sent: each byte that is not UTF-8 as U+FFFD."""
    return data.decode("utf-8", "replace")


def _escape(exc: UnicodeError) -> tuple[str | bytes, int]:
    """Encode an escaped byte as that byte and other lone surrogates as they are; decode what is not UTF-8 so too."""
    if isinstance(exc, UnicodeEncodeError):
        return b"".join(bytes([ord(c) - 0xDC00]) if "\udc80" <= c <= "\udcff" else c.encode("utf-8", "surrogatepass")
                        for c in exc.object[exc.start:exc.end]), exc.end
    try:
        return codecs.lookup_error("surrogatepass")(exc)
    except UnicodeError:
        return codecs.lookup_error("surrogateescape")(exc)


codecs.register_error("contextpipe.bytes", _escape)
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _utf8_window(data: bytes, offset: int, length: int, size: int) -> tuple[int, int, str]:
    """Return where the whole characters of a `length`-byte range read from `offset` start and end, and their text.

    A range that begins inside a character skips that character's remaining bytes; one that ends
    inside a character ends before it, unless the range is too short for even one character, which
    then comes back whole. `data` holds 6 bytes more than `length` for both. Lone surrogates come
    back as they were stored, and bytes that are not UTF-8 as their ``surrogateescape`` escapes.
    """
    skip = 0
    if offset > 0:
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1

    def whole(stop: int) -> tuple[str, int]:
        window = data[skip:stop]
        decoder = codecs.getincrementaldecoder("utf-8")("contextpipe.bytes")
        text = decoder.decode(window, final=offset + skip + len(window) >= size)
        return text, offset + skip + len(window) - len(decoder.getstate()[0])

    text, end = whole(length)
    for stop in range(skip + 1, skip + 5):  # too short for one character: the first, whole
        if text:
            break
        text, end = whole(stop)
    return offset + skip, end, text
