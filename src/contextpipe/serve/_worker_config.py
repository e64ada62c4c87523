"""The configuration ``contextpipe serve`` hands its worker processes, in an environment variable.

uvicorn starts each worker (``--workers N``) as a process of its own that builds the app from a
factory: `run_server` writes the configuration before it starts them, and the app factory and the
connection protocol (`contextpipe.serve._connections`) read it in each worker.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

__all__ = ["CONFIG_ENV", "read_config", "write_config"]

CONFIG_ENV: Final = "CONTEXTPIPE_SERVE_CONFIG"
"""The environment variable holding the configuration, as JSON."""


def write_config(config: dict[str, Any]) -> None:
    """Leave `config` in this process's environment, for the worker processes it starts."""
    os.environ[CONFIG_ENV] = json.dumps(config)


def read_config() -> dict[str, Any]:
    """Return the configuration `write_config` left in the environment."""
    config: dict[str, Any] = json.loads(os.environ[CONFIG_ENV])
    return config
