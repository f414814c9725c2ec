#!/usr/bin/env bash
# Builds the real components the e2e tests drive that Debian does not ship
# in a usable version, from the modules pinned in e2e/tools/go.mod, and the
# container images they need, into target/tools. Outputs are cached: a
# rebuild happens only when the pins (go.sum) or the image sources change.
# Sourced by scripts/test.sh; runnable alone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=target/tools
mkdir -p "$out/images"

stamp() { cat "$@" | sha256sum | cut -d' ' -f1; }

# crictl (cri-tools), the CRI client kubelet's own tests use.
want=$(stamp e2e/tools/go.mod e2e/tools/go.sum)
if [ ! -x "$out/crictl" ] || [ "$(cat "$out/crictl.stamp" 2>/dev/null)" != "$want" ]; then
    echo "building crictl from e2e/tools/go.mod"
    (cd e2e/tools && go build -trimpath -o "../../$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
    echo "$want" >"$out/crictl.stamp"
fi

# The pause image every pod sandbox runs: a static binary, one layer.
want=$(stamp e2e/images/pause.c e2e/images/docker-archive.sh)
if [ ! -f "$out/images/pause.tar" ] || [ "$(cat "$out/images/pause.stamp" 2>/dev/null)" != "$want" ]; then
    echo "building localhost/pause:3.10"
    rootfs=$(mktemp -d)
    gcc -static -O2 -o "$rootfs/pause" e2e/images/pause.c
    e2e/images/docker-archive.sh "$rootfs" localhost/pause:3.10 /pause "$out/images/pause.tar"
    rm -rf "$rootfs"
    echo "$want" >"$out/images/pause.stamp"
fi

# The CRDs of the IPAMClaim tests: KubeVirt's VirtualMachineInstance and
# VirtualMachine as its virt-operator generates them, and the IPAMClaim CRD
# the pinned ipamclaims module ships (e2e/tools/kubevirt/go.mod).
want=$(stamp e2e/tools/kubevirt/go.mod e2e/tools/kubevirt/go.sum e2e/tools/kubevirt/main.go)
if [ ! -s "$out/crds/kubevirt.yaml" ] || [ "$(cat "$out/crds/stamp" 2>/dev/null)" != "$want" ]; then
    echo "generating KubeVirt's CRDs and the IPAMClaim CRD from e2e/tools/kubevirt/go.mod"
    mkdir -p "$out/crds"
    (cd e2e/tools/kubevirt && go build -trimpath -o ../../../"$out/kubevirt-crds" .)
    "$out/kubevirt-crds" >"$out/crds/kubevirt.yaml.new"
    mv "$out/crds/kubevirt.yaml.new" "$out/crds/kubevirt.yaml"
    ipamclaims=$(cd e2e/tools/kubevirt && go list -m -f '{{.Dir}}' github.com/k8snetworkplumbingwg/ipamclaims)
    install -m 644 "$ipamclaims/artifacts/k8s.cni.cncf.io_ipamclaims.yaml" "$out/crds/ipamclaims.yaml"
    echo "$want" >"$out/crds/stamp"
fi
