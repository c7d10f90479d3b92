#!/usr/bin/env bash
# Build real kube-apiserver, kube-scheduler, kube-controller-manager, etcd, KWOK
# and CoreDNS binaries, and the kubectl and helm clients, from the Go module proxy
# for the integration tests, cached by version.
#
# Usage: scripts/k8s-bins.sh [all | kube-apiserver | kube-scheduler | kube-controller-manager
#                             | kube-proxy | kubectl | etcd | kwok | coredns | helm | coredns-multicluster]...
#
# Builds whatever is missing and prints the bin directory on the last line of
# stdout; everything else (progress, go output) goes to stderr. Idempotent:
# existing versioned binaries are reused, a stable symlink (kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl, etcd, kwok, coredns, helm,
# coredns-multicluster) points at the pinned version.
#
# Environment:
#   CLUSTERSET_DNS_CACHE   cache root (default ~/.cache/clusterset-dns);
#                          binaries in $CLUSTERSET_DNS_CACHE/bin, wrapper modules in .../src
#   K8S_VERSION            k8s.io/kubernetes tag of kube-apiserver, kube-scheduler,
#                          kube-controller-manager and kubectl (default below)
#   KWOK_VERSION           sigs.k8s.io/kwok tag of the kwok controller (fake nodes, pods)
#   ETCD_VERSION           go.etcd.io/etcd/server/v3 tag    (default below)
#   COREDNS_VERSION        github.com/coredns/coredns tag for the stock coredns
#   HELM_VERSION           helm.sh/helm/v3 tag
#   MC_COREDNS_VERSION     coredns version paired with the multicluster plugin
#   MULTICLUSTER_VERSION   github.com/coredns/multicluster pseudo-version
#                          (coredns-multicluster is built only from the module
#                          proxy; while the proxy refuses that module the target
#                          fails, and `all` skips it with a warning)
#   K8S_BINS_JOBS          go build -p value (default 2)
#
# Go builds run under `nice -n 19` so that they do not starve other work.
# GOMODCACHE / GOCACHE are left at their defaults (~/go/pkg/mod, ~/.cache/go-build).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.33.13}"
ETCD_VERSION="${ETCD_VERSION:-v3.5.35}"
# v0.7.0: client-go v0.33 (the API servers' minor) and `go 1.24.0`, the oldest Go
# scripts/test.sh installs; v0.8.0 needs Go 1.26 and client-go v0.36.
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.4}"
# The newest Helm 3 whose go.mod asks for no Go newer than 1.24.
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
# The multicluster plugin's own go.mod requires coredns v1.11.4; keep that pairing.
MC_COREDNS_VERSION="${MC_COREDNS_VERSION:-v1.11.4}"
MULTICLUSTER_VERSION="${MULTICLUSTER_VERSION:-v0.0.0-20250326123025-edbcb64886f6}"

CACHE="${CLUSTERSET_DNS_CACHE:-$HOME/.cache/clusterset-dns}"
BIN="$CACHE/bin"
SRC="$CACHE/src"

GO="${GO:-go}"
if ! command -v "$GO" >/dev/null 2>&1; then
    if [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; else
        echo "k8s-bins: no go toolchain found (need go >= 1.24)" >&2; exit 1
    fi
fi

export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# Overrides any `go env -w GOFLAGS` value; -mod=mod is passed per build where needed.
export GOFLAGS="-p=${K8S_BINS_JOBS:-2} -buildvcs=false"

log() { printf '[%s] k8s-bins: %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

TIME_BIN=""
if [ -x /usr/bin/time ] && /usr/bin/time -v true >/dev/null 2>&1; then TIME_BIN=/usr/bin/time; fi

# run_timed NAME CMD...: run CMD (niced, output to stderr), log wall time and peak RSS.
run_timed() {
    local name="$1"; shift
    local start=$SECONDS tf rc=0
    tf="$(mktemp)"
    if [ -n "$TIME_BIN" ]; then
        nice -n 19 "$TIME_BIN" -v -o "$tf" "$@" >&2 || rc=$?
    else
        nice -n 19 "$@" >&2 || rc=$?
    fi
    local wall=$((SECONDS - start)) rss="?"
    if [ -n "$TIME_BIN" ]; then
        rss="$(awk -F': ' '/Maximum resident set size/ {printf "%d", $2/1024}' "$tf")"
    fi
    rm -f "$tf"
    if [ "$rc" -ne 0 ]; then
        log "building $name FAILED after ${wall}s (exit $rc)"
        return "$rc"
    fi
    log "built $name in ${wall}s (peak RSS of one process: ${rss} MiB)"
    printf '%s %s wall=%ss peak_rss=%sMiB go=%s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" \
        "$name" "$wall" "$rss" "$("$GO" env GOVERSION)" >>"$CACHE/build-times.log"
}

# install_bin TMPFILE FINALNAME LINKNAME: atomically move into place, point symlink.
install_bin() {
    chmod 0755 "$1"
    mv -f "$1" "$BIN/$2"
    ln -sfn "$2" "$BIN/$3"
}

# have FINALNAME LINKNAME: true if the versioned binary exists (re-points the symlink).
have() {
    if [ -x "$BIN/$1" ]; then
        ln -sfn "$1" "$BIN/$2"
        log "$2: $BIN/$1 present"
        return 0
    fi
    return 1
}

mod_field() { # mod_field MODULE@VERSION FIELD  (from go mod download -json)
    "$GO" mod download -json "$1" | sed -n "s/^[[:space:]]*\"$2\": \"\(.*\)\",\{0,1\}$/\1/p"
}

# k8s_module: a wrapper module requiring k8s.io/kubernetes@$K8S_VERSION in
# $SRC/kubernetes-$K8S_VERSION (kube-apiserver and kubectl are built in it, so
# the second shares the first's downloads and build cache); sets K8S_DIR and
# K8S_LDFLAGS.
k8s_module() {
    local v="$K8S_VERSION"
    [[ "$v" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.N.M, got $v"
    local minor="${BASH_REMATCH[1]}" staging_v="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
    K8S_DIR="$SRC/kubernetes-$v"
    mkdir -p "$K8S_DIR"
    local upstream_mod
    upstream_mod="$(mod_field "k8s.io/kubernetes@$v" GoMod)"
    [ -f "$upstream_mod" ] || die "cannot download k8s.io/kubernetes@$v"
    # Same go/godebug lines as upstream's go.mod (dependency godebug lines are ignored).
    local golang godebug
    golang="$(awk '$1 == "go" {print $2; exit}' "$upstream_mod")"
    godebug="$(awk '$1 == "godebug" && $2 ~ /^default=/ {print $2; exit}' "$upstream_mod")"
    rm -f "$K8S_DIR/go.mod" "$K8S_DIR/go.sum"
    (
        cd "$K8S_DIR"
        "$GO" mod init local/k8sbins >/dev/null 2>&1
        "$GO" mod edit -go="$golang" -require="k8s.io/kubernetes@$v"
        if [ -n "$godebug" ]; then "$GO" mod edit -godebug="$godebug"; fi
        # Every staging module upstream maps to ./staging/src (not part of the module
        # zip) goes to its published tag instead.
        local mods=() m
        mapfile -t mods < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\/k8s\.io\// {print $1}' "$upstream_mod")
        [ "${#mods[@]}" -gt 0 ] || die "no staging replace lines found in $upstream_mod"
        local args=()
        for m in "${mods[@]}"; do args+=("-replace=$m=$m@$staging_v"); done
        "$GO" mod edit "${args[@]}"
        log "k8s.io/kubernetes: wrapper module $K8S_DIR (${#mods[@]} staging replaces at $staging_v)"
    )
    K8S_LDFLAGS="-s -w"
    K8S_LDFLAGS+=" -X k8s.io/component-base/version.gitVersion=$v"
    K8S_LDFLAGS+=" -X k8s.io/component-base/version.gitMajor=1"
    K8S_LDFLAGS+=" -X k8s.io/component-base/version.gitMinor=$minor"
    K8S_LDFLAGS+=" -X k8s.io/component-base/version.gitTreeState=clean"
    K8S_LDFLAGS+=" -X k8s.io/component-base/version.buildDate=$(date -u '+%Y-%m-%dT%H:%M:%SZ')"
    # kubectl reads its own version from client-go's copy of these.
    K8S_LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitVersion=$v"
    K8S_LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
    K8S_LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}

build_kube_apiserver() {
    local v="$K8S_VERSION" name="kube-apiserver-$K8S_VERSION"
    have "$name" kube-apiserver && return 0
    log "building kube-apiserver $v (cold build takes ~4-7 min on 2 cores, ~15 s warm)..."
    k8s_module
    (cd "$K8S_DIR" && run_timed "kube-apiserver $v" "$GO" build -mod=mod -trimpath -ldflags "$K8S_LDFLAGS" \
        -o "$BIN/.$name.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
    install_bin "$BIN/.$name.tmp" "$name" kube-apiserver
    "$BIN/kube-apiserver" --version >&2
}

# k8s_component CMD: kube-scheduler or kube-controller-manager of the same release, in
# the same wrapper module as kube-apiserver (shared downloads and build cache).
k8s_component() {
    local c="$1" v="$K8S_VERSION" name="$1-$K8S_VERSION"
    have "$name" "$c" && return 0
    log "building $c $v (~2.5 min on 2 cores after kube-apiserver, whose build cache it shares)..."
    k8s_module
    (cd "$K8S_DIR" && run_timed "$c $v" "$GO" build -mod=mod -trimpath -ldflags "$K8S_LDFLAGS" \
        -o "$BIN/.$name.tmp" "k8s.io/kubernetes/cmd/$c")
    install_bin "$BIN/.$name.tmp" "$name" "$c"
    "$BIN/$c" --version >&2
}
build_kube_scheduler() { k8s_component kube-scheduler; }
build_kube_controller_manager() { k8s_component kube-controller-manager; }

# KWOK's controller: fake Nodes and Pods (Running, Ready, with an IP) for test
# clusters that have no kubelet (scripts/clusters.sh with CLUSTERS_NODES=1).
build_kwok() {
    local v="$KWOK_VERSION" name="kwok-$KWOK_VERSION"
    have "$name" kwok && return 0
    log "building kwok $v (cold build took 12 min on 2 busy cores)..."
    local gobin
    gobin="$(mktemp -d "$BIN/.gobin.XXXXXX")"
    # go install pkg@version: kwok's go.mod has no replace directives.
    if ! GOBIN="$gobin" run_timed "kwok $v" "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$v"; then
        rm -rf "$gobin"; return 1
    fi
    mv -f "$gobin/kwok" "$BIN/.$name.tmp"
    rm -rf "$gobin"
    install_bin "$BIN/.$name.tmp" "$name" kwok
    "$BIN/kwok" --version >&2 || true
}

# The client the tests (and scripts/clusters.sh) apply manifests with, from the
# same Kubernetes release as the API server.
build_kubectl() {
    local v="$K8S_VERSION" name="kubectl-$K8S_VERSION"
    have "$name" kubectl && return 0
    log "building kubectl $v (~1 min on 2 cores after kube-apiserver, whose build cache it shares)..."
    k8s_module
    (cd "$K8S_DIR" && run_timed "kubectl $v" "$GO" build -mod=mod -trimpath -ldflags "$K8S_LDFLAGS" \
        -o "$BIN/.$name.tmp" k8s.io/kubernetes/cmd/kubectl)
    install_bin "$BIN/.$name.tmp" "$name" kubectl
    "$BIN/kubectl" version --client >&2
}

# --- kube-proxy (issue 15: the data-path tests) -----------------------------
# The real Service proxy of the same Kubernetes release as kube-apiserver,
# built in the same wrapper module (shares its downloads and build cache).
build_kube_proxy() {
    local v="$K8S_VERSION" name="kube-proxy-$K8S_VERSION"
    have "$name" kube-proxy && return 0
    log "building kube-proxy $v (~2 min on 2 cores after kube-apiserver, whose build cache it shares)..."
    k8s_module
    (cd "$K8S_DIR" && run_timed "kube-proxy $v" "$GO" build -mod=mod -trimpath -ldflags "$K8S_LDFLAGS" \
        -o "$BIN/.$name.tmp" k8s.io/kubernetes/cmd/kube-proxy)
    install_bin "$BIN/.$name.tmp" "$name" kube-proxy
    "$BIN/kube-proxy" --version >&2
}
# --- end kube-proxy ---------------------------------------------------------

build_helm() {
    local v="$HELM_VERSION" name="helm-$HELM_VERSION"
    have "$name" helm && return 0
    log "building helm $v (cold build takes ~2-4 min on 2 cores)..."
    local gobin
    gobin="$(mktemp -d "$BIN/.gobin.XXXXXX")"
    # What helm's Makefile sets: its version, and the Kubernetes version that
    # `helm template` and `helm lint` assume (a chart's kubeVersion is checked
    # against it), from the client-go it is built with (v0.N.M: 1.N).
    local helm_mod client_go ld
    helm_mod="$(mod_field "helm.sh/helm/v3@$v" GoMod)"
    client_go="$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$helm_mod")"
    [[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || die "helm $v: no k8s.io/client-go version in $helm_mod"
    ld="-s -w -X helm.sh/helm/v3/internal/version.version=$v"
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${BASH_REMATCH[1]}"
    done
    if ! GOBIN="$gobin" run_timed "helm $v" "$GO" install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$v"; then
        rm -rf "$gobin"; return 1
    fi
    mv -f "$gobin/helm" "$BIN/.$name.tmp"
    rm -rf "$gobin"
    install_bin "$BIN/.$name.tmp" "$name" helm
    "$BIN/helm" version >&2
}

build_etcd() {
    local v="$ETCD_VERSION" name="etcd-$ETCD_VERSION"
    have "$name" etcd && return 0
    log "building etcd $v (cold build takes ~1-2 min on 2 cores)..."
    local dir="$SRC/etcd-$v"
    mkdir -p "$dir"
    rm -f "$dir/go.mod" "$dir/go.sum"
    (
        cd "$dir"
        "$GO" mod init local/etcdbin >/dev/null 2>&1
        # server/v3's own replace lines (to its sibling modules) are ignored in a dependency; its
        # require block pins the sibling modules at the same release.
        "$GO" mod edit -require="go.etcd.io/etcd/server/v3@$v"
        run_timed "etcd $v" "$GO" build -mod=mod -trimpath -ldflags "-s -w" \
            -o "$BIN/.$name.tmp" go.etcd.io/etcd/server/v3
    )
    install_bin "$BIN/.$name.tmp" "$name" etcd
    "$BIN/etcd" --version >&2
}

build_coredns() {
    local v="$COREDNS_VERSION" name="coredns-$COREDNS_VERSION"
    have "$name" coredns && return 0
    log "building coredns $v with all stock plugins (cold build takes ~3-4 min on 2 cores)..."
    local gobin
    gobin="$(mktemp -d "$BIN/.gobin.XXXXXX")"
    # go install pkg@version runs outside any module; -mod must not be set.
    if ! GOBIN="$gobin" run_timed "coredns $v" "$GO" install -trimpath -ldflags "-s -w" \
        "github.com/coredns/coredns@$v"; then
        rm -rf "$gobin"; return 1
    fi
    mv -f "$gobin/coredns" "$BIN/.$name.tmp"
    rm -rf "$gobin"
    install_bin "$BIN/.$name.tmp" "$name" coredns
    "$BIN/coredns" -version >&2
}

build_coredns_multicluster() {
    local short="${MULTICLUSTER_VERSION##*-}"
    local v="$MC_COREDNS_VERSION" name="coredns-multicluster-$MC_COREDNS_VERSION-${short:0:12}"
    have "$name" coredns-multicluster && return 0
    local dir="$SRC/coredns-multicluster-$v-${short:0:12}"
    mkdir -p "$dir"
    rm -f "$dir/go.mod" "$dir/go.sum"
    if ! "$GO" mod download "github.com/coredns/multicluster@$MULTICLUSTER_VERSION" 2>/dev/null; then
        log "coredns-multicluster: the module proxy does not serve github.com/coredns/multicluster@$MULTICLUSTER_VERSION"
        return 2
    fi
    log "building coredns-multicluster (coredns $v + multicluster ${short:0:12}) (cold build takes ~1.5-2 min on 2 cores)..."
    cat >"$dir/main.go" <<'EOF'
// Generated by scripts/k8s-bins.sh: CoreDNS with a trimmed plugin set plus the
// external multicluster plugin (github.com/coredns/multicluster).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
	_ "github.com/coredns/multicluster"
)

// The multicluster README puts the directive right after "kubernetes".
func init() {
	d := make([]string, 0, len(dnsserver.Directives)+1)
	found := false
	for _, n := range dnsserver.Directives {
		d = append(d, n)
		if n == "kubernetes" {
			d = append(d, "multicluster")
			found = true
		}
	}
	if !found {
		panic("kubernetes directive not found in dnsserver.Directives")
	}
	dnsserver.Directives = d
}

func main() { coremain.Run() }
EOF
    (
        cd "$dir"
        "$GO" mod init local/corednsmc >/dev/null 2>&1
        "$GO" mod edit -go=1.23.0 \
            -require="github.com/coredns/coredns@$v" \
            -require="github.com/coredns/multicluster@$MULTICLUSTER_VERSION"
        run_timed "coredns-multicluster $v+${short:0:12}" "$GO" build -mod=mod -trimpath \
            -ldflags "-s -w" -o "$BIN/.$name.tmp" .
    )
    "$BIN/.$name.tmp" -plugins | grep -qE '^[[:space:]]*(dns\.)?multicluster$' \
        || die "built coredns-multicluster does not list dns.multicluster"
    install_bin "$BIN/.$name.tmp" "$name" coredns-multicluster
    "$BIN/coredns-multicluster" -version >&2
}

main() {
    local targets=("$@") explicit=1
    if [ "${#targets[@]}" -eq 0 ] || [ "${targets[*]}" = all ]; then
        targets=(etcd kube-apiserver kube-scheduler kube-controller-manager kube-proxy kubectl kwok coredns helm coredns-multicluster); explicit=0
    fi
    for t in "${targets[@]}"; do
        case "$t" in
            kube-apiserver|kube-scheduler|kube-controller-manager|kube-proxy|kubectl|etcd|kwok|coredns|helm|coredns-multicluster) ;;
            *) die "unknown target '$t' (kube-apiserver, kube-scheduler, kube-controller-manager, kube-proxy, kubectl, etcd, kwok, coredns, helm, coredns-multicluster, all)";;
        esac
    done
    mkdir -p "$BIN" "$SRC"
    # Serialise concurrent invocations (e.g. parallel test binaries) on one cache.
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$CACHE/.lock"
        flock 9
    fi
    local failed=0 rc
    for t in "${targets[@]}"; do
        # Subshell with errexit re-enabled: `f || rc=$?` would disable set -e inside f.
        set +e
        ( set -e; "build_${t//-/_}" )
        rc=$?
        set -e
        if [ "$rc" -ne 0 ]; then
            # Default "all": the multicluster module missing from the proxy is a warning.
            if [ "$t" = coredns-multicluster ] && [ "$rc" -eq 2 ] && [ "$explicit" -eq 0 ]; then
                log "WARNING: skipped coredns-multicluster"
            else
                failed=1
            fi
        fi
    done
    [ "$failed" -eq 0 ] || die "some builds failed"
    echo "$BIN"
}

main "$@"
