#!/usr/bin/env bash
# Does a flood of anonymous /status/outcomes requests stall webhook intake? A release
# `director serve` on loopback (SQLite, as bench/intake.sh starts it) over a store seeded by
# director-outcomesbench (100,000 issues over a year), then the fixed-rate intake phase of
# director-loadgen, alternately alone and while a second director-loadgen process GETs the
# outcomes page (every window, and an unknown parameter) flat out on 64 connections without
# credentials. Prints intake's p50/p99 each time, the flood's answers and the pages computed
# (director_outcomes_pages_computed_total, from /metrics).
# Usage: bench/outcomes-flood.sh   (ISSUES=100000 ROUNDS=2 RATE_SECS=30 FLOOD_CONNS=64)
set -euo pipefail
cd "$(dirname "$0")/.."
issues=${ISSUES:-100000}
rounds=${ROUNDS:-2}
# Longer than the cache's 15 s: the pages are computed again inside the measured phase.
rate_secs=${RATE_SECS:-30}
flood_conns=${FLOOD_CONNS:-64}
cargo build --release --quiet -p director -p director-bench \
  --bin director --bin director-loadgen --bin director-outcomesbench
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
base=http://127.0.0.1:18080

echo "== seeding $issues issues; one computation of the 90-day view, for scale =="
target/release/director-outcomesbench --issues "$issues" --passes 1 --days 90 --keep "$work/bench.db"

DIRECTOR_SERVER__LISTEN=127.0.0.1:18080 \
DIRECTOR_STORE__URL="sqlite://$work/bench.db" \
DIRECTOR_STORE__SYNCHRONOUS="${SYNC:-full}" \
DIRECTOR_WEBHOOK__SECRETS=bench-secret \
DIRECTOR_SCAN__REPOS=acme/widgets \
DIRECTOR_SCAN__ENABLED=false \
RUST_LOG=warn \
  target/release/director serve >"$work/director.log" 2>&1 &
director_pid=$!
for _ in $(seq 300); do
  curl -s -o /dev/null "$base/healthz" && break || sleep 0.1
done

computed() {
  curl -s "$base/metrics" | awk '$1 == "director_outcomes_pages_computed_total" { print $2 }'
}
intake() {
  target/release/director-loadgen --url "$base/webhooks/forgejo" --fixed-only \
    --rate-secs "$rate_secs" --offset "$1"
}

flood_urls="$base/status/outcomes?days=30,$base/status/outcomes?days=7,$base/status/outcomes?days=90,$base/status/outcomes?since=30d"
for round in $(seq "$rounds"); do
  echo "== round $round: intake alone =="
  intake $((round * 40000000))
  echo "== round $round: intake under the flood ($flood_conns connections) =="
  before=$(computed)
  target/release/director-loadgen --flood "$flood_urls" --concurrency "$flood_conns" \
    --flood-secs $((rate_secs + 60)) >"$work/flood.out" &
  flood_pid=$!
  # The flood is under way once it has had a page computed.
  for _ in $(seq 300); do
    [ "$(computed)" -gt "$before" ] && break || sleep 0.1
  done
  intake $((round * 40000000 + 20000000))
  kill -TERM "$flood_pid"
  wait "$flood_pid"
  cat "$work/flood.out"
  echo "pages computed during the flood: $(($(computed) - before))"
done
echo "director RSS at the end: $(awk '/VmRSS/ {print $2, $3}' /proc/$director_pid/status)"
if grep -q . "$work/director.log"; then
  echo "== director log (warnings) =="
  tail -5 "$work/director.log"
fi
