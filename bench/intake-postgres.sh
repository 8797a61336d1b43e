#!/usr/bin/env bash
# Webhook intake on PostgreSQL: N release `director serve` replicas on one private cluster
# (durable: fsync and synchronous commits on), the load spread over them in turn by
# `director-loadgen`. Each 202 is a verified delivery committed to the database.
# Usage: bench/intake-postgres.sh [REPLICAS] [loadgen flags...]   (default 1 replica)
set -euo pipefail
cd "$(dirname "$0")/.."
replicas=${1:-1}
shift || true
cargo build --release --quiet -p director -p director-bench --bin director --bin director-loadgen
work=$(mktemp -d)
eval "$(DIRECTOR_PG_DURABLE=1 tests/pg-cluster.sh start)"
trap 'kill $(jobs -p) 2>/dev/null || true; tests/pg-cluster.sh stop "$DIRECTOR_TEST_PG_DIR"; rm -rf "$work"' EXIT
db="${DIRECTOR_TEST_PG_URL%/*}/bench"
psql -q "$DIRECTOR_TEST_PG_URL" -c "CREATE DATABASE bench"

urls=""
pids=""
for i in $(seq 0 $((replicas - 1))); do
  port=$((18090 + i))
  HOSTNAME="bench-$i" \
  DIRECTOR_SERVER__LISTEN="127.0.0.1:$port" \
  DIRECTOR_STORE__URL="$db" \
  DIRECTOR_WEBHOOK__SECRETS=bench-secret \
  DIRECTOR_SCAN__REPOS=acme/widgets \
  DIRECTOR_SCAN__ENABLED=false \
  RUST_LOG=warn \
    target/release/director serve >"$work/director-$i.log" 2>&1 &
  pids="$pids $!"
  urls="${urls:+$urls,}http://127.0.0.1:$port/webhooks/forgejo"
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break || sleep 0.1
  done
done
sleep 1
echo "== $replicas replica(s) on PostgreSQL (durable commits) =="
target/release/director-loadgen --url "$urls" "$@"
for pid in $pids; do
  echo "replica RSS after load: $(awk '/VmRSS/ {print $2, $3}' /proc/$pid/status)"
done
