# shellcheck shell=bash
# Sourced by scripts/cluster.sh, which sets ROOT, C, B, BIN and the other
# settings and defines log, die, node_ip and stamp. This part: building the
# components from the modules pinned in e2e/tools, the test images and the
# previous release (cached in target/cluster).
# It only defines; the commands in commands.sh run it.

# go_build NAME MODULE_DIR OUTPUTS... -- BUILD ARGS: rebuilt when the module's
# go.mod/go.sum/*.go or the build arguments change, or an output (a path
# under target/cluster) is missing.
go_build() {
    local name=$1 dir=$2; shift 2
    local outs=()
    while [ "$1" != -- ]; do outs+=("$1"); shift; done
    shift
    local want have ok=1
    want=$(printf '%s\n' "$(stamp "$dir/go.mod" "$dir/go.sum" "$dir"/*.go)" "$*" | sha256sum | cut -d' ' -f1)
    have=$(cat "$B/stamps/$name" 2>/dev/null || true)
    for o in "${outs[@]}"; do [ -x "$B/$o" ] || ok=; done
    if [ -n "$ok" ] && [ "$want" = "$have" ]; then return; fi
    log "building $name (from $dir)"
    local t0=$SECONDS
    (cd "$dir" && go build -trimpath "$@")
    echo "$want" >"$B/stamps/$name"
    log "built $name in $((SECONDS - t0)) s"
}

build_images() {
    local want rootfs
    mkdir -p "$B/images"
    # pause: the sandbox image.
    want=$(stamp e2e/images/pause.c e2e/images/docker-archive.sh)
    if [ "$(cat "$B/stamps/pause" 2>/dev/null)" != "$want" ] || [ ! -f "$B/images/pause.tar" ]; then
        rootfs=$(mktemp -d)
        gcc -static -O2 -o "$rootfs/pause" e2e/images/pause.c
        e2e/images/docker-archive.sh "$rootfs" localhost/pause:3.10 /pause "$B/images/pause.tar"
        rm -rf "$rootfs"; echo "$want" >"$B/stamps/pause"
    fi
    # testbox: busybox (sh, ip, ping, sleep, cat ...), static.
    want=$(stamp /bin/busybox e2e/images/docker-archive.sh)
    if [ "$(cat "$B/stamps/testbox" 2>/dev/null)" != "$want" ] || [ ! -f "$B/images/testbox.tar" ]; then
        rootfs=$(mktemp -d)
        mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
        cp /bin/busybox "$rootfs/bin/busybox"
        for a in $("$rootfs/bin/busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$rootfs/bin/$a"; done
        echo "root:x:0:0:root:/:/bin/sh" >"$rootfs/etc/passwd"
        e2e/images/docker-archive.sh "$rootfs" localhost/testbox:1 /bin/sh "$B/images/testbox.tar"
        rm -rf "$rootfs"; echo "$want" >"$B/stamps/testbox"
    fi
    # The project's image exactly as a user builds it (scripts/image.sh:
    # binaries for glibc >= 2.28, the tag the examples name).
    bash scripts/image.sh --out "$B/release-image"
    cp "$B/release-image/sticky-macvlan-image.tar" "$B/images/sticky-macvlan.tar"
    # gobgpd (Debian's) for the BGP seed workload.
    want=$(stamp "$(command -v gobgpd)" "$(command -v gobgp)" /bin/busybox e2e/images/docker-archive.sh)
    if [ "$(cat "$B/stamps/gobgpd" 2>/dev/null)" != "$want" ] || [ ! -f "$B/images/gobgpd.tar" ]; then
        rootfs=$(mktemp -d)
        mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc"
        cp "$(command -v gobgpd)" "$(command -v gobgp)" "$rootfs/bin/"
        cp /bin/busybox "$rootfs/bin/busybox"
        for a in sh cat sleep ip ping echo; do ln -s busybox "$rootfs/bin/$a"; done
        copy_libs "$rootfs" "$rootfs/bin/gobgpd" "$rootfs/bin/gobgp"
        e2e/images/docker-archive.sh "$rootfs" localhost/gobgpd:dev /bin/gobgpd "$B/images/gobgpd.tar"
        rm -rf "$rootfs"; echo "$want" >"$B/stamps/gobgpd"
    fi
    build_previous_release
}

# The previous release, for the upgrade test: its source from this
# repository's history, built as it built itself (cargo build --release,
# the image tagged as its deploy/40-daemonset.yaml names it), and its
# manifests exactly as it shipped them, in $B/previous/examples. 0.1.0 is
# the last commit before issue 17 (Events, conditions, retention,
# node-bound tokens, node scope): what a user who adopted us on 2026-12-04
# runs.
PREVIOUS_VERSION=0.1.0
PREVIOUS_COMMIT=1a4277c88b51b1dc27e7efa5843964520e5bf446
PREVIOUS_IMAGE=localhost/sticky-macvlan:dev
build_previous_release() {
    local out=$B/previous rootfs t0=$SECONDS
    if [ "$(cat "$B/stamps/previous" 2>/dev/null)" = "$PREVIOUS_COMMIT" ] && [ -f "$B/images/sticky-macvlan-previous.tar" ]; then
        return
    fi
    if ! git cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null; then
        # A shallow clone: its origin has the commit.
        git fetch -q --depth 1 origin "$PREVIOUS_COMMIT" 2>/dev/null || true
    fi
    git cat-file -e "$PREVIOUS_COMMIT^{commit}" 2>/dev/null ||
        die "release $PREVIOUS_VERSION (commit $PREVIOUS_COMMIT) is not in this clone's history and could not be fetched: clone without --depth to build what the upgrade test starts from"
    log "building release $PREVIOUS_VERSION from $PREVIOUS_COMMIT"
    rm -rf "$out/src" "$out/examples"
    mkdir -p "$out/src"
    git archive "$PREVIOUS_COMMIT" | tar -x -C "$out/src"
    cp -r "$out/src/examples" "$out/examples"
    (cd "$out/src" && cargo build -q --locked --release -p sticky-macvlan --bins --target-dir ../target)
    rootfs=$(mktemp -d)
    cp "$out/target/release/sticky-macvlan" "$out/target/release/sticky-ipam" "$rootfs/"
    copy_libs "$rootfs" "$rootfs/sticky-macvlan" "$rootfs/sticky-ipam"
    mkdir -p "$rootfs/tmp"
    e2e/images/docker-archive.sh "$rootfs" "$PREVIOUS_IMAGE" /sticky-macvlan "$B/images/sticky-macvlan-previous.tar"
    rm -rf "$rootfs" "$out/src"
    echo "$PREVIOUS_VERSION $PREVIOUS_IMAGE" >"$out/release"
    echo "$PREVIOUS_COMMIT" >"$B/stamps/previous"
    log "built release $PREVIOUS_VERSION ($PREVIOUS_IMAGE) in $((SECONDS - t0)) s"
}

# copy_libs ROOTFS BINARY...: the shared libraries the binaries load, at
# the same paths, so a from-scratch image runs them.
copy_libs() {
    local rootfs=$1; shift
    local lib
    for lib in $(ldd "$@" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
        [ -e "$lib" ] || continue
        mkdir -p "$rootfs$(dirname "$lib")"
        cp -L "$lib" "$rootfs$lib"
    done
}

build() {
    command -v go >/dev/null || die "go is missing: the cluster's components are built with Go 1.26 (see README)"
    local gv
    gv=$(go env GOVERSION)
    case $gv in
    go1.2[6-9]* | go1.[3-9][0-9]*) ;;
    *) die "$gv is too old to build the cluster's components (Kubernetes v1.36 needs Go 1.26): put Go 1.26 first on PATH" ;;
    esac
    mkdir -p "$BIN" "$B/stamps"
    local v=k8s.io/component-base/version
    go_build kubernetes e2e/tools/kubernetes bin/kube-apiserver bin/kube-controller-manager bin/kube-scheduler \
        bin/kubelet bin/kubectl bin/kube-proxy -- \
        -ldflags "-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=36 -X $v.gitTreeState=clean -X $v.buildDate=2026-12-03T00:00:00Z" \
        -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
        k8s.io/kubernetes/cmd/kube-proxy
    go_build etcd e2e/tools/etcd bin/etcd -- -ldflags "-s -w" -o "$BIN/etcd" .
    go_build containerd e2e/tools/containerd bin/containerd bin/containerd-shim-runc-v2 bin/ctr -- \
        -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w" -o "$BIN/" \
        github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
        github.com/containerd/containerd/v2/cmd/ctr
    go_build multus e2e/tools/multus bin/multus bin/multus-daemon bin/multus-shim -- -ldflags "-s -w" -o "$BIN/" \
        gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus \
        gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon \
        gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim
    mkdir -p "$B/cni"
    go_build cni-plugins e2e/tools/cni-plugins cni/bridge cni/loopback cni/macvlan cni/host-local \
        cni/static cni/tuning -- -ldflags "-s -w" -o "$B/cni/" \
        github.com/containernetworking/plugins/plugins/main/bridge \
        github.com/containernetworking/plugins/plugins/main/loopback \
        github.com/containernetworking/plugins/plugins/main/macvlan \
        github.com/containernetworking/plugins/plugins/ipam/host-local \
        github.com/containernetworking/plugins/plugins/ipam/static \
        github.com/containernetworking/plugins/plugins/meta/tuning
    go_build whereabouts e2e/tools/whereabouts cni/whereabouts -- -ldflags "-s -w" -o "$B/cni/whereabouts" \
        github.com/k8snetworkplumbingwg/whereabouts/cmd
    # The chart's tools: helm (lint, template, and the install test) and
    # promtool (the alert rules' checks and unit tests). remove_all_sd is
    # Prometheus' own build tag for leaving out the service discoveries,
    # which rule checks never use: it halves promtool's cold build.
    go_build helm e2e/tools/helm bin/helm -- -ldflags "-s -w" -o "$BIN/helm" helm.sh/helm/v4/cmd/helm
    go_build promtool e2e/tools/promtool bin/promtool -- -tags remove_all_sd -ldflags "-s -w" -o "$BIN/promtool" \
        github.com/prometheus/prometheus/cmd/promtool
    build_images
}
