#!/usr/bin/env bash
# The benchmark suite: installs what it needs, builds the release binaries
# and runs every section, interleaved with the reference plugins. A full
# run rewrites BENCHMARKS.md and docs/bench/ (results.json, the plots);
# pass --quick for a short smoke run that writes to target/bench-quick.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "scripts/bench.sh: the benchmarks create network namespaces and need root" >&2
    exit 1
fi
source scripts/deps.sh
cargo build --release --workspace
exec target/release/bench "$@"
