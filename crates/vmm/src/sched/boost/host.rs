//! Host-side boosts: the seed's "the host can proactively boost the vcpu
//! threads when ... injecting interrupts", for a guest that shares no boost
//! area (a Linux guest, or the built-in guest before it registers). Such a
//! guest never unboosts, so the host ends the boost itself: the monitor
//! looks at the thread each pass and ends the boost once the thread sleeps
//! (the vCPU halted: the interrupt's work is done) or has run
//! `--boost-irq-us` of CPU time since the boost (a guest that computes on
//! gets back to its fair share). Neither is the guest's fault, so neither
//! throttles; the rate limit (`--boost-max-rate`) still applies, as to
//! every boost.

use super::decide::{self, HostEnd};
use super::{policy, Booster};

impl Booster {
    /// The monitor's look at vCPU `vcpu`'s boost, its thread seen in
    /// scheduler state `state` (`None`: unreadable): a host-side boost ends
    /// as [`decide::host_boost_ends`] says; any other boost is left alone.
    pub(super) fn settle_host_boost(&self, vcpu: usize, state: Option<char>) {
        let s = self.lock(vcpu);
        let (Some((_, cpu0)), true) = (s.since, s.host_ended) else {
            return;
        };
        let ran_ns = s
            .tid
            .and_then(|tid| policy::thread_cpu_ns(tid).ok())
            .filter(|_| cpu0 != u64::MAX)
            .map(|cpu| cpu.saturating_sub(cpu0));
        let budget_ns = self.tuning().irq_us.saturating_mul(1000);
        let Some(end) = decide::host_boost_ends(state, ran_ns, budget_ns) else {
            return;
        };
        let mut s = s;
        match end {
            HostEnd::Halted => s.stats.host_ended_halted += 1,
            HostEnd::Budget | HostEnd::Unwatched => s.stats.host_ended_budget += 1,
        }
        self.unboost_locked(s, vcpu, None);
    }
}
