# shellcheck shell=bash
# Sourced by scripts/cluster.sh, which sets ROOT, C, B, BIN and the other
# settings and defines log, die, node_ip and stamp. This part: the
# subcommands (up, env, crash, restart, control, cut, heal, down, status).
# It only defines; the case at the end of cluster.sh runs these.

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
