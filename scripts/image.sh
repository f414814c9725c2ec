#!/usr/bin/env bash
# The release: sticky-macvlan and sticky-ipam built for any x86_64 or
# aarch64 Linux with glibc 2.28 or later (RHEL 8, Ubuntu 20.04, Debian 10
# and newer), and the multi-arch OCI image deploy/40-daemonset.yaml and
# deploy/optional/reconcile-deployment.yaml name, built from the
# Containerfile by buildah (Debian's; FROM scratch, nothing pulled, no
# registry).
#
#   scripts/image.sh [--out DIR]
#
# Writes DIR (default target/release-image) with:
#   bin/sticky-macvlan, bin/sticky-ipam   the x86_64 host binaries
#   bin/kubectl-sticky                    a link: the kubectl plugin
#   bin-aarch64/                          the same for aarch64
#   rootfs/amd64, rootfs/arm64            each platform's image file system
#   sticky-macvlan-image.tar              localhost/sticky-macvlan:<version>,
#                                         an OCI archive of the image index
#                                         (linux/amd64 and linux/arm64) that
#                                         `ctr -n k8s.io images import`,
#                                         `skopeo copy` and `podman load` read
# The glibc floor is checked (readelf): a symbol newer than 2.28 fails the
# build. Zig (PyPI `ziglang`) is the cross linker, through cargo-zigbuild
# (PyPI), installed into target/zigenv on first use: rustup cannot fetch a
# musl target here, and a static glibc breaks NSS lookups. The image's
# timestamps are the last commit's (SOURCE_DATE_EPOCH), so one commit
# builds one image.
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
ZIG_PINS="cargo-zigbuild==0.24.0 ziglang==0.17.0"
# rust target -> OCI architecture
PLATFORMS="x86_64:amd64 aarch64:arm64"
version=$(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "sticky-macvlan"))')
tag=localhost/sticky-macvlan:$version
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

env_dir=target/zigenv
if [ "$(cat "$env_dir/pins" 2>/dev/null)" != "$ZIG_PINS" ]; then
    echo "image: installing $ZIG_PINS into $env_dir"
    rm -rf "$env_dir"
    python3 -m venv "$env_dir"
    # shellcheck disable=SC2086
    "$env_dir/bin/pip" install -q $ZIG_PINS
    echo "$ZIG_PINS" >"$env_dir/pins"
fi
missing=()
command -v readelf >/dev/null || missing+=(binutils)
command -v buildah >/dev/null || missing+=(buildah)
# The C library the arm64 image carries (and qemu's sysroot in the smoke test).
[ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || missing+=(libc6-arm64-cross)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu ||
    rustup target add aarch64-unknown-linux-gnu

rm -rf "$out"
mkdir -p "$out"
for platform in $PLATFORMS; do
    arch=${platform%%:*} oci_arch=${platform#*:}
    PATH="$PWD/$env_dir/bin:$PATH" cargo zigbuild --release -p sticky-macvlan --bins \
        --target "$arch-unknown-linux-gnu.$GLIBC_FLOOR" --target-dir target/zig
    built=target/zig/$arch-unknown-linux-gnu/release
    # The floor: no versioned glibc symbol newer than GLIBC_FLOOR.
    for b in sticky-macvlan sticky-ipam; do
        newest=$(readelf --dyn-syms -W "$built/$b" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
        if [ "$(printf '%s\n' "GLIBC_$GLIBC_FLOOR" "$newest" | sort -V | tail -1)" != "GLIBC_$GLIBC_FLOOR" ]; then
            echo "image: $arch $b needs $newest, above the floor GLIBC_$GLIBC_FLOOR" >&2
            exit 1
        fi
        echo "image: $arch $b needs at most $newest"
    done
    bin=$out/bin
    [ "$arch" = x86_64 ] || bin=$out/bin-$arch
    mkdir -p "$bin"
    cp "$built/sticky-macvlan" "$built/sticky-ipam" "$bin/"
    # kubectl runs it as a plugin by this name (`kubectl sticky claims`).
    ln -s sticky-macvlan "$bin/kubectl-sticky"

    # The image's file system: both binaries at / with the C library they
    # load (the installer runs in the container; the host's own glibc
    # serves them once installed): the build host's for x86_64, Debian's
    # cross one for aarch64, at the paths the binaries ask for.
    rootfs=$out/rootfs/$oci_arch
    mkdir -p "$rootfs/tmp"
    cp "$bin/sticky-macvlan" "$bin/sticky-ipam" "$rootfs/"
    if [ "$arch" = x86_64 ]; then
        for lib in $(ldd "$rootfs/sticky-macvlan" "$rootfs/sticky-ipam" |
            awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u); do
            mkdir -p "$rootfs$(dirname "$lib")"
            cp -L "$lib" "$rootfs$lib"
        done
    else
        # Where Debian's arm64 loader looks first (its built-in path).
        mkdir -p "$rootfs/lib/aarch64-linux-gnu"
        cp -L /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 "$rootfs/lib/"
        for lib in $(readelf -d "$rootfs/sticky-macvlan" "$rootfs/sticky-ipam" | grep -o 'Shared library: \[[^]]*' | sed 's/.*\[//' | sort -u); do
            [ "$lib" = ld-linux-aarch64.so.1 ] && continue
            cp -L "/usr/aarch64-linux-gnu/lib/$lib" "$rootfs/lib/aarch64-linux-gnu/$lib"
        done
    fi
done

# The image index, one image per platform, from the Containerfile. buildah
# keeps its state under target/buildah (vfs: no overlay mount needed), so
# the host's container storage is neither read nor changed.
store=(--root "$PWD/target/buildah/root" --runroot "$PWD/target/buildah/run" --storage-driver vfs)
buildah "${store[@]}" manifest rm "$tag" >/dev/null 2>&1 || true
for platform in $PLATFORMS; do
    buildah "${store[@]}" build -q --platform "linux/${platform#*:}" --manifest "$tag" \
        --timestamp "$epoch" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
        -f Containerfile "$out" >/dev/null
done
buildah "${store[@]}" manifest push -q --all --format oci "$tag" "oci-archive:$out/sticky-macvlan-image.tar:$tag"
buildah "${store[@]}" manifest rm "$tag" >/dev/null
buildah "${store[@]}" rmi --all -f >/dev/null 2>&1 || true
echo "image: $tag (linux/amd64, linux/arm64) in $out/sticky-macvlan-image.tar; host binaries in $out/bin, $out/bin-aarch64"
