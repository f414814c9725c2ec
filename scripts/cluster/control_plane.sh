# shellcheck shell=bash
# Sourced by scripts/cluster.sh, which sets ROOT, C, B, BIN and the other
# settings and defines log, die, node_ip and stamp. This part: etcd, kube-
# apiserver, the controller manager, the scheduler, and the CRDs and RBAC of
# Multus and Whereabouts.
# It only defines; the commands in commands.sh run it.

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
