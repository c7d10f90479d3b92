#!/usr/bin/env bash
# Runs every test of clusterset-dns on a fresh Debian machine, installing
# what the tests need first: formatting and lint gates, unit tests, the
# over-the-wire suite (real sockets, real `dig` and `nslookup`), the
# Kubernetes suite against real kube-apiservers and etcd (built from the Go
# module proxy with the machine's Go, cached under ~/.cache/clusterset-dns),
# and a bounded fuzzing run of each fuzz target (fuzz/README.md).
#
# usage: scripts/test.sh            everything
#        FUZZ_SECONDS=N scripts/test.sh   fuzz each target N seconds (default 45;
#                                         CI=true: at least 45)
#        FUZZ_SECONDS=0 scripts/test.sh   skip the fuzzing run (local use only;
#                                         CI=true always fuzzes)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n=== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fuzz_seconds=${FUZZ_SECONDS:-45}
if [ "${CI:-}" = true ] && [ "$fuzz_seconds" -lt 45 ]; then fuzz_seconds=45; fi

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
  say "fuzzing each target for ${fuzz_seconds}s"
  command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
  # One build for every target: they share all their dependencies. Stable
  # Rust, so no sanitizer; the targets' own assertions are the oracle.
  cargo fuzz build --sanitizer none 2>&1 | { grep -Ev "^ +(Compiling|Downloaded|Downloading)" || true; } | tail -5
  for target in query structured differential objects; do
    # New inputs go to the first directory; the committed seeds are read only.
    mkdir -p "fuzz/target/corpus/$target"
    log="fuzz/target/fuzz-$target.log"
    args=(-max_total_time="$fuzz_seconds" -max_len=4096 -print_final_stats=1)
    [ "$target" = objects ] && args+=(-dict=fuzz/objects.dict)
    if ! cargo fuzz run "$target" --sanitizer none "fuzz/target/corpus/$target" "fuzz/seeds/$target" -- \
      "${args[@]}" >"$log" 2>&1; then
      tail -40 "$log"
      echo "fuzzing: $target failed; reproduce with cargo fuzz run $target --sanitizer none <the crash file above>" >&2
      exit 1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    echo "fuzzing: $target: no crash in ${fuzz_seconds}s, $execs runs, $rate/s"
  done
fi
say "all tests passed"
