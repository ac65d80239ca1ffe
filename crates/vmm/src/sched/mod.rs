//! Scheduling controls the monitor applies to its vCPUs.

pub mod halt_poll;
pub mod boost;
