#!/usr/bin/env bash
# Idle memory: the RSS of a release `director serve` (SQLite, no forge) one second after its
# first answer, over RUNS starts (default 5). Usage: bench/idle.sh [RUNS]
# (DIRECTOR_BIN=PATH measures another build instead of building this one.)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
bin=${DIRECTOR_BIN:-target/release/director}
[ -n "${DIRECTOR_BIN:-}" ] || cargo build --release --quiet --locked --bin director
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
for i in $(seq "$runs"); do
  DIRECTOR_SERVER__LISTEN=127.0.0.1:18090 \
  DIRECTOR_STORE__URL="sqlite://$work/idle-$i.db" \
  DIRECTOR_WEBHOOK__SECRETS=idle-secret \
  DIRECTOR_SCAN__ENABLED=false \
  RUST_LOG=warn \
    "$bin" serve >"$work/director.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    curl -s -o /dev/null http://127.0.0.1:18090/healthz && break || sleep 0.05
  done
  sleep 1
  awk -v run="$i" '/^VmRSS/ {printf "run %s: idle RSS %.1f MB\n", run, $2 / 1024}' "/proc/$pid/status"
  kill -INT "$pid"
  wait "$pid" || true
done
