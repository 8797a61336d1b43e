#!/usr/bin/env bash
# Builds the director's image without pulling a base image (there is no registry here):
# a root filesystem with the binary, git, the libraries they link (found with ldd), CA
# certificates, and a passwd/group naming the non-root user 65532, no shell; then
# `docker import` with the same user, entry point and command as the Dockerfile's.
#   tests/image/build-local.sh BINARY TAG
set -euo pipefail
binary="$1"
tag="$2"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$binary" "$root/usr/local/bin/director"
# Debug information stays out of the image when binutils is at hand.
if command -v strip >/dev/null 2>&1; then strip "$root/usr/local/bin/director"; fi
# The dynamic loader and every shared library, at the paths the binary asks for.
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u | while read -r lib; do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
# git, which the gateway checks pushes with: Debian's git and its HTTP helper, and what they
# link (no shell: the director gives git its credentials in a header, not a helper script).
for prog in /usr/bin/git /usr/lib/git-core/git-remote-http; do
  install -D -m 0755 "$prog" "$root$prog"
  ldd "$prog" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u | while read -r lib; do
    [ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
  done
done
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
mkdir -p "$root/etc" "$root/tmp" "$root/data" "$root/etc/director"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
chown 65532:65532 "$root/data"
tar --numeric-owner -C "$root" -c . | docker import \
  --change 'USER 65532:65532' \
  --change 'WORKDIR /data' \
  --change 'EXPOSE 8080' \
  --change 'ENV MALLOC_ARENA_MAX=2' \
  --change 'ENTRYPOINT ["/usr/local/bin/director"]' \
  --change 'CMD ["serve", "--config", "/etc/director/director.toml"]' \
  - "$tag" >/dev/null
echo "$tag"
