"""``contextpipe index``: documents chunked and indexed for ``chat --search``; and which embedder the CLI runs.

The choice itself is `contextpipe.vectors.embedder_for`; `embedders` says on stderr what the user
may want to know about it (a model kept for a collection's vectors, how to get search by meaning,
a model to be built first).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..session import DEFAULT_TENANT
from ..stores.sqlite import SQLiteStore
from ..vectors.base import Embedder, VectorStore
from ..vectors.choice import embedder_for, local_models, mpnet_cache, mpnet_state
from ._shared import DEFAULT_DB, DbOption, check_new_db, err, out

__all__ = ["embedders", "index"]


def index(
    folder: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Folder of .md and .txt files.")],
    db: DbOption = DEFAULT_DB,
    collection: Annotated[str, typer.Option(help="Collection to index into.")] = "documents",
) -> None:
    """Chunk and index a folder of documents for `chat --search`, with a progress bar."""
    from rich.progress import Progress

    from ..vectors import ingest_folder

    check_new_db(db)

    async def run() -> int:
        async with SQLiteStore(db) as store:
            await store.list_sessions(DEFAULT_TENANT, limit=1)  # a clear error for a file that is not ours
            vectors = store.vectors()
            try:
                embedder = (await embedders(vectors, [collection]))[collection]
                with Progress(console=err) as progress:
                    task = progress.add_task(f"indexing {folder}", total=None)

                    def advance(done: int, total: int) -> None:
                        progress.update(task, completed=done, total=total)

                    return await ingest_folder(folder, vectors, embedder, collection=collection, progress=advance)
            finally:
                await vectors.close()

    chunks = asyncio.run(run())
    out.print(f"indexed {chunks} chunk(s) from {folder} into {db} (collection {collection!r})")


async def embedders(vectors: VectorStore, collections: list[str]) -> dict[str, Embedder]:
    """Return, for each of `collections`, the local embedder that can search it (`embedder_for`), one per model.

    A collection whose vectors name a model none of the local ones is refused with ``use another --db``.
    """
    if mpnet_state() == "cache not writable":
        err.print(f"[dim]all-mpnet-base-v2 cannot be built in {escape(str(mpnet_cache()))}; set "
                  "CONTEXTPIPE_CACHE to a folder you can write[/dim]")
    models = local_models()  # one set for all the collections: those of the same model share its embedder
    runs = ", ".join(model.label for model in models)
    chosen: dict[str, Embedder] = {}
    mpnet = False
    for collection in collections:
        choice = await embedder_for(vectors, collection, models,
                                    fix=f"the command line runs only {runs}; use another --db")
        if choice.note:
            err.print(f"[dim]{collection}: {escape(choice.note)}[/dim]")
        chosen[collection] = choice.embedder
        mpnet |= choice.model.name == "all-mpnet-base-v2"
    if mpnet and mpnet_state() == "not built":
        err.print(f"[dim]all-mpnet-base-v2: its int8 model is built on first use, once (about 15 seconds, 2 GB of "
                  f"memory, in {escape(str(mpnet_cache()))})[/dim]")
    return chosen
