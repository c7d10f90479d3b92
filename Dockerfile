# syntax=docker/dockerfile:1
#
# clusterset-dns: a static binary on distroless, running as non-root.
#
#   docker build -t clusterset-dns .         # or: buildah bud -t clusterset-dns .
#   docker run --rm -p 1053:53/udp -p 1053:53/tcp clusterset-dns
#   dig @127.0.0.1 -p 1053 web.shop.svc.clusterset.local A +short   # 10.42.0.10
#
# Without arguments it serves the embedded example fleet (zones/) on port 53;
# deploy/base/ runs it with `serve --in-cluster ...`.
#
# Static musl, not static glibc: the runtime image has no libc at all. A
# glibc binary linked with crt-static still loads NSS modules with dlopen()
# for getaddrinfo() (a kubeconfig that names its API server by host name),
# and those are not in the image; musl resolves names itself from
# /etc/resolv.conf. ring (rustls' crypto, through kube) has C and assembly
# parts, compiled with musl-gcc from Debian's musl-tools. The query path
# allocates nothing, so musl's slower malloc does not touch it.
#
# Port 53 as a non-root user: the binary carries the file capability
# cap_net_bind_service+ep, as CoreDNS's image does. In Kubernetes a capability
# added to a container that does not run as root reaches only its bounding
# set; a plain binary started as uid 65532 gets no capability from it. The
# file capability is granted at exec when the container may have
# NET_BIND_SERVICE (deploy/base: drop ALL, add NET_BIND_SERVICE; Docker and
# containerd allow it by default), also with allowPrivilegeEscalation: false.
# A container without NET_BIND_SERVICE cannot exec the binary at all
# ("operation not permitted"), whatever port it listens on.
#
# Verified on Debian 12 (x86_64, kernel 6.18, Rust 1.95.0, 2 cores), with no
# registry reachable (registry-1.docker.io and gcr.io do not resolve here):
#   - `buildah bud .` (buildah 1.28.2 from Debian) stops at the first FROM:
#     "pinging container registry registry-1.docker.io: ... no such host".
#   - The same `cargo build --release --locked --target
#     x86_64-unknown-linux-musl` on the host, with musl-tools, builds a
#     static-pie binary (`ldd`: "statically linked"); `serve --listen
#     127.0.0.1:PORT` answers `dig ... web.shop.svc.clusterset.local A +short`
#     with 10.42.0.10 over UDP and TCP; /health and /ready answer 200.
#     (Rechecked at the commit that made recvmmsg's flags argument portable:
#     c_uint on musl, c_int on glibc.)
#   - With stand-ins tagged with the two FROM names (Debian bookworm from
#     debootstrap plus rustup 1.95.0 as the official rust:slim image does;
#     scratch plus passwd/group with nonroot 65532 and a CA bundle for
#     distroless), `buildah bud --isolation chroot --pull=never .` of this
#     file builds the image (15 MB; cargo 14 min on 2
#     busy cores) and the file capability survives COPY --from. Run with
#     podman/runc as Kubernetes runs deploy/base (--user 65532:65532
#     --cap-drop ALL --cap-add NET_BIND_SERVICE --security-opt
#     no-new-privileges --read-only, default seccomp) it serves port 53:
#     dig gets 10.42.0.10. With --cap-drop ALL alone: "exec /clusterset-dns:
#     operation not permitted", on any port. The default CMD serves too.
#   - Kubernetes' CRI (unlike podman) sets no ambient capabilities: emulating
#     runc's sequence for it (bounding and permitted = NET_BIND_SERVICE,
#     no ambient, uid 65532, no_new_privs), the binary without the file
#     capability fails with "Permission denied" on port 53; with it, it serves.
#
# Not verified (no registry, no container engine daemon, no kubelet):
#   - the real base images: the rust:1.95-slim-bookworm tag, what
#     distroless/static-debian12:nonroot contains; pin them by digest when
#     publishing;
#   - Docker/BuildKit (only buildah ran this file), and other architectures
#     (the target is x86_64 only);
#   - a pod actually running on a kubelet with containerd or CRI-O.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
# The registry and target directories are build caches, kept between builds
# by BuildKit and buildah; the binary is copied out of the cache in the same step.
# Debug info is stripped (about 59 MB -> 15 MB); symbols stay, for backtraces
# and profilers.
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target x86_64-unknown-linux-musl --bin clusterset-dns \
 && cp target/x86_64-unknown-linux-musl/release/clusterset-dns /clusterset-dns
RUN setcap cap_net_bind_service=+ep /clusterset-dns

# Distroless static: no shell, no libc, CA certificates, user nonroot (65532).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /clusterset-dns /clusterset-dns
USER 65532:65532
EXPOSE 53/udp 53/tcp 9153/tcp
ENTRYPOINT ["/clusterset-dns"]
CMD ["serve", "--listen", "0.0.0.0:53", "--http-listen", "0.0.0.0:9153"]
