#!/usr/bin/env bash
# Runs every test of clusterset-dns on a fresh Debian machine, installing
# what the tests need first: formatting and lint gates, unit tests, the
# over-the-wire suite (real sockets, real `dig` and `nslookup`), the
# Kubernetes suite against real kube-apiservers and etcd (built from the Go
# module proxy with the machine's Go, cached under ~/.cache/clusterset-dns),
# and a bounded fuzzing run of the query path.
#
# usage: scripts/test.sh            everything
#        FUZZ_SECONDS=0 scripts/test.sh   skip the fuzzing run (local use only;
#                                         CI=true always fuzzes)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n=== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fuzz_seconds=${FUZZ_SECONDS:-60}
if [ "${CI:-}" = true ] && [ "$fuzz_seconds" -lt 60 ]; then fuzz_seconds=60; fi

say "tools"
need_apt=()
command -v dig >/dev/null || need_apt+=(bind9-dnsutils)
command -v nslookup >/dev/null || need_apt+=(bind9-dnsutils)
command -v cc >/dev/null || need_apt+=(build-essential)
command -v curl >/dev/null || need_apt+=(curl)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v ss >/dev/null || need_apt+=(iproute2)
command -v flock >/dev/null && command -v setpriv >/dev/null || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "installing ${need_apt[*]} (Debian packages)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
cargo --version; dig -v 2>&1 | sed -n 1p
# The cluster tests need Go (to build kube-apiserver and etcd) and kubectl;
# both come with this project's machine image. Missing means failing, not skipping.
command -v go >/dev/null || { echo "go not found: the Kubernetes tests build kube-apiserver and etcd with it" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "kubectl not found: the Kubernetes tests install CRDs with it" >&2; exit 1; }
go version; kubectl version --client 2>/dev/null | sed -n 1p

say "real Kubernetes components (a cold build takes ~5-10 min, then cached)"
scripts/k8s-bins.sh etcd kube-apiserver coredns

say "format and lints"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings

say "tests (unit, over-the-wire, allocation)"
cargo test --all-targets --locked

if [ "$fuzz_seconds" -gt 0 ]; then
  say "fuzzing the query path for ${fuzz_seconds}s"
  command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
  mkdir -p fuzz/target/corpus
  # New inputs go to the first directory; the committed seeds are read only.
  cargo fuzz run query --sanitizer none fuzz/target/corpus fuzz/seeds/query -- \
    -max_total_time="$fuzz_seconds" -max_len=1500 -print_final_stats=1 2>&1 | grep -v "^   Compiling" | tail -40
  echo "fuzzing: no crash in ${fuzz_seconds}s"
fi
say "all tests passed"
