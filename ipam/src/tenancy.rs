//! The namespace boundary of a sticky identity (ARCHITECTURE.md, "A
//! sticky identity stays in its namespace"). Multus lets a pod reference a NAD of another
//! namespace and put any `identity` in its `cni-args`, and a delegate is
//! not told the NAD's namespace, so the boundary rests on what the claim
//! records: the namespace of the pod that first claimed the identity.
//! A pod of another namespace never obtains that identity's address,
//! whatever it asks for, unless the config lists its namespace for the
//! identity (`ipam.reservations.<identity>.namespaces`), which then is the
//! whole rule for that identity.

use cni::{code, CniError, CniResult, Refusal};

use crate::claim::Claim;
use crate::config::IpamConfig;
use crate::identity::{Identity, IdentitySource};

fn refuse(msg: String) -> CniError {
    CniError::new(code::NAMESPACE_NOT_ALLOWED, msg).refused_as(Refusal::NamespaceNotAllowed)
}

/// Whether a pod of namespace `caller` may obtain `identity`, whose
/// existing claims are `claims`. A caller without a namespace is not a
/// pod (CNI run by hand on the node, as root) and is not bounded.
pub fn check(
    conf: &IpamConfig,
    identity: &Identity,
    claims: &[Claim],
    caller: Option<&str>,
) -> CniResult<()> {
    // A dynamic key contains the caller's own container ID.
    if identity.source == IdentitySource::Container {
        return Ok(());
    }
    let Some(caller) = caller else {
        return Ok(());
    };
    if let Some(allowed) = conf.identity_namespaces.get(&identity.key) {
        if allowed.iter().any(|ns| ns == caller) {
            return Ok(());
        }
        return Err(refuse(format!(
            "identity {:?} on network {:?} is reserved for namespaces {} (ipam.reservations[{:?}].namespaces); a pod in namespace {caller:?} may not take it: add {caller:?} to that list if it should",
            identity.key,
            conf.network,
            allowed.join(", "),
            identity.key
        )));
    }
    // A raw identity (cni-args, the NAD, the identity annotation) of the
    // form NAMESPACE/NAME is that namespace's: derived identities (a
    // StatefulSet pod, the pod-name policy) have exactly this form, so a pod
    // elsewhere naming one would squat it before its pod first runs.
    let raw = matches!(
        identity.source,
        IdentitySource::ArgsCni | IdentitySource::Config | IdentitySource::Annotation
    );
    if let Some((owner_ns, _)) = identity.key.split_once('/').filter(|_| raw) {
        if owner_ns != caller {
            return Err(refuse(format!(
                "identity {:?} on network {:?} (from {}) names namespace {owner_ns:?}, but the pod is in namespace {caller:?}: an identity of the form NAMESPACE/NAME belongs to that namespace, as a StatefulSet pod's does; choose an identity without '/' or one starting with \"{caller}/\", or list {caller:?} in ipam.reservations[{:?}].namespaces to share it",
                identity.key,
                conf.network,
                identity.source.as_str(),
                identity.key
            )));
        }
    }
    // A tombstone (an operator released the identity) binds nothing.
    let Some((claim, bound)) = claims
        .iter()
        .filter(|c| !c.is_tombstone())
        .find_map(|c| c.namespace.as_deref().map(|ns| (c, ns)))
    else {
        return Ok(());
    };
    if bound == caller {
        return Ok(());
    }
    Err(refuse(format!(
        "identity {:?} on network {:?} belongs to namespace {bound:?} (its claim of {} was made there); a pod in namespace {caller:?} may not take it: to share it, give it a reservation with \"namespaces\": [{bound:?}, {caller:?}] in ipam.reservations, or free it with `sticky-macvlan release --network {} --identity {:?}`",
        identity.key, conf.network, claim.ip, conf.network, identity.key
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf() -> IpamConfig {
        IpamConfig::parse(
            "fabric",
            &json!({
                "subnet": "10.0.0.0/24",
                "reservations": {
                    "peer-a": "10.0.0.2",
                    "peer-b": {"ip": "10.0.0.3", "namespaces": ["bgp", "bgp-canary"]}
                }
            }),
        )
        .unwrap()
    }

    fn identity(key: &str, source: IdentitySource) -> Identity {
        Identity {
            key: key.into(),
            sticky: source != IdentitySource::Container,
            source,
            owner: None,
        }
    }

    fn claim(namespace: Option<&str>) -> Claim {
        Claim {
            ip: "10.0.0.2".parse().unwrap(),
            identity: "peer-a".into(),
            sticky: true,
            holder: None,
            owner: None,
            namespace: namespace.map(str::to_string),
            created: 0,
            updated: 0,
            unconfirmed: None,
        }
    }

    #[test]
    fn who_may_take_an_identity() {
        use IdentitySource::*;
        let bound = vec![claim(Some("bgp"))];
        let legacy = vec![claim(None)];
        // (identity, source, its claims, caller namespace, allowed?, message has)
        type Case<'a> = (
            &'a str,
            IdentitySource,
            &'a [Claim],
            Option<&'a str>,
            bool,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            ("peer-a", ArgsCni, &bound, Some("bgp"), true, ""),
            (
                "peer-a",
                ArgsCni,
                &bound,
                Some("evil"),
                false,
                "belongs to namespace \"bgp\"",
            ),
            ("peer-a", Config, &bound, Some("evil"), false, "release"),
            (
                "bgp/speaker-0",
                ArgsCni,
                &bound,
                Some("evil"),
                false,
                "\"evil\"",
            ),
            // A raw NAMESPACE/NAME identity is that namespace's, claimed or
            // not (issue 26 item 7: "db/sq-0" named by a pod in "evil"
            // before StatefulSet db/sq first ran).
            (
                "db/sq-0",
                ArgsCni,
                &[],
                Some("evil"),
                false,
                "names namespace \"db\"",
            ),
            (
                "db/sq-0",
                Annotation,
                &[],
                Some("evil"),
                false,
                "starting with \"evil/\"",
            ),
            (
                "db/sq-0",
                Config,
                &[],
                Some("evil"),
                false,
                "ipam.reservations",
            ),
            ("db/sq-0", ArgsCni, &[], Some("db"), true, ""),
            // An IPAMClaim's identity named by hand in cni-args belongs to
            // no namespace a pod can be in, its own included.
            (
                "ipamclaim:vms/vm1.phys",
                ArgsCni,
                &[],
                Some("vms"),
                false,
                "names namespace \"ipamclaim:vms\"",
            ),
            (
                "ipamclaim:vms/vm1.phys",
                IpamClaim,
                &[],
                Some("vms"),
                true,
                "",
            ),
            // Derived keys are the caller's own namespace by construction.
            ("db/sq-0", StatefulSet, &[], Some("db"), true, ""),
            // No '/': no namespace named.
            ("peer-a", Annotation, &[], Some("evil"), true, ""),
            // Nothing recorded yet: the first namespace binds it.
            ("peer-a", ArgsCni, &[], Some("evil"), true, ""),
            ("peer-a", ArgsCni, &legacy, Some("evil"), true, ""),
            // Not a pod: CNI run by hand on the node.
            ("peer-a", ArgsCni, &bound, None, true, ""),
            // A dynamic key is the caller's own.
            (
                "container:c/net1",
                Container,
                &bound,
                Some("evil"),
                true,
                "",
            ),
            // An explicit list is the whole rule.
            ("peer-b", ArgsCni, &[], Some("bgp-canary"), true, ""),
            ("peer-b", ArgsCni, &bound, Some("bgp-canary"), true, ""),
            (
                "peer-b",
                ArgsCni,
                &[],
                Some("evil"),
                false,
                "ipam.reservations[\"peer-b\"].namespaces",
            ),
        ];
        let conf = conf();
        for (key, source, claims, caller, allowed, says) in cases {
            let got = check(&conf, &identity(key, source), claims, caller);
            assert_eq!(got.is_ok(), allowed, "{key} {caller:?}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.code, code::NAMESPACE_NOT_ALLOWED);
                assert!(e.msg.contains(says), "{}", e.msg);
                assert!(e.msg.contains(key), "{}", e.msg);
            }
        }
    }
}
