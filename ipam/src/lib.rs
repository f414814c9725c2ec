pub mod addr;
pub mod claim;
pub mod config;
pub mod identity;
pub mod liveness;
