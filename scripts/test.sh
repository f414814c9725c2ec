#!/usr/bin/env bash
# The whole test suite: installs the Debian packages it needs when missing,
# builds everything, runs unit tests and the root-only e2e tests.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh: the e2e tests create network namespaces and need root" >&2
    exit 1
fi

need=()
[ -x /usr/lib/cni/macvlan ] || need+=(containernetworking-plugins)
command -v go >/dev/null || need+=(golang-go)
[ -d /usr/share/gocode/src/github.com/containernetworking/cni/libcni ] || need+=(golang-github-appc-cni-dev)
command -v ip >/dev/null || need+=(iproute2)
command -v ping >/dev/null || need+=(iputils-ping)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo fmt --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace

# The real CNI client, built with Debian's Go in GOPATH mode.
GOPATH="$PWD/e2e/go:/usr/share/gocode" GO111MODULE=off GOCACHE="$PWD/target/go-cache" \
    go build -o target/libcni-driver libcni-driver

# e2e tests share the machine's namespaces: one test binary at a time.
cargo test --workspace -- --test-threads=2
