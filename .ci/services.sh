# Service start and stop for .ci/run and for local runs of the service suites.
# Source it: `. .ci/services.sh; start_postgres; ...; stop_services`.
# Every server listens on 127.0.0.1 on a free port, in a temporary directory,
# and is stopped by stop_services (also on exit, via a trap the caller sets).
# Needs root (it installs what is missing with apt-get and runs PostgreSQL as
# the postgres user).

SERVICE_DIRS=()

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# PostgreSQL 15 from the machine's packages (installed when missing).
# Exports RHEO_POSTGRES_URL, PG_CTL_DATA (for restarts) and PGBIN.
start_postgres() {
  PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
  if [ ! -x "$PGBIN/initdb" ]; then
    echo "installing postgresql-15 (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null
  fi
  local port dir t0
  t0=$(date +%s)
  port=$(free_port)
  dir=$(mktemp -d /tmp/rheo-pg.XXXXXX)
  chown postgres:postgres "$dir"
  runuser -u postgres -- "$PGBIN/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log"; return 1; }
  # fsync=off: CI only (the benchmarks in docs/benchmarks.md say what they ran with).
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null \
    || { cat "$dir/log"; return 1; }
  runuser -u postgres -- "$PGBIN/psql" -h 127.0.0.1 -p "$port" -U postgres -qc 'CREATE DATABASE rheo_test' \
    || { cat "$dir/log"; return 1; }
  SERVICE_DIRS+=("pg:$dir")
  export PGBIN PG_CTL_DATA="$dir/data" PG_PORT="$port"
  export RHEO_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/rheo_test"
  echo "postgres: $("$PGBIN/postgres" --version) on 127.0.0.1:$port ($dir), started in $(( $(date +%s) - t0 )) s"
}

stop_services() {
  local entry kind dir
  for entry in "${SERVICE_DIRS[@]}"; do
    kind=${entry%%:*}
    dir=${entry#*:}
    case "$kind" in
      pg) runuser -u postgres -- "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true ;;
    esac
    rm -rf "$dir"
  done
  SERVICE_DIRS=()
}
