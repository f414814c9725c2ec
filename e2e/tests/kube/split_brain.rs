//! A split brain on the kubernetes store: the takeover refused while the
//! old holder answers on the fabric.

use super::*;

/// Split brain: the API says the old pod is gone, but its node is only
/// partitioned from the API and the pod still answers on the fabric. The
/// takeover is refused with code 11 naming the answering MAC, the old pod
/// keeps working and the claim is unchanged; once the old pod's netns is
/// really gone, the takeover succeeds and the router moves to the new MAC.
#[test]
fn split_brain_takeover_is_refused_while_the_old_holder_answers() {
    let (mut topo, api) = nodes_on_api(2);
    let set = api.add_stateful_set(NS, "sb");
    let uid = api.add_pod(NS, "sb-0", &api.node(1), Some(("sb", &set)), None);
    let old = topo.add_pod("sb-0-old");
    let x = add_on_node(
        &topo,
        &api,
        0,
        &old,
        "sb-old",
        &pod_args_in_ns("sb-0", &uid),
    )
    .first_address();
    let router = topo.router.clone();
    assert!(topo.ping_eventually(&router, &x, 3));
    let old_mac = link_mac(&old.netns, "net1");
    let claim_before = api.claims();

    // The pod object is force-deleted; node1 and the pod live on.
    api.remove_pod(NS, "sb-0");
    let uid2 = api.add_pod(NS, "sb-0", &api.node(2), Some(("sb", &set)), None);
    let new = topo.add_pod("sb-0-new");
    let refused = add_on_node(
        &topo,
        &api,
        1,
        &new,
        "sb-new",
        &pod_args_in_ns("sb-0", &uid2),
    );
    refused.expect_refused(11, &[&x, &old_mac]);
    assert_eq!(
        sticky_e2e::links_in(&new.netns),
        ["lo"],
        "the refused link is gone"
    );
    let strip = |claims: Vec<Value>| -> Vec<(Value, Value)> {
        claims
            .into_iter()
            .map(|c| (c["spec"].clone(), c["status"].clone()))
            .collect()
    };
    assert_eq!(
        strip(api.claims()),
        strip(claim_before),
        "the claim changed"
    );
    assert!(topo.ping_from(&router, &x), "the old pod stopped answering");
    assert_eq!(
        neighbour_mac(&router, &x).as_deref(),
        Some(old_mac.as_str())
    );

    // The old pod is really gone now.
    let old_ns = old.netns.clone();
    topo.delete_netns(&old_ns);
    let started = Instant::now();
    let moved = add_on_node(
        &topo,
        &api,
        1,
        &new,
        "sb-new",
        &pod_args_in_ns("sb-0", &uid2),
    );
    let took = started.elapsed();
    assert_eq!(moved.first_address(), x);
    let new_mac = link_mac(&new.netns, "net1");
    // Announced: the router's entry moves without waiting for its ARP timeout.
    let deadline = Instant::now() + Duration::from_secs(2);
    while neighbour_mac(&router, &x).as_deref() != Some(new_mac.as_str()) {
        assert!(
            Instant::now() < deadline,
            "the router still has {:?} for {x}, not {new_mac}",
            neighbour_mac(&router, &x)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(topo.ping_eventually(&router, &x, 3));
    eprintln!("takeover ADD with the ARP probe took {took:?}");
}
