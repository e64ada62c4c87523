#!/usr/bin/env bash
# Create one virtualenv per peer under bench/ (bench/.venv-peer-NAME), each with only that peer installed,
# contextpipe itself runs in the project's .venv (this checkout).
# Idempotent: an existing venv is kept.   bash bench/peers/setup.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$here/.." && pwd)"
python="${PYTHON:-python3}"
make_venv() {  # name, pip args...
    local name="$1"; shift
    local venv="$here/.venv-peer-$name"
    if [ ! -x "$venv/bin/python" ]; then
        echo "creating $venv" >&2
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --upgrade pip
    fi
    "$venv/bin/python" -m pip install -q "$@"
}
make_venv openai-agents "openai-agents==0.24.0"
make_venv langgraph "langgraph==1.2.22" "langgraph-checkpoint-sqlite==3.1.2" "aiosqlite==0.22.1"
make_venv maf "agent-framework-core==1.23.0"
echo "peers ready under $here/.venv-peer-*" >&2
