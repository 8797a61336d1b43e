#!/usr/bin/env bash
# Webhook intake benchmark: a release `director serve` on loopback against the same load sent
# to a trivial actix handler, both driven by `director-loadgen` on this machine.
# Usage: bench/intake.sh   (prints the figures docs/benchmarks.md quotes)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p director -p director-bench --bin director --bin director-loadgen
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
sync_mode=${SYNC:-full}

DIRECTOR_SERVER__LISTEN=127.0.0.1:18080 \
DIRECTOR_STORE__URL="sqlite://$work/bench.db" \
DIRECTOR_STORE__SYNCHRONOUS="$sync_mode" \
DIRECTOR_WEBHOOK__SECRETS=bench-secret \
DIRECTOR_SCAN__REPOS=acme/widgets \
DIRECTOR_SCAN__ENABLED=false \
RUST_LOG=warn \
  target/release/director serve >"$work/director.log" 2>&1 &
director_pid=$!
target/release/director-loadgen --serve-trivial 127.0.0.1:18081 &
for port in 18080 18081; do
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break || sleep 0.1
  done
done
sleep 1
echo "director idle RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/$director_pid/status)"
echo "== director serve (store.synchronous=$sync_mode) =="
target/release/director-loadgen --url http://127.0.0.1:18080/webhooks/forgejo "$@"
echo "director RSS after load: $(awk '/VmRSS/ {print $2, $3}' /proc/$director_pid/status)"
echo "== trivial actix handler =="
target/release/director-loadgen --url http://127.0.0.1:18081/webhooks/forgejo "$@"
