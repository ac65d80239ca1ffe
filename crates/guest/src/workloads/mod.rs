//! Workloads, selected by `workload=NAME` on the command line. The table of
//! names, parameters, ranges and defaults lives in `hover_abi::workload`,
//! shared with the monitor.
//!
//! vCPU 0 spawns the workload's main task, which may spawn more tasks; its
//! return value is the VM's exit code.

mod audio;
mod bm;
mod critical;
mod ctxsw;
mod evict_report;
mod exception;
mod hello;
mod iolat;
mod irq;
mod kvstore;
mod memtouch;
mod nubcall;
mod pingpong;
mod spin;
mod timer;
mod triple_fault;
mod uart;

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hover_abi::boot::BootInfo;
use hover_abi::exit_code;
use hover_abi::workload::{self, WorkloadError, WorkloadSpec};

use crate::kernel::api::{
    exit, join, println, report_apf, report_boost, report_haltpoll, report_timer, spawn,
    ticks_to_ns, Placement, Reports,
};

/// What a workload gets.
pub struct Context {
    /// The boot-info page.
    pub boot: &'static BootInfo,
    /// The command line (already checked against the workload table).
    pub cmdline: &'static str,
    /// This workload's entry in the table.
    pub spec: &'static WorkloadSpec,
    /// TSC at vCPU 0's first instruction.
    pub boot_tsc: u64,
}

impl Context {
    /// A numeric parameter (or its default).
    pub fn number(&self, name: &str) -> u64 {
        self.spec.param(name).number(self.cmdline)
    }

    /// A choice parameter (or its default).
    pub fn choice(&self, name: &str) -> &'static str {
        self.spec.param(name).choice(self.cmdline)
    }

    /// Number of vCPUs.
    pub fn vcpus(&self) -> usize {
        self.boot.vcpu_count as usize
    }
}

static BOOT: AtomicUsize = AtomicUsize::new(0);
static CMDLINE: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));
static BOOT_TSC: AtomicU64 = AtomicU64::new(0);

/// Check the command line and spawn the main task (vCPU 0, at boot).
pub fn start(boot: &'static BootInfo, cmdline: &'static str, boot_tsc: u64) {
    let code = match workload::resolve(cmdline) {
        Ok(_) => {
            BOOT.store(boot as *const BootInfo as usize, Ordering::Relaxed);
            CMDLINE
                .0
                .store(cmdline.as_ptr() as usize, Ordering::Relaxed);
            CMDLINE.1.store(cmdline.len(), Ordering::Relaxed);
            BOOT_TSC.store(boot_tsc, Ordering::Relaxed);
            match spawn(main_task, 0, Placement::Pinned(0)) {
                Ok(_) => return,
                Err(e) => {
                    println!("guest: cannot start the workload: {}", e);
                    exit_code::WORKLOAD_FAILED
                }
            }
        }
        Err(WorkloadError::Syntax(err)) => {
            println!("guest: bad command line: {:?}", err);
            exit_code::BAD_CMDLINE
        }
        Err(WorkloadError::UnknownWorkload(name)) => {
            println!("guest: unknown workload '{}'", name);
            exit_code::UNKNOWN_WORKLOAD
        }
        Err(WorkloadError::UnknownParam { workload, key }) => {
            println!("guest: workload {} takes no parameter '{}'", workload, key);
            exit_code::BAD_CMDLINE
        }
        Err(WorkloadError::BadValue { param, value }) => {
            println!("guest: bad value '{}' for {}", value, param.name);
            exit_code::BAD_CMDLINE
        }
    };
    exit(code)
}

fn main_task(_: usize) {
    // SAFETY: start() stored a reference to the boot-info page and a slice of
    // it (the command line), which live for the whole run.
    let boot: &'static BootInfo = unsafe { &*(BOOT.load(Ordering::Relaxed) as *const BootInfo) };
    let cmdline = unsafe {
        let bytes = core::slice::from_raw_parts(
            CMDLINE.0.load(Ordering::Relaxed) as *const u8,
            CMDLINE.1.load(Ordering::Relaxed),
        );
        core::str::from_utf8_unchecked(bytes)
    };
    let spec = workload::resolve(cmdline).expect("checked in start()");
    let ctx = Context {
        boot,
        cmdline,
        spec,
        boot_tsc: BOOT_TSC.load(Ordering::Relaxed),
    };
    let code = match spec.name {
        "hello" => hello::run(&ctx),
        "bm" => bm::run(&ctx),
        "spin" => spin::run(&ctx),
        "memtouch" => memtouch::run(&ctx),
        "kvstore" => kvstore::run(&ctx),
        "timer" => timer::run(&ctx),
        "audio" => audio::run(&ctx),
        "critical" => critical::run(&ctx),
        "ctxsw" => ctxsw::run(&ctx),
        "nubcall" => nubcall::run(&ctx),
        "irq" => irq::run(&ctx),
        "uart" => uart::run(&ctx),
        "iolat" => iolat::run(&ctx),
        "pingpong" => pingpong::run(&ctx),
        "evict-report" => evict_report::run(&ctx),
        "exception" => exception::run(&ctx),
        "panic" => panic!("the panic test workload panics on purpose"),
        "triple-fault" => triple_fault::run(&ctx),
        other => {
            println!(
                "guest: workload '{}' is in the ABI table but not in this guest",
                other
            );
            exit_code::UNKNOWN_WORKLOAD
        }
    };
    // Every run ends with the runtime's own reports: the TSC at vCPU 0's first
    // instruction (lets the monitor time the boot) and the async-PF counters.
    let mut r = Reports::new();
    r.u64(format_args!("boot_tsc"), ctx.boot_tsc);
    report_apf(&mut r, ctx.vcpus());
    report_timer(&mut r, ctx.vcpus());
    report_boost(&mut r, ctx.vcpus());
    report_haltpoll(&mut r, ctx.vcpus());
    r.send();
    exit(code)
}

/// Spawn `entry(i)` for `i` in `0..n` with `placement`; on failure print why
/// and return `None` (the workload then fails).
pub fn spawn_all(
    n: usize,
    entry: fn(usize),
    placement: impl Fn(usize) -> Placement,
) -> Option<[usize; 64]> {
    let mut ids = [0usize; 64];
    for (i, id) in ids.iter_mut().enumerate().take(n) {
        match spawn(entry, i, placement(i)) {
            Ok(t) => *id = t,
            Err(e) => {
                println!("guest: cannot spawn task {}: {}", i, e);
                return None;
            }
        }
    }
    Some(ids)
}

/// Spinning tasks that stand for the rest of a busy guest (`background=N`).
pub struct Background {
    ids: [usize; 64],
    n: usize,
}

static BACKGROUND_STOP: AtomicUsize = AtomicUsize::new(0);

fn background_task(_: usize) {
    while BACKGROUND_STOP.load(Ordering::Relaxed) == 0 {
        core::hint::spin_loop();
    }
}

impl Background {
    /// Start `n` spinners on the least loaded vCPUs (`None`: could not).
    pub fn start(n: usize) -> Option<Background> {
        BACKGROUND_STOP.store(0, Ordering::Relaxed);
        let ids = spawn_all(n, background_task, |_| Placement::Any)?;
        Some(Background { ids, n })
    }

    /// Stop them and wait until they have ended.
    pub fn stop(self) {
        BACKGROUND_STOP.store(1, Ordering::Relaxed);
        join_all(&self.ids[..self.n]);
    }
}

/// Wait for every task in `ids` to finish.
pub fn join_all(ids: &[usize]) {
    for &id in ids {
        join(id);
    }
}

/// Latency statistics in TSC ticks, with a log2 histogram in microseconds.
pub struct Latency {
    /// Samples.
    pub n: u64,
    min: u64,
    max: u64,
    sum: u64,
    /// Bucket 0: under 1 us; bucket k: [2^(k-1), 2^k) us; the last: 2^14 us and more.
    hist: [u64; 16],
}

impl Latency {
    /// No samples yet.
    pub const fn new() -> Self {
        Latency {
            n: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
            hist: [0; 16],
        }
    }

    /// Add a sample of `ticks`.
    pub fn add(&mut self, ticks: u64) {
        self.n += 1;
        self.min = self.min.min(ticks);
        self.max = self.max.max(ticks);
        self.sum += ticks;
        let us = ticks_to_ns(ticks) / 1000;
        let bucket = if us == 0 {
            0
        } else {
            (64 - us.leading_zeros() as usize).min(15)
        };
        self.hist[bucket] += 1;
    }

    /// Add `prefix.samples`, `.min_ns`, `.avg_ns`, `.max_ns` and, with
    /// `hist`, `.hist.lt_Nus` / `.hist.ge_16384us` to `r`.
    pub fn report(&self, r: &mut Reports, prefix: &str, hist: bool) {
        r.u64(format_args!("{prefix}.samples"), self.n);
        if self.n == 0 {
            return;
        }
        r.u64(format_args!("{prefix}.min_ns"), ticks_to_ns(self.min));
        r.u64(
            format_args!("{prefix}.avg_ns"),
            ticks_to_ns(self.sum / self.n),
        );
        r.u64(format_args!("{prefix}.max_ns"), ticks_to_ns(self.max));
        if hist {
            for (k, &count) in self.hist.iter().enumerate() {
                if k == 15 {
                    r.u64(format_args!("{prefix}.hist.ge_16384us"), count);
                } else {
                    r.u64(format_args!("{prefix}.hist.lt_{}us", 1u64 << k), count);
                }
            }
        }
    }

    /// Mean in nanoseconds.
    pub fn avg_ns(&self) -> u64 {
        self.sum.checked_div(self.n).map_or(0, ticks_to_ns)
    }
}
