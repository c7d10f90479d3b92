#!/usr/bin/env bash
# Runs every test of clusterset-dns on a fresh Debian machine, installing
# what the tests need first (only rustup is assumed): formatting and lint
# gates, unit tests, the over-the-wire suite (real sockets, real `dig` and
# `nslookup`), the Kubernetes suite against real kube-apiservers and etcd,
# the Helm chart (helm, kubectl), the container image (buildah, podman, runc)
# and a bounded fuzzing run of each fuzz target (fuzz/README.md).
#
# Installed when missing: Debian packages (apt-get), a Go toolchain >= 1.24
# (the golang.org/toolchain module, through Debian's go), and kube-apiserver,
# etcd, CoreDNS, kubectl and helm built from the Go module proxy
# (scripts/k8s-bins.sh); everything built is cached under ~/.cache/clusterset-dns.
#
# usage: scripts/test.sh            everything
#        scripts/test.sh --quick    the inner loop (CONTRIBUTING.md): formatting,
#                                   clippy, unit tests, the over-the-wire tests
#                                   that need no Kubernetes, tidy, alloc and the
#                                   footprint budget; installs only dig and a C
#                                   compiler. CI always runs everything.
#        FUZZ_SECONDS=N scripts/test.sh   fuzz each target N seconds (default 45;
#                                         CI=true: at least 45)
#        FUZZ_SECONDS=0 scripts/test.sh   skip the fuzzing run (local use only;
#                                         CI=true always fuzzes)
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n=== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fuzz_seconds=${FUZZ_SECONDS:-45}
quick=false
case "${1:-}" in
  --quick) quick=true ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 64 ;;
esac
if [ "${CI:-}" = true ] && $quick; then
  echo "CI runs everything: --quick is for the inner loop" >&2; exit 64
fi

# The modules of tests/it that start our own server in process or as the
# binary on loopback and need nothing else but dig and nslookup: no
# Kubernetes component, no root, no container tools. The rest of tests/it
# runs real clusters, CoreDNS, kube-proxy, Helm or podman.
QUICK_IT=(abuse binary client conformance contract dig_debug hostile interop metrics
  policy readiness reverse same_name supervise transfer)

# The fuzz crate has a lock file of its own (it depends on this crate by
# path): a dependency changed here without `cargo update -w` in fuzz/ would
# make the fuzz build rewrite it, and the run end with a changed checkout.
# Said at once, with the fix, instead of after the whole run.
fuzz_lock_current() {
  if ! (cd fuzz && cargo metadata --locked --format-version 1 >/dev/null 2>&1); then
    echo "fuzz/Cargo.lock is not current: run (cd fuzz && cargo update -w) and commit it" >&2
    exit 1
  fi
}

if $quick; then
  start=$SECONDS
  say "quick: tools"
  need_apt=()
  command -v dig >/dev/null && command -v nslookup >/dev/null || need_apt+=(bind9-dnsutils)
  command -v cc >/dev/null || need_apt+=(build-essential)
  if [ ${#need_apt[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
  say "quick: format and lints"
  cargo fmt --check
  fuzz_lock_current
  cargo clippy --all-targets --locked --features fakes -- -D warnings
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --document-private-items
  say "quick: unit, tidy, alloc and over-the-wire tests without Kubernetes"
  filters=()
  for m in "${QUICK_IT[@]}"; do filters+=("$m::"); done
  cargo test --locked --lib --bins --test tidy --test alloc
  cargo test --locked --test it -- "${filters[@]}"
  say "quick: footprint budget"
  cargo test --locked --bench footprint
  say "quick: passed in $((SECONDS - start)) s (scripts/test.sh runs everything)"
  exit 0
fi
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
# The image (scripts/image.sh, tests/it/image.rs).
command -v musl-gcc >/dev/null || need_apt+=(musl-tools)
command -v setcap >/dev/null || need_apt+=(libcap2-bin)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
command -v buildah >/dev/null || need_apt+=(buildah)
command -v podman >/dev/null || need_apt+=(podman)
command -v runc >/dev/null || need_apt+=(runc)
# The data-path fleet (scripts/dataplane.sh, tests/it/dataplane.rs): kube-proxy runs
# nft; the Pods' servers and clients are python3.
command -v nft >/dev/null || need_apt+=(nftables)
command -v python3 >/dev/null || need_apt+=(python3)
# A replica's wall clock stepped while its monotonic clock runs on
# (tests/it/sync_clock.rs): libfaketime.
dpkg -s libfaketime >/dev/null 2>&1 || need_apt+=(libfaketime)
# scripts/conformance.sh by hand (not run here): its Pods' programs come from the host.
command -v socat >/dev/null || need_apt+=(socat)
command -v nc >/dev/null || need_apt+=(netcat-openbsd)
# Go >= 1.24 builds the Kubernetes parts; Debian's go only fetches that toolchain.
CACHE="${CLUSTERSET_DNS_CACHE:-$HOME/.cache/clusterset-dns}"
GO_TOOLCHAIN=go1.24.13
go_ok() { # go_ok GO: GO is 1.24 or newer
  local v; v="$("$1" env GOVERSION 2>/dev/null)" || return 1
  [[ "$v" =~ ^go1\.([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 24 ]
}
if [ -x "$CACHE/go/bin/go" ] && ! go_ok go; then export PATH="$CACHE/go/bin:$PATH"; fi
if ! go_ok go && ! command -v go >/dev/null; then need_apt+=(golang-go); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "installing ${need_apt[*]} (Debian packages)"
  start=$SECONDS
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
  echo "installed in $((SECONDS - start)) s"
fi
if ! go_ok go; then
  # The toolchain the go command itself would switch to (GOTOOLCHAIN), as a
  # module: any go can download it; it lands unpacked in the module cache.
  echo "go $(go env GOVERSION 2>/dev/null) is older than 1.24: fetching $GO_TOOLCHAIN"
  root="$(go mod download -json "golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$(go env GOARCH)" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -f "$root/bin/go" ] || { echo "could not fetch $GO_TOOLCHAIN" >&2; exit 1; }
  # The module cache keeps no executable bits; the go command sets them too.
  chmod +x "$root"/bin/* "$root"/pkg/tool/*/*
  ln -sfn "$root" "$CACHE/go"
  export PATH="$CACHE/go/bin:$PATH"
  go_ok go || { echo "$CACHE/go/bin/go does not run" >&2; exit 1; }
fi
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
cargo --version; dig -v 2>&1 | sed -n 1p
go version

say "real Kubernetes components (a cold build takes ~20 min on 2 cores, then cached)"
# kube-scheduler, kube-controller-manager and kwok: test clusters that run pods
# (TestClusters::start_with_nodes, CLUSTERS_NODES=1); kube-proxy: the data-path
# tests (tests/it/dataplane.rs).
scripts/k8s-bins.sh etcd kube-apiserver kube-scheduler kube-controller-manager kwok kube-proxy coredns helm
# kubectl: the machine's, else one built from the same release as kube-apiserver.
if ! command -v kubectl >/dev/null; then
  export PATH="$(scripts/k8s-bins.sh kubectl | tail -1):$PATH"
fi
kubectl version --client 2>/dev/null | sed -n 1p

say "format and lints"
cargo fmt --check
fuzz_lock_current
cargo clippy --all-targets --locked --features fakes -- -D warnings
# The docs a next engineer reads: every link resolves, private items too.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --document-private-items

say "dependencies (cargo deny: duplicate versions, licenses, sources, advisories)"
# deny.toml says what is allowed and why. Built once from crates.io (7.5 min
# on 2 busy cores), cached by version.
DENY_VERSION=0.20.2
deny="$CACHE/cargo-deny-$DENY_VERSION/bin/cargo-deny"
if [ ! -x "$deny" ]; then
  cargo install cargo-deny --locked --version "$DENY_VERSION" --root "$CACHE/cargo-deny-$DENY_VERSION" 2>&1 | tail -1
fi
"$deny" --locked check bans licenses sources
# Advisories need the RustSec database, a git repository on github.com,
# kept under ~/.cargo/advisory-dbs. A copy fetched before still serves while
# it is within 90 days (cargo deny's limit: older, the check fails). With
# no copy at all (github.com unreachable from a fresh machine), the run
# says loudly that advisories went unchecked instead of failing on the
# network.
timeout 120 "$deny" fetch db >/dev/null 2>&1 ||
  echo "cargo deny: the RustSec advisory database could not be fetched (github.com unreachable?)"
if compgen -G "${CARGO_HOME:-$HOME/.cargo}/advisory-dbs/advisory-db-*/.git" >/dev/null; then
  "$deny" --locked --offline check advisories
else
  echo "cargo deny: ADVISORIES NOT CHECKED: no copy of the RustSec database on this machine" >&2
fi

say "tests (unit, over-the-wire, allocation)"
# The image test builds a static release binary: minutes of both cores. Run
# beside the rest it starved the real API servers past the tests' read bounds,
# so it runs alone afterwards. `image::` names only tests/it/image.rs. The
# benches (criterion, no libtest: they take no --skip) run once each in test
# mode on their own line. `--features fakes` on every line: the sync_events
# bench needs the fake members, and one feature set builds the crate once.
cargo test --lib --bins --tests --locked --features fakes -- --skip image::
cargo test --benches --locked --features fakes
say "tests (the container image)"
cargo test --locked --features fakes --test it -- image::

if [ "$fuzz_seconds" -gt 0 ]; then
  say "fuzzing each target for ${fuzz_seconds}s"
  command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
  # One build for every target: they share all their dependencies. Stable
  # Rust, so no sanitizer; the targets' own assertions are the oracle.
  cargo fuzz build --sanitizer none 2>&1 | { grep -Ev "^ +(Compiling|Downloaded|Downloading)" || true; } | tail -5
  for target in query structured differential objects protobuf; do
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
# A test run must leave the checkout as it found it: a stale lock file that
# a build rewrote, or a test writing into the tree, shows here.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  changed="$(git status --porcelain)"
  if [ -n "$changed" ]; then
    echo "the test run changed the checkout:" >&2
    echo "$changed" >&2
    git diff --stat >&2
    exit 1
  fi
fi
say "all tests passed"
