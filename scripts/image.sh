#!/usr/bin/env bash
# Builds the clusterset-dns image with buildah from the Dockerfile, no registry
# needed: a static musl binary (cargo), the file capability on it (setcap), a
# passwd/group and the CA bundle, in target/image/rootfs, then `buildah bud`.
#
# usage: scripts/image.sh [--context-only] [TAG]      (TAG default: clusterset-dns:latest)
#
# Environment:
#   IMAGE_PROFILE   cargo profile of the binary: release (default) or dev
#                   (tests/it/image.rs: a debug build is quicker to make)
#   IMAGE_LABEL     an extra KEY=VALUE label on the image (the test's cleanup)
#
# Needs musl-tools (musl-gcc, for ring's C parts), libcap2-bin (setcap),
# buildah, ca-certificates and the Rust target x86_64-unknown-linux-musl;
# scripts/test.sh installs them. Prints the image's size on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
context_only=0
if [ "${1:-}" = --context-only ]; then context_only=1; shift; fi
tag="${1:-clusterset-dns:latest}"
profile="${IMAGE_PROFILE:-release}"
target=x86_64-unknown-linux-musl

for tool in musl-gcc setcap; do
  command -v "$tool" >/dev/null || { echo "image: $tool not found (apt-get install musl-tools libcap2-bin)" >&2; exit 1; }
done
[ -f /etc/ssl/certs/ca-certificates.crt ] || { echo "image: no CA bundle (apt-get install ca-certificates)" >&2; exit 1; }
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

# Debug info stripped: the image carries the binary only (symbols stay, for
# backtraces and profilers).
case "$profile" in
  release) dir=release; export CARGO_PROFILE_RELEASE_STRIP=debuginfo ;;
  dev) dir=debug; export CARGO_PROFILE_DEV_STRIP=debuginfo ;;
  *) echo "image: IMAGE_PROFILE must be release or dev, not $profile" >&2; exit 1 ;;
esac
cargo build --locked --profile "$profile" --target "$target" --bin clusterset-dns

ctx=target/image
rm -rf "$ctx"
mkdir -p "$ctx/rootfs/etc/ssl/certs"
cp "target/$target/$dir/clusterset-dns" "$ctx/rootfs/clusterset-dns"
setcap cap_net_bind_service=+ep "$ctx/rootfs/clusterset-dns"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/rootfs/etc/group"
cp /etc/ssl/certs/ca-certificates.crt "$ctx/rootfs/etc/ssl/certs/"
if [ "$context_only" -eq 1 ]; then echo "$ctx"; exit 0; fi

command -v buildah >/dev/null || { echo "image: buildah not found (apt-get install buildah)" >&2; exit 1; }
labels=(--label "org.opencontainers.image.version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)")
[ -z "${IMAGE_LABEL:-}" ] || labels+=(--label "$IMAGE_LABEL")
# chroot isolation: no container runtime is needed for a build without RUN steps.
buildah bud --isolation chroot --pull=never --layers=false "${labels[@]}" -t "$tag" -f Dockerfile "$ctx" >&2
size=$(buildah inspect --type image --format '{{.Docker.Size}}' "$tag" 2>/dev/null || true)
echo "image: $tag built ($(du -sh "$ctx/rootfs/clusterset-dns" | cut -f1) binary)"
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$tag" 2>/dev/null || echo "$tag $size"
