#!/usr/bin/env bash
# A first start over a backlog: `director serve` started against a FakeForge (served by
# `director-scanbench --serve-fake`, a separate process) holding REPOS repositories with
# ISSUES labelled issues in all, and a stand-in model that answers GO. The pre-flight's hourly
# cap (60) lets 60 issues be read; the rest wait. Prints the director's peak RSS, the forge
# requests it made, and the comments it posted, once its outbox is idle.
# Usage: bench/backlog.sh [REPOS] [ISSUES]   (defaults 1000 and 10000)
# MALLOC_ARENA_MAX is 2 as in the image (Dockerfile); MALLOC_ARENA_MAX= measures glibc's default.
set -euo pipefail
cd "$(dirname "$0")/.."
repos=${1:-1000}
issues=${2:-10000}
cargo build --release --quiet -p director -p director-bench --bin director --bin director-scanbench
bin="target/release"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# The FakeForge: its URL is its first line; it serves until its stdin closes.
mkfifo "$work/hold"
"$bin/director-scanbench" --serve-fake --repos "$repos" --issues "$issues" <"$work/hold" >"$work/forge.url" &
exec 3>"$work/hold"
for _ in $(seq 600); do [ -s "$work/forge.url" ] && break; sleep 0.5; done
forge=$(head -1 "$work/forge.url")

# The model: an OpenAI-compatible endpoint that answers GO.
cat >"$work/llm.py" <<'EOF'
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get('content-length', 0)))
        text = "Context to front-load: none.\n\nFine.\n\nGO"
        body = json.dumps({"id": "b", "model": "bench", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(('127.0.0.1', 18091), H).serve_forever()
EOF
python3 "$work/llm.py" &

names=$(seq 0 $((repos - 1)) | awk '{printf "%sbench/repo-%03d", (NR>1?",":""), $1}')
DIRECTOR_SERVER__LISTEN=127.0.0.1:18090 \
DIRECTOR_STORE__URL="sqlite://$work/backlog.db" \
DIRECTOR_WEBHOOK__SECRETS=bench-secret \
DIRECTOR_FORGE__URL="$forge" \
DIRECTOR_FORGE__TOKEN=bench-bot-token \
DIRECTOR_SCAN__REPOS="$names" \
DIRECTOR_PREFLIGHT__PROVIDER=openai \
DIRECTOR_PREFLIGHT__BASE_URL=http://127.0.0.1:18091/v1 \
DIRECTOR_PREFLIGHT__MODEL=bench \
RUST_LOG=warn \
MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX-2} \
  "$bin/director" serve >"$work/director.log" 2>&1 &
director=$!
started=$(date +%s)
metric() { curl -s http://127.0.0.1:18090/metrics | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s + 0}'; }
# Done: every issue carries its state label (queued or waiting) and no delivery waits; the
# deferred reads wait for their hour.
for _ in $(seq 3600); do
  sleep 1
  pending=$(metric 'director_deliveries_pending' 2>/dev/null || echo 1)
  labelled=$(metric 'director_actions_total{kind="sync_labels",outcome="done"}' 2>/dev/null || echo 0)
  if [ "$pending" = 0 ] && [ "$labelled" -ge "$issues" ]; then break; fi
done
echo "backlog: $repos repositories, $issues labelled issues, $(( $(date +%s) - started )) s to idle"
echo "peak RSS: $(awk '/VmHWM/ {print $2, $3}' /proc/$director/status)"
echo "forge requests: $(metric 'director_forge_requests_total')"
echo "state labels synced: $(metric 'director_actions_total{kind="sync_labels",outcome="done"}')"
echo "comments posted or edited: $(metric 'director_actions_total{kind="upsert_sticky",outcome="done"}')"
