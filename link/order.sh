#!/usr/bin/env bash
# Makes link/startup-order.txt: the functions a release `director serve` runs from start-up to
# idle, then those a delivery adds (webhook, intake, consumer), by their symbol names, for the
# linker to lay out together (build.rs). Run it after changing the compiler, the dependencies
# or much of the code; bench/intake.sh says how many of the listed names the binary still has.
# Needs valgrind (callgrind counts every function run). Usage: link/order.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
cargo build --release --quiet --bin director --bin director-loadgen
bin=target/release/director
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# Runs `director serve` under callgrind until it answers, then `$@`, then two seconds idle;
# stops it as an operator would (SIGINT) and lists the functions it ran.
profile() {
  local out=$1; shift
  if curl -s -o /dev/null http://127.0.0.1:18095/; then
    echo "127.0.0.1:18095 is taken: something else would answer for the director" >&2
    exit 1
  fi
  rm -f "$work/bench.db"*
  DIRECTOR_SERVER__LISTEN=127.0.0.1:18095 \
  DIRECTOR_STORE__URL="sqlite://$work/bench.db" \
  DIRECTOR_WEBHOOK__SECRETS=bench-secret \
  DIRECTOR_SCAN__REPOS=acme/widgets \
  DIRECTOR_SCAN__ENABLED=false \
  RUST_LOG=warn \
    valgrind --quiet --tool=callgrind --demangle=no --compress-strings=no \
      --callgrind-out-file="$work/callgrind" "$bin" serve >"$work/log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    curl -s -o /dev/null http://127.0.0.1:18095/ && break || sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null || { echo "director serve did not start:" >&2; cat "$work/log" >&2; exit 1; }
  "$@"
  sleep 2
  kill -INT "$pid"
  wait "$pid" || true
  sed -n 's/^fn=//p' "$work/callgrind" | sort -u >"$out"
}

profile "$work/idle" true
profile "$work/delivery" target/release/director-loadgen \
  --url http://127.0.0.1:18095/webhooks/forgejo --requests 200 --concurrency 4 --rate 100 --rate-secs 1
# Only the binary's own functions (not libc's), by the names the linker knows them by.
nm --defined-only "$bin" | awk '$2 ~ /^[tTwW]$/ {print $3}' | sort -u >"$work/defined"
{
  comm -12 "$work/idle" "$work/defined"
  comm -23 "$work/delivery" "$work/idle" | comm -12 - "$work/defined"
} >link/startup-order.txt
echo "link/startup-order.txt: $(wc -l <link/startup-order.txt) functions ($(comm -12 "$work/idle" "$work/defined" | wc -l) from start-up to idle)"
