#!/usr/bin/env bash
# The test suite, in tiers; each tier says what it needs.
#
#   scripts/test.sh unit       no root, no packages: fmt, clippy, the layer
#                              check, the unit tests and the manifest checks
#                              (seconds after the build)
#   scripts/test.sh netns      root: the plugin on network namespaces (the
#                              reference plugins side by side, libcni, BGP)
#   scripts/test.sh apiserver  root: a real etcd + kube-apiserver per
#                              scenario (multi-node kube store, doctor,
#                              API faults, kubectl-sticky)
#   scripts/test.sh cluster    root: the local cluster of real components,
#                              Multus thin, then thick for what differs
#   scripts/test.sh [all]      everything above (what .ci/run runs)
#
# Every tier but unit installs the Debian packages it needs when missing
# and builds the pinned components (cached in target/cluster).
set -euo pipefail
cd "$(dirname "$0")/.."

tier=${1:-all}
# Which e2e test binary belongs to which tier; a file in e2e/tests/ that
# is in none fails the run, so no test is silently left out of a tier.
UNIT_TESTS=(examples)
NETNS_TESTS=(bad_input bgp conformance dataplane libcni new_user release_image sticky)
APISERVER_TESTS=(kube doctor faults kubectl_plugin)
CLUSTER_TESTS=(real_cluster)
case "$tier" in
unit | netns | apiserver | cluster | all) ;;
*)
    echo "scripts/test.sh: unknown tier $tier (usage: scripts/test.sh [unit|netns|apiserver|cluster|all])" >&2
    exit 2
    ;;
esac
# A test binary is a file (e2e/tests/NAME.rs) or a folder with a module
# per scenario family (e2e/tests/NAME/main.rs).
for f in e2e/tests/*.rs e2e/tests/*/main.rs; do
    [ -e "$f" ] || continue
    case "$f" in */main.rs) name=$(basename "$(dirname "$f")") ;; *) name=$(basename "$f" .rs) ;; esac
    case " ${UNIT_TESTS[*]} ${NETNS_TESTS[*]} ${APISERVER_TESTS[*]} ${CLUSTER_TESTS[*]} " in
    *" $name "*) ;;
    *) echo "scripts/test.sh: e2e/tests/$name is in no tier: add it to one of the lists at the top" >&2; exit 1 ;;
    esac
done
# --test NAME for each test binary of a tier.
test_args() { local t; for t in "$@"; do printf -- '--test %s ' "$t"; done; }

static_checks() {
    cargo fmt --check
    cargo clippy --workspace --all-targets -- -D warnings
    # No module of a crate imports another that imports it back.
    for crate in cni ipam ops plugin e2e; do python3 scripts/check-layers.py "$crate/src"; done
    # File sizes, one name per type, module and test helper, crate names.
    python3 scripts/check-layout.py
    # The manual's links and anchors, every page in the book, the README short.
    python3 scripts/check-docs.py
    # Every script parses (the cluster's parts are sourced, so a typo in
    # one would only show once a cluster is started).
    local script
    for script in scripts/*.sh scripts/cluster/*.sh .ci/run; do bash -n "$script"; done
}

# The chart (charts/sticky-macvlan) with helm and promtool from their
# pinned modules (scripts/cluster.sh build): it lints with every optional
# part on, deploy/ is its rendering, and the alert rules are valid and
# pass their unit tests (each alert fired and held back).
chart_checks() {
    local bin=target/cluster/bin chart=charts/sticky-macvlan
    "$bin/helm" lint --strict "$chart"
    "$bin/helm" lint --strict "$chart" --set prometheusRule.enabled=true \
        --set reconcile.metrics.serviceMonitor.enabled=true --set cni.confDir=/var/lib/rancher/k3s/agent/etc/cni/net.d
    "$bin/helm" lint --strict "$chart" --set reconcile.enabled=false --set nodeScopePolicy.enabled=false \
        --set crds.install=false
    HELM=$bin/helm python3 scripts/render-deploy.py --check
    "$bin/promtool" check rules "$chart/files/prometheus-rules.yaml"
    (cd "$chart" && "../../$bin/promtool" test rules tests/prometheus-rules.test.yaml)
}

if [ "$tier" = unit ]; then
    static_checks
    # The crates' own tests (no namespaces, no root) and the manifests.
    cargo test --workspace --lib --bins -q
    # shellcheck disable=SC2046
    cargo test -p sticky-e2e -q $(test_args "${UNIT_TESTS[@]}")
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "scripts/test.sh $tier: the e2e tests create network namespaces and need root (scripts/test.sh unit does not)" >&2
    exit 1
fi

source scripts/deps.sh
# crictl and the pause image, from the pins in e2e/tools (cached).
bash scripts/tools.sh
# The local cluster's components and images, and the reference plugins
# 1.10.0 (cached in target/cluster; a cold build takes about 20 minutes).
bash scripts/cluster.sh build
# The cluster tier installs the chart, so it checks it too (all does below).
if [ "$tier" = cluster ]; then chart_checks; fi

if [ "$tier" = all ]; then
    # The manifests against the Kubernetes schemas, offline (the validator
    # from PyPI carries the schemas; custom kinds such as the NAD are
    # checked by e2e/tests/examples.rs instead).
    if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
        # A Debian system python refuses plain pip installs (PEP 668).
        python3 -m pip install -q --root-user-action=ignore kubernetes-validate==1.37.0 ||
            python3 -m pip install -q --root-user-action=ignore --break-system-packages kubernetes-validate==1.37.0
    fi
    # As a module: a fresh pyenv may not have a shim for the script yet.
    python3 -m kubernetes_validate --strict --quiet deploy/*.yaml deploy/optional/*.yaml examples/*.yaml
    static_checks
    chart_checks
    # The manual builds (mdbook from crates.io, pinned, cached in target/tools).
    MDBOOK_VERSION=0.5.4
    if [ "$(target/tools/mdbook/bin/mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
        cargo install -q --locked mdbook --version "$MDBOOK_VERSION" --root target/tools/mdbook
    fi
    target/tools/mdbook/bin/mdbook build docs
fi
cargo build --workspace

# The real CNI client: libcni 1.3 from its module (e2e/tools/libcni-driver).
(cd e2e/tools/libcni-driver && go build -trimpath -o ../../../target/libcni-driver .)

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
# A failing test run must still reach the summary and the leftover check,
# and one failing test binary must not hide the others (--no-fail-fast).
status=0
set +e
case "$tier" in
all) cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee "$LOG" ;;
# shellcheck disable=SC2046
netns) cargo test -p sticky-e2e --no-fail-fast $(test_args "${NETNS_TESTS[@]}") -- --test-threads=2 2>&1 | tee "$LOG" ;;
# shellcheck disable=SC2046
apiserver) cargo test -p sticky-e2e --no-fail-fast $(test_args "${APISERVER_TESTS[@]}") -- --test-threads=2 2>&1 | tee "$LOG" ;;
cluster) true ;;
esac
[ "${PIPESTATUS[0]}" = 0 ] || status=1
set -e

if [ "$tier" = all ] || [ "$tier" = netns ]; then
    # The side-by-side conformance again, against the reference plugins
    # 1.10.0 built from their module (they speak CNI 1.1.0, Debian's 1.1.1
    # does not).
    set +e
    STICKY_REFERENCE_DIR="$PWD/target/cluster/cni" cargo test -p sticky-e2e --test conformance -- --test-threads=2 2>&1 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    set -e
fi

# The Kubernetes scenarios on a local real cluster (scripts/cluster.sh:
# etcd, kube-apiserver, controller-manager, scheduler, three kubelets with
# containerd and runc, Multus), its components built from the pins in
# e2e/tools (cached in target/cluster). A cluster that does not come up
# fails the run. The run owns the cluster: one left by an earlier run is
# removed first, and this one is removed at the end (STICKY_KEEP_CLUSTER=1
# keeps it for a look with `eval "$(scripts/cluster.sh env)"`).
stop_cluster() { [ "${STICKY_KEEP_CLUSTER:-}" = 1 ] || bash scripts/cluster.sh down || true; }
# cluster_pass MULTUS [TEST FILTER...]: a fresh cluster with Multus thin or
# thick, then the cluster scenarios (those matching the filters, or all).
cluster_pass() {
    local multus=$1 t0=$SECONDS
    shift
    bash scripts/cluster.sh down >/dev/null 2>&1 || true
    if bash scripts/cluster.sh up --nodes 3 --multus "$multus"; then
        echo "local cluster (Multus $multus) up after $((SECONDS - t0)) s (builds included)"
        STICKY_E2E_CLUSTER=1 cargo test -p sticky-e2e --test real_cluster -- --test-threads=1 --nocapture "$@" 2>&1 | tee -a "$LOG"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    else
        echo "the local cluster (Multus $multus) did not come up (logs in .cluster/logs):"
        tail -n 20 .cluster/logs/*.log 2>/dev/null | tail -n 80
        echo "test result: FAILED. 0 passed; 1 failed; (scripts/cluster.sh up --multus $multus)" | tee -a "$LOG"
        status=1
    fi
}
if [ "$tier" = all ] || [ "$tier" = cluster ]; then
    trap 'rm -f "$LOG"; stop_cluster' EXIT
    set +e
    cluster_pass thin
    # The StatefulSet, node-crash and BGP scenarios again with Multus' thick
    # plugin (multus-shim + multus-daemon), its default install.
    cluster_pass thick statefulset_keeps node_crash
    set -e
    stop_cluster
fi

if [ "$tier" = all ]; then
    # The benchmark suite must keep working: a smoke run of it on the debug
    # build (its figures mean nothing here; scripts/bench.sh measures).
    echo "benchmark suite, smoke run: target/debug/bench --quick"
    if target/debug/bench --quick --out target/bench-smoke >target/bench-smoke.log 2>&1; then
        echo "bench smoke: ok ($(grep -c '^target ' target/bench-smoke.log) targets reported)"
    else
        tail -40 target/bench-smoke.log
        echo "bench smoke: FAILED"
        status=1
    fi
fi
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?/) p += $i; if ($(i+1) ~ /^failed;?/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f }' "$LOG"
if ip netns list | grep -q '^smvt-'; then
    echo "leftover test namespaces:"; ip netns list | grep '^smvt-'; exit 1
fi
if { [ "$tier" = all ] || [ "$tier" = cluster ]; } && [ "${STICKY_KEEP_CLUSTER:-}" != 1 ] && ip netns list | grep -q '^smc-'; then
    echo "leftover cluster namespaces:"; ip netns list | grep '^smc-'; exit 1
fi
exit "$status"
