//! The kernel: the CPL3 runtime on top of [`crate::arch`]. Tasks and the
//! scheduler, time and the timer, events, preemption control and locks,
//! interrupts for tasks, async page faults, halt polling, priority boosting,
//! guest memory for buffers and reports.
//!
//! Its modules are for the boot sequence (`main.rs`), the arch layer and the
//! drivers. Workloads import [`api`] and nothing else of the guest.

pub mod apf;
pub mod api;
pub mod boost;
pub mod clock;
pub mod event;
pub mod fmtbuf;
pub mod frames;
pub mod haltpoll;
pub mod irq;
pub mod report;
pub mod sched;
pub mod sync;
pub mod timer;
