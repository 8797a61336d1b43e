#!/usr/bin/env bash
# What gVisor costs a run, beside runc: a container's start to its first command's end (with a
# run's hardening and its task volume), and a clone of a repository over HTTP from inside it.
# Each measured N times (default 10) per runtime; prints the median and the slowest, in ms.
#
#   bench/runtime-cost.sh [N]      (needs Docker, runsc registered: tests/runtimes/register-runsc.sh)
#
# The image is the sandbox tests' (busybox, this machine's git and curl); the repository is a
# copy of this one's last 200 commits, served by `git http-backend` behind Python's CGI server.
set -euo pipefail
n=${1:-10}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -n "${server:-}" ] && kill "$server" 2>/dev/null || true' EXIT

# The image, as tests/api/sandbox.rs builds it.
ctx="$work/ctx"; mkdir -p "$ctx/rootfs/bin"
cp /bin/busybox "$ctx/rootfs/bin/busybox"
for f in /usr/bin/git /usr/lib/git-core/git-remote-http /usr/bin/curl \
  $(ldd /usr/bin/git /usr/lib/git-core/git-remote-http /usr/bin/curl | awk '/=>/ {print $3} /^\t\// {print $1}' | sort -u); do
  mkdir -p "$ctx/rootfs$(dirname "$f")"; cp -L "$f" "$ctx/rootfs$f"
done
printf 'FROM scratch\nCOPY rootfs/ /\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n' > "$ctx/Dockerfile"
image=director-bench-runtime:latest
docker build -q -t "$image" "$ctx" >/dev/null 2>&1

# The repository, served over HTTP on the default bridge's host address.
git clone -q --bare --depth 200 "file://$here" "$work/srv/repo.git"
mkdir -p "$work/srv/cgi-bin"
cat > "$work/srv/cgi-bin/git" <<'CGI'
#!/bin/sh
export GIT_PROJECT_ROOT="$(dirname "$0")/.." GIT_HTTP_EXPORT_ALL=1
exec git http-backend
CGI
chmod +x "$work/srv/cgi-bin/git"
port=$((20000 + RANDOM % 20000))
(cd "$work/srv" && exec python3 -W ignore -m http.server --cgi --bind 0.0.0.0 "$port" >/dev/null 2>&1) &
server=$!
bridge=$(ip -4 -o addr show docker0 | awk '{print $4}' | cut -d/ -f1)
url="http://$bridge:$port/cgi-bin/git/repo.git"
sleep 1

hardening=(--user 1000:1000 --read-only --cap-drop ALL --security-opt no-new-privileges
  --tmpfs /tmp:rw,nosuid,nodev,exec,size=256m --tmpfs /workspace:rw,nosuid,nodev,size=1024m,uid=1000,gid=1000
  --memory 1g --pids-limit 512 --mount type=volume,target=/task -w /workspace -e HOME=/workspace)

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
stats() { sort -n | awk '{a[NR]=$1} END {printf "median %d ms, slowest %d ms (of %d)\n", a[int((NR+1)/2)], a[NR], NR}'; }

for runtime in runc runsc; do
  for _ in $(seq "$n"); do
    t=$(date +%s%N); docker run --rm --runtime "$runtime" "${hardening[@]}" "$image" true; ms "$t"
  done | stats | sed "s/^/start  $runtime: /"
  for _ in $(seq "$n"); do
    t=$(date +%s%N)
    docker run --rm --runtime "$runtime" "${hardening[@]}" "$image" git clone -q "$url" repo 2>/dev/null
    ms "$t"
  done | stats | sed "s/^/clone  $runtime: /"
done
