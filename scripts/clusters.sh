#!/usr/bin/env bash
# Real Kubernetes test clusters on loopback: N independent control planes,
# each one etcd + one kube-apiserver on its own ports, RBAC on, token auth,
# the MCS CRDs (ServiceImport, ServiceExport) and clusterset-dns's serve RBAC
# installed. By default no kubelet, scheduler or controller-manager: nothing
# runs pods, deleted namespaces stay Terminating (use a fresh namespace per test).
#
# With CLUSTERS_NODES=1 each cluster also runs kube-scheduler,
# kube-controller-manager (the controllers listed in KCM_CONTROLLERS below:
# Deployments, ReplicaSets, StatefulSets, EndpointSlices, namespace deletion,
# garbage collection, ServiceAccounts) and KWOK with one fake Node, `node-1`
# (annotation kwok.x-k8s.io/node=fake, no taints): a Deployment's pods are
# scheduled, become Running and Ready with an IP from 10.(200+I).0.0/16, and the
# real EndpointSlice controller writes their Service's slices. Pods run no
# containers (no exec, no logs, no traffic; scripts/kwok-pods.py runs them, for
# scripts/conformance.sh). Pods need no ServiceAccount token:
# the ServiceAccount admission plugin stays off.
#
# Usage:
#   scripts/clusters.sh up N DIR           start N clusters under DIR (new or empty), print
#                                          "READY DIR" on stdout, then supervise in the
#                                          foreground until SIGTERM/SIGINT/SIGHUP or until
#                                          the parent process exits; every process it
#                                          started is stopped on the way out
#   scripts/clusters.sh stop DIR I COMP    stop COMP (etcd | apiserver; with nodes also
#                                          scheduler | controllers | kwok) of cluster I (1..N)
#   scripts/clusters.sh start DIR I COMP   start it again with the same ports and data and
#                                          wait until it is ready
#   scripts/clusters.sh status DIR         print DIR/state
#   scripts/clusters.sh down DIR           stop the supervisor of DIR and wait for it
#
# `stop` and `start` are executed by the supervisor (they are sent through the
# FIFO DIR/control), so every etcd and kube-apiserver stays its child: it can
# wait for them, and they get SIGTERM if it dies (PR_SET_PDEATHSIG).
#
# `up` prints two lines on stdout: "BINARIES <bin dir>" once etcd and
# kube-apiserver are built (a cold build takes minutes: scripts/k8s-bins.sh),
# then "READY DIR". Progress and errors go to stderr.
#
# DIR after READY:
#   DIR/kubeconfig                     every cluster, admin user; contexts cluster-1..N
#   DIR/cluster-I/kubeconfig           cluster I, admin (group system:masters), context cluster-I
#   DIR/cluster-I/ROLE.kubeconfig      cluster I as the ServiceAccount of deploy/ROLE/rbac.yaml
#                                      (centralized, sync: clusterset-dns/clusterset-dns-ROLE)
#   DIR/cluster-I/serve.kubeconfig     cluster I as ServiceAccount clusterset-dns/clusterset-dns,
#                                      bound only to ClusterRole clusterset-dns-serve
#                                      (deploy/serve/rbac.yaml)
#   DIR/cluster-I/{etcd,apiserver}.log component logs (appended on restart); with nodes also
#                                      {scheduler,controllers,kwok}.log
#   DIR/state                          one line per cluster: name=cluster-I etcd_port=P
#                                      etcd_peer_port=Q apiserver_port=S etcd_pid=..
#                                      etcd_state=running|stopped|exited apiserver_pid=..
#                                      apiserver_state=.. (with nodes also scheduler_*,
#                                      controllers_*, kwok_* port, pid and state;
#                                      kubelet_port: see CLUSTERS_KWOK_EXEC_CRD)
#   DIR/supervisor.pid, DIR/control    the supervisor and its command FIFO
#
# Environment:
#   CLUSTERS_PARENT_PID   the supervisor stops everything when this process is gone
#                         (default: the parent of `up`)
#   CLUSTERS_REMOVE_DIR   1: remove DIR after everything has stopped (default 0)
#   CLUSTERS_DEPLOY_DIR   where crds/ and serve/rbac.yaml are (default: the repository's deploy/)
#   CLUSTERS_TIMEOUT      seconds a component gets to become ready (default 120)
#   CLUSTERS_NODES        1: also run kube-scheduler, kube-controller-manager and KWOK with
#                         one fake Node per cluster (see above; default 0). Their binaries
#                         come from scripts/k8s-bins.sh too (cold: minutes)
#   KUBECTL               kubectl binary (default: kubectl)
#   CLUSTERS_SERVICE_CIDR each cluster's --service-cluster-ip-range, "{I}" replaced by the
#                         cluster's number (default: 10.(100+I).0.0/16)
#   CLUSTERS_POD_CIDR     with nodes: KWOK's --cidr (the first Pod IP, then on), "{I}"
#                         replaced by the cluster's number (default: 10.(200+I).0.1/16)
#   CLUSTERS_KWOK_EXEC_CRD  with nodes: KWOK's Exec CRD (kwok.x-k8s.io_execs.yaml of its
#                         source). Set, node-1 reports a kubelet API at 127.0.0.1 on port
#                         kubelet_port (DIR/state; kube-apiserver gets
#                         --kubelet-preferred-address-types=InternalIP and checks no serving
#                         certificate: it has no --kubelet-certificate-authority), which the
#                         caller serves (scripts/kwok-pods.py: a proxy to KWOK's own kubelet
#                         API on kwok_port), the CRD is installed and KWOK watches Exec
#                         objects: `kubectl exec` runs on the host as an Exec object says
#                         (scripts/kwok-pods.py writes them)
#   CLUSTERS_KWOK_PATH    directories put first on KWOK's PATH (the commands it execs:
#                         scripts/kwok-exec)
#   CLUSTERS_APISERVER_ARGS  extra kube-apiserver flags for every cluster, split on blanks,
#                         after ours (e.g. "--max-requests-inflight=1": API Priority and
#                         Fairness is off, so the plain in-flight limits apply; requests of
#                         group system:masters, the admin kubeconfigs', are never refused)
#   CLUSTERSET_DNS_CACHE, K8S_VERSION, ETCD_VERSION   passed to scripts/k8s-bins.sh
#
# A missing toolchain or binary is an error (exit 1), never a skip.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
DEPLOY="${CLUSTERS_DEPLOY_DIR:-$HERE/../deploy}"
TIMEOUT="${CLUSTERS_TIMEOUT:-120}"
KUBECTL="${KUBECTL:-kubectl}"
SERVE_NS=clusterset-dns
SERVE_SA=clusterset-dns
COMPONENTS=(etcd apiserver)
NODES="${CLUSTERS_NODES:-0}"
case "$NODES" in 0 | 1) ;; *) printf 'clusters: CLUSTERS_NODES must be 0 or 1, not %s\n' "$NODES" >&2; exit 64 ;; esac
NODE_COMPONENTS=(scheduler controllers kwok)
[ "$NODES" = 0 ] || COMPONENTS+=("${NODE_COMPONENTS[@]}")
# What Pods of Deployments and StatefulSets need to run and be reachable through
# their Services' slices, and what a test's namespace deletion needs. No node
# lifecycle controller: nothing taints the fake Node not-ready.
KCM_CONTROLLERS=deployment-controller,replicaset-controller,statefulset-controller
KCM_CONTROLLERS+=,endpointslice-controller,namespace-controller,garbage-collector-controller
KCM_CONTROLLERS+=,serviceaccount-controller

log() { printf '[%s] clusters: %s\n' "$(date '+%H:%M:%S')" "$*" >&2 || true; }
# In the supervisor, die stops everything first; in helpers and subshells it only exits.
die() {
    log "ERROR: $*"
    if [ "$BASHPID" = "${SUPERVISOR:-}" ]; then cleanup 1; fi
    exit 1
}
# shellcheck disable=SC2016 # a literal backquote in the pattern
usage() { sed -n '/^# Usage:/,/^# `stop`/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit 64; }

# --- Components: the one place their command lines live --------------------------------

# Per cluster I (globals of the supervisor): ETCD_PORT[I] PEER_PORT[I] API_PORT[I]; per
# component K="I.etcd" / "I.apiserver": PID[K] and STATE[K].
declare -A ETCD_PORT PEER_PORT API_PORT SCHED_PORT KCM_PORT KWOK_PORT KUBELET_PORT PID STATE USED_PORT

cdir() { printf '%s/cluster-%s' "$DIR" "$1"; }

# etcd_cmd I / apiserver_cmd I: set CMD to the component's command line.
etcd_cmd() {
    local d p="${ETCD_PORT[$1]}" q="${PEER_PORT[$1]}"
    d="$(cdir "$1")"
    CMD=("$BIN/etcd" --name e --data-dir "$d/etcd"
        --listen-client-urls "http://127.0.0.1:$p" --advertise-client-urls "http://127.0.0.1:$p"
        --listen-peer-urls "http://127.0.0.1:$q" --initial-advertise-peer-urls "http://127.0.0.1:$q"
        --initial-cluster "e=http://127.0.0.1:$q" --unsafe-no-fsync --log-level warn)
}

apiserver_cmd() {
    local d s="${API_PORT[$1]}"
    d="$(cdir "$1")"
    CMD=("$BIN/kube-apiserver" "--etcd-servers=http://127.0.0.1:${ETCD_PORT[$1]}"
        --bind-address=127.0.0.1 "--secure-port=$s" --advertise-address=127.0.0.1
        --endpoint-reconciler-type=none "--cert-dir=$d/pki" "--token-auth-file=$d/tokens.csv"
        --authorization-mode=RBAC "--service-cluster-ip-range=$(service_cidr "$1")"
        "--service-account-issuer=https://127.0.0.1:$s" "--service-account-key-file=$d/sa.pub"
        "--service-account-signing-key-file=$d/sa.key" --disable-admission-plugins=ServiceAccount
        --allow-privileged=true --etcd-compaction-interval=0 --enable-priority-and-fairness=false
        --profiling=false -v=1)
    [ "$NODES" = 0 ] || [ -z "${CLUSTERS_KWOK_EXEC_CRD:-}" ] || CMD+=(--kubelet-preferred-address-types=InternalIP)
    # Extra flags last: a repeated flag's last value wins.
    local extra=()
    read -ra extra <<<"${CLUSTERS_APISERVER_ARGS:-}"
    CMD+=("${extra[@]}")
}

# --- Service CIDR (issue 15: the data-path fleet) ---------------------------------------
# service_cidr I: cluster I's --service-cluster-ip-range; CLUSTERS_SERVICE_CIDR with {I}
# replaced by I (scripts/dataplane.sh routes 198.19.{I}.0/24), else 10.(100+I).0.0/16.
service_cidr() {
    local t="${CLUSTERS_SERVICE_CIDR:-}"
    if [ -n "$t" ]; then printf '%s' "${t//\{I\}/$1}"; else printf '10.%s.0.0/16' "$((100 + $1))"; fi
}
# --- end Service CIDR ------------------------------------------------------------------

# The node components (CLUSTERS_NODES=1) talk to the API server as admin; /healthz of
# their own servers is open without credentials (always-allowed paths).
scheduler_cmd() {
    local d
    d="$(cdir "$1")"
    CMD=("$BIN/kube-scheduler" "--kubeconfig=$d/kubeconfig" "--authentication-kubeconfig=$d/kubeconfig"
        "--authorization-kubeconfig=$d/kubeconfig" --bind-address=127.0.0.1
        "--secure-port=${SCHED_PORT[$1]}" "--cert-dir=$d/pki-scheduler" --leader-elect=false -v=1)
}

controllers_cmd() {
    local d
    d="$(cdir "$1")"
    CMD=("$BIN/kube-controller-manager" "--kubeconfig=$d/kubeconfig" "--authentication-kubeconfig=$d/kubeconfig"
        "--authorization-kubeconfig=$d/kubeconfig" --bind-address=127.0.0.1
        "--secure-port=${KCM_PORT[$1]}" "--cert-dir=$d/pki-controllers" --leader-elect=false
        "--controllers=$KCM_CONTROLLERS" "--service-cluster-ip-range=$(service_cidr "$1")"
        "--root-ca-file=$d/pki/apiserver.crt" -v=1)
}

# KWOK manages the one fake Node node_up creates; pod IPs from 10.(200+I).0.0/16
# (CLUSTERS_POD_CIDR).
kwok_cmd() {
    local d cidr="${CLUSTERS_POD_CIDR:-}"
    d="$(cdir "$1")"
    if [ -n "$cidr" ]; then cidr="${cidr//\{I\}/$1}"; else cidr="10.$((200 + $1)).0.1/16"; fi
    CMD=("$BIN/kwok" "--kubeconfig=$d/kubeconfig" --manage-all-nodes=false
        --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake
        "--cidr=$cidr" --node-ip=127.0.0.1
        "--server-address=127.0.0.1:${KWOK_PORT[$1]}")
    if [ -n "${CLUSTERS_KWOK_EXEC_CRD:-}" ]; then
        CMD+=("--node-port=${KUBELET_PORT[$1]}" --enable-crds=Exec)
    fi
    if [ -n "${CLUSTERS_KWOK_PATH:-}" ]; then CMD=(env "PATH=$CLUSTERS_KWOK_PATH:$PATH" "${CMD[@]}"); fi
}

# probe I COMP: is it serving?
probe() {
    case "$2" in
    etcd) curl -fsS -m 2 "http://127.0.0.1:${ETCD_PORT[$1]}/health" 2>/dev/null | grep -q '"health":"true"' ;;
    apiserver) curl -fsSk -m 2 -o /dev/null "https://127.0.0.1:${API_PORT[$1]}/readyz" 2>/dev/null ;;
    scheduler) curl -fsSk -m 2 -o /dev/null "https://127.0.0.1:${SCHED_PORT[$1]}/healthz" 2>/dev/null ;;
    controllers) curl -fsSk -m 2 -o /dev/null "https://127.0.0.1:${KCM_PORT[$1]}/healthz" 2>/dev/null ;;
    kwok) curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${KWOK_PORT[$1]}/healthz" 2>/dev/null ;;
    esac
}

# pick_port: set PORT to a free loopback port below the ephemeral range, not handed out before.
pick_port() {
    local p
    while :; do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
        [ -z "${USED_PORT[$p]:-}" ] || continue
        USED_PORT[$p]=1
        if command -v ss >/dev/null 2>&1; then
            [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ] || continue
        elif (exec 9<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            continue
        fi
        PORT=$p
        return
    done
}

repick_ports() { # repick_ports I COMP (after "address already in use")
    case "$2" in
    etcd) pick_port; ETCD_PORT[$1]=$PORT; pick_port; PEER_PORT[$1]=$PORT ;;
    apiserver) pick_port; API_PORT[$1]=$PORT ;;
    scheduler) pick_port; SCHED_PORT[$1]=$PORT ;;
    controllers) pick_port; KCM_PORT[$1]=$PORT ;;
    kwok) pick_port; KWOK_PORT[$1]=$PORT ;;
    esac
}

# launch I COMP: start the component as a direct child of this shell (so PR_SET_PDEATHSIG
# refers to the supervisor), output appended to its log.
launch() {
    local i="$1" c="$2" log
    log="$(cdir "$i")/$c.log"
    "${c}_cmd" "$i"
    printf '=== %s clusters.sh: starting %s\n' "$(date '+%F %T')" "$c" >>"$log"
    if [ -n "$PDEATHSIG" ]; then
        setpriv --pdeathsig TERM -- "${CMD[@]}" </dev/null >>"$log" 2>&1 3>&- &
    else
        "${CMD[@]}" </dev/null >>"$log" 2>&1 3>&- &
    fi
    PID[$i.$c]=$!
    STATE[$i.$c]=starting
}

# wait_ready KEY...: wait until every component (I.COMP) serves; a component that exits
# because its port was taken meanwhile is started again on new ports (3 tries).
wait_ready() {
    local deadline=$((SECONDS + TIMEOUT)) pending=("$@") next k i c
    declare -A tries
    while [ "${#pending[@]}" -gt 0 ]; do
        should_stop && return 1
        next=()
        for k in "${pending[@]}"; do
            i="${k%%.*}" c="${k#*.}"
            # Alive first: a port taken meanwhile may be served by someone else.
            if ! kill -0 "${PID[$k]}" 2>/dev/null; then
                wait "${PID[$k]}" 2>/dev/null
                if tail -n 30 "$(cdir "$i")/$c.log" | grep -q 'address already in use' &&
                    [ "${tries[$k]:-0}" -lt 3 ]; then
                    tries[$k]=$((${tries[$k]:-0} + 1))
                    log "cluster-$i $c: port taken, retrying on new ports"
                    repick_ports "$i" "$c"
                    launch "$i" "$c"
                    next+=("$k")
                else
                    STATE[$k]=exited
                    log "cluster-$i $c exited; last lines of $(cdir "$i")/$c.log:"
                    tail -n 25 "$(cdir "$i")/$c.log" >&2
                    return 1
                fi
            elif probe "$i" "$c"; then
                STATE[$k]=running
            elif [ "$SECONDS" -ge "$deadline" ]; then
                log "cluster-$i $c not ready after ${TIMEOUT}s; last lines of $(cdir "$i")/$c.log:"
                tail -n 25 "$(cdir "$i")/$c.log" >&2
                return 1
            else
                next+=("$k")
            fi
        done
        pending=("${next[@]}")
        [ "${#pending[@]}" -eq 0 ] || sleep 0.2
    done
}

# terminate KEY...: SIGTERM, wait up to 20 s, then SIGKILL; reap.
terminate() {
    local k p deadline=$((SECONDS + 20)) alive
    for k in "$@"; do
        p="${PID[$k]:-}"
        [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
    done
    while :; do
        alive=0
        for k in "$@"; do
            p="${PID[$k]:-}"
            [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1
        done
        [ "$alive" -eq 1 ] || break
        if [ "$SECONDS" -ge "$deadline" ]; then
            for k in "$@"; do
                p="${PID[$k]:-}"
                [ -n "$p" ] && kill -0 "$p" 2>/dev/null && log "killing ${k} (pid $p): no exit 20 s after SIGTERM" &&
                    kill -KILL "$p" 2>/dev/null
            done
            deadline=$((SECONDS + 3600))
        fi
        sleep 0.1
    done
    for k in "$@"; do
        p="${PID[$k]:-}"
        [ -n "$p" ] && wait "$p" 2>/dev/null
        STATE[$k]=stopped
    done
}

write_state() {
    local i c line
    {
        for ((i = 1; i <= N; i++)); do
            line="name=cluster-$i etcd_port=${ETCD_PORT[$i]} etcd_peer_port=${PEER_PORT[$i]}"
            line+=" apiserver_port=${API_PORT[$i]}"
            [ "$NODES" = 0 ] ||
                line+=" scheduler_port=${SCHED_PORT[$i]:-0} controllers_port=${KCM_PORT[$i]:-0} kwok_port=${KWOK_PORT[$i]:-0} kubelet_port=${KUBELET_PORT[$i]:-0}"
            for c in "${COMPONENTS[@]}"; do
                line+=" ${c}_pid=${PID[$i.$c]:-0} ${c}_state=${STATE[$i.$c]:-none}"
            done
            printf '%s\n' "$line"
        done
    } >"$DIR/state.tmp" && mv -f "$DIR/state.tmp" "$DIR/state"
}

# --- Cluster setup ---------------------------------------------------------------------

random_hex() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }

prepare_cluster() { # keys and the token file of cluster I
    local d
    d="$(cdir "$1")"
    mkdir -p "$d/pki" || die "cannot create $d"
    if ! openssl genrsa -out "$d/sa.key" 2048 2>/dev/null ||
        ! openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null; then
        die "openssl failed to make the service-account key of cluster-$1"
    fi
    printf '%s,admin,admin-uid,"system:masters"\n' "$(random_hex)" >"$d/tokens.csv"
}

kubeconfig_doc() { # kubeconfig_doc CURRENT (NAME SERVER CA USER TOKEN)...
    local current="$1" clusters="" users="" contexts=""
    shift
    while [ "$#" -ge 5 ]; do
        clusters+="- name: $1
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 "$3")
"
        users+="- name: $4
  user:
    token: $5
"
        contexts+="- name: $1
  context:
    cluster: $1
    user: $4
"
        shift 5
    done
    printf 'apiVersion: v1\nkind: Config\nclusters:\n%susers:\n%scontexts:\n%scurrent-context: %s\n' \
        "$clusters" "$users" "$contexts" "$current"
}

admin_entry() { # admin_entry I: NAME SERVER CA USER TOKEN words for kubeconfig_doc
    local d
    d="$(cdir "$1")"
    ENTRY=("cluster-$1" "https://127.0.0.1:${API_PORT[$1]}" "$d/pki/apiserver.crt" "admin-cluster-$1"
        "$(cut -d, -f1 "$d/tokens.csv" | head -n1)")
}

# install I: CRDs, serve RBAC and the serve kubeconfig (runs in a background subshell).
install() {
    local i="$1" d kc crds=() f names token
    d="$(cdir "$i")"
    kc=("$KUBECTL" --kubeconfig "$d/kubeconfig" --request-timeout=30s)
    for f in "$DEPLOY"/crds/*.yaml; do
        [ "$(basename "$f")" = kustomization.yaml ] || crds+=(-f "$f")
    done
    [ "${#crds[@]}" -gt 0 ] || die "no CRDs in $DEPLOY/crds"
    [ "$NODES" = 0 ] || [ -z "${CLUSTERS_KWOK_EXEC_CRD:-}" ] || crds+=(-f "$CLUSTERS_KWOK_EXEC_CRD")
    names="$("${kc[@]}" apply --server-side --field-manager=clusters.sh "${crds[@]}" -o name)" ||
        die "cluster-$i: applying $DEPLOY/crds failed"
    # shellcheck disable=SC2086 # one word per CRD
    "${kc[@]}" wait --for condition=established --timeout=60s $names >/dev/null ||
        die "cluster-$i: CRDs not established"
    # One identity per component, each with exactly its deploy/<component>/rbac.yaml.
    local role sa
    for role in serve centralized sync agent; do
        [ -f "$DEPLOY/$role/rbac.yaml" ] || continue
        sa="$SERVE_SA"
        [ "$role" = serve ] || sa="$SERVE_SA-$role"
        "${kc[@]}" apply --server-side --field-manager=clusters.sh -f "$DEPLOY/$role/rbac.yaml" >/dev/null ||
            die "cluster-$i: applying $DEPLOY/$role/rbac.yaml failed"
        token="$("${kc[@]}" create token "$sa" -n "$SERVE_NS" --duration=24h)" ||
            die "cluster-$i: kubectl create token $sa failed"
        admin_entry "$i"
        kubeconfig_doc "cluster-$i" "cluster-$i" "${ENTRY[1]}" "${ENTRY[2]}" "$SERVE_NS-$sa" "$token" \
            >"$d/$role.kubeconfig.tmp" && mv -f "$d/$role.kubeconfig.tmp" "$d/$role.kubeconfig"
    done
}

# The fake Node: KWOK manages it (annotation) and sets its status (Ready, capacity).
NODE_MANIFEST='apiVersion: v1
kind: Node
metadata:
  name: node-1
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: node-1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok'

# node_up I: create the fake Node, wait until KWOK has made it Ready, lift the not-ready
# taint. Untainted and with KWOK's capacity, every pod can be scheduled on it.
node_up() {
    local i="$1" d kc
    d="$(cdir "$i")"
    kc=("$KUBECTL" --kubeconfig "$d/kubeconfig" --request-timeout=30s)
    printf '%s\n' "$NODE_MANIFEST" | "${kc[@]}" apply --server-side --field-manager=clusters.sh -f - >/dev/null ||
        die "cluster-$i: creating node-1 failed"
    "${kc[@]}" wait --for=condition=Ready --timeout="${TIMEOUT}s" node/node-1 >/dev/null ||
        die "cluster-$i: node-1 not Ready (see $d/kwok.log)"
    # The API server's TaintNodesByCondition admission gives a new Node this taint; the
    # node lifecycle controller would lift it once Ready, but it does not run here (it
    # would also taint the node again whenever KWOK's heartbeat came late).
    "${kc[@]}" taint nodes node-1 node.kubernetes.io/not-ready:NoSchedule- >/dev/null ||
        die "cluster-$i: removing the not-ready taint of node-1 failed"
}

# --- Supervisor ------------------------------------------------------------------------

# Signals only set STOP; the supervisor checks it (and its parent) in every wait and
# stops outside any trap. (bash 5.2 has been seen to crash when the clean-up ran inside
# an EXIT trap entered from a signal trap.)
STOP=""
should_stop() {
    [ -z "$STOP" ] || return 0
    kill -0 "$PARENT" 2>/dev/null && return 1
    STOP="parent process $PARENT is gone"
}

# wait_job PID: wait for a helper job, stopping everything if asked to meanwhile.
wait_job() {
    while kill -0 "$1" 2>/dev/null; do
        if should_stop; then stop_now; fi
        sleep 0.2
    done
    wait "$1"
}

stop_now() {
    log "$STOP: stopping"
    cleanup 0
}

CLEANED=0
cleanup() { # cleanup EXIT_CODE: stop everything this supervisor started, then exit
    local rc="${1:-$?}" k keys=()
    [ "$BASHPID" = "${SUPERVISOR:-}" ] && [ "$CLEANED" -eq 0 ] || return 0
    CLEANED=1
    trap '' TERM INT HUP
    for k in "${!PID[@]}"; do
        if [ "${STATE[$k]}" != stopped ] && kill -0 "${PID[$k]}" 2>/dev/null; then keys+=("$k"); fi
    done
    [ "${#keys[@]}" -eq 0 ] || log "stopping ${#keys[@]} processes"
    # Helpers (a build, kubectl) too: the whole process group when this shell leads one.
    if [ "$(cut -d' ' -f5 "/proc/$$/stat" 2>/dev/null)" = "$$" ]; then
        kill -TERM -- "-$$" 2>/dev/null
    else
        for k in $(jobs -p); do kill -TERM "$k" 2>/dev/null; done
    fi
    terminate "${keys[@]}"
    wait 2>/dev/null
    exec 3>&-
    if [ "${N:-0}" -gt 0 ] && [ -d "$DIR" ]; then
        write_state 2>/dev/null
        rm -f "$DIR/control" "$DIR/supervisor.pid"
        if [ "${CLUSTERS_REMOVE_DIR:-0}" = 1 ]; then rm -rf "$DIR"; fi
    fi
    log "stopped"
    exit "$rc"
}

# handle CMD I COMP REPLY: a stop/start request from the FIFO; answer in DIR/.reply.REPLY.
handle() {
    local cmd="$1" i="$2" c="$3" reply="$DIR/.reply.$4" msg=ok k
    k="$i.$c"
    if ! [[ "$i" =~ ^[0-9]+$ ]] || [ "$i" -lt 1 ] || [ "$i" -gt "$N" ] || [ -z "${STATE[$k]:-}" ]; then
        msg="error: no component $c in cluster $i (clusters 1..$N, components ${COMPONENTS[*]})"
    elif [ "$cmd" = stop ]; then
        if [ "${STATE[$k]}" = stopped ]; then msg="ok (already stopped)"; else
            log "cluster-$i: stopping $c"
            terminate "$k"
        fi
    elif [ "$cmd" = start ]; then
        if [ "${STATE[$k]}" = running ] && kill -0 "${PID[$k]}" 2>/dev/null; then msg="ok (already running)"; else
            log "cluster-$i: starting $c"
            launch "$i" "$c"
            local keys=("$k")
            # After etcd, wait until the apiserver serves again too.
            if [ "$c" = etcd ] && [ "${STATE[$i.apiserver]}" = running ]; then keys+=("$i.apiserver"); fi
            if ! wait_ready "${keys[@]}"; then
                msg="error: cluster-$i $c did not become ready (see $(cdir "$i")/$c.log)"
                if should_stop; then msg="error: the supervisor is stopping ($STOP)"; fi
            fi
        fi
    else
        msg="error: unknown command $cmd"
    fi
    write_state
    printf '%s\n' "$msg" >"$reply.tmp" && mv -f "$reply.tmp" "$reply"
}

cmd_up() {
    [ "$#" -eq 2 ] && [[ "$1" =~ ^[1-9][0-9]*$ ]] || usage
    N="$1"
    DIR="$2"
    [ "$N" -le 100 ] || die "at most 100 clusters"
    mkdir -p "$DIR" || die "cannot create $DIR"
    DIR="$(cd "$DIR" && pwd)"
    # Fresh state only: old etcd data or keys would be half-reused.
    [ -z "$(ls -A "$DIR")" ] || die "$DIR is not empty (a fresh or empty directory is needed)"
    SUPERVISOR=$$
    PARENT="${CLUSTERS_PARENT_PID:-$PPID}"
    trap cleanup EXIT # only for an unexpected exit; stops and errors call cleanup directly
    trap 'STOP=SIGTERM' TERM
    trap 'STOP=SIGINT' INT
    trap 'STOP=SIGHUP' HUP
    # The reader of stdout/stderr may be gone (a crashed test); a write must not kill us
    # before we have cleaned up.
    trap '' PIPE
    echo $$ >"$DIR/supervisor.pid"

    local t0=$SECONDS i c
    for c in curl openssl base64 "$KUBECTL"; do
        command -v "$c" >/dev/null 2>&1 || die "$c not found (needed to run test clusters)"
    done
    PDEATHSIG=""
    if command -v setpriv >/dev/null 2>&1 && setpriv --pdeathsig TERM true 2>/dev/null; then PDEATHSIG=1; fi
    [ -f "$DEPLOY/serve/rbac.yaml" ] || die "$DEPLOY/serve/rbac.yaml not found (set CLUSTERS_DEPLOY_DIR)"

    # Binaries: built once, cached by version (a cold build takes minutes).
    local bins=(etcd kube-apiserver) b
    [ "$NODES" = 0 ] || bins+=(kube-scheduler kube-controller-manager kwok)
    "$HERE/k8s-bins.sh" "${bins[@]}" >"$DIR/.bins" &
    wait_job $! || die "scripts/k8s-bins.sh ${bins[*]} failed: no binaries"
    BIN="$(tail -n1 "$DIR/.bins")"
    rm -f "$DIR/.bins"
    for b in "${bins[@]}"; do [ -x "$BIN/$b" ] || die "no $b in '$BIN'"; done
    printf 'BINARIES %s\n' "$BIN" || true

    for ((i = 1; i <= N; i++)); do
        prepare_cluster "$i"
        pick_port; ETCD_PORT[$i]=$PORT
        pick_port; PEER_PORT[$i]=$PORT
        pick_port; API_PORT[$i]=$PORT
    done
    local t1=$SECONDS keys=()
    for ((i = 1; i <= N; i++)); do launch "$i" etcd; keys+=("$i.etcd"); done
    write_state
    wait_ready "${keys[@]}" || { should_stop && stop_now; die "etcd did not start"; }
    keys=()
    for ((i = 1; i <= N; i++)); do launch "$i" apiserver; keys+=("$i.apiserver"); done
    write_state
    wait_ready "${keys[@]}" || { should_stop && stop_now; die "kube-apiserver did not start"; }
    local t2=$SECONDS all=()
    for ((i = 1; i <= N; i++)); do
        admin_entry "$i"
        kubeconfig_doc "cluster-$i" "${ENTRY[@]}" >"$(cdir "$i")/kubeconfig"
        all+=("${ENTRY[@]}")
    done
    kubeconfig_doc cluster-1 "${all[@]}" >"$DIR/kubeconfig"
    local jobs=()
    for ((i = 1; i <= N; i++)); do
        install "$i" &
        jobs+=($!)
    done
    for i in "${jobs[@]}"; do wait_job "$i" || die "installing the CRDs and RBAC failed"; done
    local t3=$SECONDS nodes=""
    if [ "$NODES" = 1 ]; then
        keys=()
        for ((i = 1; i <= N; i++)); do
            pick_port; SCHED_PORT[$i]=$PORT
            pick_port; KCM_PORT[$i]=$PORT
            pick_port; KWOK_PORT[$i]=$PORT
            pick_port; KUBELET_PORT[$i]=$PORT
            for c in "${NODE_COMPONENTS[@]}"; do launch "$i" "$c"; keys+=("$i.$c"); done
        done
        write_state
        wait_ready "${keys[@]}" || { should_stop && stop_now; die "the node components did not start"; }
        jobs=()
        for ((i = 1; i <= N; i++)); do
            node_up "$i" &
            jobs+=($!)
        done
        for i in "${jobs[@]}"; do wait_job "$i" || die "the fake nodes did not become Ready"; done
        nodes=", scheduler+controllers+kwok+node $((SECONDS - t3))s"
    fi
    log "$N clusters ready in $((SECONDS - t0))s (etcd+apiserver $((t2 - t1))s, CRDs+RBAC $((t3 - t2))s$nodes)"

    rm -f "$DIR/control"
    mkfifo "$DIR/control" || die "mkfifo $DIR/control failed"
    exec 3<>"$DIR/control"
    write_state
    printf 'READY %s\n' "$DIR" || true

    local cmd a b r k part line="" tick=$SECONDS
    while ! should_stop; do
        # A timeout can fall between the bytes of a line (bash reads a FIFO
        # byte by byte): the part read so far is kept and completed by the
        # next read, else "start …" arrives as "tart …".
        if IFS= read -r -t 1 -u 3 part; then
            read -r cmd a b r <<<"$line$part"
            line=""
            [ -n "${r:-}" ] && handle "$cmd" "$a" "$b" "$r"
        else
            line+="$part"
        fi
        [ -z "$STOP" ] || break
        if [ "$SECONDS" -ne "$tick" ]; then
            tick=$SECONDS
            for k in "${!PID[@]}"; do
                if [ "${STATE[$k]}" = running ] && ! kill -0 "${PID[$k]}" 2>/dev/null; then
                    wait "${PID[$k]}" 2>/dev/null
                    STATE[$k]=exited
                    log "cluster-${k%%.*} ${k#*.} (pid ${PID[$k]}) exited on its own; see $(cdir "${k%%.*}")/${k#*.}.log"
                    write_state
                fi
            done
        fi
    done
    stop_now
}

# --- Clients of a running supervisor ---------------------------------------------------

supervisor_of() { # supervisor_of DIR: set SUP to the live supervisor's pid
    SUP="$(cat "$1/supervisor.pid" 2>/dev/null)"
    if [ -z "$SUP" ] || [ ! -p "$1/control" ] || ! kill -0 "$SUP" 2>/dev/null; then
        die "no supervisor running for $1"
    fi
}

cmd_control() { # cmd_control stop|start DIR I COMP
    [ "$#" -eq 4 ] || usage
    local cmd="$1" dir="$2" i="$3" c="$4" id reply deadline
    case "$c" in etcd | apiserver | scheduler | controllers | kwok) ;; kube-apiserver) c=apiserver ;; *) usage ;; esac
    supervisor_of "$dir"
    id="$$.$RANDOM"
    reply="$dir/.reply.$id"
    exec 4<>"$dir/control" # read-write: never blocks, even if the supervisor just died
    printf '%s %s %s %s\n' "$cmd" "$i" "$c" "$id" >&4
    exec 4>&-
    deadline=$((SECONDS + TIMEOUT + 60))
    while [ ! -f "$reply" ]; do
        kill -0 "$SUP" 2>/dev/null || die "the supervisor of $dir exited"
        [ "$SECONDS" -lt "$deadline" ] || die "no answer from the supervisor of $dir"
        sleep 0.1
    done
    local msg
    msg="$(cat "$reply")"
    rm -f "$reply"
    case "$msg" in ok*) log "cluster-$i $c: $cmd $msg" ;; *) die "$msg" ;; esac
}

cmd_down() {
    [ "$#" -eq 1 ] || usage
    supervisor_of "$1"
    kill -TERM "$SUP"
    local deadline=$((SECONDS + 60))
    while kill -0 "$SUP" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || die "supervisor $SUP still running after 60 s"
        sleep 0.2
    done
}

case "${1:-}" in
up) shift; cmd_up "$@" ;;
stop | start) cmd_control "$@" ;;
status) [ "$#" -eq 2 ] || usage; cat "$2/state" ;;
down) shift; cmd_down "$@" ;;
*) usage ;;
esac
