#!/usr/bin/env bash
# The official MCS API conformance suite (kubernetes-sigs/mcs-api, conformance/:
# Ginkgo specs labelled Required/Optional) against `clusterset-dns sync` on two
# real clusters that run pods (scripts/clusters.sh with CLUSTERS_NODES=1).
#
# Usage: scripts/conformance.sh [OUT_DIR]
#
# Steps: start two clusters with nodes, run `clusterset-dns sync --cluster
# cluster-1=… --cluster cluster-2=…` (the sync identity of deploy/sync/rbac.yaml),
# run the suite binary with contexts cluster-1,cluster-2 of the clusters'
# kubeconfig, and print one line per spec:
#
#   RESULT passed|failed|skipped|pending <labels> | <spec text>
#
# then "SUMMARY passed=P failed=F skipped=S". The JUnit report, the suite's own
# report.html and report.yaml, its output and the sync log stay in OUT_DIR
# (default: a new temporary directory).
# Exit 0: every spec that ran passed; 1: some failed; 2: the suite could not run.
#
# The suite itself is not in this repository and this script does not fetch or
# build it: MCS_CONFORMANCE names a suite binary you built from a checkout of
# github.com/kubernetes-sigs/mcs-api as that project describes (its
# conformance/ directory is a Go test package). CONFORMANCE.md names the commit
# the recorded results come from.
#
# Not run by default (CONFORMANCE_LABELS, CONFORMANCE_SKIP): the specs that exec
# into a request pod (labels DNS and Connectivity, and the Required "Connectivity
# to a service that is not exported should be inaccessible", which ignores exec
# errors and so would pass without checking anything): KWOK pods run no
# containers, so `kubectl exec` has nowhere to go. CONFORMANCE.md says more.
#
# Environment:
#   MCS_CONFORMANCE      the suite binary (required)
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
LABELS="${CONFORMANCE_LABELS:-!DNS && !Connectivity}"
SKIP="${CONFORMANCE_SKIP:-Connectivity to a service that is not exported should be inaccessible}"
PARENT="${CONFORMANCE_PARENT_PID:-$PPID}"

log() { printf '[%s] conformance: %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

for c in setpriv; do command -v "$c" >/dev/null || die "$c not found (util-linux)"; done
SUITE="${MCS_CONFORMANCE:-}"
[ -n "$SUITE" ] || die "set MCS_CONFORMANCE to the mcs-api conformance suite binary (see CONTRIBUTING.md)"
[ -x "$SUITE" ] || die "MCS_CONFORMANCE=$SUITE is not an executable file"

OUT="${1:-$(mktemp -d "${TMPDIR:-/tmp}/clusterset-dns-conformance.XXXXXX")}"
mkdir -p "$OUT" || die "cannot create $OUT"
OUT="$(cd "$OUT" && pwd)"

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
