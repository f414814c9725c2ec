//! Planning again after a lost race, written once: every verb that plans
//! and commits (ADD, DEL, GC, undo, the CLI's release and reconcile) goes
//! through `with_retries`, so a conflicting write is never an error a
//! caller must know about, only a reason to read again.

use std::time::Duration;

use super::{ClaimStore, Plan, PlanError, PlanResult, StoreError};

/// How often a plan that lost a race is planned again before the verb
/// gives up with code 11 (kubelet retries the whole ADD later).
pub const MAX_ATTEMPTS: u32 = 8;

/// Plans with `plan` and commits, planning again after a conflict with a
/// jittered, bounded backoff.
pub fn with_retries<T>(
    store: &mut dyn ClaimStore,
    what: &str,
    mut plan: impl FnMut(&mut dyn ClaimStore) -> PlanResult<(Plan, T)>,
) -> PlanResult<(Plan, T)> {
    let mut last = String::new();
    for attempt in 0..MAX_ATTEMPTS {
        // Even an empty plan is committed: a store that planned from a
        // cache confirms there what the plan relied on.
        let outcome = plan(store).and_then(|(p, t)| {
            store.commit(&p)?;
            Ok((p, t))
        });
        match outcome {
            Err(PlanError::Store(StoreError::Conflict(why))) => {
                cni::log::debug(&format!(
                    "{what}: attempt {} lost a race: {why}",
                    attempt + 1
                ));
                last = why;
                std::thread::sleep(backoff(attempt));
                match store.conflicted() {
                    // The reload raced too: the next attempt reads afresh.
                    Err(StoreError::Conflict(why)) => last = why,
                    Err(e) => return Err(e.into()),
                    Ok(()) => {}
                }
            }
            other => return other,
        }
    }
    // Busy: code 11, and the CLI's sweep knows to skip to the next one.
    Err(StoreError::Busy(format!(
        "{what} gave up after {MAX_ATTEMPTS} conflicting writes (last: {last}); kubelet retries it"
    ))
    .into())
}

/// 5 ms doubling to 320 ms, each with up to 100% jitter so racing nodes
/// spread out.
fn backoff(attempt: u32) -> Duration {
    let base = 5u64 << attempt.min(6);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    Duration::from_millis(base + u64::from(seed) % (base + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use cni::{code, CniError};

    #[test]
    fn conflicts_are_planned_again_and_other_errors_returned() {
        let mut store = MemoryStore::default();
        let mut calls = 0;
        let out = with_retries(&mut store, "test", |_| {
            calls += 1;
            if calls < 3 {
                Err(StoreError::Conflict(format!("race {calls}")).into())
            } else {
                Ok((Plan::default(), calls))
            }
        });
        assert_eq!(out.map(|(_, n)| n), Ok(3));
        let out: PlanResult<(Plan, ())> = with_retries(&mut store, "test", |_| {
            Err(StoreError::Io("disk".into()).into())
        });
        assert_eq!(out, Err(PlanError::Store(StoreError::Io("disk".into()))));
    }

    #[test]
    fn endless_conflicts_give_up_with_code_11() {
        let mut store = MemoryStore::default();
        let out: PlanResult<(Plan, ())> = with_retries(&mut store, "ADD", |_| {
            Err(StoreError::Conflict("always".into()).into())
        });
        let e: CniError = out.unwrap_err().into();
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("gave up after 8") && e.msg.contains("always"),
            "{}",
            e.msg
        );
    }
}
