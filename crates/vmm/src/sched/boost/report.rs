//! The figures a run with boosting reports.

use serde::Serialize;

use crate::config::boost::BoostMode;

/// One vCPU's boosting figures (outcome, `GET /vm/stats`, metrics).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VcpuBoostStats {
    /// The guest registered a shared area for this vCPU.
    pub registered: bool,
    /// Boosts granted.
    pub boosts: u64,
    /// ... because request bits were set.
    pub boosts_request: u64,
    /// ... because an interrupt was injected.
    pub boosts_interrupt: u64,
    /// ... because an announced real-time wake-up was due.
    pub boosts_timer: u64,
    /// Of those, boosts granted after the wake-up was already due (the
    /// monitor learned of it late).
    pub late_timer_boosts: u64,
    /// Boosts ended by the guest's unboost call.
    pub unboosts: u64,
    /// Unboost calls (and quiet unboosts) that kept the boost: the next
    /// real-time wake-up was due within `--boost-keep-us`.
    pub kept: u64,
    /// Quiet unboosts the monitor found: the guest ended its boost with a
    /// write to its area instead of the call (no exit), its next wake-up
    /// being due within `--boost-keep-us`; each then kept or ended as a
    /// call would be, counted in `kept`, `budget_unboosts` or `unboosts`
    /// (neither if a request bit was set again by then: the boost goes on).
    pub quiet_unboosts: u64,
    /// Unboost calls that would have kept the boost but for its CPU
    /// budget (the gap could take it past half of `--boost-max-ms`).
    pub budget_unboosts: u64,
    /// Monitor passes that found a request and granted no boost because
    /// the thread had not waited for a CPU lately (`--boost-when
    /// contended`).
    pub not_contended: u64,
    /// Host-side boosts (an interrupt for a vCPU with no boost area) the
    /// monitor ended as the vCPU halted.
    pub host_ended_halted: u64,
    /// Host-side boosts ended at `--boost-irq-us` of the thread's CPU time.
    pub host_ended_budget: u64,
    /// Boosts revoked by the throttle.
    pub throttles: u64,
    /// Wall time spent boosted, microseconds.
    pub boosted_us: u64,
    /// Boosts the OS refused (no privilege, say).
    pub errors: u64,
}

/// The whole VM's boosting figures, after its settings in the shape
/// `PUT /vm/boost` takes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BoostReport {
    /// `off`, `dynamic` or `static`.
    pub mode: BoostMode,
    /// The policy, as `fifo:PRIO` or `nice:VALUE`.
    pub policy: String,
    /// A boost's CPU time before it is revoked, ms.
    pub max_ms: u64,
    /// No boost for this long after a revocation, ms.
    pub cooldown_ms: u64,
    /// Most boosts per vCPU per second.
    pub max_rate: u32,
    /// The boost monitor's period, us.
    pub poll_us: u64,
    /// When boosts are granted: `always` or `contended`.
    pub when: crate::config::boost::BoostWhen,
    /// Unboost calls keep a boost across gaps up to this long, us (0: never).
    pub keep_us: u64,
    /// A host-side boost lasts at most this much of its thread's CPU time, us.
    pub irq_us: u64,
    /// Per vCPU.
    pub vcpus: Vec<VcpuBoostStats>,
}
