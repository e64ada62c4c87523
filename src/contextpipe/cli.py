"""The ``contextpipe`` command."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from . import __version__

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``contextpipe`` command; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="contextpipe", description="LLM agents built around the context pipeline."
    )
    parser.add_argument("--version", action="version", version=f"contextpipe {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("demo", help="run the offline demonstration (no network, no API key)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        asyncio.run(run_demo())
        return 0
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
