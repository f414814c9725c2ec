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

# The example manifests against the Kubernetes schemas, offline (the
# validator from PyPI carries the schemas; custom kinds such as the NAD are
# checked by e2e/tests/examples.rs instead).
command -v kubernetes-validate >/dev/null || python3 -m pip install -q --root-user-action=ignore kubernetes-validate==1.37.0
kubernetes-validate --strict --quiet examples/*.yaml

cargo fmt --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace

# The real CNI client, built with Debian's Go in GOPATH mode.
GOPATH="$PWD/e2e/go:/usr/share/gocode" GO111MODULE=off GOCACHE="$PWD/target/go-cache" \
    go build -o target/libcni-driver libcni-driver

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
cargo test --workspace -- --test-threads=2 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?/) p += $i; if ($(i+1) ~ /^failed;?/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f }' "$LOG"
if ip netns list | grep -q '^smvt-'; then
    echo "leftover test namespaces:"; ip netns list | grep '^smvt-'; exit 1
fi
exit "$status"
