# clusterset-dns: the static (musl) binary on an empty base, running as
# non-root. Nothing is pulled from a registry.
#
#   scripts/image.sh                     # builds the binary and the context, then
#                                        # buildah bud -f Dockerfile target/image
#   podman run --rm --network host clusterset-dns serve --listen 127.0.0.1:1053
#   dig @127.0.0.1 -p 1053 web.shop.svc.clusterset.local A +short   # 10.42.0.10
#
# The build context is target/image/, made by scripts/image.sh (docker users:
# `scripts/image.sh --context-only`, then `docker build -f Dockerfile
# target/image`): rootfs/ holds
#   /clusterset-dns                     cargo build --target x86_64-unknown-linux-musl,
#                                       with the file capability cap_net_bind_service+ep
#   /etc/passwd, /etc/group             root and nonroot (65532), as distroless has
#   /etc/ssl/certs/ca-certificates.crt  the build machine's CA bundle (Debian's
#                                       ca-certificates), for API servers with public certificates
#
# Static musl, not static glibc: the image has no libc at all. A glibc binary
# linked with crt-static still loads NSS modules with dlopen() for
# getaddrinfo() (a kubeconfig that names its API server by host name); musl
# resolves names itself from /etc/resolv.conf. The query path allocates
# nothing, so musl's slower malloc does not touch it.
#
# Port 53 as a non-root user: the binary carries the file capability
# cap_net_bind_service+ep, as CoreDNS's image does (COPY keeps it: buildah and
# BuildKit copy extended attributes). A capability added to a container that
# does not run as root reaches only its bounding set; the file capability is
# granted at exec when the container may have NET_BIND_SERVICE (deploy/ and
# the chart: drop ALL, add NET_BIND_SERVICE; Docker, containerd and podman
# allow it by default), also with allowPrivilegeEscalation: false. A container
# without NET_BIND_SERVICE cannot exec the binary at all ("operation not
# permitted"), whatever port it listens on.
#
# tests/it/image.rs builds this with Debian's buildah and runs it with podman
# and runc: non-root, read-only root file system, every capability dropped but
# NET_BIND_SERVICE, dig answered on port 53; and without NET_BIND_SERVICE it
# does not start.
FROM scratch
COPY rootfs/ /
USER 65532:65532
EXPOSE 53/udp 53/tcp 9153/tcp
ENTRYPOINT ["/clusterset-dns"]
# Without arguments: the embedded example fleet (zones/) on port 53. deploy/
# and the chart run `serve --in-cluster ...` or `sync ...`.
CMD ["serve", "--listen", "0.0.0.0:53", "--http-listen", "0.0.0.0:9153"]
