"""``contextpipe demo``: the offline demonstration (no network, no API key), in `_demonstration`.

The demonstration is imported when the command runs, so that the other commands do not load what it
needs (the vectors, the scripted model, the fake Messages API).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from ._shared import check_new_db, out

__all__ = ["demo"]


def demo(
    db: Annotated[Path | None, typer.Option("--db", help="Keep the demo's sessions in this file (run again, it "
                                            "adds a fresh set of sessions beside the earlier ones).")] = None,
) -> None:
    """Run the offline demonstration: no network, no API key."""
    from ._demonstration import run_demo

    if db is not None:
        check_new_db(db)
    asyncio.run(run_demo(lambda line: out.print(line, markup=False), db=str(db) if db else None))
