//! What a store can fail with, typed, so callers decide on the kind (plan
//! again after a conflict, serve degraded after no answer, skip a damaged
//! candidate) instead of comparing codes. `From<StoreError> for CniError`
//! is the one place kinds become CNI codes.

use std::fmt;

use cni::{code, CniError};

use crate::kube::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// A conditional write lost a race (or a read found a claim gone or
    /// changed under it): plan again from fresh reads.
    Conflict(String),
    /// The kubernetes API did not answer: nothing is known of the cluster.
    Unreachable(String),
    /// The kubernetes API refused the request (RBAC, validation), rejected
    /// the credentials (401), or no client could be built.
    Refused(String),
    /// A record cannot be read; named, never guessed at.
    Damaged(String),
    /// The network's lock stayed held too long: try again later.
    Busy(String),
    /// The store's files cannot be read or written.
    Io(String),
    /// The caller named something that is not part of the store.
    Invalid(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    pub fn message(&self) -> &str {
        match self {
            StoreError::Conflict(m)
            | StoreError::Unreachable(m)
            | StoreError::Refused(m)
            | StoreError::Damaged(m)
            | StoreError::Busy(m)
            | StoreError::Io(m)
            | StoreError::Invalid(m) => m,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for StoreError {}

/// How an API that did not answer is said, in errors and logs alike.
pub fn api_unreachable(why: &str) -> String {
    format!("kubernetes API unreachable: {why}")
}

/// How a 401 is said: the token in the kubeconfig is no longer valid,
/// which no RBAC change fixes.
pub fn token_rejected(why: &str) -> String {
    format!(
        "kubernetes API rejected the credentials: {why}: the token of ipam.store.kubeconfig is no longer valid (it expired, or its Node object was deleted and the node registered again under a new UID); the sticky-macvlan installer on this node renews it within a minute, or delete the DaemonSet's pod on this node to write a new one"
    )
}

impl From<StoreError> for CniError {
    fn from(e: StoreError) -> CniError {
        match e {
            StoreError::Conflict(m) => CniError::new(code::STORE_CONFLICT, m),
            StoreError::Unreachable(m) => {
                CniError::new(code::STORE_UNREACHABLE, api_unreachable(&m))
            }
            StoreError::Refused(m) => CniError::new(code::STORE_REFUSED, m),
            StoreError::Damaged(m) => CniError::new(code::STORE_DAMAGED, m),
            StoreError::Busy(m) => CniError::new(code::TRY_AGAIN_LATER, m),
            StoreError::Io(m) => CniError::new(code::IO_FAILURE, m),
            StoreError::Invalid(m) => CniError::new(code::INVALID_CONFIG, m),
        }
    }
}

impl From<ApiError> for StoreError {
    fn from(e: ApiError) -> StoreError {
        match e {
            ApiError::Conflict(m) => StoreError::Conflict(m),
            ApiError::Unreachable(m) => StoreError::Unreachable(m),
            ApiError::Refused(m) => StoreError::Refused(format!(
                "kubernetes API refused the request: {m}; check the RBAC of deploy/20-rbac.yaml and ipam.store.kubeconfig"
            )),
            ApiError::Unauthorized(m) => StoreError::Refused(token_rejected(&m)),
            ApiError::Client(m) => StoreError::Refused(format!(
                "cannot use the kubernetes store (no request was made): {m}"
            )),
        }
    }
}

/// What planning can fail with: the store, or a decision (a refusal, a
/// request the config does not allow) that is already a CNI error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    Store(StoreError),
    Refused(CniError),
}

pub type PlanResult<T> = Result<T, PlanError>;

impl From<StoreError> for PlanError {
    fn from(e: StoreError) -> PlanError {
        PlanError::Store(e)
    }
}

impl From<CniError> for PlanError {
    fn from(e: CniError) -> PlanError {
        PlanError::Refused(e)
    }
}

impl From<PlanError> for CniError {
    fn from(e: PlanError) -> CniError {
        match e {
            PlanError::Store(s) => s.into(),
            PlanError::Refused(c) => c,
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Store(e) => e.fmt(f),
            PlanError::Refused(e) => e.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_code() {
        let cases = [
            (StoreError::Conflict("c".into()), code::STORE_CONFLICT),
            (StoreError::Unreachable("u".into()), code::STORE_UNREACHABLE),
            (StoreError::Refused("r".into()), code::STORE_REFUSED),
            (StoreError::Damaged("d".into()), code::STORE_DAMAGED),
            (StoreError::Busy("b".into()), code::TRY_AGAIN_LATER),
            (StoreError::Io("i".into()), code::IO_FAILURE),
            (StoreError::Invalid("v".into()), code::INVALID_CONFIG),
        ];
        for (e, want) in cases {
            let c: CniError = e.clone().into();
            assert_eq!(c.code, want, "{e:?}");
            assert!(code::is_known(c.code));
            assert!(c.msg.contains(e.message()));
        }
        let refused: CniError = StoreError::from(ApiError::Client("no file".into())).into();
        assert!(refused.msg.contains("no request was made") && !refused.msg.contains("RBAC"));
        let plan: CniError =
            PlanError::Refused(CniError::new(code::TRY_AGAIN_LATER, "held")).into();
        assert_eq!(plan.code, code::TRY_AGAIN_LATER);
    }
}
