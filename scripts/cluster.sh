#!/usr/bin/env bash
# A local Kubernetes cluster of real components, for trying sticky-macvlan
# and for the e2e tests: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler in a control-plane netns, and N nodes, each a kubelet +
# containerd + runc + kube-proxy in its own network, mount and UTS namespace
# and its own cgroup root, with Multus (thin) as its CNI config. Every
# component is built from the modules pinned in e2e/tools (or is Debian's
# runc); nothing is pulled: the images are built here.
#
#   scripts/cluster.sh up [--nodes N] [--multus thin|thick]
#                                       build (cached), start, wait for Ready
#   scripts/cluster.sh env              the exports for kubectl
#   scripts/cluster.sh crash NODE       SIGKILL everything of NODE, remove its namespaces
#   scripts/cluster.sh restart NODE     bring a crashed NODE back (disk kept, /run new)
#   scripts/cluster.sh cut NODE | heal NODE   take its management link down / up
#   scripts/cluster.sh control stop|start|pause|resume|restart etcd|kube-apiserver
#   scripts/cluster.sh down             remove everything (also after a failed run)
#   scripts/cluster.sh build            only build the components and images
#   scripts/cluster.sh status           what runs
#
# Topology (all inside namespaces this script creates; the host's
# interfaces, addresses and routes are never touched):
#   smc-cp      bridge "mgmt" 10.200.0.1/24: etcd (127.0.0.1), the API
#               server (10.200.0.1:6443), controller-manager, scheduler
#   smc-fabric  bridge "fabric": every node's eth1 and the router
#   smc-router  the gateway of the examples' subnets (172.31.59-62.1, fd00:31:60/62::1)
#   smc-nodeN   eth0 on mgmt (10.200.0.(10+N)), eth1 on the fabric
# The host reaches the API at 127.0.0.1:$API_PORT through a socat pair and
# a unix socket (so nothing listens on a host interface).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
C=$ROOT/.cluster
B=$ROOT/target/cluster
BIN=$B/bin
K8S_VERSION=v1.36.3
API_PORT=${STICKY_CLUSTER_API_PORT:-16443}
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
CP_IP=10.200.0.1
RUNC=$(command -v runc || echo /usr/sbin/runc)

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: $*" >&2; exit 1; }
node_ip() { echo "10.200.0.$((10 + ${1#node}))"; }
stamp() { cat "$@" | sha256sum | cut -d' ' -f1; }

# --- build ------------------------------------------------------------------

# go_build NAME MODULE_DIR OUTPUTS... -- BUILD ARGS: rebuilt when the module's
# go.mod/go.sum change or an output (a path under target/cluster) is missing.
go_build() {
    local name=$1 dir=$2; shift 2
    local outs=()
    while [ "$1" != -- ]; do outs+=("$1"); shift; done
    shift
    local want have ok=1
    want=$(stamp "$dir/go.mod" "$dir/go.sum" "$dir"/*.go)
    have=$(cat "$B/stamps/$name" 2>/dev/null || true)
    for o in "${outs[@]}"; do [ -x "$B/$o" ] || ok=; done
    if [ -n "$ok" ] && [ "$want" = "$have" ]; then return; fi
    log "building $name (from $dir)"
    local t0=$SECONDS
    (cd "$dir" && go build -trimpath "$@")
    echo "$want" >"$B/stamps/$name"
    log "built $name in $((SECONDS - t0)) s"
}

build_images() {
    local want rootfs
    mkdir -p "$B/images"
    # pause: the sandbox image.
    want=$(stamp e2e/images/pause.c e2e/images/docker-archive.sh)
    if [ "$(cat "$B/stamps/pause" 2>/dev/null)" != "$want" ] || [ ! -f "$B/images/pause.tar" ]; then
        rootfs=$(mktemp -d)
        gcc -static -O2 -o "$rootfs/pause" e2e/images/pause.c
        e2e/images/docker-archive.sh "$rootfs" localhost/pause:3.10 /pause "$B/images/pause.tar"
        rm -rf "$rootfs"; echo "$want" >"$B/stamps/pause"
    fi
    # testbox: busybox (sh, ip, ping, sleep, cat ...), static.
    want=$(stamp /bin/busybox e2e/images/docker-archive.sh)
    if [ "$(cat "$B/stamps/testbox" 2>/dev/null)" != "$want" ] || [ ! -f "$B/images/testbox.tar" ]; then
        rootfs=$(mktemp -d)
        mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
        cp /bin/busybox "$rootfs/bin/busybox"
        for a in $("$rootfs/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$rootfs/bin/$a"; done
        echo "root:x:0:0:root:/:/bin/sh" >"$rootfs/etc/passwd"
        e2e/images/docker-archive.sh "$rootfs" localhost/testbox:1 /bin/sh "$B/images/testbox.tar"
        rm -rf "$rootfs"; echo "$want" >"$B/stamps/testbox"
    fi
    # The project's image exactly as a user builds it (scripts/image.sh:
    # binaries for glibc >= 2.28, the tag the examples name).
    bash scripts/image.sh --out "$B/release-image"
    cp "$B/release-image/sticky-macvlan-image.tar" "$B/images/sticky-macvlan.tar"
    # gobgpd (Debian's) for the BGP seed workload.
    want=$(stamp "$(command -v gobgpd)" "$(command -v gobgp)" /bin/busybox e2e/images/docker-archive.sh)
    if [ "$(cat "$B/stamps/gobgpd" 2>/dev/null)" != "$want" ] || [ ! -f "$B/images/gobgpd.tar" ]; then
        rootfs=$(mktemp -d)
        mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
        cp "$(command -v gobgpd)" "$(command -v gobgp)" "$rootfs/bin/"
        cp /bin/busybox "$rootfs/bin/busybox"
        for a in sh cat sleep ip ping echo; do ln -s busybox "$rootfs/bin/$a"; done
        copy_libs "$rootfs" "$rootfs/bin/gobgpd" "$rootfs/bin/gobgp"
        e2e/images/docker-archive.sh "$rootfs" localhost/gobgpd:dev /bin/gobgpd "$B/images/gobgpd.tar"
        rm -rf "$rootfs"; echo "$want" >"$B/stamps/gobgpd"
    fi
    build_previous_release
}

# The previous release, for the upgrade test: its source from this
# repository's history, built as it built itself (cargo build --release,
# the image tagged as its deploy/40-daemonset.yaml names it), and its
# manifests exactly as it shipped them, in $B/previous/examples. 0.1.0 is
# the last commit before issue 17 (Events, conditions, retention,
# node-bound tokens, node scope): what a user who adopted us on 2026-12-04
# runs.
PREVIOUS_VERSION=0.1.0
PREVIOUS_COMMIT=1a4277c88b51b1dc27e7efa5843964520e5bf446
PREVIOUS_IMAGE=localhost/sticky-macvlan:dev
build_previous_release() {
    local out=$B/previous rootfs t0=$SECONDS
    if [ "$(cat "$B/stamps/previous" 2>/dev/null)" = "$PREVIOUS_COMMIT" ] && [ -f "$B/images/sticky-macvlan-previous.tar" ]; then
        return
    fi
    if ! git cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null; then
        # A shallow clone: its origin has the commit.
        git fetch -q --depth 1 origin "$PREVIOUS_COMMIT" 2>/dev/null || true
    fi
    git cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null ||
        die "release $PREVIOUS_VERSION (commit $PREVIOUS_COMMIT) is not in this clone's history and could not be fetched: clone without --depth to build what the upgrade test starts from"
    log "building release $PREVIOUS_VERSION from $PREVIOUS_COMMIT"
    rm -rf "$out/src" "$out/examples"
    mkdir -p "$out/src"
    git archive "$PREVIOUS_COMMIT" | tar -x -C "$out/src"
    cp -r "$out/src/examples" "$out/examples"
    (cd "$out/src" && cargo build -q --locked --release -p sticky-macvlan --bins --target-dir ../target)
    rootfs=$(mktemp -d)
    cp "$out/target/release/sticky-macvlan" "$out/target/release/sticky-ipam" "$rootfs/"
    copy_libs "$rootfs" "$rootfs/sticky-macvlan" "$rootfs/sticky-ipam"
    mkdir -p "$rootfs/tmp"
    e2e/images/docker-archive.sh "$rootfs" "$PREVIOUS_IMAGE" /sticky-macvlan "$B/images/sticky-macvlan-previous.tar"
    rm -rf "$rootfs" "$out/src"
    echo "$PREVIOUS_VERSION $PREVIOUS_IMAGE" >"$out/release"
    echo "$PREVIOUS_COMMIT" >"$B/stamps/previous"
    log "built release $PREVIOUS_VERSION ($PREVIOUS_IMAGE) in $((SECONDS - t0)) s"
}

# copy_libs ROOTFS BINARY...: the shared libraries the binaries load, at
# the same paths, so a from-scratch image runs them.
copy_libs() {
    local rootfs=$1; shift
    local lib
    for lib in $(ldd "$@" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
        [ -e "$lib" ] || continue
        mkdir -p "$rootfs$(dirname "$lib")"
        cp -L "$lib" "$rootfs$lib"
    done
}

build() {
    command -v go >/dev/null || die "go is missing: the cluster's components are built with Go 1.26 (see README)"
    local gv
    gv=$(go env GOVERSION)
    case $gv in
    go1.2[6-9]* | go1.[3-9][0-9]*) ;;
    *) die "$gv is too old to build the cluster's components (Kubernetes v1.36 needs Go 1.26): put Go 1.26 first on PATH" ;;
    esac
    mkdir -p "$BIN" "$B/stamps"
    local v=k8s.io/component-base/version
    go_build kubernetes e2e/tools/kubernetes bin/kube-apiserver bin/kube-controller-manager bin/kube-scheduler \
        bin/kubelet bin/kubectl bin/kube-proxy -- \
        -ldflags "-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=36 -X $v.gitTreeState=clean -X $v.buildDate=2026-12-03T00:00:00Z" \
        -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
        k8s.io/kubernetes/cmd/kube-proxy
    go_build etcd e2e/tools/etcd bin/etcd -- -ldflags "-s -w" -o "$BIN/etcd" .
    go_build containerd e2e/tools/containerd bin/containerd bin/containerd-shim-runc-v2 bin/ctr -- \
        -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w" -o "$BIN/" \
        github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
        github.com/containerd/containerd/v2/cmd/ctr
    go_build multus e2e/tools/multus bin/multus bin/multus-daemon bin/multus-shim -- -ldflags "-s -w" -o "$BIN/" \
        gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus \
        gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon \
        gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim
    mkdir -p "$B/cni"
    go_build cni-plugins e2e/tools/cni-plugins cni/bridge cni/loopback cni/macvlan cni/host-local \
        cni/static cni/tuning -- -ldflags "-s -w" -o "$B/cni/" \
        github.com/containernetworking/plugins/plugins/main/bridge \
        github.com/containernetworking/plugins/plugins/main/loopback \
        github.com/containernetworking/plugins/plugins/main/macvlan \
        github.com/containernetworking/plugins/plugins/ipam/host-local \
        github.com/containernetworking/plugins/plugins/ipam/static \
        github.com/containernetworking/plugins/plugins/meta/tuning
    go_build whereabouts e2e/tools/whereabouts cni/whereabouts -- -ldflags "-s -w" -o "$B/cni/whereabouts" \
        github.com/k8snetworkplumbingwg/whereabouts/cmd
    build_images
}

# --- cgroups ----------------------------------------------------------------

# Every cgroup hierarchy mounted on the host (v1 controllers, name=systemd,
# the hybrid unified one).
hierarchies() { findmnt -rn -t cgroup,cgroup2 -o TARGET; }

# make_cgroup PATH: PATH (e.g. /smc-node1/system) in every hierarchy; a
# new cpuset inherits its parent's cpus and mems, or no task may join it.
make_cgroup() {
    local h dir part sofar
    for h in $(hierarchies); do
        sofar=$h
        for part in ${1//\// }; do
            dir=$sofar/$part
            if [ ! -d "$dir" ]; then
                mkdir "$dir"
                if [ -f "$sofar/cpuset.cpus" ]; then
                    cat "$sofar/cpuset.cpus" >"$dir/cpuset.cpus"
                    cat "$sofar/cpuset.mems" >"$dir/cpuset.mems"
                fi
            fi
            sofar=$dir
        done
    done
}

# The command that moves the calling shell into cgroup PATH everywhere.
join_cgroup_cmd() {
    local h cmd=""
    for h in $(hierarchies); do cmd+="echo \$\$ > $h$1/cgroup.procs; "; done
    echo "$cmd"
}

cgroup_pids() {
    local h=/sys/fs/cgroup/pids
    [ -d "$h" ] || h=$(hierarchies | head -1)
    [ -d "$h$1" ] || return 0
    find "$h$1" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un
}

# kill_cgroup PATH: freeze (no fork escapes), SIGKILL every task, thaw,
# wait until empty, then remove PATH from every hierarchy.
kill_cgroup() {
    local f=/sys/fs/cgroup/freezer$1 pids i h
    [ -d "$f" ] && echo FROZEN >"$f/freezer.state" 2>/dev/null || true
    for i in $(seq 1 50); do
        pids=$(cgroup_pids "$1")
        [ -z "$pids" ] && break
        # shellcheck disable=SC2086
        kill -9 $pids 2>/dev/null || true
        [ -d "$f" ] && echo THAWED >"$f/freezer.state" 2>/dev/null || true
        sleep 0.1
    done
    for h in $(hierarchies); do
        [ -d "$h$1" ] && find "$h$1" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    for h in $(hierarchies); do
        [ -d "$h$1" ] && log "warning: cgroup $h$1 could not be removed"
    done
    return 0
}

# --- namespaces -------------------------------------------------------------

netns_add() { ip netns add "$1"; ip -n "$1" link set lo up; }

topology() {
    netns_add smc-cp
    ip -n smc-cp link add mgmt type bridge
    ip -n smc-cp addr add "$CP_IP/24" dev mgmt
    ip -n smc-cp link set mgmt up
    netns_add smc-fabric
    ip -n smc-fabric link add fabric type bridge
    ip -n smc-fabric link set fabric up
    netns_add smc-router
    ip link add smc-rt0 netns smc-router type veth peer name rt0 netns smc-fabric
    ip -n smc-fabric link set rt0 master fabric up
    ip -n smc-router link set smc-rt0 name eth0
    ip netns exec smc-router sysctl -qw net.ipv6.conf.eth0.accept_dad=0
    for a in 172.31.59.1/24 172.31.60.1/24 172.31.61.1/24 172.31.62.1/24 172.31.66.1/24 fd00:31:60::1/64 fd00:31:62::1/64; do
        ip -n smc-router addr add "$a" dev eth0
    done
    ip -n smc-router link set eth0 up
}

node_links() {
    local n=$1 i=${1#node}
    netns_add "smc-$n"
    ip link add "smc-m$i" netns "smc-$n" type veth peer name "m$n" netns smc-cp
    ip -n smc-cp link set "m$n" master mgmt up
    ip -n "smc-$n" link set "smc-m$i" name eth0
    ip -n "smc-$n" addr add "$(node_ip "$n")/24" dev eth0
    ip -n "smc-$n" link set eth0 up
    ip -n "smc-$n" route add "$SERVICE_CIDR" via "$CP_IP"
    ip link add "smc-f$i" netns "smc-$n" type veth peer name "f$n" netns smc-fabric
    ip -n smc-fabric link set "f$n" master fabric up
    ip -n "smc-$n" link set "smc-f$i" name eth1
    ip -n "smc-$n" link set eth1 up
    ip netns exec "smc-$n" sysctl -qw net.ipv4.ip_forward=1
}

# --- PKI --------------------------------------------------------------------

cert() { # NAME CN O [SANs]
    local name=$1 cn=$2 o=$3 san=${4:-}
    local p=$C/pki
    openssl genrsa -out "$p/$name.key" 2048 2>/dev/null
    local ext
    ext=$(mktemp)
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
    [ -z "$san" ] || echo "subjectAltName=$san" >>"$ext"
    openssl req -new -key "$p/$name.key" -subj "/CN=$cn${o:+/O=$o}" -out "$p/$name.csr" 2>/dev/null
    openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -days 30 -extfile "$ext" -out "$p/$name.crt" 2>/dev/null
    rm -f "$ext" "$p/$name.csr"
}

pki() {
    local p=$C/pki
    mkdir -p "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" \
        -subj "/CN=sticky-macvlan-test-ca" -days 30 2>/dev/null
    cert apiserver kube-apiserver "" \
        "IP:127.0.0.1,IP:$CP_IP,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert apiserver-kubelet-client kube-apiserver-kubelet-client ""
    cert admin admin system:masters
    cert controller-manager system:kube-controller-manager ""
    cert scheduler system:kube-scheduler ""
    cert kube-proxy system:kube-proxy ""
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
}

kubeconfig() { # FILE SERVER USER [CERT-NAME | token=TOKEN]
    local file=$1 server=$2 user=$3 cred=$4 p=$C/pki
    {
        printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: %s\n    certificate-authority: %s\n' "$server" "$p/ca.crt"
        printf 'users:\n- name: %s\n  user:\n' "$user"
        case $cred in
        token=*) printf '    token: %s\n' "${cred#token=}" ;;
        *) printf '    client-certificate: %s\n    client-key: %s\n' "$p/$cred.crt" "$p/$cred.key" ;;
        esac
        printf 'contexts:\n- name: local\n  context:\n    cluster: local\n    user: %s\ncurrent-context: local\n' "$user"
    } >"$file"
}

# --- control plane ----------------------------------------------------------

# start NAME CGROUP NETNS CMD...: a daemon in NETNS and CGROUP, logging to
# .cluster/logs/NAME.log.
start() {
    local name=$1 cg=$2 ns=$3; shift 3
    local enter=()
    [ -z "$ns" ] || enter=(nsenter "--net=/run/netns/$ns")
    setsid "${enter[@]}" bash -c "$(join_cgroup_cmd "$cg") exec \"\$@\"" "$name" "$@" \
        >>"$C/logs/$name.log" 2>&1 </dev/null &
    mkdir -p "$C/run"
    echo $! >"$C/run/$name.pid"
}

wait_for() { # WHAT SECONDS CMD...
    local what=$1 limit=$2 t0=$SECONDS; shift 2
    until "$@" >/dev/null 2>&1; do
        [ $((SECONDS - t0)) -lt "$limit" ] || die "$what did not come up within $limit s (logs: .cluster/logs)"
        sleep 0.5
    done
}

start_etcd() {
    start etcd /smc-cp smc-cp "$BIN/etcd" --name cp --data-dir "$C/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster cp=http://127.0.0.1:2380 --unsafe-no-fsync --snapshot-count 10000
}

start_apiserver() {
    local p=$C/pki
    start kube-apiserver /smc-cp smc-cp "$BIN/kube-apiserver" \
        --etcd-servers http://127.0.0.1:2379 --bind-address 0.0.0.0 --advertise-address "$CP_IP" \
        --secure-port 6443 --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
        --client-ca-file "$p/ca.crt" --token-auth-file "$p/tokens.csv" \
        --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --allow-privileged=true --service-cluster-ip-range "$SERVICE_CIDR" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
        --kubelet-client-certificate "$p/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$p/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types InternalIP \
        --default-not-ready-toleration-seconds 10 --default-unreachable-toleration-seconds 10 \
        --profiling=false
}

control_plane() {
    local p=$C/pki
    make_cgroup /smc-cp
    mkdir -p "$C/etcd" "$C/logs" "$C/run"
    start_etcd
    wait_for etcd 60 ip netns exec smc-cp bash -c 'exec 3<>/dev/tcp/127.0.0.1/2379'
    # Static tokens for the kubelets (system:node:NAME, group system:nodes):
    # what a bootstrap would end with, without the CSR round trip.
    : >"$C/pki/tokens.csv"
    local n
    for n in $(seq 1 32); do
        echo "$(node_token "node$n"),system:node:node$n,node$n-uid,system:nodes" >>"$C/pki/tokens.csv"
    done
    start_apiserver
    # The host's way in: 127.0.0.1:$API_PORT -> unix socket -> API in smc-cp.
    start api-forward-cp /smc-cp smc-cp socat "UNIX-LISTEN:$C/run/api.sock,fork,unlink-early" "TCP:$CP_IP:6443"
    start api-forward-host /smc-cp "" socat "TCP-LISTEN:$API_PORT,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$C/run/api.sock"
    kubeconfig "$C/admin.kubeconfig" "https://127.0.0.1:$API_PORT" admin admin
    kubeconfig "$C/pki/controller-manager.kubeconfig" "https://$CP_IP:6443" system:kube-controller-manager controller-manager
    kubeconfig "$C/pki/scheduler.kubeconfig" "https://$CP_IP:6443" system:kube-scheduler scheduler
    kubeconfig "$C/pki/kube-proxy.kubeconfig" "https://$CP_IP:6443" system:kube-proxy kube-proxy
    mkdir -p "$C/bin"
    ln -sf "$BIN/kubectl" "$C/bin/kubectl"
    wait_for kube-apiserver 120 kc get --raw /readyz
    # As hack/local-up-cluster.sh does: the API server's kubelet client may
    # use the kubelet API (exec, logs).
    kc create clusterrolebinding kube-apiserver-kubelet-admin --clusterrole system:kubelet-api-admin \
        --user kube-apiserver-kubelet-client >/dev/null
    start kube-controller-manager /smc-cp smc-cp "$BIN/kube-controller-manager" \
        --kubeconfig "$C/pki/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$C/pki/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$C/pki/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --use-service-account-credentials --controllers '*' \
        --service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
        --cluster-signing-cert-file "$p/ca.crt" --cluster-signing-key-file "$p/ca.key" \
        --leader-elect=false --node-monitor-period 2s --node-monitor-grace-period 16s \
        --terminated-pod-gc-threshold 100
    start kube-scheduler /smc-cp smc-cp "$BIN/kube-scheduler" --kubeconfig "$C/pki/scheduler.kubeconfig" \
        --authentication-kubeconfig "$C/pki/scheduler.kubeconfig" \
        --authorization-kubeconfig "$C/pki/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --leader-elect=false
}

node_token() { echo "smc-$1-$(sha256sum "$C/pki/ca.key" | cut -c1-16)"; }
kc() { "$BIN/kubectl" --kubeconfig "$C/admin.kubeconfig" "$@"; }

# Multus' CRD (NetworkAttachmentDefinition), ClusterRole, binding and
# service account: the documents of its own install manifest (thin or
# thick) before its ConfigMap and DaemonSet; the DaemonSet is not run:
# each node gets the thin plugin as its CNI config, or the thick one's
# shim and daemon.
multus_rbac() {
    local dir
    dir=$(cd e2e/tools/multus && go list -m -f '{{.Dir}}' gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
    local manifest=multus-daemonset.yml
    [ "$(cat "$C/multus.mode" 2>/dev/null)" != thick ] || manifest=multus-daemonset-thick.yml
    awk '/^---/{n++} n<5' "$dir/deployments/$manifest" | kc apply -f - >/dev/null
    kc -n kube-system create token multus --duration 720h >"$C/pki/multus.token"
}

# Whereabouts' CRDs and RBAC from its module (the service account, binding
# and ClusterRole that open its install manifest); its DaemonSet is not run:
# each node gets the binary and a kubeconfig, as its installer would write.
# Its IP reconciler (ip-control-loop) is not run either.
whereabouts_rbac() {
    local dir
    dir=$(cd e2e/tools/whereabouts && go list -m -f '{{.Dir}}' github.com/k8snetworkplumbingwg/whereabouts)
    awk '/^---/{n++} n<3' "$dir/doc/crds/daemonset-install.yaml" | kc apply -f - >/dev/null
    kc apply -f "$dir/doc/crds/whereabouts.cni.cncf.io_ippools.yaml" \
        -f "$dir/doc/crds/whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml" >/dev/null
    kc -n kube-system create token whereabouts --duration 720h >"$C/pki/whereabouts.token"
}

# --- nodes ------------------------------------------------------------------

node_dirs() { # the node's disk: kept across crash and restart
    local d=$C/nodes/$1/disk
    mkdir -p "$d"/{etc-cni-net.d,opt-cni-bin,var-lib-cni,var-lib-kubelet,var-lib-containerd,var-log,etc-kubernetes}
}

node_config() {
    local n=$1 d=$C/nodes/$1/disk i=${1#node}
    cp "$B/cni/"{bridge,host-local,loopback,macvlan,whereabouts} "$BIN/multus" "$d/opt-cni-bin/"
    mkdir -p "$d/etc-cni-net.d/whereabouts.d"
    kubeconfig "$d/etc-cni-net.d/whereabouts.d/whereabouts.kubeconfig" "https://$CP_IP:6443" whereabouts \
        "token=$(cat "$C/pki/whereabouts.token")"
    printf '{"datastore": "kubernetes", "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}, "log_file": "/var/log/whereabouts.log", "log_level": "debug"}\n' \
        >"$d/etc-cni-net.d/whereabouts.d/whereabouts.conf"
    mkdir -p "$d/etc-cni-net.d/multus.d"
    kubeconfig "$d/etc-cni-net.d/multus.d/multus.kubeconfig" "https://$CP_IP:6443" multus "token=$(cat "$C/pki/multus.token")"
    # The cluster network is a directory holding one conflist: Multus
    # v4.2.1+ caches a conflist named by file path re-marshalled through
    # its own NetConfList type, which drops every plugin-specific key
    # (bridge, ipam.ranges), so the pod's DEL then fails with "no IP ranges
    # specified" and the pod never terminates; loaded from a directory it
    # keeps the file's bytes.
    mkdir -p "$d/etc-cni-net.d/multus.d/podnet"
    cat >"$d/etc-cni-net.d/multus.d/podnet/podnet.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "podnet", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.$i.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
    if [ "$(cat "$C/multus.mode" 2>/dev/null)" = thick ]; then
        # Thick: the runtime calls multus-shim, which hands the request to
        # multus-daemon on the node; the daemon (a process in the node's
        # namespaces here, where Multus ships it as a DaemonSet pod) runs
        # the delegates. The daemon's config names the cluster network.
        # As its shipped ConfigMap does: "auto" makes the daemon write
        # 00-multus.conflist (type multus-shim) from the primary network's
        # config, and keep running (with a file of our own it exits at once,
        # as nothing is left for it to wait on).
        cp "$BIN/multus-shim" "$d/opt-cni-bin/"
        cp "$d/etc-cni-net.d/multus.d/podnet/podnet.conflist" "$d/etc-cni-net.d/10-podnet.conflist"
        cat >"$d/etc-cni-net.d/multus.d/daemon-config.json" <<EOF
{"cniVersion": "1.0.0", "logLevel": "verbose", "logFile": "/var/log/multus.log",
 "cniConfigDir": "/etc/cni/net.d", "multusAutoconfigDir": "/etc/cni/net.d", "multusConfigFile": "auto",
 "socketDir": "/run/multus/", "confDir": "/etc/cni/net.d", "cniDir": "/var/lib/cni/multus",
 "binDir": "/opt/cni/bin", "multusNamespace": "kube-system"}
EOF
    else
        cat >"$d/etc-cni-net.d/00-multus.conf" <<EOF
{"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus",
 "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig",
 "clusterNetwork": "/etc/cni/net.d/multus.d/podnet",
 "confDir": "/etc/cni/net.d", "cniDir": "/var/lib/cni/multus", "binDir": "/opt/cni/bin",
 "multusNamespace": "kube-system", "logFile": "/var/log/multus.log", "logLevel": "verbose"}
EOF
    fi
    cat >"$d/etc-kubernetes/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/pause:3.10"
[plugins.'io.containerd.cri.v1.runtime']
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$RUNC"
      SystemdCgroup = false
EOF
    kubeconfig "$d/etc-kubernetes/kubelet.kubeconfig" "https://$CP_IP:6443" "system:node:$n" "token=$(node_token "$n")"
    cat >"$d/etc-kubernetes/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: /smc-$n
enforceNodeAllocatable: [pods]
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $C/pki/ca.crt}
authorization: {mode: Webhook}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 4s
nodeLeaseDurationSeconds: 10
oomScoreAdj: 0
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
resolvConf: /etc/resolv.conf
serializeImagePulls: false
maxPods: 250
localStorageCapacityIsolation: false
EOF
    cat >"$d/etc-kubernetes/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $C/pki/kube-proxy.kubeconfig}
hostnameOverride: $n
mode: iptables
clusterCIDR: 10.244.0.0/16
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
EOF
}

holder_pid() { cat "$C/nodes/$1/holder.pid" 2>/dev/null; }

# in_node NODE CMD...: run CMD in the node's network, mount and UTS namespaces.
in_node() {
    local n=$1; shift
    local pid
    pid=$(holder_pid "$n") || die "$n is not running"
    nsenter -t "$pid" -n -m -u -- "$@"
}

# The node's "machine": a process holding its mount and UTS namespaces, in
# which its disk directories are bound over the paths a real node uses and
# /run is a fresh tmpfs (as after a boot).
start_holder() {
    local n=$1 d=$C/nodes/$1/disk
    make_cgroup "/smc-$n/system"
    local host_dir
    for host_dir in /etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/kubelet /var/lib/containerd \
        /etc/kubernetes; do
        mkdir -p "$host_dir"
    done
    rm -f "$C/nodes/$n/holder.pid"
    setsid nsenter "--net=/run/netns/smc-$n" -- unshare --mount --uts --propagation private -- bash -c "
        $(join_cgroup_cmd "/smc-$n/system")
        set -e
        hostname $n
        mount -t tmpfs -o mode=755 tmpfs /run
        mkdir -p /run/netns /run/containerd
        mount --bind $d/etc-cni-net.d /etc/cni/net.d
        mount --bind $d/opt-cni-bin /opt/cni/bin
        mount --bind $d/var-lib-cni /var/lib/cni
        mount --bind $d/var-lib-kubelet /var/lib/kubelet
        mount --bind $d/var-lib-containerd /var/lib/containerd
        mount --bind $d/var-log /var/log
        mount --bind $d/etc-kubernetes /etc/kubernetes
        mount --make-rshared /
        echo \$\$ > $C/nodes/$n/holder.pid
        exec sleep infinity" >>"$C/logs/$n-holder.log" 2>&1 </dev/null &
    wait_for "$n's namespaces" 10 test -s "$C/nodes/$n/holder.pid"
}

start_node_daemons() {
    local n=$1 pid
    pid=$(holder_pid "$n")
    local enter=(nsenter -t "$pid" -n -m -u --)
    start "$n-containerd" "/smc-$n/system" "" "${enter[@]}" env PATH="$BIN:$PATH" \
        "$BIN/containerd" --config /etc/kubernetes/containerd.toml
    wait_for "$n's containerd" 60 in_node "$n" test -S /run/containerd/containerd.sock
    local img
    for img in pause testbox sticky-macvlan sticky-macvlan-previous gobgpd; do
        in_node "$n" "$BIN/ctr" --address /run/containerd/containerd.sock -n k8s.io images import \
            --local "$B/images/$img.tar" >/dev/null 2>&1 ||
            in_node "$n" "$BIN/ctr" --address /run/containerd/containerd.sock -n k8s.io images import "$B/images/$img.tar" >/dev/null
    done
    if [ "$(cat "$C/multus.mode" 2>/dev/null)" = thick ]; then
        # The in-cluster credentials a DaemonSet pod would have, at the
        # paths client-go reads them from (/var/run is the node's /run).
        in_node "$n" mkdir -p /run/secrets/kubernetes.io/serviceaccount
        in_node "$n" cp "$C/pki/multus.token" /run/secrets/kubernetes.io/serviceaccount/token
        in_node "$n" cp "$C/pki/ca.crt" /run/secrets/kubernetes.io/serviceaccount/ca.crt
        start "$n-multus-daemon" "/smc-$n/system" "" "${enter[@]}" env KUBERNETES_SERVICE_HOST="$CP_IP" \
            KUBERNETES_SERVICE_PORT=6443 "$BIN/multus-daemon" --config /etc/cni/net.d/multus.d/daemon-config.json
    fi
    start "$n-kube-proxy" "/smc-$n/system" "" "${enter[@]}" "$BIN/kube-proxy" --config /etc/kubernetes/kube-proxy.yaml
    start "$n-kubelet" "/smc-$n/system" "" "${enter[@]}" env PATH="$BIN:$PATH" "$BIN/kubelet" \
        --config /etc/kubernetes/kubelet.yaml --kubeconfig /etc/kubernetes/kubelet.kubeconfig \
        --hostname-override "$n" --node-ip "$(node_ip "$n")" --v 1
}

node_up() {
    local n=$1
    make_cgroup "/smc-$n"
    node_links "$n"
    node_dirs "$n"
    node_config "$n"
    start_holder "$n"
    start_node_daemons "$n"
}

nodes_ready() {
    local want=$1 ready
    ready=$(kc get nodes -o jsonpath='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status}{"\n"}{end}{end}' | grep -c True)
    [ "$ready" -ge "$want" ]
}

# --- commands ---------------------------------------------------------------

cmd_up() {
    local nodes=3 multus=thin
    while [ $# -gt 0 ]; do
        case $1 in
        --nodes) nodes=$2; shift 2 ;;
        --multus) multus=$2; shift 2 ;;
        *) die "up: unknown argument $1 (usage: scripts/cluster.sh up [--nodes N] [--multus thin|thick])" ;;
        esac
    done
    [ "$(id -u)" = 0 ] || die "up needs root (namespaces, cgroups, mounts)"
    [ "$nodes" -ge 1 ] && [ "$nodes" -le 32 ] || die "--nodes must be 1..32"
    case $multus in thin | thick) ;; *) die "--multus must be thin or thick" ;; esac
    if [ -e "$C/nodes.count" ]; then
        die "a cluster is already up (.cluster/nodes.count); run scripts/cluster.sh down first"
    fi
    local t0=$SECONDS
    build
    log "starting a cluster of $nodes nodes"
    mkdir -p "$C/logs"
    echo "$nodes" >"$C/nodes.count"
    echo "$multus" >"$C/multus.mode"
    save_host_sysctls
    pki
    topology
    control_plane
    multus_rbac
    whereabouts_rbac
    local i
    for i in $(seq 1 "$nodes"); do node_up "node$i"; done
    log "waiting for $nodes Ready nodes"
    local w0=$SECONDS
    until nodes_ready "$nodes"; do
        [ $((SECONDS - w0)) -lt 180 ] || { kc get nodes -o wide >&2 || true; die "nodes not Ready within 180 s (logs: .cluster/logs)"; }
        sleep 1
    done
    kc get nodes -o wide >&2
    log "up in $((SECONDS - t0)) s; run: eval \"\$(scripts/cluster.sh env)\""
}

# kubelet sets these kernel-wide (not per-netns) sysctls to its defaults
# at start; `up` records the host's values first and `down` puts them back.
HOST_SYSCTLS="kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

save_host_sysctls() {
    local k
    [ -e "$C/host-sysctls" ] && return
    for k in $HOST_SYSCTLS; do echo "$k=$(sysctl -n "$k")"; done >"$C/host-sysctls"
}

restore_host_sysctls() {
    local line
    [ -e "$C/host-sysctls" ] || return 0
    while read -r line; do sysctl -qw "$line" || log "warning: could not restore $line"; done <"$C/host-sysctls"
}

cmd_env() {
    echo "export KUBECONFIG=$C/admin.kubeconfig"
    echo "export PATH=$C/bin:\$PATH"
}

node_kill() {
    local n=$1
    kill_cgroup "/smc-$n"
    rm -f "$C/nodes/$n/holder.pid"
    ip netns del "smc-$n" 2>/dev/null || true
    # The kernel tears a netns down asynchronously, and its veth ends with
    # it; deleting the peers on the bridges now makes a restart at once
    # find the names free.
    ip -n smc-cp link del "m$n" 2>/dev/null || true
    ip -n smc-fabric link del "f$n" 2>/dev/null || true
}

cmd_crash() {
    local n=${1:?usage: scripts/cluster.sh crash NODE}
    [ -d "$C/nodes/$n" ] || die "no node $n in this cluster"
    node_kill "$n"
    log "$n crashed: every process killed, its namespaces gone, the API not told"
}

cmd_restart() {
    local n=${1:?usage: scripts/cluster.sh restart NODE}
    [ -d "$C/nodes/$n" ] || die "no node $n in this cluster"
    [ -z "$(holder_pid "$n")" ] || die "$n is running; crash it first"
    node_kill "$n" # what a failed restart may have left
    make_cgroup "/smc-$n"
    node_links "$n"
    start_holder "$n"
    start_node_daemons "$n"
    log "$n restarted (its disk kept, /run and namespaces new)"
}

# control ACTION COMPONENT: stop (SIGKILL), start, pause (SIGSTOP: it
# holds its connections and answers nothing), resume, restart; COMPONENT is
# etcd or kube-apiserver.
cmd_control() {
    local action=${1:-} what=${2:-} pid
    case $what in etcd | kube-apiserver) ;; *) die "usage: scripts/cluster.sh control stop|start|pause|resume|restart etcd|kube-apiserver" ;; esac
    pid=$(cat "$C/run/$what.pid" 2>/dev/null || true)
    case $action in
    stop) [ -z "$pid" ] || kill -9 "$pid" 2>/dev/null || true
        while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.1; done ;;
    start) if [ "$what" = etcd ]; then start_etcd; else start_apiserver; fi
        if [ "$what" = etcd ]; then wait_for etcd 60 ip netns exec smc-cp bash -c 'exec 3<>/dev/tcp/127.0.0.1/2379'
        else wait_for kube-apiserver 120 kc get --raw /readyz; fi ;;
    pause) kill -STOP "$pid" ;;
    resume) kill -CONT "$pid" ;;
    restart) cmd_control stop "$what"; cmd_control start "$what" ;;
    *) die "usage: scripts/cluster.sh control stop|start|pause|resume|restart etcd|kube-apiserver" ;;
    esac
}

cmd_cut() { ip -n "smc-${1:?usage: cut NODE}" link set eth0 down; }
cmd_heal() {
    ip -n "smc-${1:?usage: heal NODE}" link set eth0 up
    ip -n "smc-$1" route replace "$SERVICE_CIDR" via "$CP_IP"
}

cmd_down() {
    local n
    for d in "$C"/nodes/*/; do
        [ -d "$d" ] || continue
        n=$(basename "$d")
        node_kill "$n"
    done
    # Nodes of a run whose state directory is gone.
    for h in $(hierarchies | head -1); do
        for d in "$h"/smc-node*; do [ -d "$d" ] && kill_cgroup "/$(basename "$d")"; done
    done
    kill_cgroup /smc-cp
    for ns in $(ip netns list | awk '/^smc-/{print $1}'); do ip netns del "$ns"; done
    restore_host_sysctls
    rm -rf "$C"
    log "down: no cluster process, namespace or cgroup is left"
}

cmd_status() {
    local n
    [ -e "$C/nodes.count" ] || { echo "no cluster"; return; }
    echo "control plane: $(cgroup_pids /smc-cp | wc -l) processes"
    for d in "$C"/nodes/*/; do
        n=$(basename "$d")
        echo "$n: holder $(holder_pid "$n" || echo none), $(cgroup_pids "/smc-$n" | wc -l) processes"
    done
    kc get nodes -o wide || true
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) cmd_down ;;
env) cmd_env ;;
build) build ;;
crash) cmd_crash "${2:-}" ;;
restart) cmd_restart "${2:-}" ;;
cut) cmd_cut "${2:-}" ;;
heal) cmd_heal "${2:-}" ;;
control) cmd_control "${2:-}" "${3:-}" ;;
status) cmd_status ;;
exec) shift; in_node "$@" ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
