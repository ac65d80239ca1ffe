//! Kernel calls: what workloads use. They are plain calls into the CPL3
//! runtime; only the few that need privilege go through the nub.

pub use crate::boost::{critical_begin, critical_end, status_bits as boost_status};
pub use crate::clock::{now, ticks_per_sec, ticks_to_ns};
pub use crate::control::{exit, inject_msi};
pub use crate::event::Event;
pub use crate::irq::wait as wait_irq;
pub use crate::report::Reports;
pub use crate::sched::{join, set_realtime, spawn, yield_now, Placement};
pub use crate::timer::sleep_until;
