//! Scheduling controls the monitor applies to its vCPUs.

pub mod boost;
pub mod halt_poll;
