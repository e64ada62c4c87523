#!/usr/bin/env bash
# Set up .venv with the test dependencies, start the PostgreSQL and Redis servers the store tests
# use (installing them with apt when missing), and run the whole test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch is pinned to the CPU build this machine kind keeps on disk; the local embeddings need it.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,local]"
# shellcheck source=scripts/services.sh
source scripts/services.sh
exec .venv/bin/python -m pytest "$@"
