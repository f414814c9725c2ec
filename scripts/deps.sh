# Sourced by scripts/test.sh and scripts/bench.sh: installs the Debian
# packages the tests and benchmarks need, when missing.

need=()
[ -x /usr/lib/cni/macvlan ] || need+=(containernetworking-plugins)
command -v go >/dev/null || need+=(golang-go)
command -v ip >/dev/null || need+=(iproute2)
[ -x /usr/bin/time ] || need+=(time)
command -v ping >/dev/null || need+=(iputils-ping)
# ARP and NDP from the router netns: who answers for an address on the fabric.
command -v arping >/dev/null || need+=(iputils-arping)
command -v ndisc6 >/dev/null || need+=(ndisc6)
command -v gobgpd >/dev/null || need+=(gobgpd)
command -v bird >/dev/null || need+=(bird2)
# A real container runtime for the import tests (which sandboxes exist is
# read from its CRI); its service never starts on the host (see below).
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v nsenter >/dev/null || need+=(util-linux)
# The local cluster (scripts/cluster.sh): its API forwarder, kube-proxy's
# iptables, the PKI, the test image's busybox.
command -v socat >/dev/null || need+=(socat)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v openssl >/dev/null || need+=(openssl)
[ -x /bin/busybox ] || need+=(busybox-static)
# The release image (scripts/image.sh): buildah builds it from the
# Containerfile, the arm64 image carries Debian's cross C library, qemu
# runs its binaries in the smoke test, skopeo reads the image back.
command -v buildah >/dev/null || need+=(buildah)
[ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || need+=(libc6-arm64-cross)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v skopeo >/dev/null || need+=(skopeo)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    apt-get update -qq
    # Packages such as bird2 and gobgpd ship services: the tests run their
    # own instances inside test namespaces, so none may start on the host.
    added_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && added_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    [ -z "$added_policy" ] || rm -f /usr/sbin/policy-rc.d
fi
