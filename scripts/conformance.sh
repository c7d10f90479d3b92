#!/usr/bin/env bash
# The official MCS API conformance suite (kubernetes-sigs/mcs-api, conformance/:
# Ginkgo specs labelled Required/Optional) against `clusterset-dns sync` on two
# real clusters that run pods (scripts/clusters.sh with CLUSTERS_NODES=1).
#
# Usage: scripts/conformance.sh [OUT_DIR]
#
# Steps: get the suite's source at the pinned commit, build it with `go test -c`
# (cached under $CLUSTERSET_DNS_CACHE/bin), start two clusters with nodes, run
# `clusterset-dns sync --cluster cluster-1=… --cluster cluster-2=…` (the sync
# identity of deploy/sync/rbac.yaml), run the suite with contexts
# cluster-1,cluster-2 of the clusters' kubeconfig, and print one line per spec:
#
#   RESULT passed|failed|skipped|pending <labels> | <spec text>
#
# then "SUMMARY passed=P failed=F skipped=S". The JUnit report, the suite's own
# report.html and report.yaml, its output and the sync log stay in OUT_DIR
# (default: a new temporary directory).
# Exit 0: every spec that ran passed; 1: some failed; 2: the suite could not run.
#
# Where the suite comes from, in order:
#   MCS_API_DIR            a checkout of github.com/kubernetes-sigs/mcs-api (its
#                          conformance/ directory is built as is; the commit is
#                          checked when it is a git checkout)
#   the Go module proxy    sigs.k8s.io/mcs-api/conformance at the pseudo-version of
#                          MCS_API_COMMIT (conformance/ has no tags of its own)
#   git clone              https://github.com/kubernetes-sigs/mcs-api at MCS_API_COMMIT
# None of it is copied into this repository.
#
# Not run by default (CONFORMANCE_LABELS, CONFORMANCE_SKIP): the specs that exec
# into a request pod (labels DNS and Connectivity, and the Required "Connectivity
# to a service that is not exported should be inaccessible", which ignores exec
# errors and so would pass without checking anything): KWOK pods run no
# containers, so `kubectl exec` has nowhere to go. CONFORMANCE.md says more.
#
# Environment:
#   MCS_API_COMMIT       pinned mcs-api commit (default below)
#   CONFORMANCE_LABELS   Ginkgo label filter (default '!DNS && !Connectivity')
#   CONFORMANCE_SKIP     Ginkgo --skip regex on spec texts (default: the spec above)
#   CLUSTERSET_DNS_BIN   the clusterset-dns binary (default: `cargo build`, then
#                        target/debug/clusterset-dns)
#   CONFORMANCE_PARENT_PID  stop everything when this process is gone (default: the
#                        parent of this script)
#   CLUSTERSET_DNS_CACHE, GO, K8S_VERSION, ...: as for scripts/k8s-bins.sh
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
MCS_API_COMMIT="${MCS_API_COMMIT:-ded161af6ea9596cd9e878c61ed4f4e8d5cf8401}"
# The Go pseudo-version of that commit (its committer time in UTC).
MCS_API_PSEUDO="${MCS_API_PSEUDO:-v0.0.0-20260507113920-ded161af6ea9}"
LABELS="${CONFORMANCE_LABELS:-!DNS && !Connectivity}"
SKIP="${CONFORMANCE_SKIP:-Connectivity to a service that is not exported should be inaccessible}"
CACHE="${CLUSTERSET_DNS_CACHE:-$HOME/.cache/clusterset-dns}"
PARENT="${CONFORMANCE_PARENT_PID:-$PPID}"

log() { printf '[%s] conformance: %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

GO="${GO:-go}"
if ! command -v "$GO" >/dev/null 2>&1; then
    if [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; else die "no go toolchain found (need go >= 1.23)"; fi
fi
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-p=${K8S_BINS_JOBS:-2} -buildvcs=false"
for c in setpriv curl; do command -v "$c" >/dev/null || die "$c not found (util-linux, curl)"; done

OUT="${1:-$(mktemp -d "${TMPDIR:-/tmp}/clusterset-dns-conformance.XXXXXX")}"
mkdir -p "$OUT" || die "cannot create $OUT"
OUT="$(cd "$OUT" && pwd)"
SUITE="$CACHE/bin/mcs-conformance-${MCS_API_COMMIT:0:12}"
mkdir -p "$CACHE/bin" "$CACHE/src"

# --- The suite binary ---------------------------------------------------------------

build_timed() { # build_timed DIR PKG: go test -c in DIR, niced, timed into build-times.log
    local start=$SECONDS
    (cd "$1" && nice -n 19 "$GO" test -c -mod=mod -trimpath -o "$SUITE.tmp" "$2" >&2) || return 1
    mv -f "$SUITE.tmp" "$SUITE"
    log "built the suite in $((SECONDS - start))s"
    printf '%s mcs-conformance %s wall=%ss go=%s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" \
        "${MCS_API_COMMIT:0:12}" "$((SECONDS - start))" "$("$GO" env GOVERSION)" >>"$CACHE/build-times.log"
}

build_from_checkout() { # build_from_checkout DIR (a checkout of mcs-api)
    [ -f "$1/conformance/go.mod" ] || die "$1 has no conformance/go.mod (not an mcs-api checkout)"
    if [ -d "$1/.git" ] || git -C "$1" rev-parse HEAD >/dev/null 2>&1; then
        local head
        head="$(git -C "$1" rev-parse HEAD 2>/dev/null)"
        [ "$head" = "$MCS_API_COMMIT" ] || log "WARNING: $1 is at $head, not the pinned $MCS_API_COMMIT"
    fi
    log "building the suite from $1/conformance"
    build_timed "$1/conformance" . || die "go test -c in $1/conformance failed"
}

suite() {
    [ -x "$SUITE" ] && { log "suite: $SUITE present"; return; }
    if [ -n "${MCS_API_DIR:-}" ]; then build_from_checkout "$MCS_API_DIR"; return; fi
    # The module proxy: conformance/ is a module of its own (its go.mod replaces
    # sigs.k8s.io/mcs-api with ".." only when it is the main module; as a
    # dependency it takes the published sigs.k8s.io/mcs-api it requires).
    local wrap="$CACHE/src/mcs-conformance-${MCS_API_COMMIT:0:12}"
    if "$GO" mod download "sigs.k8s.io/mcs-api/conformance@$MCS_API_PSEUDO" 2>"$OUT/proxy.err"; then
        log "building the suite from the module proxy (sigs.k8s.io/mcs-api/conformance@$MCS_API_PSEUDO)"
        mkdir -p "$wrap" && rm -f "$wrap/go.mod" "$wrap/go.sum"
        (cd "$wrap" && "$GO" mod init local/mcsconformance >/dev/null 2>&1 &&
            "$GO" mod edit -require="sigs.k8s.io/mcs-api/conformance@$MCS_API_PSEUDO") || die "wrapper module in $wrap"
        build_timed "$wrap" sigs.k8s.io/mcs-api/conformance || die "go test -c sigs.k8s.io/mcs-api/conformance failed"
        return
    fi
    log "the module proxy does not serve sigs.k8s.io/mcs-api/conformance@$MCS_API_PSEUDO: $(tail -n1 "$OUT/proxy.err")"
    local clone="$CACHE/src/mcs-api-${MCS_API_COMMIT:0:12}"
    if [ ! -f "$clone/conformance/go.mod" ]; then
        command -v git >/dev/null || die "git not found, and the module proxy does not serve the suite"
        rm -rf "$clone.tmp"
        git clone --quiet --filter=blob:none https://github.com/kubernetes-sigs/mcs-api "$clone.tmp" >&2 &&
            git -C "$clone.tmp" -c advice.detachedHead=false checkout --quiet "$MCS_API_COMMIT" >&2 ||
            die "cannot get the suite: the module proxy refused it and 'git clone https://github.com/kubernetes-sigs/mcs-api' failed (set MCS_API_DIR to a checkout at $MCS_API_COMMIT)"
        mv "$clone.tmp" "$clone"
    fi
    build_from_checkout "$clone"
}

suite

# --- Clusters, sync, the run ----------------------------------------------------------

BIN="${CLUSTERSET_DNS_BIN:-}"
if [ -z "$BIN" ]; then
    command -v cargo >/dev/null || die "cargo not found (or set CLUSTERSET_DNS_BIN)"
    (cd "$ROOT" && cargo build --quiet --bin clusterset-dns) || die "cargo build failed"
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/clusterset-dns"
fi
[ -x "$BIN" ] || die "no clusterset-dns binary at $BIN"

PIDS=()
finish() { # stop what we started (clusters.sh stops its own processes)
    local p
    trap '' TERM INT HUP
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    # Keep the clusters' logs, not their etcd data (~60 MB a cluster).
    [ -z "${CLUSTERS:-}" ] || rm -rf "$CLUSTERS"/cluster-*/etcd
}
trap finish EXIT
trap 'exit 2' TERM INT HUP

# wait_for PID WHAT TEST...: until TEST succeeds; fail if PID or our parent is gone.
alive_or_die() {
    kill -0 "$PARENT" 2>/dev/null || die "parent process $PARENT is gone"
    kill -0 "$1" 2>/dev/null || die "$2 exited; see $OUT"
}

CLUSTERS="$OUT/clusters"
log "starting 2 clusters with nodes under $CLUSTERS"
# The supervisor is tied to this shell: it stops everything when we are gone,
# also after a SIGKILL.
CLUSTERS_NODES=1 CLUSTERS_PARENT_PID=$$ "$HERE/clusters.sh" up 2 "$CLUSTERS" >"$OUT/clusters.out" 2>"$OUT/clusters.log" &
PIDS+=($!)
start=$SECONDS
until grep -q '^READY' "$OUT/clusters.out" 2>/dev/null; do
    alive_or_die "${PIDS[0]}" "scripts/clusters.sh up (last lines: $(tail -n 5 "$OUT/clusters.log" | tr '\n' ' '))"
    [ $((SECONDS - start)) -lt 3600 ] || die "clusters not ready within an hour"
    sleep 1
done
log "clusters ready in $((SECONDS - start))s"

RUST_LOG="${SYNC_LOG:-info}" setpriv --pdeathsig TERM -- "$BIN" sync --http-listen 127.0.0.1:0 \
    --cluster "cluster-1=$CLUSTERS/cluster-1/sync.kubeconfig" \
    --cluster "cluster-2=$CLUSTERS/cluster-2/sync.kubeconfig" >"$OUT/sync.log" 2>&1 &
PIDS+=($!)
start=$SECONDS
until grep -q 'leading: syncing' "$OUT/sync.log"; do
    alive_or_die "${PIDS[1]}" "clusterset-dns sync"
    [ $((SECONDS - start)) -lt 60 ] || die "clusterset-dns sync did not lead within 60 s; see $OUT/sync.log"
    sleep 0.5
done
log "clusterset-dns sync leading"

log "running the suite (labels: $LABELS; skipped: $SKIP)"
start=$SECONDS
# From OUT: the suite writes its own report.html and report.yaml to its working directory.
(cd "$OUT" && exec setpriv --pdeathsig TERM -- "$SUITE" -test.v -test.timeout=90m \
    -kubeconfig "$CLUSTERS/kubeconfig" -contexts cluster-1,cluster-2 \
    -ginkgo.label-filter "$LABELS" -ginkgo.skip "$SKIP" -ginkgo.no-color -ginkgo.v \
    -ginkgo.junit-report "$OUT/junit.xml" >"$OUT/suite.log" 2>&1) &
suite_pid=$!
PIDS+=("$suite_pid")
while kill -0 "$suite_pid" 2>/dev/null; do alive_or_die "$suite_pid" suite; sleep 1; done
wait "$suite_pid"
rc=$?
log "the suite ran for $((SECONDS - start))s (exit $rc); output in $OUT/suite.log"
[ -s "$OUT/junit.xml" ] || { tail -n 40 "$OUT/suite.log" >&2; die "the suite wrote no report"; }

# One line per spec: Ginkgo's JUnit <testcase name="[It] TEXT [LABEL, ...]" status=…>.
unxml() { sed -e 's/&lt;/</g; s/&gt;/>/g; s/&quot;/"/g; s/&#39;/'"'"'/g; s/&apos;/'"'"'/g; s/&amp;/\&/g'; }
pass=0 fail=0 skip=0
while IFS= read -r line; do
    name="$(sed -n 's/.*<testcase name="\([^"]*\)".*/\1/p' <<<"$line" | unxml)"
    status="$(sed -n 's/.* status="\([^"]*\)".*/\1/p' <<<"$line")"
    case "$name" in "[It] "*) ;; *) continue ;; esac
    # Empty Describe/Context texts leave runs of spaces.
    name="$(tr -s ' ' <<<"${name#\[It\]}" | sed 's/^ //; s/ $//')"
    labels=""
    if [[ "$name" =~ ^(.*)\ \[([^]]*)\]$ ]]; then name="${BASH_REMATCH[1]}" labels="${BASH_REMATCH[2]// /}"; fi
    case "$status" in passed) pass=$((pass + 1)) ;; failed | panicked | timedout | interrupted | aborted) fail=$((fail + 1)) ;; *) skip=$((skip + 1)) ;; esac
    printf 'RESULT %s %s | %s\n' "$status" "${labels:--}" "$name"
done < <(grep -o '<testcase [^>]*>' "$OUT/junit.xml")
printf 'SUMMARY passed=%d failed=%d skipped=%d\n' "$pass" "$fail" "$skip"
log "report: $OUT/junit.xml, suite output: $OUT/suite.log, sync log: $OUT/sync.log"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ] && exit 0
exit 1
