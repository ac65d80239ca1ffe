//! Halt polling (seed 5): per-VM control through `KVM_CAP_HALT_POLL`, and a
//! governor that picks the poll window from measured wake-ups; a running
//! VM's setting, changed live, is [`HaltPollControl`] (`control.rs`).
//!
//! When a vCPU halts, KVM can spin ("poll") for a while before putting the
//! vCPU thread to sleep; a wake-up that arrives within the window is caught
//! cheaply, one that arrives later costs a sleep and a wake-up of the host
//! thread, and the polling was wasted CPU. `KVM_CAP_HALT_POLL` sets the
//! VM's maximum window; KVM's own per-vCPU algorithm grows the window
//! (doubling) after a wake-up just missed and shrinks it after long waits,
//! within that maximum, knowing nothing of how wake-ups are distributed or
//! what polling costs.
//!
//! The governor instead reads every vCPU's KVM histograms each period
//! (`halt_poll_success_hist`, `halt_poll_fail_hist`, `halt_wait_hist`),
//! rebuilds the distribution of wake-up times over the last second
//! ([`model`], which accounts for KVM's per-vCPU windows being smaller than
//! the VM's), and sets the window that catches the most wake-ups while the
//! time spent in polls that fail stays within a CPU budget per vCPU
//! (default 2.5%, the host load the seed measured per idle vCPU). A guest
//! that polls before it halts (`idle=haltpoll`, [`super::guest_poll`])
//! takes its failed polls out of the same budget: KVM only sees the halts
//! the guest's poll did not cover, and gets what budget is left.

mod control;
mod governor;
pub mod model;
pub use control::{GovernorSource, HaltPollControl, HaltPollError};
pub use governor::{Governor, GovernorReport};
pub use model::{add_period, choose_window, WakeHist};
use std::time::Duration;

use kvm_bindings::{
    kvm_enable_cap, KVM_CAP_HALT_POLL, KVM_CAP_X86_DISABLE_EXITS, KVM_X86_DISABLE_EXITS_HLT,
};
use kvm_ioctls::VmFd;

use crate::config::halt_poll::MAX_WINDOW_NS;
/// How often the governor looks.
pub const PERIOD: Duration = Duration::from_millis(100);
/// How much history the governor weighs (periods).
const HISTORY: usize = 10;

/// Whether this KVM lets a VM set its own halt-poll window.
pub fn supported(vm: &VmFd) -> bool {
    vm.check_extension_raw(KVM_CAP_HALT_POLL as libc::c_ulong) > 0
}

/// KVM's module-wide default window (`halt_poll_ns`), what a VM polls for
/// when it sets no window of its own.
pub fn kvm_default_window() -> std::io::Result<u64> {
    let s = std::fs::read_to_string("/sys/module/kvm/parameters/halt_poll_ns")?;
    s.trim()
        .parse()
        .map_err(|e| std::io::Error::other(format!("halt_poll_ns {s:?}: {e}")))
}

/// Set the VM's maximum halt-poll window.
pub fn set_window(vm: &VmFd, ns: u64) -> Result<(), kvm_ioctls::Error> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_HALT_POLL,
        ..Default::default()
    };
    cap.args[0] = ns;
    vm.enable_cap(&cap)
}

/// Let guest HLT run without exiting to KVM (the vCPU thread never sleeps:
/// the upper bound on wake-up latency, at the cost of a host CPU per vCPU).
pub fn disable_hlt_exits(vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_X86_DISABLE_EXITS,
        ..Default::default()
    };
    cap.args[0] = KVM_X86_DISABLE_EXITS_HLT as u64;
    vm.enable_cap(&cap)
}
