#!/usr/bin/env bash
# Starts a private PostgreSQL cluster for the tests (initdb into a temporary directory, as an
# unprivileged user, on a free loopback port) and prints `export` lines for it:
#   eval "$(tests/pg-cluster.sh start)"   ...   tests/pg-cluster.sh stop "$DIRECTOR_TEST_PG_DIR"
# Tests that find DIRECTOR_TEST_PG_URL use this cluster (a fresh database each); without it
# each such test starts a cluster of its own.
set -euo pipefail

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || { echo "PostgreSQL is not installed (Debian: apt-get install postgresql)" >&2; exit 1; }

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start_cluster() {
  local dir=$1 port opts
  port=$(cat "$dir/port")
  opts="-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300"
  # Tests need no fsync; benchmarks (DIRECTOR_PG_DURABLE=1) measure durable commits.
  [ -f "$dir/durable" ] || opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "$opts" start >/dev/null
}

# Says why the server did not start: pg_ctl itself only says to look at the log.
explain() {
  echo "PostgreSQL did not start; its log ($1/log):" >&2
  tail -n 20 "$1/log" >&2 2>/dev/null || true
}

case "${1:-}" in
  start)
    dir=$(mktemp -d /tmp/director-pg.XXXXXX)
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_pg "$bin/initdb" -D "$dir/data" -A trust -U postgres --no-sync >/dev/null
    [ "${DIRECTOR_PG_DURABLE:-}" = 1 ] && touch "$dir/durable"
    # A port below the kernel's ephemeral range (where the tests' own listeners and outgoing
    # connections take theirs) that nothing answers on. Another process can still take it
    # before postgres binds it, so a failed start is tried again on another port.
    started=""
    for _ in $(seq 1 5); do
      port=""
      for _ in $(seq 1 50); do
        candidate=$((20000 + RANDOM % 12000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then port=$candidate; break; fi
      done
      [ -n "$port" ] || { echo "no free port found" >&2; exit 1; }
      echo "$port" > "$dir/port"
      if start_cluster "$dir" 2>/dev/null; then started=1; break; fi
    done
    [ -n "$started" ] || { explain "$dir"; exit 1; }
    echo "export DIRECTOR_TEST_PG_URL=postgres://postgres@127.0.0.1:$port/postgres"
    echo "export DIRECTOR_TEST_PG_DIR=$dir"
    ;;
  pause)
    # An outage: the server stops, its data stays (resume starts it again on the same port).
    as_pg "$bin/pg_ctl" -D "${2:?the cluster directory}/data" -m fast -w stop >/dev/null
    ;;
  resume)
    start_cluster "${2:?the cluster directory}" || { explain "$2"; exit 1; }
    ;;
  stop)
    dir=${2:?the cluster directory}
    as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start | pause DIR | resume DIR | stop DIR" >&2
    exit 2
    ;;
esac
