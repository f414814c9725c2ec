# shellcheck shell=bash
# Sourced by scripts/cluster.sh, which sets ROOT, C, B, BIN and the other
# settings and defines log, die, node_ip and stamp. This part: a node's
# disk, its configs, the holder process that keeps its namespaces, and its
# daemons (containerd, kubelet, kube-proxy).
# It only defines; the commands in commands.sh run it.

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
