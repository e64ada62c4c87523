"""A fake vendor server on its own: ``python -m contextpipe.testing.fake_openai`` (or ``.fake_anthropic``).

`serve` starts the server, prints where it listens and the lines that point a client at it (the
exact ``contextpipe chat`` command included), then serves until Ctrl-C or SIGTERM and returns 0.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ..errors import UsageError
from ._http import FakeHTTPServer

__all__ = ["Vendor", "serve"]


@dataclass(frozen=True)
class Vendor:
    """One fake as the command runs it: the server, its reply type and how a client is pointed at it."""

    name: str
    """The API, as the first line says it (``OpenAI``)."""
    module: str
    """The module ``python -m`` runs."""
    server: Callable[..., FakeHTTPServer]
    """The server class (called with ``model``, ``host`` and ``port``)."""
    reply: Callable[[str], Any]
    """Makes a text reply step of the script."""
    env: str
    """Prefix of the environment variables clients read (``OPENAI`` for ``OPENAI_BASE_URL``...)."""
    model: str
    """The model name the printed lines use by default."""
    chat: str
    """The ``contextpipe chat`` command line for this API."""


def _parser(vendor: Vendor) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m {vendor.module}",
        description=f"Serve a fake {vendor.name} API with scripted replies until Ctrl-C or SIGTERM.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: 0, a free port)")
    parser.add_argument("--reply", action="append", default=[], metavar="TEXT",
                        help="the reply to a request; repeat it for a script, whose last reply then repeats "
                             "(default: 'ok')")
    parser.add_argument("--model", default=vendor.model,
                        help=f"the model name the printed lines use (default: {vendor.model}; any name works)")
    return parser


def _replies(texts: list[str]) -> str:
    if not texts:
        return "'ok' to every request (--reply TEXT to change it)"
    if len(texts) == 1:
        return f"{texts[0]!r} to every request"
    return ", ".join(repr(t) for t in texts) + ", then the last one again"


def _instructions(vendor: Vendor, server: FakeHTTPServer, model: str, replies: list[str]) -> list[str]:
    env = {f"{vendor.env}_BASE_URL": server.base_url, f"{vendor.env}_API_KEY": "fake-key",
           f"{vendor.env}_MODEL": model}
    return [
        f"fake {vendor.name} API at {server.base_url} (Ctrl-C or SIGTERM stops it)",
        f"replies: {_replies(replies)}",
        "to use it from another shell:",
        "  export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items()),
        f"  {vendor.chat}",
    ]


def serve(vendor: Vendor, argv: Sequence[str] | None = None) -> int:
    """Run the fake `vendor` as the command line `argv` says; return the exit code (0 once stopped)."""
    args = _parser(vendor).parse_args(argv)
    try:
        server = vendor.server(model=args.model, host=args.host, port=args.port)
        server.start()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.reply:
        replies = [vendor.reply(text) for text in args.reply]
        server.enqueue(*replies[:-1])
        server.default_reply = replies[-1]
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {number: signal.signal(number, on_signal) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        for line in _instructions(vendor, server, args.model, args.reply):
            print(line, flush=True)
        stop.wait()
    finally:
        server.stop()
        for number, handler in previous.items():
            signal.signal(number, handler)
    print(f"fake {vendor.name} API stopped after {len(server.requests)} request(s)", flush=True)
    return 0
