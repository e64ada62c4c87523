"""Serve an agent over HTTP, with tenants, API keys and a web inspector (``pip install "contextpipe[serve]"``).

From the command line, like ``uvicorn module:app``::

    contextpipe serve examples.weather:agent --keys keys.txt

or in code, as an ASGI app for any ASGI server:

>>> from contextpipe import Agent
>>> from contextpipe.testing import ScriptedModel
>>> from contextpipe.serve import ApiKeys, create_app, new_key
>>> key, line = new_key("acme")
>>> app = create_app(Agent(ScriptedModel(["Hi!"])), keys=ApiKeys.parse(line))

Routes: ``/v1/sessions`` (create, list with a cursor, read messages page by page, delete),
``/v1/sessions/{id}/runs`` (the result, or server-sent events), ``/v1/sessions/{id}/approvals`` (the
tool calls awaiting a person's decision, and the decisions), ``/v1/ag-ui`` (the AG-UI protocol),
``/ui/`` (the inspector), ``/docs`` and ``/openapi.json``. ``import contextpipe`` does not load
this package.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    from ..errors import UsageError

    raise UsageError(f'contextpipe serve needs {exc.name}: pip install "contextpipe[serve]"') from None

from ._app import ServeSettings, create_app
from ._keys import ApiKeys, Grant, hash_key, new_key
from ._runs import OnDisconnect

__all__ = ["ApiKeys", "Grant", "OnDisconnect", "ServeSettings", "create_app", "hash_key", "new_key"]
