#!/usr/bin/env bash
# Builds the image of one real agent for the end-to-end tests, without a registry: a Debian
# root filesystem from Debian's packages (mmdebstrap), the agent from PyPI in a venv, the
# examples' entrypoint, then `docker import`. Prints the image's tag. Cached: the root
# filesystem by its package list, the image by the content of everything that makes it.
#
#   tests/agents/build.sh claude-code|aider|mini-swe-agent
set -euo pipefail
agent=${1:?an agent: claude-code, aider or mini-swe-agent}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${DIRECTOR_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/director-agents}
mkdir -p "$cache"

# Pinned as the examples pin them.
case "$agent" in
  claude-code) packages="claude-agent-sdk==0.2.189" ;;
  aider) packages="aider-chat==0.86.2" ;;
  mini-swe-agent) packages="mini-swe-agent==2.4.6" ;;
  *) echo "build.sh: unknown agent $agent" >&2; exit 2 ;;
esac
debs="git,ca-certificates,python3,python3-venv,procps"
entrypoint="$repo/examples/entrypoint/director-entrypoint.sh"
profile="$repo/examples/$agent/image.env"

key=$(cat "$0" "$entrypoint" "$profile" <(echo "$packages $debs") | sha256sum | cut -c1-16)
tag="director-test-$agent:$key"
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"
  exit 0
fi

if ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "build.sh: installing mmdebstrap" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >&2
fi
base="$cache/base-$(echo "$debs" | sha256sum | cut -c1-12).tar"
if [ ! -s "$base" ]; then
  echo "build.sh: a Debian root filesystem ($debs)" >&2
  # mmdebstrap tells the output's format by its name: a tar.
  part="$cache/.base-$$.tar"
  mmdebstrap --quiet --variant=minbase --include="$debs" bookworm "$part" http://deb.debian.org/debian >&2
  mv "$part" "$base"
fi

root=$(mktemp -d "$cache/root-$agent.XXXXXX")
trap 'rm -rf "$root"' EXIT
tar -xf "$base" -C "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
echo "build.sh: $packages into /opt/venv" >&2
chroot "$root" python3 -m venv /opt/venv
# The wheels are fetched by this machine's pip (its configuration reaches the package index,
# certificates included) and kept: a rebuild after a change of the entrypoint fetches
# nothing. The root filesystem's pip installs them offline; both are CPython 3.11 on glibc.
wheels=${DIRECTOR_AGENT_WHEELS:-$cache/wheels-$agent}
mkdir -p "$wheels"
platforms=()
for minor in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --python-version 3.11.2 "${platforms[@]}" --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform linux_x86_64 --platform any \
  --dest "$wheels" $packages >&2
mkdir -p "$root/wheels"
cp "$wheels"/* "$root/wheels/"
chroot "$root" /opt/venv/bin/pip install --quiet --disable-pip-version-check \
  --no-index --find-links /wheels $packages >&2
rm -rf "$root/wheels"
if [ "$agent" = claude-code ]; then
  # The CLI the SDK bundles: Claude Code itself, unmodified.
  bundled=$(find "$root/opt/venv/lib" -path '*claude_agent_sdk/_bundled/claude' -type f | head -n 1)
  ln -s "${bundled#"$root"}" "$root/usr/local/bin/claude"
fi
install -m 0755 "$entrypoint" "$root/usr/local/bin/director-entrypoint"
echo "agent:x:1000:1000::/workspace:/bin/sh" >> "$root/etc/passwd"
echo "agent:x:1000:" >> "$root/etc/group"
mkdir -p "$root/workspace"
chown 1000:1000 "$root/workspace"
: > "$root/etc/resolv.conf"
rm -rf "$root/var/cache/apt" "$root/var/lib/apt/lists" "$root/root/.cache"

changes=(--change 'ENTRYPOINT ["/usr/local/bin/director-entrypoint"]'
  --change 'USER 1000:1000' --change 'WORKDIR /workspace'
  --change 'ENV PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin')
# The profile's variables, as the example's Dockerfile sets them.
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  changes+=(--change "ENV $line")
done < "$profile"
tar -C "$root" -c . | docker import "${changes[@]}" - "$tag" >/dev/null
echo "$tag"
