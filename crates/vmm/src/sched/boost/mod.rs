//! Dynamic vCPU priority boosting (seed 2), the host half.
//!
//! The host schedules vCPU threads without knowing what they run. Here the
//! guest tells it, through one [`hover_abi::boost::BoostArea`] per vCPU
//! (docs/ABI.md), and the [`Booster`] raises the vCPU's thread
//! ([`BoostPolicy`](crate::config::BoostPolicy)) when:
//! - the guest's request bits are set: seen on each of the vCPU's exits
//!   ([`Booster::on_exit`]) and by the monitor thread (`monitor.rs`), which
//!   reads every area each `--boost-poll-us`; a vCPU waiting behind host
//!   threads makes no exits, so the monitor is what reaches it;
//! - the VMM injects an interrupt it raised ([`Booster::on_interrupt`]:
//!   MSIs, I/O completions, virtio devices' interrupts and the serial line
//!   to the vCPU the IOAPIC routes them to), as the seed's KVM boosts on
//!   injection; for a vCPU with no area (a Linux guest) too, a host-side
//!   boost the host ends (`host.rs`);
//! - a real-time task's announced wake-up (`wake_at`) is near: the LAPIC
//!   timer is injected by KVM, out of this process's sight, so the guest
//!   says when it is due and the monitor boosts [`TIMER_LEAD`] before.
//!
//! Unboosting is guest-driven ([`Booster::unboost_call`]), so host threads
//! compete fairly as soon as the guest's sensitive work ends; where this
//! host offers to keep a boost across a short gap (`--boost-keep-us`) the
//! guest's unboost is a write to its area the monitor settles
//! (`Booster::quiet_unboost`), not a call. The guest is not trusted: a
//! boost whose thread has run more than `max_ms` of CPU time since it was
//! granted, or a vCPU boosted more than `max_rate` times in a second, is
//! revoked, and no boost is granted during
//! the cool-down (the guest sees [`status::THROTTLED`]). A boosted vCPU that
//! halts holds nothing of the host, so the limit counts CPU time, not wall
//! time. Pausing or ending the VM unboosts every thread.
//!
//! `--vcpu-rt` is the static baseline: every vCPU thread boosted for as
//! long as it runs guest code, whatever the guest does.
//!
//! Files: `area.rs` the shared areas (registration, their fields),
//! `unboost.rs` how a boost ends (the guest's call or quiet write, kept
//! across a gap, the throttle), `host.rs` how a host-side boost ends, `tuning.rs` this host's tuning (when
//! boosts are granted and kept), `decide.rs` those decisions as pure
//! functions, `monitor.rs` the monitor thread, `policy.rs` what a boost
//! does to a thread, `report.rs` the figures (the settings are
//! `config::boost`).

mod area;
pub mod decide;
mod host;
mod monitor;
pub mod policy;
mod report;
mod tuning;
mod unboost;

use crate::config::boost::{BoostConfig, BoostMode, BoostTuning, BoostWhen};
use crate::sync::Locked;
pub use report::{BoostReport, VcpuBoostStats};
pub use tuning::UpdateError;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hover_abi::boost::{offset, status};

use crate::memory::host_writes::GuestWriter;
use policy::SchedParams;

/// How long before an announced real-time wake-up the monitor boosts.
pub const TIMER_LEAD: Duration = Duration::from_micros(100);
/// How long past its announced wake-up a kept boost may wait for the
/// guest's next unboost call before the monitor ends it; and how much CPU
/// time its thread must have had since the keep ([`decide::kept_boost_ends`]).
pub const KEPT_GRACE: Duration = Duration::from_millis(1);
/// Area value meaning "none registered".
const NO_AREA: u64 = u64::MAX;

/// Why a boost was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The guest's request bits.
    Request,
    /// The monitor injected an interrupt.
    Interrupt,
    /// A real-time wake-up the guest announced is due.
    Timer,
}

#[derive(Default)]
struct SlotState {
    tid: Option<i32>,
    original: Option<SchedParams>,
    /// When the boost began, and the thread's CPU time then.
    since: Option<(Instant, u64)>,
    throttled_until: Option<Instant>,
    /// Start of the current one-second rate window, and boosts in it.
    window: Option<(Instant, u32)>,
    stats: VcpuBoostStats,
    warned_bits: bool,
    /// A kept boost's end, which the monitor enforces: see [`Kept`].
    kept: Option<Kept>,
    /// The area's quiet-unboost count as this boost began (or as the last
    /// one was settled): only a count that moved during the boost ends it,
    /// never one from an earlier boost or from before the monitor looked.
    quiet_seen: u64,
    /// This boost is the host's to end (`host.rs`): it was granted with
    /// an interrupt to a vCPU that has no area, so no guest will unboost.
    host_ended: bool,
}

/// A kept boost's end: the monitor unboosts a boost still kept past it
/// with no request set (a wake-up announced and then never taken), but
/// not one the host kept from its CPU ([`decide::kept_boost_ends`]).
#[derive(Clone, Copy, Debug)]
struct Kept {
    /// The announced wake-up (or the keep, for one already past) and
    /// [`KEPT_GRACE`], TSC.
    until: u64,
    /// The thread's CPU time at the keep, ns.
    cpu0: u64,
}

struct Slot {
    /// The registered area's gpa, or [`NO_AREA`].
    area: AtomicU64,
    /// Mirrors `state.since.is_some()`, for the lock-free fast paths.
    boosted: AtomicBool,
    /// The thread has lately waited for a CPU (the monitor's reading of
    /// its schedstat; `--boost-when contended`).
    contended: AtomicBool,
    state: Mutex<SlotState>,
}

/// The host half of boosting for one VM; shared by its vCPU threads, the
/// control device, the interrupt sources and the monitor thread.
pub struct Booster {
    /// The settings; changed live by [`Booster::set`].
    config: Mutex<BoostConfig>,
    /// This host's tuning; changed live by [`Booster::set_tuning`].
    tuning: Mutex<BoostTuning>,
    /// The vCPUs' areas, written with every write recorded for migration.
    guest: GuestWriter,
    /// The guest's TSC rate (set again when a saved state arrives).
    tsc_khz: AtomicU64,
    slots: Vec<Slot>,
    paused: AtomicBool,
    warned_os: AtomicBool,
    monitor: Mutex<Option<monitor::Monitor>>,
    nudge: std::sync::OnceLock<monitor::Nudge>,
    /// Runs once between an unboost's unlock and its system call (tests).
    #[cfg(test)]
    before_restore: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Booster {
    /// A booster for `vcpus` vCPUs whose areas live in `guest`'s memory
    /// (TSC at `tsc_khz`).
    pub fn new(
        config: BoostConfig,
        tuning: BoostTuning,
        guest: GuestWriter,
        vcpus: usize,
        tsc_khz: u64,
    ) -> Arc<Booster> {
        Arc::new(Booster {
            config: Mutex::new(config),
            tuning: Mutex::new(tuning),
            guest,
            tsc_khz: AtomicU64::new(tsc_khz.max(1)),
            slots: (0..vcpus)
                .map(|_| Slot {
                    area: AtomicU64::new(NO_AREA),
                    boosted: AtomicBool::new(false),
                    contended: AtomicBool::new(false),
                    state: Mutex::default(),
                })
                .collect(),
            paused: AtomicBool::new(false),
            warned_os: AtomicBool::new(false),
            monitor: Mutex::new(None),
            nudge: std::sync::OnceLock::new(),
            #[cfg(test)]
            before_restore: Mutex::new(None),
        })
    }

    /// The settings now.
    pub fn config(&self) -> BoostConfig {
        *self.config.locked()
    }

    fn mode(&self) -> BoostMode {
        self.config().mode
    }

    /// Change the settings while the VM runs (`PUT /vm/boost`): every
    /// thread is unboosted, then the new mode takes over (the monitor starts
    /// or stops; `static` boosts every thread). Registrations stay, so a
    /// guest can be switched to dynamic boosting and back.
    pub fn set(self: &Arc<Self>, new: BoostConfig) -> Result<(), UpdateError> {
        new.check().map_err(|reason| UpdateError::Invalid {
            field: "boost",
            reason: reason.to_string(),
        })?;
        self.stop_monitor();
        for v in 0..self.slots.len() {
            self.unboost(v, None);
            let mut s = self.lock(v);
            s.throttled_until = None;
            s.window = None;
        }
        *self.config.locked() = new;
        for v in 0..self.slots.len() {
            self.set_status(v, 0, status::THROTTLED);
        }
        self.start().map_err(UpdateError::Monitor)?;
        if new.mode == BoostMode::Static && !self.paused.load(Ordering::SeqCst) {
            for v in 0..self.slots.len() {
                self.boost(v, Source::Request);
            }
        }
        Ok(())
    }

    fn lock(&self, vcpu: usize) -> MutexGuard<'_, SlotState> {
        self.slots[vcpu].state.locked()
    }

    /// Start the monitor thread (dynamic mode only; idempotent).
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        if self.mode() != BoostMode::Dynamic {
            return Ok(());
        }
        let mut m = self.monitor.locked();
        if m.is_none() {
            let started = monitor::Monitor::start(self.clone())?;
            let _ = self.nudge.set(started.nudge());
            *m = Some(started);
        }
        Ok(())
    }

    fn stop_monitor(&self) {
        let m = self.monitor.locked().take();
        if let Some(m) = m {
            m.stop();
        }
    }

    /// Stop the monitor and unboost every thread (the VM ends).
    pub fn stop(&self) {
        self.stop_monitor();
        self.paused.store(true, Ordering::SeqCst);
        for v in 0..self.slots.len() {
            self.unboost(v, None);
        }
    }

    /// Called by vCPU `vcpu`'s thread when it starts: remembers how the
    /// thread is scheduled, and boosts it for good under `--vcpu-rt`.
    pub fn attach(&self, vcpu: usize) {
        let tid = policy::gettid();
        let original = match policy::read(tid) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(
                    vcpu,
                    "cannot read the vCPU thread's scheduling ({e}); it will not be boosted"
                );
                None
            }
        };
        {
            let mut s = self.lock(vcpu);
            s.tid = Some(tid);
            s.original = original;
        }
        if self.mode() == BoostMode::Static && !self.paused.load(Ordering::SeqCst) {
            self.boost(vcpu, Source::Request);
        }
    }

    /// Called by vCPU `vcpu`'s thread as it ends: never leaves it boosted.
    pub fn detach(&self, vcpu: usize) {
        self.unboost(vcpu, None);
        self.lock(vcpu).tid = None;
    }

    /// The VM pauses: unboost every thread and grant nothing until [`Self::resume`].
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        for v in 0..self.slots.len() {
            self.unboost(v, None);
        }
    }

    /// The VM runs again.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        if self.mode() == BoostMode::Static {
            for v in 0..self.slots.len() {
                self.boost(v, Source::Request);
            }
        }
    }

    /// After each of vCPU `vcpu`'s exits, on its own thread: boost if the
    /// guest asks. Costs one load of guest memory when nothing is to do.
    #[inline]
    pub fn on_exit(&self, vcpu: usize) {
        let Some(gpa) = self.area(vcpu) else { return };
        if !self.slots[vcpu].boosted.load(Ordering::Relaxed)
            && self.requested(vcpu, gpa) != 0
            && self.mode() == BoostMode::Dynamic
            // Refusals for want of contention are counted by the monitor,
            // once a pass, not on every exit.
            && self.worth_boosting(vcpu)
        {
            self.boost(vcpu, Source::Request);
        }
    }

    /// The guest's TSC rate, kHz.
    pub fn tsc_khz(&self) -> u64 {
        self.tsc_khz.load(Ordering::Relaxed)
    }

    /// The guest's TSC runs at `khz` from now on (a restored or arriving
    /// VM's saved rate, which KVM keeps).
    pub fn set_tsc_khz(&self, khz: u64) {
        self.tsc_khz.store(khz.max(1), Ordering::Relaxed);
    }

    /// Number of vCPUs.
    pub fn vcpus(&self) -> usize {
        self.slots.len()
    }

    /// Whether [`Self::on_interrupt`] can boost anything now (dynamic mode,
    /// running, some vCPU not boosted already): lets an interrupt source
    /// skip work such as reading the IOAPIC's routing when it cannot (with
    /// boosts kept across interrupts, at most of them).
    pub fn boosts_interrupts(&self) -> bool {
        self.mode() == BoostMode::Dynamic
            && !self.paused.load(Ordering::SeqCst)
            && (0..self.slots.len()).any(|v| !self.is_boosted(v))
    }

    /// Whether interrupts should be raised where the boost can follow
    /// them (any boosting on): an irqfd on an IOAPIC pin is injected by a
    /// kernel worker on the raising thread's CPU, which waits behind a
    /// real-time vCPU thread there (`devices::irq_line`).
    pub fn active(&self) -> bool {
        self.mode() != BoostMode::Off
    }

    /// The VMM has just injected an interrupt into vCPU `vcpu`: boost it
    /// (dynamic mode). A vCPU whose guest registered an area unboosts
    /// itself; for one without, the boost is the host's to end (`host.rs`).
    ///
    /// Called after the injection, not before: a real-time thread woken
    /// from sleep goes back to the CPU it last ran on, preempting whatever
    /// normal thread runs there (often the other vCPU, the one raising
    /// the interrupt) even when another CPU is idle, while a normal
    /// thread's wake-up takes the idle CPU. Boosted right after, it keeps
    /// that CPU against host threads all the same. Boosting first cost
    /// the serial line a third of its speed on an idle host
    /// (docs/BENCHMARKS.md).
    pub fn on_interrupt(&self, vcpu: usize) {
        if vcpu < self.slots.len()
            && !self.slots[vcpu].boosted.load(Ordering::Relaxed)
            && self.mode() == BoostMode::Dynamic
        {
            self.boost(vcpu, Source::Interrupt);
        }
    }

    /// Boost vCPU `vcpu`'s thread (nothing if it is boosted, throttled,
    /// not started, or the VM is paused).
    ///
    /// The area's status is written under the slot's lock, like every
    /// change of the boost, so that the guest never reads "not boosted"
    /// for a thread that is (it would then never make the unboost call).
    pub fn boost(&self, vcpu: usize, source: Source) {
        let config = self.config();
        if config.mode == BoostMode::Off {
            return;
        }
        let mut s = self.lock(vcpu);
        // Under the lock: pause() unboosts each slot under it after setting
        // the flag, so a boost racing a pause is either refused or undone.
        if self.paused.load(Ordering::SeqCst) || s.since.is_some() {
            return;
        }
        let now = Instant::now();
        let (Some(tid), Some(_)) = (s.tid, s.original) else {
            return;
        };
        if let Some(until) = s.throttled_until {
            if now < until {
                return;
            }
            s.throttled_until = None;
            self.set_status(vcpu, 0, status::THROTTLED);
        }
        let in_window = match s.window {
            Some((start, n)) if now.duration_since(start) < Duration::from_secs(1) => n,
            _ => {
                s.window = Some((now, 0));
                0
            }
        };
        if config.mode == BoostMode::Dynamic && in_window >= config.max_rate {
            self.throttle_locked(s, vcpu, "boosted too often");
            return;
        }
        if config.mode == BoostMode::Dynamic && !self.worth_boosting(vcpu) {
            s.stats.not_contended += 1;
            return;
        }
        if let Err(e) = policy::apply(tid, config.policy) {
            s.stats.errors += 1;
            if !self.warned_os.swap(true, Ordering::Relaxed) {
                tracing::warn!(vcpu, "cannot boost the vCPU thread: {e}");
            }
            return;
        }
        // Unreadable: the CPU-time limit cannot apply to this boost.
        let cpu = policy::thread_cpu_ns(tid).unwrap_or(u64::MAX);
        s.since = Some((now, cpu));
        s.host_ended = config.mode == BoostMode::Dynamic && self.area(vcpu).is_none();
        if let Some(gpa) = self.area(vcpu) {
            s.quiet_seen = self.read_quiet_unboosts(gpa);
        }
        if let Some((_, n)) = s.window.as_mut() {
            *n += 1;
        }
        s.stats.boosts += 1;
        match source {
            Source::Request => s.stats.boosts_request += 1,
            Source::Interrupt => s.stats.boosts_interrupt += 1,
            Source::Timer => s.stats.boosts_timer += 1,
        }
        self.slots[vcpu].boosted.store(true, Ordering::SeqCst);
        // Static boosts are not the guest's to end: it is not told, so it
        // makes no unboost calls.
        if config.mode == BoostMode::Dynamic {
            if let Some(gpa) = self.area(vcpu) {
                self.write_u64(gpa + offset::BOOSTS, s.stats.boosts);
                // Before BOOSTED: the guest reads the offer only while
                // that bit shows. Rewritten at each boost, so a live
                // change of --boost-keep-us reaches the guest.
                let keep_us = u32::try_from(self.tuning().keep_us).unwrap_or(u32::MAX);
                self.write_u32(gpa + offset::KEEP_US, keep_us);
            }
            self.set_status(vcpu, status::BOOSTED, 0);
        }
    }

    /// The figures so far (a boost still held counts up to now).
    pub fn report(&self) -> BoostReport {
        let config = self.config();
        let tuning = self.tuning();
        BoostReport {
            mode: config.mode,
            policy: config.policy.to_string(),
            max_ms: config.max_ms,
            cooldown_ms: config.cooldown_ms,
            max_rate: config.max_rate,
            poll_us: config.poll_us,
            when: tuning.when,
            keep_us: tuning.keep_us,
            irq_us: tuning.irq_us,
            vcpus: (0..self.slots.len())
                .map(|v| {
                    let s = self.lock(v);
                    let mut st = s.stats.clone();
                    if let Some((since, _)) = s.since {
                        st.boosted_us += since.elapsed().as_micros() as u64;
                    }
                    st
                })
                .collect(),
        }
    }

    /// Since when vCPU `vcpu`'s thread is boosted (`None`: it is not).
    pub(super) fn boosted_since(&self, vcpu: usize) -> Option<Instant> {
        self.lock(vcpu).since.map(|(at, _)| at)
    }

    /// Whether vCPU `vcpu`'s thread is boosted now.
    pub fn is_boosted(&self, vcpu: usize) -> bool {
        self.slots
            .get(vcpu)
            .is_some_and(|s| s.boosted.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests;
