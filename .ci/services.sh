# Service start and stop for .ci/run and for local runs of the service suites.
# Source it: `. .ci/services.sh; start_postgres; ...; stop_services`.
# Every server listens on 127.0.0.1 on a free port, in a temporary directory
# under SERVICE_BASE (default /tmp),
# and is stopped by stop_services (also on exit, via a trap the caller sets).
# Needs root (it installs what is missing with apt-get and runs PostgreSQL as
# the postgres user).

SERVICE_DIRS=()

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# A free port at most 55535 whose bus port (10000 above) is free too: what a
# Redis Cluster node needs.
free_cluster_port() {
  python3 -c '
import random, socket
for _ in range(1000):
    p = random.randint(20000, 55535)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
    except OSError:
        continue
    print(p); break
'
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
  dir=$(mktemp -d "${SERVICE_BASE:-/tmp}/rheo-pg.XXXXXX")
  chown postgres:postgres "$dir"
  runuser -u postgres -- "$PGBIN/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log"; return 1; }
  # fsync=off: CI only (the benchmarks in docs/benchmarks.md say what they
  # ran with); PG_FSYNC=on for a durable server (scripts/bench-peers).
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=${PG_FSYNC:-off} -c max_connections=${PG_MAX_CONNECTIONS:-200}" start >/dev/null \
    || { cat "$dir/log"; return 1; }
  runuser -u postgres -- "$PGBIN/psql" -h 127.0.0.1 -p "$port" -U postgres -qc 'CREATE DATABASE rheo_test' \
    || { cat "$dir/log"; return 1; }
  SERVICE_DIRS+=("pg:$dir")
  export PGBIN PG_CTL_DATA="$dir/data" PG_PORT="$port"
  export RHEO_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/rheo_test"
  echo "postgres: $("$PGBIN/postgres" --version) on 127.0.0.1:$port ($dir), started in $(( $(date +%s) - t0 )) s"
}

# A MongoDB-wire server: SecantusDB from PyPI (a one-node replica set named
# `secantus`, reporting MongoDB 8.2; transactions and change streams work with
# directConnection=true), in a venv under its own temporary directory.
# Exports RHEO_MONGO_URL and MONGO_PORT.
SECANTUS_VERSION=0.7.0b3
start_mongo() {
  local port dir t0 py
  t0=$(date +%s)
  port=$(free_port)
  dir=$(mktemp -d "${SERVICE_BASE:-/tmp}/rheo-mongo.XXXXXX")
  SERVICE_DIRS+=("mongo:$dir")
  python3 -m venv "$dir/venv" || { echo "python3 -m venv failed (install python3-venv)"; return 1; }
  "$dir/venv/bin/pip" install -q --disable-pip-version-check "secantusdb==$SECANTUS_VERSION" >"$dir/pip.log" 2>&1 \
    || { cat "$dir/pip.log"; return 1; }
  # From a directory without a secantusd.toml (it looks in ./ for one).
  mkdir -p "$dir/run"
  ( cd "$dir/run" && exec "$dir/venv/bin/secantusd-py" --host 127.0.0.1 --port "$port" \
      --storage-path "$dir/data" --log-level WARNING ) >"$dir/log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  py="$dir/venv/bin/python"
  local url="mongodb://127.0.0.1:$port/?directConnection=true"
  for _ in $(seq 1 300); do
    "$py" -c "import pymongo,sys; pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=200).admin.command('ping')" \
      "$url" 2>/dev/null && break
    sleep 0.1
  done
  "$py" -c "import pymongo,sys; pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=3000).admin.command('ping')" \
    "$url" || { echo "SecantusDB did not answer:"; cat "$dir/log"; return 1; }
  # serverMonitoringMode=poll: SecantusDB 0.7 spins on the driver's streaming
  # (awaitable) hello and then answers nothing else; polling works.
  export MONGO_PORT="$port" RHEO_MONGO_URL="$url&serverMonitoringMode=poll"
  echo "mongo: SecantusDB $SECANTUS_VERSION on 127.0.0.1:$port ($dir), installed and started in $(( $(date +%s) - t0 )) s"
}

# Redis 7 and its tools from the machine's packages, when missing.
start_redis_install() {
  if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    echo "installing redis-server and redis-tools (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  fi
}

# Redis 7 from the machine's packages (installed when missing), with any
# extra redis-server arguments (`--appendonly yes --appendfsync always`).
# Exports REDIS_PORT and RHEO_REDIS_URL of the server it started last.
start_redis() {
  start_redis_install
  local port dir
  port=$(free_port)
  dir=$(mktemp -d "${SERVICE_BASE:-/tmp}/rheo-redis.XXXXXX")
  SERVICE_DIRS+=("redis:$dir:$port")
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "$@" \
    || { cat "$dir/redis.log"; return 1; }
  for _ in $(seq 1 100); do redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  redis-cli -h 127.0.0.1 -p "$port" ping | grep -q PONG || { cat "$dir/redis.log"; return 1; }
  export REDIS_PORT="$port" RHEO_REDIS_URL="redis://127.0.0.1:$port/"
  echo "redis: $(redis-server --version | cut -d' ' -f3) on 127.0.0.1:$port ($dir) $*"
}

# A Redis Cluster of 3 masters and 3 replicas on free loopback ports, each
# node with AOF and `appendfsync always`, made with `redis-cli --cluster
# create`. Exports RHEO_REDIS_CLUSTER_URL (redis+cluster://host:port,...)
# and REDIS_CLUSTER_PORTS (masters first). Extra arguments go to every node.
start_redis_cluster() {
  local ports=() port dir nodes=()
  start_redis_install
  for _ in 1 2 3 4 5 6; do
    port=$(free_cluster_port)
    dir=$(mktemp -d "${SERVICE_BASE:-/tmp}/rheo-redis-cluster.XXXXXX")
    SERVICE_DIRS+=("redis:$dir:$port")
    redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save '' --appendonly yes --appendfsync always \
      --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" --cluster-node-timeout 1000 \
      --repl-diskless-sync-delay 0 --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "$@" \
      || { cat "$dir/redis.log"; return 1; }
    ports+=("$port")
    nodes+=("127.0.0.1:$port")
  done
  for port in "${ports[@]}"; do
    for _ in $(seq 1 100); do redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null \
    || { echo "redis-cli --cluster create failed" >&2; return 1; }
  # Every node agrees the cluster is up and every replica has synced.
  local ok
  for _ in $(seq 1 200); do
    ok=1
    for port in "${ports[@]}"; do
      redis-cli -h 127.0.0.1 -p "$port" cluster info | grep -q 'cluster_state:ok' || ok=0
      if redis-cli -h 127.0.0.1 -p "$port" info replication | grep -q 'role:slave'; then
        redis-cli -h 127.0.0.1 -p "$port" info replication | grep -q 'master_link_status:up' || ok=0
      fi
    done
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
  [ "$ok" = 1 ] || { echo "the redis cluster did not come up" >&2; return 1; }
  local IFS=,
  export RHEO_REDIS_CLUSTER_URL="redis+cluster://${nodes[*]}/" REDIS_CLUSTER_PORTS="${ports[*]}"
  echo "redis cluster: 3 masters, 3 replicas on ${nodes[*]} $*"
}

stop_services() {
  local entry kind dir
  for entry in "${SERVICE_DIRS[@]}"; do
    kind=${entry%%:*}
    dir=${entry#*:}
    if [ "$kind" = redis ]; then
      redis-cli -h 127.0.0.1 -p "${dir##*:}" shutdown nosave >/dev/null 2>&1 || true
      dir=${dir%:*}
    fi
    case "$kind" in
      pg) runuser -u postgres -- "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true ;;
      mongo)
        if [ -f "$dir/pid" ]; then
          local pid
          pid=$(cat "$dir/pid")
          kill "$pid" 2>/dev/null || true
          # It exits after a checkpoint (up to ~10 s); then it is killed.
          for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
          kill -9 "$pid" 2>/dev/null || true
        fi
        ;;
    esac
    rm -rf "$dir"
  done
  SERVICE_DIRS=()
}
