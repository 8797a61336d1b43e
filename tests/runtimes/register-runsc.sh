#!/usr/bin/env bash
# Installs gVisor's `runsc` (Debian's package) and registers it in the Docker engine as the
# runtime `runsc`, idempotently: the engine's daemon.json keeps every other key, and the engine
# reloads its configuration (SIGHUP) only when the file changed. Ends when `docker info` lists
# the runtime. `--network=host` makes gVisor use the network namespace Docker made for the
# container (its own network stack cannot start here: docs/operations.md#gvisor).
#
#   tests/runtimes/register-runsc.sh [daemon.json]   (default /etc/docker/daemon.json)
set -euo pipefail
config=${1:-/etc/docker/daemon.json}

if ! command -v runsc >/dev/null 2>&1; then
  echo "register-runsc: installing runsc" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq runsc >&2 || { apt-get update -qq >&2 && apt-get install -y -qq runsc >&2; }
fi
runsc=$(command -v runsc)

listed() { docker info --format '{{range $name, $_ := .Runtimes}}{{$name}} {{end}}' 2>/dev/null | tr ' ' '\n' | grep -qx runsc; }

# The file with `runtimes.runsc` set, every other key kept (python3: no jq on a fresh Debian).
wanted=$(python3 - "$config" "$runsc" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
data = {}
if os.path.exists(path) and os.path.getsize(path) > 0:
    with open(path) as f:
        data = json.load(f)
data.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": ["--network=host"]}
print(json.dumps(data, indent=2, sort_keys=True))
PY
)
current=""
[ -f "$config" ] && current=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])), indent=2, sort_keys=True))' "$config" 2>/dev/null || true)
if [ "$wanted" != "$current" ]; then
  mkdir -p "$(dirname "$config")"
  printf '%s\n' "$wanted" > "$config.director-tmp"
  mv "$config.director-tmp" "$config"
  echo "register-runsc: runsc registered in $config" >&2
fi
if ! listed; then
  pid=$(pidof dockerd || true)
  [ -n "$pid" ] || { echo "register-runsc: dockerd is not running" >&2; exit 1; }
  kill -HUP "$pid"
  for _ in $(seq 1 50); do
    listed && break
    sleep 0.2
  done
fi
listed || { echo "register-runsc: the engine does not list runsc after a reload of $config" >&2; exit 1; }
echo "register-runsc: the engine lists runsc" >&2
