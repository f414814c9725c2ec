#!/usr/bin/env bash
# The release: sticky-macvlan and sticky-ipam built for any x86_64 Linux
# with glibc 2.28 or later (RHEL 8, Ubuntu 20.04, Debian 10 and newer), and
# the OCI image deploy/40-daemonset.yaml and deploy/optional/reconcile-deployment.yaml
# name, packed without a registry or a container engine.
#
#   scripts/image.sh [--out DIR]
#
# Writes DIR (default target/release-image) with:
#   bin/sticky-macvlan, bin/sticky-ipam   the host binaries (glibc >= 2.28)
#   bin/kubectl-sticky                    a link: the kubectl plugin
#   sticky-macvlan-image.tar              localhost/sticky-macvlan:<version>,
#                                         a docker-archive that
#                                         `ctr -n k8s.io images import` and
#                                         `podman load` read
# The glibc floor is checked (objdump -T): a symbol newer than 2.28 fails
# the build. Zig (PyPI `ziglang`) is the cross linker, through
# cargo-zigbuild (PyPI), installed into target/zigenv on first use: rustup
# cannot fetch a musl target here, and a static glibc breaks NSS lookups.
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/release-image
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2; shift 2 ;;
    *) echo "scripts/image.sh: unknown argument $1 (usage: scripts/image.sh [--out DIR])" >&2; exit 2 ;;
    esac
done

GLIBC_FLOOR=2.28
TARGET=x86_64-unknown-linux-gnu.$GLIBC_FLOOR
ZIG_PINS="cargo-zigbuild==0.24.0 ziglang==0.17.0"
version=$(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "sticky-macvlan"))')
tag=localhost/sticky-macvlan:$version

env_dir=target/zigenv
if [ "$(cat "$env_dir/pins" 2>/dev/null)" != "$ZIG_PINS" ]; then
    echo "image: installing $ZIG_PINS into $env_dir"
    rm -rf "$env_dir"
    python3 -m venv "$env_dir"
    # shellcheck disable=SC2086
    "$env_dir/bin/pip" install -q $ZIG_PINS
    echo "$ZIG_PINS" >"$env_dir/pins"
fi
command -v objdump >/dev/null || { apt-get update -qq && apt-get install -y -qq binutils >/dev/null; }

PATH="$PWD/$env_dir/bin:$PATH" cargo zigbuild --release -p sticky-macvlan --bins \
    --target "$TARGET" --target-dir target/zig
built=target/zig/x86_64-unknown-linux-gnu/release

# The floor: no versioned glibc symbol newer than GLIBC_FLOOR.
for b in sticky-macvlan sticky-ipam; do
    newest=$(objdump -T "$built/$b" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    if [ "$(printf '%s\n' "GLIBC_$GLIBC_FLOOR" "$newest" | sort -V | tail -1)" != "GLIBC_$GLIBC_FLOOR" ]; then
        echo "image: $b needs $newest, above the floor GLIBC_$GLIBC_FLOOR" >&2
        exit 1
    fi
    echo "image: $b needs at most $newest"
done

rm -rf "$out"
mkdir -p "$out/bin"
cp "$built/sticky-macvlan" "$built/sticky-ipam" "$out/bin/"
# kubectl runs it as a plugin by this name (`kubectl sticky claims`).
ln -s sticky-macvlan "$out/bin/kubectl-sticky"

# The image: both binaries at / with the C library they load inside the
# container (the installer runs there; the host's own glibc serves them
# once installed).
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
cp "$out/bin/sticky-macvlan" "$out/bin/sticky-ipam" "$rootfs/"
for lib in $(ldd "$rootfs/sticky-macvlan" "$rootfs/sticky-ipam" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
    [ -e "$lib" ] || continue
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
done
mkdir -p "$rootfs/tmp"
e2e/images/docker-archive.sh "$rootfs" "$tag" /sticky-macvlan "$out/sticky-macvlan-image.tar"
echo "image: $tag in $out/sticky-macvlan-image.tar; host binaries in $out/bin"
