"""``GET /v1/sessions/{session_id}/facts``: the history of every fact the agent's `FactMemory` keeps about the user.

For each `FactMemory` of the agent (none on a server without an agent): every fact about the
session's user, each version with when it was true and the ids of the messages it came from
(``/v1/sessions/{session_id}/messages`` holds them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from ..session import user_id
from ._json import json_response

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = ["session_facts"]


class _Api(Protocol):
    """What the route needs of the API (`serve._app._Api`): its agent, and a session of the caller's tenant."""

    agent: Agent | None

    async def _existing(self, request: Request, tenant: str, session_id: str) -> Any: ...


async def session_facts(api: _Api, request: Request, tenant: str, params: list[str]) -> Response:
    """Return the histories of the facts about the session's user, per `FactMemory` of the agent."""
    from ..providers.facts import FactMemory

    session = await api._existing(request, tenant, params[0])
    memories = [p for p in api.agent.providers if isinstance(p, FactMemory)] if api.agent is not None else []
    return json_response({"user_id": user_id(session), "memories": [
        {"source_id": memory.source_id, "collection": memory.collection,
         "facts": [{"lineage": versions[0].lineage, "versions": [v.to_dict() for v in versions]}
                   for versions in await memory.history(session)]}
        for memory in memories]})
