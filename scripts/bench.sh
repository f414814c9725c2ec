#!/usr/bin/env bash
# The benchmark suite: installs what it needs, builds the release binaries
# and runs every section, interleaved with the reference plugins. A full
# run rewrites BENCHMARKS.md and docs/bench/ (results.json, the plots);
# pass --quick for a short smoke run that writes to target/bench-quick;
# --cluster [--quick] measures pod start on the local cluster instead
# (sticky-macvlan, Whereabouts, host-local; docs/bench/pod-start.md).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/bench.sh: the benchmarks create network namespaces and need root" >&2
    exit 1
fi
source scripts/deps.sh
cargo build --release --workspace
if [ "${1:-}" = --cluster ]; then
    # Pod start on the local cluster (docs/bench/pod-start.md): a fresh
    # cluster for the run, removed afterwards, also after a failure.
    shift
    bash scripts/cluster.sh build
    bash scripts/cluster.sh down >/dev/null 2>&1 || true
    trap 'bash scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
    bash scripts/cluster.sh up --nodes 3 --multus thin
    STICKY_E2E_CLUSTER=1 target/release/bench-cluster "$@"
    exit
fi
exec target/release/bench "$@"
