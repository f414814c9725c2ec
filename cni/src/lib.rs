//! The CNI protocol, independent of what a plugin does: versions, env,
//! `CNI_ARGS`, errors and results.

pub mod args;
pub mod conf;
pub mod env;
pub mod error;
pub mod fault;
pub mod keys;
pub mod log;
pub mod result;
pub mod skel;
pub mod version;

pub use args::CniArgs;
pub use env::{CniEnv, Command};
pub use error::{code, CniError, CniResult, Refusal};
pub use result::{CniOutput, Dns, Interface, IpConfig, Route};
pub use version::CniVersion;
