"""`Agent.fork`'s copy of a session's artifacts in the other stores its `Artifacts` providers keep them in.

`rewind.fork` copies the session's log, state and artifacts in the agent's store; an `Artifacts`
provider given another store keeps the artifacts there, and the fork's copied tool results name
them, so they are copied there too, each under a lease of the fork in that store. A copy that fails
there leaves the fork half done (its log copied): the `StoreError` says so and how to clear it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import StoreError
from .providers.base import ContextProvider
from .stores.base import SessionStore

__all__ = ["copy_provider_artifacts"]


async def copy_provider_artifacts(run_store: SessionStore, providers: Sequence[ContextProvider], tenant: str,
                                  source: str, target: str) -> int:
    """Copy the artifacts of `source` into `target` in each `Artifacts` provider's store but `run_store`."""
    from .providers.artifacts import Artifacts  # here: an agent without artifacts never loads them
    from .rewind import leased
    from .stores._artifacts_sql import copy_artifacts

    copied = 0
    for store in dict.fromkeys(p.store for p in providers if isinstance(p, Artifacts)):
        if store is not run_store:
            try:
                async with leased(store, tenant, target, 0.0) as lease:
                    copied += await copy_artifacts(store, tenant, source, target, lease)
            except Exception as exc:  # the log is forked already: say what is left and how to clear it
                raise StoreError(
                    f"the fork {target!r} of {source!r} is half done: its log is copied but copying its artifacts "
                    f"into the {store.backend} store of an Artifacts provider failed ({type(exc).__name__}: {exc}). "
                    f"Erase the fork (erase_session({tenant!r}, {target!r}) on the agent's store and on that store) "
                    "and fork again", backend=store.backend, tenant=tenant, session_id=target) from exc
    return copied
