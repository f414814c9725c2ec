#!/usr/bin/env bash
# The demo: a fabric switch, a router and a node in network namespaces this
# script creates; a pod gets a macvlan from sticky-macvlan (host-local IPAM
# delegated), pings the router, and is torn down. Everything is removed at
# exit. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }
[ -x /usr/lib/cni/host-local ] || { apt-get update -qq; apt-get install -y -qq containernetworking-plugins iproute2 iputils-ping >/dev/null; }
cargo build --release -q -p sticky-macvlan
BIN="$PWD/target/release/sticky-macvlan"
P="smvt-demo$$"
STATE=$(mktemp -d)
cleanup() { for n in pod node router fabric; do ip netns del "$P-$n" 2>/dev/null || true; done; rm -rf "$STATE"; }
trap cleanup EXIT
for n in fabric router node pod; do ip netns add "$P-$n"; ip -n "$P-$n" link set lo up; done
ip -n "$P-fabric" link add br0 type bridge && ip -n "$P-fabric" link set br0 up
ip -n "$P-fabric" link add p1 type veth peer name eth0 netns "$P-router"
ip -n "$P-fabric" link add p2 type veth peer name uplink0 netns "$P-node"
for p in p1 p2; do ip -n "$P-fabric" link set $p master br0 up; done
ip -n "$P-router" link set eth0 up && ip -n "$P-router" addr add 10.213.0.1/24 dev eth0
ip -n "$P-node" link set uplink0 up
CONF=$(cat <<JSON
{"cniVersion":"1.0.0","name":"macnet","type":"sticky-macvlan","master":"uplink0",
 "ipam":{"type":"host-local","subnet":"10.213.0.0/24","rangeStart":"10.213.0.10","rangeEnd":"10.213.0.20",
         "gateway":"10.213.0.1","routes":[{"dst":"0.0.0.0/0"}],"dataDir":"$STATE/ipam"}}
JSON
)
cni() { CNI_COMMAND=$1 CNI_CONTAINERID=demo CNI_NETNS=/var/run/netns/$P-pod CNI_IFNAME=net1 CNI_PATH=/usr/lib/cni \
        ip netns exec "$P-node" "$BIN" <<<"$CONF"; }
echo "== ADD"; cni ADD
echo "== pod netns"; ip -n "$P-pod" -br addr show net1; ip -n "$P-pod" route
echo "== ping the router from the pod"; ip netns exec "$P-pod" ping -c 2 -W 2 10.213.0.1
echo "== DEL (twice: idempotent)"; cni DEL; cni DEL; echo ok
ip -n "$P-pod" link show net1 2>/dev/null && { echo "net1 still there"; exit 1; } || echo "net1 removed"
