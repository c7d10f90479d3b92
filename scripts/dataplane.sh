#!/usr/bin/env bash
# A data plane for the test clusters of scripts/clusters.sh: per cluster one
# "node" (a network namespace running the real kube-proxy, nftables mode,
# against that cluster's API server) and "Pods" (network namespaces routed
# through their node, each running scripts/dataplane-pod.py), with every
# cluster's Pod network routed to every other's (a flat network, as
# multi-cluster services assume). No containers, no kubelet: root, iproute2,
# nft and python3 are all it needs.
#
# Usage:
#   scripts/dataplane.sh up CLUSTERS_DIR   after `CLUSTERS_SERVICE_CIDR='198.19.{I}.0/24'
#                                          scripts/clusters.sh up N CLUSTERS_DIR`: build the
#                                          data plane of its N clusters, print "READY DIR"
#                                          (DIR = CLUSTERS_DIR/dataplane), then supervise in
#                                          the foreground until SIGTERM/SIGINT/SIGHUP or until
#                                          the parent process exits; everything is torn down
#                                          on the way out
#   scripts/dataplane.sh fleet N DIR       by hand: clusters.sh up N DIR with the Service CIDRs
#                                          below, `up DIR`, then (with target/debug/clusterset-dns
#                                          or CLUSTERSET_DNS_BIN) sync over every cluster, serve
#                                          per cluster on 198.18.0.1:530I and CoreDNS in each dns
#                                          Pod (Corefile.example's block); Ctrl-C stops it all
#   scripts/dataplane.sh exec DIR CLUSTER NAME CMD...
#                                          run CMD in Pod NAME (pod-1, pod-2, client, dns) of
#                                          cluster CLUSTER (1..N), e.g. `... exec DIR 2 client
#                                          dig web.shop.svc.clusterset.local.`
#   scripts/dataplane.sh sweep             remove what a dead data plane left (also done by up)
#
# Addresses (198.18.0.0/15 and 2001:2::/48 only, the benchmarking ranges of RFC 2544
# and RFC 5180, so nothing on a real network is shadowed; dual-stack):
#   198.18.0.1/24      the host, on bridge PREFIX (kube-apiservers reached here: the
#                      host DNATs 198.18.0.1:APISERVER_PORT to 127.0.0.1, route_localnet)
#   198.18.0.(10+I)    node of cluster I (on the bridge)
#   198.18.I.0/24      Pod CIDR of cluster I: pod-K 198.18.I.(10+K), client 198.18.I.100,
#                      dns 198.18.I.53 (for the test's CoreDNS)
#   198.19.I.0/24      Service CIDR of cluster I (clusters.sh CLUSTERS_SERVICE_CIDR);
#                      kube-system/kube-dns is 198.19.I.10 -> the dns Pod, port 53
#   IPv6: the host 2001:2::1/64, node 2001:2::(10+I), Pods 2001:2:0:I::/64 (a Pod's
#   address ends like its IPv4 one: pod-1 of cluster 2 is 2001:2:0:2::11), Services
#   2001:2:0:I00::/112 (the second Service CIDR; I <= 9). Pods reach their node at fe80::1.
# Every Pod's /etc/netns/NETNS/resolv.conf says "nameserver 198.19.I.10", so
# `ip netns exec` gives its programs the cluster DNS as a real Pod has it.
#
# Pods: a /32 on eth0, a device default route; the node side answers ARP
# (proxy_arp) and routes the /32 to the veth, as Calico does. No bridge, so
# every packet between Pods, also on one node, passes the node's netfilter
# hooks where kube-proxy's rules are. pod-1..pod-PODS run
# `dataplane-pod.py serve cluster-I pod-K PORTS` (TCP and UDP).
#
# What up writes into each cluster (admin): Node cluster-I-node (InternalIP),
# Service kube-system/kube-dns and its EndpointSlice.
#
# DIR after READY:
#   DIR/state     one line per namespace: kind=node|pod cluster=cluster-I name=NAME
#                 netns=NETNS ip=IP ip6=IPV6 pid=PID (the server, kube-proxy; 0: none)
#   DIR/*.log     kube-proxy-I.log, cluster-I-NAME.log
#   DIR/supervisor.pid
#
# Names: everything carries PREFIX=csdp<supervisor pid> (netns PREFIX-cI-NAME,
# host links PREFIX and PREFIXnI, nft table ip PREFIX, /etc/netns/PREFIX-*), so
# a sweep finds what a supervisor killed with SIGKILL left behind: any PREFIX
# whose pid is not a running dataplane.sh. Only one data plane runs at a time
# on a machine (the addresses are fixed); up fails if another one is alive.
#
# Environment:
#   DATAPLANE_PARENT_PID  stop when this process is gone (default: the parent of up)
#   DATAPLANE_PODS        server Pods per cluster (default 2)
#   DATAPLANE_PORTS       ports every server Pod answers on, TCP and UDP (default "8080 8081")
#   DATAPLANE_TIMEOUT     seconds kube-proxy gets to program kube-dns (default 120)
#   KUBECTL, CLUSTERSET_DNS_CACHE, K8S_VERSION
#
# Any failing command is an error that names the command and its output (exit 1).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
KUBECTL="${KUBECTL:-kubectl}"
PODS="${DATAPLANE_PODS:-2}"
PORTS="${DATAPLANE_PORTS:-8080 8081}"
TIMEOUT="${DATAPLANE_TIMEOUT:-120}"
HOST_IP=198.18.0.1
HOST_IP6=2001:2::1
export CLUSTERS_SERVICE_CIDR='198.19.{I}.0/24,2001:2:0:{I}00::/112'

log() { printf '[%s] dataplane: %s\n' "$(date '+%H:%M:%S')" "$*" >&2 || true; }
die() {
    log "ERROR: $*"
    if [ "$BASHPID" = "${SUPERVISOR:-}" ]; then cleanup 1; fi
    exit 1
}
usage() { sed -n '/^# Usage:/,/^# Addresses/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit 64; }

# run CMD...: run it; on failure die naming the command and its output.
run() {
    local out
    if ! out="$("$@" 2>&1)"; then die "command failed: $*: $out"; fi
}

# --- Teardown --------------------------------------------------------------------------

# remove_prefix P: kill every process in P's namespaces, delete them, the host links,
# the nft table and the resolv.conf files. Tolerates parts already gone.
remove_prefix() {
    local p="$1" ns pids deadline
    local all=()
    mapfile -t all < <(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$p-" || true)
    for ns in "${all[@]}"; do
        pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
        # shellcheck disable=SC2086 # a list of pids
        [ -z "${pids// /}" ] || kill -TERM $pids 2>/dev/null
    done
    deadline=$((SECONDS + 10))
    for ns in "${all[@]}"; do
        while [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
        pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
        # shellcheck disable=SC2086
        [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null
        rm -rf "/etc/netns/$ns"
    done
    local l
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${p}(n[0-9]+)?$" || true); do
        ip link del "$l" 2>/dev/null
    done
    nft delete table ip "$p" 2>/dev/null
    return 0
}

# sweep: remove every prefix whose supervisor is not a running dataplane.sh.
sweep() {
    local names p pid
    names="$( {
        ip netns list 2>/dev/null | awk '{print $1}'
        ip -o link show 2>/dev/null | awk -F': ' '{print $2}'
        nft list tables ip 2>/dev/null | awk '{print $3}'
        ls /etc/netns 2>/dev/null
    } | grep -oE '^csdp[0-9]+' | sort -u)"
    for p in $names; do
        pid="${p#csdp}"
        [ "$pid" = "${SUPERVISOR:-}" ] && continue
        if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'dataplane.sh'; then
            continue
        fi
        log "sweeping what dead data plane $p left"
        remove_prefix "$p"
    done
}

STOP=""
should_stop() {
    [ -z "$STOP" ] || return 0
    kill -0 "$PARENT" 2>/dev/null && return 1
    STOP="parent process $PARENT is gone"
}

CLEANED=0
cleanup() {
    local rc="${1:-$?}"
    [ "$BASHPID" = "${SUPERVISOR:-}" ] && [ "$CLEANED" -eq 0 ] || return 0
    CLEANED=1
    trap '' TERM INT HUP
    log "tearing down $PREFIX"
    remove_prefix "$PREFIX"
    wait 2>/dev/null
    [ "$(cat "$DIR/supervisor.pid" 2>/dev/null)" != "$SUPERVISOR" ] || rm -f "$DIR/supervisor.pid"
    log "stopped"
    exit "$rc"
}

# --- Building ----------------------------------------------------------------------------

declare -A API_PORT TOKEN
STATE_LINES=()

netns_of() { printf '%s-c%s-%s' "$PREFIX" "$1" "$2"; } # netns_of I NAME

# read_clusters: N, API_PORT[I] and TOKEN[I] from clusters.sh's files.
read_clusters() {
    [ -f "$CDIR/state" ] || die "$CDIR/state not found (start clusters.sh up N $CDIR first)"
    N=0
    local line i
    while read -r line; do
        [ -n "$line" ] || continue
        N=$((N + 1))
        i=$N
        API_PORT[$i]="$(sed -n 's/.*apiserver_port=\([0-9]*\).*/\1/p' <<<"$line")"
        TOKEN[$i]="$(cut -d, -f1 "$CDIR/cluster-$i/tokens.csv" | head -n1)"
        [ -n "${API_PORT[$i]}" ] && [ -n "${TOKEN[$i]}" ] || die "cannot read cluster-$i from $CDIR"
    done <"$CDIR/state"
    [ "$N" -ge 1 ] && [ "$N" -le 200 ] || die "$CDIR/state lists $N clusters (1..200 supported)"
}

host_network() {
    if ip -o addr show 2>/dev/null | grep -q " $HOST_IP/"; then
        die "$HOST_IP is already on this machine (another data plane is running: $(ip -o addr show | grep " $HOST_IP/" | awk '{print $2}'))"
    fi
    run ip link add "$PREFIX" type bridge
    run ip addr add "$HOST_IP/24" dev "$PREFIX"
    run ip addr add "$HOST_IP6/64" dev "$PREFIX" nodad
    run ip link set "$PREFIX" up
    # The API servers listen on 127.0.0.1 only: nodes reach them at the host's bridge
    # address, DNATed to loopback (route_localnet lets the kernel route to 127/8 there).
    run sysctl -qw "net.ipv4.conf.$PREFIX.route_localnet=1"
    local ports="" i
    for ((i = 1; i <= N; i++)); do ports+="${ports:+, }${API_PORT[$i]}"; done
    run nft -f - <<EOF
table ip $PREFIX {
    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        iifname "$PREFIX" ip daddr $HOST_IP tcp dport { $ports } dnat to 127.0.0.1
    }
}
EOF
    # Replies from the host (clusterset-dns serve on $HOST_IP) to Pods.
    for ((i = 1; i <= N; i++)); do
        run ip route add "198.18.$i.0/24" via "198.18.0.$((10 + i))" dev "$PREFIX"
        run ip -6 route add "2001:2:0:$i::/64" via "2001:2::$((10 + i))" dev "$PREFIX"
    done
}

# no_dad NETNS: addresses of interfaces made in NETNS from now on are usable at once
# (duplicate address detection would keep them tentative for a second or two).
no_dad() {
    run ip netns exec "$1" sysctl -qw net.ipv6.conf.default.accept_dad=0 net.ipv6.conf.all.accept_dad=0
}

node_network() { # node_network I
    local i="$1" ns j
    ns="$(netns_of "$i" node)"
    run ip netns add "$ns"
    no_dad "$ns"
    run ip link add "${PREFIX}n$i" type veth peer name eth0 netns "$ns"
    run ip link set "${PREFIX}n$i" master "$PREFIX" up
    run ip -n "$ns" link set lo up
    run ip -n "$ns" addr add "198.18.0.$((10 + i))/24" dev eth0
    run ip -n "$ns" addr add "2001:2::$((10 + i))/64" dev eth0 nodad
    run ip -n "$ns" link set eth0 up
    run ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
    run ip -n "$ns" route add default via "$HOST_IP"
    run ip -n "$ns" -6 route add default via "$HOST_IP6"
    # The flat network: every other cluster's Pods straight through its node.
    for ((j = 1; j <= N; j++)); do
        [ "$j" = "$i" ] && continue
        run ip -n "$ns" route add "198.18.$j.0/24" via "198.18.0.$((10 + j))"
        run ip -n "$ns" -6 route add "2001:2:0:$j::/64" via "2001:2::$((10 + j))"
    done
    STATE_LINES+=("kind=node cluster=cluster-$i name=node netns=$ns ip=198.18.0.$((10 + i)) ip6=2001:2::$((10 + i))")
}

pod_network() { # pod_network I NAME IP: sets IP6
    local i="$1" name="$2" ip="$3" node ns
    IP6="2001:2:0:$i::${ip##*.}"
    node="$(netns_of "$i" node)"
    ns="$(netns_of "$i" "$name")"
    run ip netns add "$ns"
    no_dad "$ns"
    run ip -n "$node" link add "v-$name" type veth peer name eth0 netns "$ns"
    run ip -n "$ns" link set lo up
    run ip -n "$ns" addr add "$ip/32" dev eth0
    run ip -n "$ns" addr add "$IP6/128" dev eth0 nodad
    run ip -n "$ns" link set eth0 up
    run ip -n "$ns" route add default dev eth0
    run ip -n "$ns" -6 route add default via fe80::1 dev eth0
    # proxy_delay 0: answer at once, not after up to 0.8 s (the default, for shared media).
    run ip netns exec "$node" sysctl -qw "net.ipv4.conf.v-$name.proxy_arp=1" "net.ipv4.neigh.v-$name.proxy_delay=0"
    run ip -n "$node" addr add fe80::1/64 dev "v-$name" nodad
    run ip -n "$node" link set "v-$name" up
    run ip -n "$node" route add "$ip/32" dev "v-$name"
    run ip -n "$node" -6 route add "$IP6/128" dev "v-$name"
    mkdir -p "/etc/netns/$ns" || die "mkdir /etc/netns/$ns failed"
    printf 'nameserver 198.19.%s.10\noptions timeout:1 attempts:2\n' "$i" >"/etc/netns/$ns/resolv.conf" ||
        die "writing /etc/netns/$ns/resolv.conf failed"
}

# kubeconfig_for I: kube-proxy's kubeconfig: the host address, the serving
# certificate checked for 127.0.0.1 (its IP SAN).
kubeconfig_for() {
    local i="$1"
    cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cluster-$i
  cluster:
    server: https://$HOST_IP:${API_PORT[$i]}
    tls-server-name: 127.0.0.1
    certificate-authority-data: $(base64 -w0 "$CDIR/cluster-$i/pki/apiserver.crt")
users:
- name: admin
  user:
    token: ${TOKEN[$i]}
contexts:
- name: cluster-$i
  context: {cluster: cluster-$i, user: admin}
current-context: cluster-$i
EOF
}

# objects I: the Node, and kube-dns with its EndpointSlice. The Service has no
# selector and the slice is ours: in clusters with a controller-manager
# (scripts/conformance.sh) the EndpointSlice controller would otherwise empty it.
objects() {
    local i="$1"
    cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: cluster-$i-node
  labels: {kubernetes.io/hostname: cluster-$i-node}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: 198.19.$i.10
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-dataplane
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: dataplane.sh
addressType: IPv4
endpoints:
- addresses: [198.18.$i.53]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: cluster-$i-node
  targetRef: {kind: Pod, namespace: kube-system, name: coredns-dataplane}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

# launch NAME NETNS CMD...: start CMD in NETNS as a child (SIGTERM when we die), log to
# DIR/NAME.log; sets LAUNCHED to its pid.
launch() {
    local name="$1" ns="$2"
    shift 2
    ip netns exec "$ns" setpriv --pdeathsig TERM -- "$@" </dev/null >>"$DIR/$name.log" 2>&1 &
    LAUNCHED=$!
}

start_node() { # start_node I: objects, the node's Node status address, kube-proxy
    local i="$1" ns kc
    ns="$(netns_of "$i" node)"
    kc="$DIR/kube-proxy-$i.kubeconfig"
    kubeconfig_for "$i" >"$kc"
    objects "$i" | run "$KUBECTL" --kubeconfig "$CDIR/cluster-$i/kubeconfig" --request-timeout=30s \
        apply --server-side --force-conflicts --field-manager=dataplane.sh -f -
    run "$KUBECTL" --kubeconfig "$CDIR/cluster-$i/kubeconfig" --request-timeout=30s patch node "cluster-$i-node" \
        --subresource=status --type=merge \
        -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"198.18.0.$((10 + i))\"},{\"type\":\"InternalIP\",\"address\":\"2001:2::$((10 + i))\"},{\"type\":\"Hostname\",\"address\":\"cluster-$i-node\"}]}}"
    # conntrack: leave the (init-namespace only) table size and the timeouts as they are.
    launch "kube-proxy-$i" "$ns" "$KUBE_PROXY" --kubeconfig "$kc" --proxy-mode nftables \
        --hostname-override "cluster-$i-node" --cluster-cidr "198.18.$i.0/24,2001:2:0:$i::/64" \
        --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
        --healthz-bind-address "198.18.0.$((10 + i)):10256" --metrics-bind-address 127.0.0.1:10249 -v 2
    KP_PID[$i]=$LAUNCHED
    STATE_LINES[$((i - 1))]+=" pid=$LAUNCHED"
}

# wait_programmed: until every node's kube-proxy has rules for its kube-dns VIP.
wait_programmed() {
    local deadline=$((SECONDS + TIMEOUT)) i ns pending
    while :; do
        pending=0
        for ((i = 1; i <= N; i++)); do
            ns="$(netns_of "$i" node)"
            kill -0 "${KP_PID[$i]}" 2>/dev/null || {
                tail -n 30 "$DIR/kube-proxy-$i.log" >&2
                die "kube-proxy of cluster-$i exited (log above: $DIR/kube-proxy-$i.log)"
            }
            ip netns exec "$ns" nft list table ip kube-proxy 2>/dev/null | grep -q "198.19.$i.10" || pending=1
        done
        [ "$pending" -eq 1 ] || return 0
        should_stop && cleanup 0
        if [ "$SECONDS" -ge "$deadline" ]; then
            for ((i = 1; i <= N; i++)); do tail -n 15 "$DIR/kube-proxy-$i.log" >&2; done
            die "kube-proxy did not program the kube-dns VIPs within ${TIMEOUT}s"
        fi
        sleep 0.2
    done
}

write_state() {
    printf '%s\n' "${STATE_LINES[@]}" >"$DIR/state.tmp" && mv -f "$DIR/state.tmp" "$DIR/state"
}

declare -A KP_PID
cmd_up() {
    [ "$#" -eq 1 ] || usage
    CDIR="$(cd "$1" && pwd)" || die "no directory $1"
    DIR="$CDIR/dataplane"
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, nft)"
    local c
    for c in ip nft sysctl setpriv python3 base64 "$KUBECTL"; do
        command -v "$c" >/dev/null 2>&1 || die "$c not found (needed by the data plane)"
    done
    SUPERVISOR=$BASHPID
    PREFIX="csdp$SUPERVISOR"
    PARENT="${DATAPLANE_PARENT_PID:-$PPID}"
    trap 'cleanup $?' EXIT
    trap 'STOP=SIGTERM' TERM
    trap 'STOP=SIGINT' INT
    trap 'STOP=SIGHUP' HUP
    trap '' PIPE
    mkdir -p "$DIR" || die "cannot create $DIR"
    echo "$SUPERVISOR" >"$DIR/supervisor.pid"
    sweep
    KUBE_PROXY="$(pinned kube-proxy K8S_VERSION)"
    [ -x "$KUBE_PROXY" ] || die "no kube-proxy at '$KUBE_PROXY'"
    read_clusters
    local t0=$SECONDS i k name ip
    host_network
    for ((i = 1; i <= N; i++)); do node_network "$i"; done
    for ((i = 1; i <= N; i++)); do start_node "$i"; done
    for ((i = 1; i <= N; i++)); do
        for ((k = 1; k <= PODS; k++)); do
            name="pod-$k" ip="198.18.$i.$((10 + k))"
            pod_network "$i" "$name" "$ip"
            # shellcheck disable=SC2086 # one word per port
            launch "cluster-$i-$name" "$(netns_of "$i" "$name")" python3 "$HERE/dataplane-pod.py" serve \
                "cluster-$i" "$name" $PORTS
            STATE_LINES+=("kind=pod cluster=cluster-$i name=$name netns=$(netns_of "$i" "$name") ip=$ip ip6=$IP6 pid=$LAUNCHED")
        done
        pod_network "$i" client "198.18.$i.100"
        STATE_LINES+=("kind=pod cluster=cluster-$i name=client netns=$(netns_of "$i" client) ip=198.18.$i.100 ip6=$IP6 pid=0")
        pod_network "$i" dns "198.18.$i.53"
        STATE_LINES+=("kind=pod cluster=cluster-$i name=dns netns=$(netns_of "$i" dns) ip=198.18.$i.53 ip6=$IP6 pid=0")
    done
    write_state
    wait_programmed
    log "data plane of $N clusters ready in $((SECONDS - t0))s ($PREFIX; state in $DIR/state)"
    printf 'READY %s\n' "$DIR" || true

    while ! should_stop; do
        sleep 1
        for ((i = 1; i <= N; i++)); do
            if [ -n "${KP_PID[$i]}" ] && ! kill -0 "${KP_PID[$i]}" 2>/dev/null; then
                log "kube-proxy of cluster-$i exited; see $DIR/kube-proxy-$i.log"
                KP_PID[$i]=""
            fi
        done
    done
    log "$STOP: stopping"
    cleanup 0
}

# pinned NAME VAR: the cached binary NAME-<version> (VAR's default in k8s-bins.sh), or
# build it. The cache lock of k8s-bins.sh is held for the whole of any other build.
pinned() {
    local name="$1" var="$2" v bin
    v="${!var:-$(sed -n "s/^$var=\"\${$var:-\\(v[0-9.]*\\)}\"\$/\\1/p" "$HERE/k8s-bins.sh")}"
    bin="${CLUSTERSET_DNS_CACHE:-$HOME/.cache/clusterset-dns}/bin"
    if [ -n "$v" ] && [ -x "$bin/$name-$v" ]; then printf '%s' "$bin/$name-$v"; return; fi
    bin="$("$HERE/k8s-bins.sh" "$name" | tail -n1)" || die "scripts/k8s-bins.sh $name failed"
    printf '%s' "$bin/$name"
}

# fleet_dns DIR N: what the tests run per scenario, for the whole fleet: sync over every
# cluster, serve per cluster on $HOST_IP:530I (fed by its own API server), CoreDNS in each
# cluster's dns Pod running Corefile.example's clusterset.local block.
fleet_dns() {
    local dir="$1" n="$2" i args=() ns block coredns
    local bin="${CLUSTERSET_DNS_BIN:-$HERE/../target/debug/clusterset-dns}"
    if [ ! -x "$bin" ]; then
        log "no $bin (cargo build, or set CLUSTERSET_DNS_BIN): no sync, serve or CoreDNS started"
        return
    fi
    for ((i = 1; i <= n; i++)); do args+=(--cluster "cluster-$i=$dir/cluster-$i/sync.kubeconfig"); done
    setpriv --pdeathsig TERM -- "$bin" sync --http-listen 127.0.0.1:9390 "${args[@]}" </dev/null \
        >>"$dir/dataplane/sync.log" 2>&1 &
    FLEET_PIDS+=($!)
    coredns="$(pinned coredns COREDNS_VERSION)"
    block="$(awk '/^clusterset\.local:53 \{/ {on = 1} on {print} on && /^\}/ {exit}' "$HERE/../Corefile.example")"
    [ -n "$block" ] || die "no clusterset.local:53 block in Corefile.example"
    for ((i = 1; i <= n; i++)); do
        setpriv --pdeathsig TERM -- "$bin" serve --kubeconfig "$dir/cluster-$i/serve.kubeconfig" \
            --listen "$HOST_IP:$((5300 + i))" --http-listen "127.0.0.1:$((9300 + i))" --cluster-id "cluster-$i" \
            </dev/null >>"$dir/dataplane/serve-$i.log" 2>&1 &
        FLEET_PIDS+=($!)
        mkdir -p "$dir/dataplane/coredns-$i"
        printf '%s\n' "${block//CLUSTERSET_DNS_SERVICE_IP/$HOST_IP:$((5300 + i))}" >"$dir/dataplane/coredns-$i/Corefile"
        ns="$(sed -n "s/.* cluster=cluster-$i name=dns netns=\([^ ]*\).*/\1/p" "$dir/dataplane/state")"
        # In the Pod's namespace: the data plane's teardown kills it.
        (cd "$dir/dataplane/coredns-$i" && exec ip netns exec "$ns" "$coredns" -conf Corefile) \
            </dev/null >>"$dir/dataplane/coredns-$i.log" 2>&1 &
    done
    log "sync, serve ($HOST_IP:5301..$((5300 + n))) and CoreDNS (kube-dns of each cluster) started; logs in $dir/dataplane"
}

FLEET_PIDS=()
cmd_fleet() { # by hand: clusters, their data plane and the DNS path, one command
    [ "$#" -eq 2 ] || usage
    local n="$1" dir="$2" line
    mkdir -p "$dir" || die "cannot create $dir"
    dir="$(cd "$dir" && pwd)"
    trap 'kill -TERM "${FLEET_PIDS[@]}" 2>/dev/null; wait' EXIT
    trap 'exit 0' INT TERM HUP
    coproc CLUSTERS { CLUSTERS_PARENT_PID=$$ exec "$HERE/clusters.sh" up "$n" "$dir"; }
    FLEET_PIDS+=("$CLUSTERS_PID")
    while read -r line <&"${CLUSTERS[0]}"; do
        case "$line" in READY*) break ;; esac
    done
    kill -0 "${FLEET_PIDS[0]}" 2>/dev/null || die "clusters.sh up failed"
    coproc DATAPLANE { DATAPLANE_PARENT_PID=$$ exec "$SELF" up "$dir"; }
    FLEET_PIDS+=("$DATAPLANE_PID")
    while read -r line <&"${DATAPLANE[0]}"; do
        case "$line" in READY*) break ;; esac
    done
    kill -0 "$DATAPLANE_PID" 2>/dev/null || die "dataplane.sh up failed"
    fleet_dns "$dir" "$n"
    log "kubeconfigs: $dir/cluster-I/kubeconfig; in a Pod: $SELF exec $dir I pod-1|pod-2|client|dns CMD"
    log "READY; Ctrl-C (or SIGTERM to $$) stops everything"
    while kill -0 "$DATAPLANE_PID" 2>/dev/null; do sleep 1; done
}

cmd_exec() { # exec DIR I NAME CMD...
    [ "$#" -ge 4 ] || usage
    local dir="$1" i="$2" name="$3" ns
    shift 3
    [ -f "$dir/dataplane/state" ] || dir="$(dirname "$dir")" # DIR or DIR/dataplane
    ns="$(sed -n "s/.* cluster=cluster-$i name=$name netns=\([^ ]*\).*/\1/p" "$dir/dataplane/state")"
    [ -n "$ns" ] || die "no $name in cluster $i (see $dir/dataplane/state)"
    exec ip netns exec "$ns" "$@"
}

case "${1:-}" in
up) shift; cmd_up "$@" ;;
fleet) shift; cmd_fleet "$@" ;;
exec) shift; cmd_exec "$@" ;;
sweep) SUPERVISOR=""; sweep ;;
*) usage ;;
esac
