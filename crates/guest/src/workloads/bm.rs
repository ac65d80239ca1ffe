//! `bm`: the async page fault seed's benchmark (its bm.c) as guest tasks.
//! `faulting` tasks write random pages of a `memory`-byte array, `working`
//! tasks increment counters, for `seconds`. The array is prefaulted first
//! (every page written once, by the faulting tasks in parallel), as the seed
//! does, so that with a memory budget smaller than the array most random
//! writes touch a page the host has evicted. Reports each worker's count and
//! the total: with async page faults, a vCPU whose faulting task waits for a
//! page runs a working task meanwhile; without, the whole vCPU waits.
//!
//! With `timeline_ms=N`, working tasks also add their progress to buckets
//! of N ms of TSC time from the start (`bm.t.K`, with
//! `bm.timeline.start_tsc` and `bm.timeline.bucket_us`), so the host can see
//! when work was done: e.g. in the first second after a restore.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hover_abi::exit_code;

use super::{join_all, spawn_all, Context};
use crate::kernel::api::{
    frames, now, println, reset_apf_parked_time, sleep_until, ticks_per_sec, ticks_to_ns,
    Placement, Reports,
};

const PAGE: u64 = 4096;

static BASE: AtomicU64 = AtomicU64::new(0);
static PAGES: AtomicU64 = AtomicU64::new(0);
static TASKS: AtomicU64 = AtomicU64::new(1);
static GO: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
static WORK: [AtomicU64; 30] = [const { AtomicU64::new(0) }; 30];
static WRITES: [AtomicU64; 30] = [const { AtomicU64::new(0) }; 30];
/// Buckets of the timeline (one report batch's worth).
const BUCKETS: usize = 200;
static TIMELINE: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];
static GO_TSC: AtomicU64 = AtomicU64::new(0);
static BUCKET_TICKS: AtomicU64 = AtomicU64::new(0);

fn prefault(i: usize) {
    let (base, pages, tasks) = (
        BASE.load(Ordering::Relaxed),
        PAGES.load(Ordering::Relaxed),
        TASKS.load(Ordering::Relaxed),
    );
    let mut p = i as u64;
    while p < pages {
        // SAFETY: inside the array allocated for this workload.
        unsafe { ((base + p * PAGE) as *mut u8).write_volatile(1) };
        p += tasks;
    }
}

fn faulter(i: usize) {
    let (base, pages) = (BASE.load(Ordering::Relaxed), PAGES.load(Ordering::Relaxed));
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
    let mut n = 0u64;
    while !GO.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    while !STOP.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let addr = base + (x % pages) * PAGE + (i as u64 * 64) % PAGE;
        // SAFETY: inside the array allocated for this workload.
        unsafe { (addr as *mut u8).write_volatile(n as u8) };
        n += 1;
    }
    WRITES[i].store(n, Ordering::Relaxed);
}

fn worker(i: usize) {
    while !GO.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
    let mut n = 0u64;
    let bucket = BUCKET_TICKS.load(Ordering::Relaxed);
    if bucket == 0 {
        while !STOP.load(Ordering::Relaxed) {
            n = core::hint::black_box(n + 1);
        }
    } else {
        // Look at the clock every 2^16 iterations: a few ns in ~20 us of work.
        let (go, mut counted) = (GO_TSC.load(Ordering::Relaxed), 0u64);
        let mut record = |n: u64| {
            let b = ((now().saturating_sub(go)) / bucket).min(BUCKETS as u64 - 1);
            TIMELINE[b as usize].fetch_add(n - counted, Ordering::Relaxed);
            counted = n;
        };
        while !STOP.load(Ordering::Relaxed) {
            n = core::hint::black_box(n + 1);
            if n & 0xffff == 0 {
                record(n);
            }
        }
        record(n);
    }
    WORK[i].store(n, Ordering::Relaxed);
}

pub fn run(ctx: &Context) -> u32 {
    let faulting = ctx.number("faulting") as usize;
    let working = ctx.number("working") as usize;
    let memory = ctx.number("memory").div_ceil(PAGE) * PAGE;
    let seconds = ctx.number("seconds");
    let Some(base) = frames::alloc(memory, PAGE) else {
        println!("bm: memory={} does not fit: {} MiB of guest memory are free, the largest contiguous piece is {} MiB (RAM is split at the 3-4 GiB hole)", memory, frames::free_bytes() >> 20, frames::largest_free() >> 20);
        return exit_code::WORKLOAD_FAILED;
    };
    BASE.store(base, Ordering::Relaxed);
    PAGES.store(memory / PAGE, Ordering::Relaxed);
    // Prefault with 4 tasks spread over the vCPUs whatever the mode, so
    // every run (the ideal one included) starts from the same memory and the
    // same per-vCPU history of page faults, and page-ins overlap.
    let prefaulters = 4;
    TASKS.store(prefaulters as u64, Ordering::Relaxed);
    let t0 = now();
    let Some(ids) = spawn_all(prefaulters, prefault, |_| Placement::Any) else {
        return exit_code::WORKLOAD_FAILED;
    };
    join_all(&ids[..prefaulters]);
    println!(
        "bm: prefaulted {} MiB in {} ms; {} faulting and {} working tasks for {} s",
        memory >> 20,
        ticks_to_ns(now() - t0) / 1_000_000,
        faulting,
        working,
        seconds
    );
    let Some(f) = spawn_all(faulting, faulter, |_| Placement::Any) else {
        return exit_code::WORKLOAD_FAILED;
    };
    let Some(w) = spawn_all(working, worker, |_| Placement::Any) else {
        return exit_code::WORKLOAD_FAILED;
    };
    reset_apf_parked_time();
    let timeline_ms = ctx.number("timeline_ms");
    BUCKET_TICKS.store(timeline_ms * ticks_per_sec() / 1000, Ordering::Relaxed);
    GO_TSC.store(now(), Ordering::Relaxed);
    GO.store(true, Ordering::Release);
    sleep_until(now() + seconds * ticks_per_sec());
    STOP.store(true, Ordering::Relaxed);
    join_all(&f[..faulting]);
    join_all(&w[..working]);
    let mut r = Reports::new();
    let mut total = 0u64;
    for (i, c) in WORK[..working].iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        println!("worker {}: {}", i, n);
        r.u64(format_args!("bm.worker.{i}"), n);
        total += n;
    }
    let writes: u64 = WRITES[..faulting]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum();
    println!("total: {}", total);
    r.u64(format_args!("bm.work_total"), total);
    r.u64(format_args!("bm.fault_writes"), writes);
    r.u64(format_args!("bm.seconds"), seconds);
    r.send();
    if timeline_ms > 0 {
        let mut t = Reports::new();
        t.u64(
            format_args!("bm.timeline.start_tsc"),
            GO_TSC.load(Ordering::Relaxed),
        );
        t.u64(format_args!("bm.timeline.bucket_us"), timeline_ms * 1000);
        for (k, b) in TIMELINE.iter().enumerate() {
            let v = b.load(Ordering::Relaxed);
            if v > 0 {
                t.u64(format_args!("bm.t.{k}"), v);
            }
        }
        t.send();
    }
    exit_code::OK
}
