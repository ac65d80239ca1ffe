//! How a run ended: the outcome `hover run` and `hover restore` print.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::config::BoostMode;
use crate::devices::pvio::PvioStats;
use crate::memory::paged::PagerStats;
use crate::memory::GuestRam;
use crate::report::{self, ReportEntry};
use crate::sched::halt_poll::GovernorReport;
use crate::vm::Vm;

/// Boot timings, in microseconds from the start of [`super::Vm::new`] (or
/// of [`super::Vm::restore`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct BootTimings {
    /// Until the VM was built and its vCPUs were about to start.
    pub setup_us: u64,
    /// Until the guest's first instruction, from the guest's own TSC reading
    /// (the `boot_tsc` report); `None` if the guest did not report it, or
    /// for a restored VM (its guest booted in another process).
    pub first_instruction_us: Option<u64>,
    /// Until the first byte on the serial console (in this process).
    pub first_console_byte_us: Option<u64>,
    /// Until the run ended.
    pub exit_us: u64,
}

/// Memory use at exit.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryUsage {
    /// Guest RAM configured, bytes.
    pub guest_memory: u64,
    /// Guest RAM resident (touched by guest or monitor), bytes.
    pub guest_resident: u64,
    /// Resident memory of the whole process, bytes.
    pub process_resident: u64,
    /// Process resident memory beyond resident guest RAM: the monitor's own cost.
    pub vmm_overhead: u64,
    /// The same in proportional set size: pages shared with other
    /// processes (the binary and libc, when several VMs run) count in
    /// part, bytes (0 where /proc/self/smaps_rollup is missing).
    pub vmm_pss: u64,
    /// The monitor's memory no other process shares (heap, stacks,
    /// written data), bytes (0 where smaps_rollup is missing).
    pub vmm_private: u64,
}

/// Why the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The guest powered off.
    PowerOff,
    /// The guest reset the machine (Linux's `reboot`): Hover ends the VM,
    /// as Firecracker does; whoever runs it starts it again.
    Reboot,
    /// The API asked the VM to shut down.
    Shutdown,
    /// The VMM was sent SIGTERM or SIGINT (the exit code is 128 + its number).
    Signal,
    /// A snapshot was taken with `stop`: the VM lives on in the file.
    Snapshot,
    /// The VM migrated: the guest runs at the destination.
    Migrated,
}

/// How a restored VM came back.
#[derive(Clone, Debug, Serialize)]
pub struct RestoreReport {
    /// The snapshot file.
    pub snapshot: String,
    /// `eager` or `lazy`.
    pub memory_restore: &'static str,
    /// Microseconds from the start of the restore until the vCPUs ran.
    pub to_running_us: u64,
    /// The host TSC when the vCPUs started (the guest's TSC too: this
    /// host's TSC cannot be offset), to place guest timestamps.
    pub running_tsc: u64,
    /// Guest memory pages read from the snapshot before the vCPUs ran.
    pub pages_loaded: u64,
}

/// How a run ended, when it ended cleanly (power-off, shutdown, snapshot).
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    /// Why the run ended.
    pub ended: EndReason,
    /// The guest's exit code (0 unless the guest powered off).
    pub exit_code: u32,
    /// The vCPU that asked to power off.
    pub exit_vcpu: Option<usize>,
    /// Everything the guest reported, in order (on a restored VM, what it
    /// reported before the snapshot too).
    pub reports: Vec<ReportEntry>,
    /// Boot timings.
    pub timings: BootTimings,
    /// For a restored VM: how it came back.
    pub restore: Option<RestoreReport>,
    /// Memory use.
    pub memory: MemoryUsage,
    /// Bytes the guest wrote to its console (in this process).
    pub console_bytes: u64,
    /// KVM's statistics of each vCPU at exit (single-valued ones; empty if
    /// this KVM has no binary stats).
    pub vcpu_stats: Vec<BTreeMap<String, u64>>,
    /// KVM's statistics of the VM at exit.
    pub vm_stats: BTreeMap<String, u64>,
    /// KVM's histograms of each vCPU at exit (bucket counts; log histograms:
    /// bucket 0 holds 0, bucket i values in [2^(i-1), 2^i)).
    pub vcpu_histograms: Vec<BTreeMap<String, Vec<u64>>>,
    /// What the pager did (with --memory-budget, or a lazy restore).
    pub pager: Option<PagerStats>,
    /// What the balloon held and dropped (with --balloon).
    pub balloon: Option<crate::devices::virtio::balloon::BalloonReport>,
    /// What the halt-poll governor did (with --halt-poll auto).
    pub halt_poll: Option<GovernorReport>,
    /// The guest's own halt polling (when the monitor offered it).
    pub guest_halt_poll: Option<crate::sched::guest_poll::GuestPoll>,
    /// What vCPU priority boosting did (with --boost on or --vcpu-rt).
    pub boost: Option<crate::sched::boost::BoostReport>,
    /// Host CPU time each vCPU thread used, microseconds.
    pub vcpu_cpu_us: Vec<u64>,
    /// What the paravirtual I/O device did, if the guest used it.
    pub io: Option<PvioStats>,
    /// On a post-copy destination: how its memory arrived.
    pub postcopy: Option<crate::migration::postcopy::PostcopyReport>,
}

/// Memory use now.
pub fn memory_usage(ram: &GuestRam) -> MemoryUsage {
    let guest_resident = ram.resident_bytes().unwrap_or(0);
    let process_resident = process_resident_bytes().unwrap_or(0);
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let field = |name: &str| smaps_field(&rollup, name);
    let private = field("Private_Clean:") + field("Private_Dirty:");
    MemoryUsage {
        guest_memory: ram.size(),
        guest_resident,
        process_resident,
        vmm_overhead: process_resident.saturating_sub(guest_resident),
        vmm_pss: field("Pss:").saturating_sub(guest_resident),
        vmm_private: private.saturating_sub(guest_resident),
    }
}

/// The bytes of field `name` (e.g. `Pss:`) in smaps text (0 if absent).
fn smaps_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb << 10)
}

/// Microseconds from `since` to `t`.
pub fn us_since(since: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(since).as_micros() as u64
}

fn process_resident_bytes() -> std::io::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("unexpected /proc/self/statm format"))?;
    // SAFETY: sysconf has no side effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Ok(pages * page)
}

/// The outcome of a run of `vm` that ended with `ended`/`code` (from
/// `vcpu`); `governor` is the halt-poll governor's last report.
#[allow(clippy::too_many_arguments)]
pub(super) fn collect(
    vm: &Vm,
    governor: Option<GovernorReport>,
    ended: EndReason,
    code: u32,
    vcpu: Option<usize>,
    tsc_ref: Option<(Instant, u64)>,
    started: Instant,
    exited: Instant,
    vcpu_cpu_us: Vec<u64>,
) -> RunOutcome {
    let us = |t: Instant| us_since(vm.hosting.created_at, t);
    let reports = vm.devices.bus.control.reports();
    let first_instruction_us = tsc_ref.and_then(|(at, tsc0)| {
        report::find(&reports, "boot_tsc")
            .and_then(|r| r.value.as_u64())
            .and_then(|tsc| tsc.checked_sub(tsc0))
            .map(|ticks| us(at) + ticks * 1000 / vm.tsc_khz.max(1) as u64)
    });
    let (vcpu_stats, vcpu_histograms) = crate::stats::read_vcpus(&vm.kvm_stats.vcpus);
    RunOutcome {
        ended,
        exit_code: code,
        exit_vcpu: vcpu,
        reports,
        timings: BootTimings {
            setup_us: us(started),
            first_instruction_us,
            first_console_byte_us: vm.devices.bus.serial.first_byte_at().map(us),
            exit_us: us(exited),
        },
        restore: vm.arrival.restored.clone(),
        memory: memory_usage(&vm.ram),
        console_bytes: vm.devices.bus.serial.bytes_written(),
        vcpu_stats,
        vcpu_histograms,
        pager: vm.pager_stats(),
        balloon: vm.devices.balloon_report(),
        halt_poll: governor,
        guest_halt_poll: vm.guest_poll_areas().and_then(|mem| {
            let g = crate::sched::guest_poll::read(&mem, vm.config().vcpus, &Default::default());
            (g.max_ns > 0).then_some(g)
        }),
        boost: {
            let r = vm.booster.report();
            (r.mode != BoostMode::Off || r.vcpus.iter().any(|v| v.boosts > 0)).then_some(r)
        },
        vcpu_cpu_us,
        io: vm.devices.pvio.stats(),
        postcopy: None,
        vm_stats: crate::stats::read_vm(vm.kvm_stats.vm.as_ref()),
    }
}

#[cfg(test)]
mod tests {
    use super::smaps_field;

    #[test]
    fn smaps_fields_are_read_in_bytes() {
        let text = "Rss:  7252 kB\nPss:  6279 kB\nPss_Dirty:  5448 kB\nPrivate_Dirty: 10 kB\n";
        assert_eq!(smaps_field(text, "Pss:"), 6279 << 10);
        assert_eq!(smaps_field(text, "Private_Dirty:"), 10 << 10);
        assert_eq!(smaps_field(text, "Private_Clean:"), 0);
        assert_eq!(smaps_field("", "Pss:"), 0);
    }
}
