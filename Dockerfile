# The director's image: build, then a minimal runtime with the binary and the C runtime it
# links, running as a numeric non-root user, with no shell.
#   docker build -t director .
# (No registry on your machine? tests/image/build-local.sh builds an equivalent image from a
# binary built here.)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The service only (the workspace's other packages are its test kit, demo and benchmarks):
# Forgejo and GitHub, Docker and Kubernetes runtimes.
RUN cargo build --release --locked --features github,kubernetes --bin director \
 && cp target/release/director /director
# git, which the git gateway checks pushes with: Debian's git and its HTTP helper with the
# libraries they link, at their own paths (the runtime image is Debian 12 too; no shell).
RUN mkdir -p /gitfs && for prog in /usr/bin/git /usr/lib/git-core/git-remote-http; do \
      install -D -m 0755 "$prog" "/gitfs$prog"; \
      ldd "$prog" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do \
        [ -e "/gitfs$lib" ] || install -D -m 0644 "$(readlink -f "$lib")" "/gitfs$lib"; \
      done; \
    done

# glibc, libgcc, CA certificates, /etc/passwd with `nonroot` (65532); no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /director /usr/local/bin/director
COPY --from=build /gitfs/ /
USER 65532:65532
# Two malloc arenas: glibc's default (eight per core) keeps freed memory in each thread's arena;
# a first start over 10,000 labelled issues peaks at 53 MB with two, 70 MB without
# (bench/backlog.sh).
ENV MALLOC_ARENA_MAX=2
WORKDIR /data
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/director"]
CMD ["serve", "--config", "/etc/director/director.toml"]
