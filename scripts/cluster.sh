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
#
# This file holds the settings and the subcommand table; the work is in
# scripts/cluster/: build, cgroups, netns, pki, control_plane, nodes,
# commands (one part per concern, each sourced here).
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

# The parts (scripts/cluster/*.sh) define the functions; the case below
# runs one subcommand.
for part in build cgroups netns pki control_plane nodes commands; do
    # shellcheck source=/dev/null
    source "$ROOT/scripts/cluster/$part.sh"
done

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
