//! DEL, CHECK, STATUS and GC on one attachment: the verbs that hand no
//! address out.

use super::*;

impl StickyIpam {
    pub fn del(&mut self) -> CniResult<()> {
        let (cid, ifname) = (self.at.container_id.clone(), self.at.ifname.clone());
        let _attachment = self.hold_attachment()?;
        let done = self.with_store(true, LEFT_FOR_LIVENESS, |s| {
            let plan = plan_del(s, &cid, &ifname, now_secs())?;
            Ok((plan, ()))
        })?;
        if let Some((plan, ())) = &done {
            for c in plan.changes.iter().filter_map(|c| c.before.as_ref()) {
                cni::log::info(&format!("released {} of identity {:?}", c.ip, c.identity));
            }
        }
        // Only a release the API took is mirrored: while the API does not
        // answer, its claim stays Bound to this pod, and kubelet's next
        // step after this DEL is the same pod's new sandbox, whose
        // degraded re-ADD needs the record.
        if self.backend.is_kube() && done.is_some() {
            self.release_local(&cid, &ifname);
        }
        Ok(())
    }

    /// The node-local record must not serve a released claim in degraded
    /// mode; best effort.
    pub(super) fn release_local(&self, cid: &str, ifname: &str) {
        let Some(record) = self.backend.local_record(&self.conf.network) else {
            return;
        };
        let outcome = record.commit_held(|local| -> PlanResult<(Plan, ())> {
            local.set_durable(false);
            Ok((plan_del(local, cid, ifname, now_secs())?, ()))
        });
        if let Err(e) = outcome {
            cni::log::warn(&format!("node-local record not updated: {e}"));
        }
    }

    pub fn check(&mut self) -> CniResult<()> {
        let (cid, ifname) = (self.at.container_id.clone(), self.at.ifname.clone());
        let _attachment = self.hold_attachment()?;
        let held = match self.with_store(false, LEFT_FOR_LIVENESS, |s| {
            let held = s.claims_of_holder(&cid, &ifname)?;
            Ok((Plan::default(), held))
        })? {
            Some((_, held)) => held,
            // API unreachable: what this node recorded.
            None => match self.backend.open_local(&self.conf.network)? {
                Some(mut local) => local.claims_of_holder(&cid, &ifname)?,
                None => Vec::new(),
            },
        };
        if held.len() < self.conf.range_sets.len() {
            return Err(CniError::new(
                cni::code::UNKNOWN_CONTAINER,
                format!(
                    "network {:?} has {} of {} claims for container {}/{}: it holds {}",
                    self.conf.network,
                    held.len(),
                    self.conf.range_sets.len(),
                    self.at.container_id,
                    self.at.ifname,
                    if held.is_empty() {
                        "none (released, or taken over by a newer holder)".to_string()
                    } else {
                        held.iter()
                            .map(|c| c.ip.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            ));
        }
        Ok(())
    }

    /// STATUS: the store can be used (the file store locked, the API
    /// answering a GET).
    pub fn status(&mut self) -> CniResult<()> {
        let unavailable = |msg: String| {
            CniError::new(
                cni::code::STATUS_UNAVAILABLE,
                format!("sticky-ipam cannot use its store: {msg}"),
            )
        };
        self.backend
            .usable(&self.conf.network)
            .map_err(|e| unavailable(CniError::from(e).msg))
    }

    pub fn gc(&mut self, keep: &[(String, String)]) -> CniResult<()> {
        let keep: BTreeSet<(String, String)> = keep.iter().cloned().collect();
        let node = self.node.node.clone();
        if let Some((plan, ())) = self.with_store(true, LEFT_FOR_LIVENESS, |s| {
            Ok((plan_gc(s, &node, &keep, now_secs())?, ()))
        })? {
            if !plan.is_empty() {
                cni::log::info(&format!("GC released {} claims", plan.changes.len()));
            }
        }
        Ok(())
    }
}
