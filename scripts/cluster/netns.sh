# shellcheck shell=bash
# Sourced by scripts/cluster.sh, which sets ROOT, C, B, BIN and the other
# settings and defines log, die, node_ip and stamp. This part: the
# namespaces and links: the control-plane bridge, the fabric, the router,
# and each node's two uplinks.
# It only defines; the commands in commands.sh run it.

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
