//! Scheduling controls the monitor applies to its vCPUs.

pub mod boost;
pub mod guest_poll;
pub mod halt_poll;
