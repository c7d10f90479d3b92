#!/usr/bin/env bash
# The official MCS API conformance suite (kubernetes-sigs/mcs-api, conformance/:
# Ginkgo specs labelled Required/Optional) against `clusterset-dns sync` on two
# real clusters that run pods (scripts/clusters.sh with CLUSTERS_NODES=1), or,
# with CONFORMANCE_MODE=hub, against one `clusterset-dns agent` per cluster and
# a hub (docs/hub.md).
#
# Usage: scripts/conformance.sh [OUT_DIR]
#
# Steps: start two clusters with nodes, run `clusterset-dns sync --cluster
# cluster-1=… --cluster cluster-2=…` (the sync identity of deploy/sync/rbac.yaml),
# or in hub mode start the hub, enrol both clusters and run their agents (below),
# run the suite binary with contexts cluster-1,cluster-2 of the clusters'
# kubeconfig, and print one line per spec:
#
#   RESULT passed|failed|skipped|pending <labels> | <spec text>
#
# then "SUMMARY passed=P failed=F skipped=S". The JUnit report, the suite's own
# report.html and report.yaml, its output and the sync (or agent) logs stay in OUT_DIR
# (default: a new temporary directory).
# Exit 0: every spec that ran passed; 1: some failed; 2: the suite could not run.
#
# The suite itself is not in this repository and this script does not fetch or
# build it: MCS_CONFORMANCE names a suite binary you built from a checkout of
# github.com/kubernetes-sigs/mcs-api as that project describes (its
# conformance/ directory is a Go test package). CONFORMANCE.md names the commit
# the recorded results come from.
#
# The specs that exec in pods (labels DNS and Connectivity, and the Required
# "Connectivity to a service that is not exported should be inaccessible") run
# too (CONFORMANCE_EXEC=1, the default; needs root): the clusters' Pods run for
# real. KWOK (CLUSTERS_NODES=1) only writes Pod status; here
#   - scripts/dataplane.sh builds a node network namespace per cluster with the
#     real kube-proxy (nftables) and the kube-dns VIP 198.19.I.10 (Service CIDR
#     198.19.I.0/24, IPv4 only: KWOK gives Pods one IPv4 address, from
#     198.18.I.128/25 here);
#   - in each cluster's dns Pod of that data plane, CoreDNS answers
#     cluster.local (kubernetes plugin) and forwards clusterset.local as
#     Corefile.example's block does, to `clusterset-dns serve --cluster-id
#     cluster-I` on 198.18.0.1:530I;
#   - scripts/kwok-pods.py gives every Pod KWOK runs a network namespace with
#     its IP behind the node, a resolv.conf naming kube-dns, and runs its
#     containers' commands there (the hello Pods' socat listeners, from the
#     host's socat);
#   - KWOK serves the kubelet API to the API server and runs `kubectl exec` on
#     the host, with scripts/kwok-exec/sh entering the Pod's namespace, so the
#     suite's `sh -c "nslookup ..."` / `sh -c "nc ..."` run in the request Pod
#     with the host's nslookup and nc (bind9-dnsutils, netcat-openbsd).
# All of it runs in a network namespace of its own (unshare --net; loopback
# only): the data plane's addresses are fixed, and another one on the machine
# (tests/it/dataplane.rs) must not meet this one.
# CONFORMANCE_EXEC=0: the clusters as before, and by default the specs that
# exec are filtered out (they would fail, or pass without checking anything).
# CONFORMANCE.md says more.
#
# CONFORMANCE_MODE=hub: no `sync`. A third API server (scripts/clusters.sh up 1
# OUT_DIR/hub, no nodes: it runs no Pods, only stores the records) is the hub;
# `clusterset-dns hub enrol cluster-I` makes each cluster's restricted hub
# identity (it may write only namespace clusterset-member-cluster-I), and
# `clusterset-dns agent --member cluster-I` runs per cluster with that cluster's
# own identity (deploy/agent/rbac.yaml) and its hub identity. Serving, the data
# plane and the suite are as in push mode.
#
# Environment:
#   MCS_CONFORMANCE      the suite binary (required)
#   CONFORMANCE_MODE     push (default): one `clusterset-dns sync` for both
#                        clusters; hub: a hub and one `clusterset-dns agent` per
#                        cluster (above)
#   CONFORMANCE_EXEC     1 (default): Pods run, exec works (see above); 0: not
#   CONFORMANCE_LABELS   Ginkgo label filter (default: none; with CONFORMANCE_EXEC=0
#                        '!DNS && !Connectivity')
#   CONFORMANCE_SKIP     Ginkgo --skip regex on spec texts (default: none; with
#                        CONFORMANCE_EXEC=0 "Connectivity to a service that is not
#                        exported should be inaccessible")
#   CLUSTERSET_DNS_BIN   the clusterset-dns binary (default: `cargo build`, then
#                        target/debug/clusterset-dns)
#   CONFORMANCE_PARENT_PID  stop everything when this process is gone (default: the
#                        parent of this script)
#   CLUSTERSET_DNS_CACHE, GO, K8S_VERSION, ...: as for scripts/k8s-bins.sh
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
EXEC="${CONFORMANCE_EXEC:-1}"
MODE="${CONFORMANCE_MODE:-push}"
if [ "$EXEC" = 1 ]; then
    LABELS="${CONFORMANCE_LABELS-}"
    SKIP="${CONFORMANCE_SKIP-}"
else
    LABELS="${CONFORMANCE_LABELS:-!DNS && !Connectivity}"
    SKIP="${CONFORMANCE_SKIP:-Connectivity to a service that is not exported should be inaccessible}"
fi
PARENT="${CONFORMANCE_PARENT_PID:-$PPID}"

log() { printf '[%s] conformance: %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

case "$MODE" in push | hub) ;; *) die "CONFORMANCE_MODE must be push or hub, not '$MODE'" ;; esac
for c in setpriv; do command -v "$c" >/dev/null || die "$c not found (util-linux)"; done
if [ "$EXEC" = 1 ]; then
    [ "$(id -u)" -eq 0 ] || die "CONFORMANCE_EXEC=1 needs root (network namespaces); CONFORMANCE_EXEC=0 does not"
    if [ -z "${CONFORMANCE_NETNS:-}" ]; then
        command -v unshare >/dev/null || die "unshare not found (util-linux)"
        # Same pid and parent after these execs.
        CONFORMANCE_NETNS=1 exec unshare --net -- bash -c 'ip link set lo up && exec "$0" "$@"' "$HERE/conformance.sh" "$@"
    fi
    for c in ip nft python3 socat nc nslookup; do
        command -v "$c" >/dev/null || die "$c not found (CONFORMANCE_EXEC=1 runs the Pods' programs from the host: iproute2, nftables, python3, socat, netcat-openbsd, bind9-dnsutils)"
    done
fi
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
    [ -z "${HUB:-}" ] || rm -rf "$HUB"/cluster-*/etcd
}
trap finish EXIT
trap 'exit 2' TERM INT HUP

# alive_or_die PID WHAT: fail if PID or our parent is gone.
alive_or_die() {
    kill -0 "$PARENT" 2>/dev/null || die "parent process $PARENT is gone"
    kill -0 "$1" 2>/dev/null || die "$2 exited; see $OUT"
}

# wait_for PID WHAT SECONDS PATTERN FILE [LOG]: until a line of FILE matches
# PATTERN; fail if PID or our parent is gone (with LOG's last lines) or after
# SECONDS. Sets WAITED to the seconds it took.
wait_for() {
    local pid="$1" what="$2" limit="$3" pattern="$4" file="$5" log="${6:-}" start=$SECONDS
    until grep -q "$pattern" "$file" 2>/dev/null; do
        alive_or_die "$pid" "$what${log:+ (last lines: $(tail -n 5 "$log" | tr '\n' ' '))}"
        [ $((SECONDS - start)) -lt "$limit" ] || die "$what: not ready within $limit s; see ${log:-$file}"
        sleep 0.5
    done
    WAITED=$((SECONDS - start))
}

# kwok_exec_crd: set KWOK_EXEC_CRD to KWOK's Exec CRD, from the source of the KWOK
# version scripts/k8s-bins.sh builds (the Go module cache; downloaded if missing).
kwok_exec_crd() {
    local go="${GO:-go}" v dir
    [ -x "$go" ] || command -v "$go" >/dev/null || go=/usr/local/go/bin/go
    v="${KWOK_VERSION:-$(sed -n 's/^KWOK_VERSION="${KWOK_VERSION:-\(v[0-9.]*\)}"$/\1/p' "$HERE/k8s-bins.sh")}"
    [ -n "$v" ] || die "cannot read KWOK_VERSION from scripts/k8s-bins.sh"
    dir="$("$go" mod download -json "sigs.k8s.io/kwok@$v" 2>"$OUT/kwok-crd.log" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    KWOK_EXEC_CRD="$dir/kustomize/crd/bases/kwok.x-k8s.io_execs.yaml"
    [ -f "$KWOK_EXEC_CRD" ] || die "no KWOK Exec CRD at '$KWOK_EXEC_CRD' (go mod download sigs.k8s.io/kwok@$v: $(cat "$OUT/kwok-crd.log"))"
}

CLUSTERS="$OUT/clusters"
log "starting 2 clusters with nodes under $CLUSTERS"
cluster_env=(CLUSTERS_NODES=1 "CLUSTERS_PARENT_PID=$$")
if [ "$EXEC" = 1 ]; then
    kwok_exec_crd
    cluster_env+=("CLUSTERS_SERVICE_CIDR=198.19.{I}.0/24" "CLUSTERS_POD_CIDR=198.18.{I}.128/25"
        "CLUSTERS_KWOK_EXEC_CRD=$KWOK_EXEC_CRD" "CLUSTERS_KWOK_PATH=$HERE/kwok-exec")
fi
# The supervisor is tied to this shell: it stops everything when we are gone,
# also after a SIGKILL.
env "${cluster_env[@]}" "$HERE/clusters.sh" up 2 "$CLUSTERS" >"$OUT/clusters.out" 2>"$OUT/clusters.log" &
clusters_pid=$!
PIDS+=("$clusters_pid")
if [ "$MODE" = hub ]; then
    # The hub: one more API server, no nodes, started beside the clusters.
    HUB="$OUT/hub"
    CLUSTERS_PARENT_PID=$$ "$HERE/clusters.sh" up 1 "$HUB" >"$OUT/hub.out" 2>"$OUT/hub.log" &
    hub_pid=$!
    PIDS+=("$hub_pid")
fi
wait_for "$clusters_pid" "scripts/clusters.sh up" 3600 '^READY' "$OUT/clusters.out" "$OUT/clusters.log"
log "clusters ready in ${WAITED}s"

if [ "$MODE" = push ]; then
    RUST_LOG="${SYNC_LOG:-info}" setpriv --pdeathsig TERM -- "$BIN" sync --http-listen 127.0.0.1:0 \
        --cluster "cluster-1=$CLUSTERS/cluster-1/sync.kubeconfig" \
        --cluster "cluster-2=$CLUSTERS/cluster-2/sync.kubeconfig" >"$OUT/sync.log" 2>&1 &
    PIDS+=($!)
    wait_for "$!" "clusterset-dns sync (leading)" 60 'leading: syncing' "$OUT/sync.log"
    log "clusterset-dns sync leading"
else
    wait_for "$hub_pid" "scripts/clusters.sh up (the hub)" 600 '^READY' "$OUT/hub.out" "$OUT/hub.log"
    log "hub ready"
    agents=()
    for i in 1 2; do
        # The real enrolment (as an admin of the hub): namespace, identity, kubeconfig.
        "$BIN" hub enrol "cluster-$i" --hub-kubeconfig "$HUB/cluster-1/kubeconfig" \
            --out "$OUT/hub-cluster-$i.kubeconfig" >>"$OUT/enrol.log" 2>&1 ||
            die "clusterset-dns hub enrol cluster-$i failed; see $OUT/enrol.log"
        # Its own cluster as deploy/agent/rbac.yaml's identity, the hub as its own
        # restricted one; the election Lease is in its own cluster.
        RUST_LOG="${SYNC_LOG:-info}" setpriv --pdeathsig TERM -- "$BIN" agent --http-listen 127.0.0.1:0 \
            --member "cluster-$i" --kubeconfig "$CLUSTERS/cluster-$i/agent.kubeconfig" \
            --hub-kubeconfig "$OUT/hub-cluster-$i.kubeconfig" --identity "agent-cluster-$i" \
            >"$OUT/agent-$i.log" 2>&1 &
        agents+=($!)
        PIDS+=($!)
    done
    # Each agent leads its cluster's Lease and has seen the other member on the hub.
    for i in 1 2; do
        wait_for "${agents[$((i - 1))]}" "clusterset-dns agent cluster-$i (leading)" 60 'leading the shard' "$OUT/agent-$i.log"
        wait_for "${agents[$((i - 1))]}" "clusterset-dns agent cluster-$i (the other member)" 60 \
            "members=.*\"cluster-$((3 - i))\"" "$OUT/agent-$i.log"
    done
    log "clusterset-dns agents leading, each syncing from the hub with the other member"
fi

if [ "$EXEC" = 1 ]; then
    # The data plane: nodes with kube-proxy, kube-dns, the dns Pods. Tied to this
    # shell like the clusters; it removes every namespace it and kwok-pods.py made.
    DATAPLANE_PODS=0 DATAPLANE_PARENT_PID=$$ "$HERE/dataplane.sh" up "$CLUSTERS" \
        >"$OUT/dataplane.out" 2>"$OUT/dataplane.log" &
    dp_pid=$!
    PIDS=("$dp_pid" "${PIDS[@]}")
    wait_for "$dp_pid" "scripts/dataplane.sh up" 300 '^READY' "$OUT/dataplane.out" "$OUT/dataplane.log"
    log "data plane ready in ${WAITED}s"
    COREDNS="$("$HERE/k8s-bins.sh" coredns | tail -n1)/coredns"
    [ -x "$COREDNS" ] || die "no CoreDNS (scripts/k8s-bins.sh coredns)"
    block="$(awk '/^clusterset\.local:53 \{/ {on = 1} on {print} on && /^\}/ {exit}' "$ROOT/Corefile.example")"
    [ -n "$block" ] || die "no clusterset.local:53 block in Corefile.example"
    for i in 1 2; do
        # serve for cluster-I, on the data plane's host address.
        RUST_LOG="${SERVE_LOG:-info}" setpriv --pdeathsig TERM -- "$BIN" serve \
            --kubeconfig "$CLUSTERS/cluster-$i/serve.kubeconfig" --cluster-id "cluster-$i" \
            --listen "198.18.0.1:$((5300 + i))" --http-listen 127.0.0.1:0 >"$OUT/serve-$i.log" 2>&1 &
        PIDS=("$!" "${PIDS[@]}")
        # CoreDNS in the dns Pod (kube-dns's endpoint): cluster.local from the API
        # server (the data plane's kubeconfig: the host address, admin), and
        # Corefile.example's clusterset.local block forwarding to serve.
        mkdir -p "$OUT/coredns-$i"
        {
            printf '.:53 {
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
'
            printf '        kubeconfig %s cluster-%s
' "$CLUSTERS/dataplane/kube-proxy-$i.kubeconfig" "$i"
            printf '        labels !multicluster.kubernetes.io/service-name
'
            printf '        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}

'
            printf '%s
' "${block//CLUSTERSET_DNS_SERVICE_IP/198.18.0.1:$((5300 + i))}"
        } >"$OUT/coredns-$i/Corefile"
        (cd "$OUT/coredns-$i" && exec "$HERE/dataplane.sh" exec "$CLUSTERS" "$i" dns \
            setpriv --pdeathsig TERM -- "$COREDNS" -conf Corefile) >"$OUT/coredns-$i.log" 2>&1 &
        PIDS=("$!" "${PIDS[@]}")
        KWOK_PODS_PARENT_PID=$$ setpriv --pdeathsig TERM -- python3 "$HERE/kwok-pods.py" "$CLUSTERS" "$i" \
            >"$OUT/kwok-pods-$i.log" 2>&1 &
        PIDS=("$!" "${PIDS[@]}")
    done
    # CoreDNS answers cluster.local once its kubernetes plugin has synced.
    start=$SECONDS
    for i in 1 2; do
        until "$HERE/dataplane.sh" exec "$CLUSTERS" "$i" client \
            dig +short +time=1 +tries=1 kube-dns.kube-system.svc.cluster.local. 2>/dev/null | grep -q "^198.19.$i.10$"; do
            [ $((SECONDS - start)) -lt 60 ] || die "cluster-$i: kube-dns does not answer through CoreDNS within 60 s; see $OUT/coredns-$i.log"
            alive_or_die "$dp_pid" "scripts/dataplane.sh"
            sleep 0.5
        done
    done
    log "serve, CoreDNS (kube-dns) and the Pod runner up in both clusters"
fi

log "running the suite ($MODE mode; labels: $LABELS; skipped: $SKIP)"
start=$SECONDS
# From OUT: the suite writes its own report.html and report.yaml to its working directory.
filters=()
[ -z "$LABELS" ] || filters+=(-ginkgo.label-filter "$LABELS")
[ -z "$SKIP" ] || filters+=(-ginkgo.skip "$SKIP")
(cd "$OUT" && exec setpriv --pdeathsig TERM -- "$SUITE" -test.v -test.timeout=90m \
    -kubeconfig "$CLUSTERS/kubeconfig" -contexts cluster-1,cluster-2 \
    "${filters[@]}" -ginkgo.no-color -ginkgo.v \
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
if [ "$MODE" = push ]; then logs="sync log: $OUT/sync.log"; else logs="agent logs: $OUT/agent-{1,2}.log"; fi
log "report: $OUT/junit.xml, suite output: $OUT/suite.log, $logs"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ] && exit 0
exit 1
