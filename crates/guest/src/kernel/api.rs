//! Kernel calls: what workloads use, and the only module of the guest they
//! import (`use crate::kernel::api::...`; `hover_abi` is theirs to use too).
//! They are plain calls into the CPL3 runtime; only the few that need
//! privilege go through the nub. Most are re-exports of the runtime's own
//! functions, renamed where the bare name would not say what it is about.
//!
//! `println!` is part of this API: a `#[macro_export]` macro lives at the
//! crate root, and it is re-exported here so that workloads import it from
//! this module like everything else. It prints one line on the serial
//! console (an exit per byte: keep lines short).

pub use crate::arch::apic::id as apic_id;
pub use crate::arch::nub::triple_fault;
pub use crate::drivers::console::{uart_read, uart_write};
pub use crate::drivers::control::{exit, inject_msi, send as send_control};
pub use crate::drivers::virtio_blk::VirtioBlk;
pub use crate::kernel::apf::{report as report_apf, reset_parked_time as reset_apf_parked_time};
pub use crate::kernel::boost::{
    critical_begin, critical_end, report as report_boost, status_bits as boost_status,
};
pub use crate::kernel::clock::{deadline_after_us, now, ticks_for_us, ticks_per_sec, ticks_to_ns};
pub use crate::kernel::event::Event;
pub use crate::kernel::haltpoll::{
    report as report_haltpoll, report_windows as report_haltpoll_windows,
};
pub use crate::kernel::irq::{count as irq_count, wait as wait_irq};
pub use crate::kernel::report::Reports;
pub use crate::kernel::sched::{
    join, runs as task_runs, set_realtime, spawn, yield_now, Placement,
};
pub use crate::kernel::sync::SpinLock;
pub use crate::kernel::timer::{report as report_timer, sleep_until};
pub use crate::println;

/// The index of the vCPU the calling task runs on (a task never leaves its
/// home vCPU).
#[inline]
pub fn cpu_index() -> usize {
    crate::arch::percpu::this_cpu().index()
}

/// Guest memory for workloads' buffers: contiguous, identity-mapped,
/// never freed.
pub mod frames {
    pub use crate::kernel::frames::{alloc, free_bytes, largest_free};
}

/// Hover's paravirtual I/O device: one ring, one request in flight.
pub mod pvio {
    pub use crate::drivers::pvio::{setup, setup_ok, write_sync};
}

/// Routing a legacy interrupt line (GSI) through the IOAPIC to a device
/// vector on one vCPU.
pub mod ioapic {
    pub use crate::arch::ioapic::{mask, route};
}
