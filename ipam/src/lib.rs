pub mod addr;
pub mod claim;
pub mod config;
pub mod engine;
pub mod identity;
pub mod liveness;
pub mod store;
