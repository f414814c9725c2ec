#!/usr/bin/env bash
# A long seeded chaos run on the local cluster (issue 26 item 12): the
# suite's a_seeded_chaos_run_never_puts_one_address_on_two_pods with a seed
# and a number of faults of your choosing. The same seed draws the same
# schedule of faults (pods deleted gracefully or by force, a node crashed
# and tainted out-of-service, the API server restarted, a node cut from
# the API while its pod is force-deleted, a StatefulSet scaled down and
# up); after every fault it checks, until the workloads are whole again,
# that no address is on two Running pods and none is answered by two MACs
# on the fabric (ARP and NDP from the router's namespace), and at the end
# that no claim is Bound to a pod the API no longer has. It prints one
# summary line with the figures.
#
#   scripts/soak.sh [--seed N] [--faults M] [--keep-cluster]
#
# A cluster already up (scripts/cluster.sh up) is used as it is and kept;
# otherwise one is made for the run and removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=26 faults=30 keep=
while [ $# -gt 0 ]; do
    case "$1" in
    --seed) seed=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --keep-cluster) keep=1; shift ;;
    *) echo "scripts/soak.sh: unknown argument $1 (usage: scripts/soak.sh [--seed N] [--faults M] [--keep-cluster])" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" != 0 ]; then
    echo "scripts/soak.sh: the local cluster needs root" >&2
    exit 1
fi
source scripts/deps.sh
if bash scripts/cluster.sh status 2>/dev/null | grep -q '^no cluster'; then
    bash scripts/tools.sh
    bash scripts/cluster.sh build
    [ -n "$keep" ] || trap 'bash scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
    bash scripts/cluster.sh up --nodes 3 --multus thin
fi
t0=$SECONDS
set +e
STICKY_E2E_CLUSTER=1 STICKY_CHAOS_SEED=$seed STICKY_CHAOS_FAULTS=$faults \
    cargo test -p sticky-e2e --test real_cluster -- --exact --nocapture --test-threads=1 \
    chaos::a_seeded_chaos_run_never_puts_one_address_on_two_pods >"target/soak-$seed.log" 2>&1
status=$?
set -e
grep -E '^chaos|test result|panicked' "target/soak-$seed.log" || true
echo "soak: seed $seed, $faults faults, $((SECONDS - t0)) s, exit $status (log: target/soak-$seed.log)"
exit "$status"
