#!/usr/bin/env bash
# The demo: the product's main job on the embedded file store, in network
# namespaces this script creates (a fabric switch, a router, two nodes,
# each node with its own store directory, as two real nodes have):
# a BGP speaker's identity gets its one IP on node1; the same identity on
# node2 while node1's pod is alive is refused, because the wire still
# answers for the address (node2's store has never seen it); node1 crashes
# (its netns is deleted, no DEL ever runs); the identity comes up on node2
# with the same IP at once, and the router reaches it. The same crash with
# the reference host-local IPAM is shown stuck. Everything is removed at
# exit. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }
command -v ping >/dev/null && [ -x /usr/lib/cni/host-local ] || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containernetworking-plugins iproute2 iputils-ping >/dev/null
}
cargo build --release -q -p sticky-macvlan
BIN="$PWD/target/release/sticky-macvlan"
P="smvt-demo$$"
STATE=$(mktemp -d)
NS=(fabric router node1 node2 pod-old pod-new ref-old ref-dup ref-new)
cleanup() { for n in "${NS[@]}"; do ip netns del "$P-$n" 2>/dev/null || true; done; rm -rf "$STATE"; }
trap cleanup EXIT
for n in "${NS[@]}"; do ip netns add "$P-$n"; ip -n "$P-$n" link set lo up; done
ip -n "$P-fabric" link add br0 type bridge && ip -n "$P-fabric" link set br0 up
i=0
for n in router node1 node2; do
    i=$((i + 1))
    ip -n "$P-fabric" link add "p$i" type veth peer name uplink0 netns "$P-$n"
    ip -n "$P-fabric" link set "p$i" master br0 up
    ip -n "$P-$n" link set uplink0 up
done
ip -n "$P-router" addr add 172.31.59.1/24 dev uplink0

conf() { # $1 ipam type, $2 plugin type, $3 node (whose own store it uses)
cat <<JSON
{"cniVersion":"1.0.0","name":"fabric","type":"$2","master":"uplink0",
 "args":{"cni":{"identity":"bgp-peer-a"}},
 "ipam":{"type":"$1","subnet":"172.31.59.0/24","rangeStart":"172.31.59.2","rangeEnd":"172.31.59.2",
         "gateway":"172.31.59.1","dataDir":"$STATE/$3/$1","nodeName":"$3"}}
JSON
}
cni() { # $1 verb, $2 node, $3 pod, $4 ipam type, $5 plugin
    CNI_COMMAND=$1 CNI_CONTAINERID="ctr-$3" CNI_NETNS="/var/run/netns/$P-$3" CNI_IFNAME=net1 CNI_PATH=/usr/lib/cni \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=bgp;K8S_POD_NAME=speaker-0;K8S_POD_UID=uid-$3" \
        ip netns exec "$P-$2" "$5" <<<"$(conf "$4" "$(basename "$5")" "$2")"
}

echo "== sticky-macvlan + sticky-ipam: identity bgp-peer-a, whose only IP is 172.31.59.2"
echo "   (node1 and node2 each keep their own file store: $STATE/node1, $STATE/node2)"
echo "-- ADD on node1"; cni ADD node1 pod-old sticky-ipam "$BIN"
echo "-- the router pings it"; ip netns exec "$P-router" ping -c 1 -W 2 172.31.59.2 | grep 'bytes from'
echo "-- the same identity on node2 while node1's pod is alive: node2's store has no"
echo "   record of it, but the ARP probe finds it answered on the wire (code 11):"
cni ADD node2 pod-new sticky-ipam "$BIN" || true
echo "-- node1 crashes: its netns and its pod's go, no DEL"
# Its uplink first: that takes every macvlan on it down at once, as a crash
# does (a deleted netns is torn down asynchronously and would go on
# answering ARP for a moment, which sticky-macvlan's probe would refuse).
ip -n "$P-node1" link del uplink0
ip netns del "$P-node1"; ip netns del "$P-pod-old"
echo "-- ADD on node2 for the same identity"; cni ADD node2 pod-new sticky-ipam "$BIN"
echo "-- the router pings it again"; ip netns exec "$P-router" ping -c 1 -W 2 172.31.59.2 | grep 'bytes from'
echo "-- node2's claims"; "$BIN" claims --dir "$STATE/node2/sticky-ipam" --node node2
echo "-- DEL (twice: idempotent)"; cni DEL node2 pod-new sticky-ipam "$BIN"; cni DEL node2 pod-new sticky-ipam "$BIN"; echo ok

echo
echo "== the reference macvlan + host-local on the same two nodes"
ip netns add "$P-node1"; ip netns add "$P-pod-old"
ip -n "$P-fabric" link add p9 type veth peer name uplink0 netns "$P-node1"
ip -n "$P-fabric" link set p9 master br0 up; ip -n "$P-node1" link set uplink0 up
cni ADD node1 ref-old host-local /usr/lib/cni/macvlan >/dev/null && echo "-- ADD on node1: ok, 172.31.59.2"
if cni ADD node2 ref-dup host-local /usr/lib/cni/macvlan >/dev/null; then
    echo "-- ADD on node2 while node1's pod is alive: ok too, so 172.31.59.2 is now live on two nodes"
    echo "   (each node's host-local store knows only its own allocations)"
fi
echo "-- node1's pod dies without a DEL (its sandbox's netns is gone); its replacement on node1:"
ip netns del "$P-ref-old"
cni ADD node1 ref-new host-local /usr/lib/cni/macvlan || echo "(stuck until a human deletes $STATE/node1/host-local/fabric/172.31.59.2)"
