#!/usr/bin/env bash
# Set up .venv with the test dependencies and run the whole test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
exec .venv/bin/python -m pytest "$@"
