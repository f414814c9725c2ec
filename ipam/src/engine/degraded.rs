//! Degraded mode (the kubernetes API does not answer): the only ADD served
//! is a pod re-ADDing what this node already holds for it (same pod UID),
//! from the node-local record; anything else is refused with code 11, and
//! nothing is allocated blindly.

use cni::{code, CniError};

use super::{AddRequest, Grant};
use crate::claim::Claim;
use crate::config::IpamConfig;
use crate::probe_policy::Origin;
use crate::store::{Change, Plan};

/// Plans the re-ADD from `recorded`, the node-local record's claims of
/// this network. `why` says what the API did. The plan is for the local
/// record only: nothing reaches the API.
pub fn plan_degraded(
    conf: &IpamConfig,
    recorded: &[Claim],
    req: &AddRequest,
    node: &str,
    why: &str,
) -> Result<(Plan, Vec<Grant>), CniError> {
    let refuse = |detail: &str| {
        CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "network {:?}: {why}; {detail}: nothing is allocated while the API is unreachable, and kubelet retries this ADD",
                conf.network
            ),
        )
    };
    let Some(uid) = req.caller.pod_uid.as_deref().filter(|u| !u.is_empty()) else {
        return Err(refuse("the ADD names no pod UID (K8S_POD_UID)"));
    };
    let mine: Vec<&Claim> = recorded
        .iter()
        .filter(|c| {
            c.holder
                .as_ref()
                .is_some_and(|h| h.pod_uid.as_deref() == Some(uid) && h.node == node)
        })
        .collect();
    let mut grants = Vec::new();
    let mut plan = Plan::default();
    for set in &conf.range_sets {
        let Some(claim) = mine.iter().find(|c| set.contains(c.ip)) else {
            return Err(refuse(&format!(
                "this node holds no address of range set {} for pod UID {uid}",
                set.describe()
            )));
        };
        let range = set
            .range_of(claim.ip)
            .cloned()
            .unwrap_or_else(|| set.ranges[0].clone());
        plan.changes.push(Change {
            before: Some((*claim).clone()),
            after: Some(Claim {
                holder: Some(req.holder.clone()),
                updated: req.now,
                ..(*claim).clone()
            }),
        });
        grants.push(Grant {
            reclaimed: false,
            ip: claim.ip,
            range,
            took_over: None,
            displaced: None,
            // Probed: another node may have taken it over since the record
            // was written (its probe heard nothing while this pod's old
            // sandbox was down).
            origin: Origin::Recorded,
            unconfirmed: false,
        });
    }
    Ok((plan, grants))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::test_support::{conf, holder, req};
    use serde_json::json;

    fn recorded(ip: &str, uid: &str, node: &str) -> Claim {
        let mut h = holder("old");
        h.pod_uid = Some(uid.into());
        h.node = node.into();
        Claim {
            ip: ip.parse().unwrap(),
            identity: "db-0".into(),
            sticky: true,
            holder: Some(h),
            owner: None,
            namespace: Some("ns".into()),
            created: 1,
            updated: 1,
            unconfirmed: None,
        }
    }

    #[test]
    fn only_the_same_pods_address_on_this_node_is_served() {
        let dual = conf(json!({"ranges": [
            [{"subnet": "10.0.0.0/24"}],
            [{"subnet": "fd00::/64"}]
        ]}));
        let single = conf(json!({"subnet": "10.0.0.0/24"}));
        let mut r = req("db-0", true, "new");
        r.caller.pod_uid = Some("uid-1".into());
        let v4 = recorded("10.0.0.5", "uid-1", "n1");
        let v6 = recorded("fd00::5", "uid-1", "n1");
        let why = "kubernetes API unreachable: timeout";
        // (config, recorded claims, caller UID, served addresses or refusal text)
        type Case<'a> = (
            &'a IpamConfig,
            Vec<Claim>,
            Option<&'a str>,
            Result<Vec<&'a str>, &'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                &single,
                vec![v4.clone()],
                Some("uid-1"),
                Ok(vec!["10.0.0.5"]),
            ),
            (
                &dual,
                vec![v4.clone(), v6.clone()],
                Some("uid-1"),
                Ok(vec!["10.0.0.5", "fd00::5"]),
            ),
            (
                &dual,
                vec![v4.clone()],
                Some("uid-1"),
                Err("no address of range set"),
            ),
            (
                &single,
                vec![v4.clone()],
                Some("uid-2"),
                Err("for pod UID uid-2"),
            ),
            (
                &single,
                vec![recorded("10.0.0.5", "uid-1", "n2")],
                Some("uid-1"),
                Err("holds no address"),
            ),
            (&single, vec![v4.clone()], None, Err("names no pod UID")),
            (&single, vec![v4.clone()], Some(""), Err("names no pod UID")),
            (&single, vec![], Some("uid-1"), Err("holds no address")),
        ];
        for (c, claims, uid, want) in cases {
            let mut r = r.clone();
            r.caller.pod_uid = uid.map(str::to_string);
            let got = plan_degraded(c, &claims, &r, "n1", why);
            match (got, want) {
                (Ok((plan, grants)), Ok(ips)) => {
                    let served: Vec<String> = grants.iter().map(|g| g.ip.to_string()).collect();
                    assert_eq!(served, ips);
                    assert!(grants.iter().all(|g| g.origin == Origin::Recorded));
                    // The holder moves to the new sandbox; nothing else changes.
                    for ch in &plan.changes {
                        let after = ch.after.as_ref().unwrap();
                        assert_eq!(after.holder.as_ref(), Some(&r.holder));
                        assert_eq!(after.ip, ch.before.as_ref().unwrap().ip);
                    }
                }
                (Err(e), Err(says)) => {
                    assert_eq!(e.code, code::TRY_AGAIN_LATER);
                    assert!(e.msg.contains(says) && e.msg.contains(why), "{}", e.msg);
                }
                (got, want) => panic!("{uid:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
