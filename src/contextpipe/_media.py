r"""Images, audio and files in prompts: their token estimates, and how they are named when left out.

Token estimates follow the providers' documented rules where the bytes allow it, and err on the
high side elsewhere so that a context budget is not overrun:

- An image whose size can be read from its header (PNG, GIF, JPEG, WebP) costs the larger of
  Anthropic's rule (width x height / 750 after scaling to fit 1568 px and 1,600 tokens) and
  OpenAI's high-detail rule (85 + 170 per 512 px tile after scaling to fit 2048 px, shortest side
  768 px). Other images (a URI, an unreadable header) cost `UNKNOWN_IMAGE_TOKENS`.
- Audio costs 10 tokens a second (OpenAI's 1 token per 100 ms), the length read from a WAV header or
  estimated at 16,000 bytes a second (128 kbit/s) for other formats.
- A PDF costs 2,000 tokens a page (Anthropic documents 1,500 to 3,000), its pages counted from its
  page objects or page tree, or where neither is seen (a PDF 1.5 may hide both in compressed object
  streams) one a 100 KB.
- Bytes no model client sends (`SENT`: ``application/octet-stream``, a zip, ``audio/ogg``) cost the
  note that names them as left out, as that is all a model receives of them.

>>> image_size(b"GIF89a\x02\x00\x03\x00")
(2, 3)
>>> image_tokens(1024, 1024)
1399
"""

from __future__ import annotations

import json
import logging
import math
import re
import struct
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Final, TypeAlias

from .messages import DataPart, FunctionResult, Message, Part, UnknownPart, UriPart

__all__ = ["ATTACHABLE", "AUDIO_FORMATS", "BINARY", "IMAGE_TYPES", "MAX_MEDIA_BYTES", "SENT", "UNKNOWN_IMAGE_TOKENS",
           "UNKNOWN_TEXT", "Media", "attachment_note", "describe", "image_size", "image_tokens", "left_out_note",
           "magic", "media_tokens", "only_readable", "returned", "returned_note", "sent", "sniff", "warn_kept",
           "with_left_out"]

Media: TypeAlias = DataPart | UriPart | UnknownPart
"""What a function result carries besides its text (`UnknownPart`: a kind of a newer contextpipe)."""

UNKNOWN_IMAGE_TOKENS: Final = 1600
"""Tokens counted for an image whose size is unknown: about the most either provider charges for one."""
AUDIO_TOKENS_PER_SECOND: Final = 10
PDF_TOKENS_PER_PAGE: Final = 2000
_PDF_PAGE: Final = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
_PDF_COUNT: Final = re.compile(rb"/Count\s+(\d{1,7})")
PDF_BYTES_PER_PAGE: Final = 100_000
ATTACHABLE: Final = ("image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf")
"""What a skill's file, a tool's bytes or an artifact is sent to a model as (a media part), not as text:
the images and the file type every vendor client here takes in a tool result."""
MAX_MEDIA_BYTES: Final = 3_750_000
"""The default bound on one attached file: the largest image Claude takes (5 MB once base64-encoded)."""
BINARY: Final = "application/octet-stream"
UNKNOWN_TEXT: Final = "text/plain; charset=unknown-8bit"
"""The media type of a tool's bytes that are mostly text but not all UTF-8 (`returned`)."""
IMAGE_TYPES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""Image types every vendor's API reads inline (an image by URL is fetched by the service, whatever its type)."""
AUDIO_FORMATS: Final = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}
"""Audio OpenAI's chat completions take after a tool result, and the format it names each."""
SENT: Final = frozenset((*IMAGE_TYPES, *AUDIO_FORMATS, "application/pdf", "text/plain"))
"""What some model client here sends of a tool result's file (Claude: text/plain; OpenAI's chat: the audio).

Every client leaves other types out, naming them, and `media_tokens` counts them as that note."""
RESULT: Final = "the tool's result"
_TAIL: Final = 1024
_logger: Final = logging.getLogger("contextpipe.tools")
_ESCAPED: Final = re.compile("[\udc80-\udcff]")


def sniff(data: bytes, *, size: int | None = None, tail: bytes | None = None) -> str | None:
    r"""Return the media type in `ATTACHABLE` that `data` is, or None: by its magic bytes and its structure.

    GIF, PDF and WebP magic bytes are plain text, so a text may start like one: an image's header
    must give its size (a GIF's first block and trailer must be in place, a WebP's RIFF length must be
    the file's), and a PDF must end with ``%%EOF`` (in its last KiB); a JPEG's segments must be well
    formed up to its frame header, or to the end of `data` when it is a start. `data` is the whole file,
    or its start (64 KiB is enough) with the file's `size` and its last KiB, `tail`.

    >>> sniff(b"%PDF-1.7 ...\n%%EOF\n"), sniff(b"%PDF-1.7 is the version we use"), sniff(b"plain text")
    ('application/pdf', None, None)
    >>> sniff(b"GIF89a is the format of the old banner;")
    """
    kind = magic(data)
    if kind is None:
        return None
    size = len(data) if size is None else size
    tail = data[-_TAIL:] if tail is None else tail
    return kind if _WELL_FORMED[kind](data, size, tail) else None


def _jpeg_ok(data: bytes, size: int, tail: bytes) -> bool:
    """No text starts with a JPEG's magic bytes: its segments are walked to its frame, or the end of `data`."""
    walked = _jpeg_walk(data)
    return isinstance(walked, tuple) or (walked and size > len(data))


def _webp_ok(data: bytes, size: int, tail: bytes) -> bool:
    return image_size(data) is not None and int.from_bytes(data[4:8], "little") + 8 == size


def _gif_ok(data: bytes, size: int, tail: bytes) -> bool:
    flags = data[10] if len(data) > 10 else 0
    first = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # after the header and global colour table
    return (image_size(data) is not None and len(data) > first and data[first] in (0x21, 0x2C)
            and tail.endswith(b";"))


_WELL_FORMED: Final = {
    "application/pdf": lambda data, size, tail: b"%%EOF" in tail,
    "image/png": lambda data, size, tail: image_size(data) is not None,
    "image/jpeg": _jpeg_ok, "image/webp": _webp_ok, "image/gif": _gif_ok,
}


def magic(data: bytes) -> str | None:
    """Return the media type in `ATTACHABLE` whose magic bytes `data` starts with, or None (see `sniff`)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    return None


def returned(value: bytes | bytearray | memoryview | DataPart | UriPart) -> tuple[str, tuple[DataPart | UriPart, ...]]:
    r"""Return the text and the parts of a tool result that is bytes or a media part, byte for byte.

    Bytes that are an image or a PDF (`sniff`) are that media; UTF-8 bytes without a NUL are text;
    mostly text (no NUL, at most 10% of the bytes not UTF-8) is shown with U+FFFD for each byte that
    is not UTF-8, the exact bytes kept as a ``text/plain; charset=unknown-8bit`` part; the rest are an
    ``application/octet-stream`` part. No model reads those two parts (they are named as left out),
    but the session, or an artifact, keeps them exactly.

    >>> text, parts = returned(b"%PDF-1.7 ...\n%%EOF\n")
    >>> print(text, parts[0].media_type)
    [the tool's result: application/pdf, 19 bytes, attached] application/pdf
    >>> returned(b"plain text")
    ('plain text', ())
    """
    if isinstance(value, UriPart):
        return f"[{RESULT}: {value.media_type} at {value.uri}, attached]", (value,)
    if isinstance(value, DataPart):
        return returned_note(value), (value,)
    data = bytes(value)
    media_type = sniff(data)
    if media_type is None and b"\0" not in data:
        bad = len(_ESCAPED.findall(data.decode("utf-8", "surrogateescape")))
        if not bad:
            return data.decode("utf-8"), ()
        if bad * 10 <= len(data):  # mostly text (`Artifacts`' rule): shown, and kept exactly
            part = DataPart(data, UNKNOWN_TEXT)
            return f"{data.decode('utf-8', 'replace')}\n{returned_note(part)}", (part,)
    part = DataPart(data, media_type or BINARY)
    return returned_note(part), (part,)


def returned_note(part: DataPart) -> str:
    """Return the note `returned` gives for `part`."""
    if part.media_type == BINARY:
        return f"[{RESULT}: {len(part.data):,} bytes of {BINARY}, not text]"
    if part.media_type == UNKNOWN_TEXT:
        bad = len(_ESCAPED.findall(part.data.decode("utf-8", "surrogateescape")))
        return (f"[{bad:,} of the {len(part.data):,} bytes of {RESULT} are not UTF-8: they are shown as "
                f"\N{REPLACEMENT CHARACTER}; the exact bytes are kept as {UNKNOWN_TEXT}]")
    return attachment_note(RESULT, part)


def warn_kept(tool: str, call_id: str, parts: Iterable[Media]) -> None:
    """Log one warning naming the files over `MAX_MEDIA_BYTES` a tool result keeps: later requests re-send them."""
    big = [describe(p) for p in parts if isinstance(p, DataPart) and len(p.data) > MAX_MEDIA_BYTES]
    if big:
        _logger.warning("tool %r (call %s) returned %s, over %s bytes each: the session keeps them and every later "
                        "request sends them (an API may refuse them all); Artifacts(store) with max_media_bytes at "
                        "most %s keeps such files as artifacts", tool, call_id, ", ".join(big),
                        f"{MAX_MEDIA_BYTES:,}", f"{MAX_MEDIA_BYTES:,}")


def attachment_note(what: str, part: DataPart) -> str:
    """Return the text of a result that attaches `part`: what, its type and size (whether the model reads it or not).

    >>> attachment_note("file 'logo.png'", DataPart(b"12345", "image/png"))
    "[file 'logo.png': image/png, 5 bytes, attached]"
    """
    return f"[{what}: {part.media_type}, {len(part.data):,} bytes, attached]"


def image_size(data: bytes) -> tuple[int, int] | None:
    """Return ``(width, height)`` of a PNG, GIF, JPEG or WebP image from its header, or None."""
    try:
        if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
            width, height = struct.unpack(">II", data[16:24])
            return int(width), int(height)
        if data[:6] in (b"GIF87a", b"GIF89a"):
            width, height = struct.unpack("<HH", data[6:10])
            return int(width), int(height)
        if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
            return _webp_size(data)
        if data.startswith(b"\xff\xd8"):
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        return width, int.from_bytes(data[27:30], "little") + 1
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return int(width) & 0x3FFF, int(height) & 0x3FFF
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    walked = _jpeg_walk(data)
    return walked if isinstance(walked, tuple) else None


_FILL = re.compile(rb"\xff+")
_JPEG_MAX_SEGMENTS: Final = 1_000  # (a real JPEG reaches its frame header within a few dozen)


def _jpeg_walk(data: bytes) -> tuple[int, int] | bool:
    """Walk a JPEG's segments to its frame header: its size; True if `data` ends first, False at a bad marker.

    At most `_JPEG_MAX_SEGMENTS` segments are walked, a run of fill bytes in one step, so crafted input
    costs little.
    """
    index = 2
    for _ in range(_JPEG_MAX_SEGMENTS):
        if index + 9 >= len(data):
            return True
        if data[index] != 0xFF:
            return False
        fill = _FILL.match(data, index)
        index = (fill.end() if fill else index + 1) - 1  # (the last 0xFF of a run starts the marker)
        if index + 9 >= len(data):
            return True
        marker = data[index + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            index += 2  # markers without a length
            continue
        length = int.from_bytes(data[index + 2:index + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[index + 5:index + 9])
            return int(width), int(height)
        if length < 2:
            return False
        index += 2 + length
    return False


def image_tokens(width: int, height: int) -> int:
    """Tokens of a `width` x `height` image: the larger of Anthropic's and OpenAI's documented counts."""
    if width <= 0 or height <= 0:
        return UNKNOWN_IMAGE_TOKENS
    scale = min(1.0, 1568 / max(width, height), math.sqrt(1_200_000 / (width * height)))
    anthropic = math.ceil(width * scale * height * scale / 750)
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    tiles = math.ceil(w * scale / 512) * math.ceil(h * scale / 512)
    return max(anthropic, 85 + 170 * tiles)


def media_tokens(part: Media) -> int:
    """Estimated tokens of an image, audio clip or file in a prompt (see the module docstring)."""
    if isinstance(part, UnknownPart):
        return max(1, len(json.dumps(dict(part.payload), default=str)) // 4)
    major = part.media_type.split("/", 1)[0]
    if isinstance(part, DataPart) and not sent(part.media_type):  # no client sends it: the note naming it left out
        return max(1, len(left_out_note((part,), "this model")) // 4)
    if major == "image":
        size = image_size(part.data) if isinstance(part, DataPart) else None
        return image_tokens(*size) if size else UNKNOWN_IMAGE_TOKENS
    if not isinstance(part, DataPart):
        return max(1, len(part.uri) // 4)
    if major == "audio":
        return max(1, math.ceil(_audio_seconds(part.data) * AUDIO_TOKENS_PER_SECOND))
    if part.media_type == "application/pdf":
        return PDF_TOKENS_PER_PAGE * _pdf_pages(part.data)
    return max(1, len(part.data) // 4)


def _pdf_pages(data: bytes) -> int:
    """Count a PDF's pages: the more of its page objects and its page tree's ``/Count``, else by its size.

    A PDF 1.5 or later may keep its page objects in compressed object streams, where neither the
    objects nor the count can be seen: its size is then the bound, one page a `PDF_BYTES_PER_PAGE`.
    """
    counts = (int(c) for c in _PDF_COUNT.findall(data))
    pages = max(len(_PDF_PAGE.findall(data)), min(max(counts, default=0), len(data) // 100))
    return pages or max(1, len(data) // PDF_BYTES_PER_PAGE)


def sent(media_type: str) -> bool:
    """Whether some model client sends a tool result's part of `media_type` (`SENT`), or every one leaves it out."""
    return media_type in SENT


def _audio_seconds(data: bytes) -> float:
    if data.startswith(b"RIFF") and data[8:16] == b"WAVEfmt " and len(data) >= 44:
        byte_rate = int.from_bytes(data[28:32], "little")
        if byte_rate > 0:
            return max(0, len(data) - 44) / byte_rate
    return len(data) / 16_000


def describe(part: Media) -> str:
    """Name a part for a note: its media type and size (or URI)."""
    if isinstance(part, UnknownPart):
        return f"content of kind {part.kind!r}"
    if isinstance(part, DataPart):
        return f"{part.media_type} ({len(part.data):,} bytes)"
    return f"{part.media_type} at {part.uri}"


def left_out_note(parts: Iterable[Media], who: str) -> str:
    """Return the note added to a tool result's text when `who` (an API) cannot take some of its parts."""
    named = ", ".join(describe(p) for p in parts)
    return f"[left out of this result: {named}; {who} cannot take this content here]"


def with_left_out(result: FunctionResult, text: str, left_out: Sequence[Media], who: str, why: str,
                  notes: list[str]) -> str:
    """Return `text` with a note naming the `left_out` parts `who` cannot take, and say so in `notes`.

    `text` comes back as it is when nothing was left out; `why` ends the note in the call's trace.
    """
    if not left_out:
        return text
    note = left_out_note(left_out, who)
    notes.append(f"left out of tool result {result.call_id}: {', '.join(describe(p) for p in left_out)} ({why})")
    return f"{text}\n{note}" if text else note


def only_readable(messages: Sequence[Message], media_types: Sequence[str] | None, model: str,
                  notes: list[str]) -> Sequence[Message]:
    """Leave out of tool results the media a model does not read, naming them in the text and in `notes`.

    `media_types` are patterns (``image/*``, ``audio/wav``) of what the model reads; None means all.
    """
    if media_types is None:
        return messages
    out: list[Message] = []
    for message in messages:
        parts: list[Part] = []
        for part in message.parts:
            if isinstance(part, FunctionResult) and part.parts:
                part = _readable(part, media_types, model, notes)
            parts.append(part)
        changed = any(p is not q for p, q in zip(parts, message.parts, strict=True))
        out.append(Message(message.role, tuple(parts), message.id, message.author_name, message.created_at,
                           message.metadata, message.source) if changed else message)
    return out


def _readable(result: FunctionResult, media_types: Sequence[str], model: str, notes: list[str]) -> FunctionResult:
    kept: list[Media] = []
    left_out: list[Media] = []
    for part in result.parts:
        readable = not isinstance(part, UnknownPart) and any(fnmatchcase(part.media_type, p) for p in media_types)
        (kept if readable else left_out).append(part)
    if not left_out:
        return result
    who = f"model {model!r}"
    text = with_left_out(result, result.result, left_out, who, f"{who} reads only {', '.join(media_types) or 'text'}",
                         notes)
    return FunctionResult(result.call_id, text, result.is_error, tuple(kept))
