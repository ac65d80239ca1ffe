//! `memtouch`: tasks write a pattern over `size` bytes of guest memory, then
//! read it back and verify it, `rounds` times (round r uses seed + r, so
//! every round rewrites every word). Reports the pages touched, a checksum of
//! what the last round read (the host can recompute it from `memtouch.base`
//! and the seed) and the number of wrong words over all rounds.

use core::sync::atomic::{AtomicU64, Ordering};

use hover_abi::exit_code;

use super::{join_all, spawn_all, Context};
use crate::kernel::api::{frames, println, Placement, Reports};

const PAGE: u64 = 4096;
/// Multiplier that spreads addresses over all 64 bits (the golden ratio).
pub const PATTERN_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

static BASE: AtomicU64 = AtomicU64::new(0);
static CHUNK: AtomicU64 = AtomicU64::new(0);
static SIZE: AtomicU64 = AtomicU64::new(0);
static SEED: AtomicU64 = AtomicU64::new(0);
static ROUNDS: AtomicU64 = AtomicU64::new(1);
static SUMS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static ERRORS: AtomicU64 = AtomicU64::new(0);

fn pattern(addr: u64, seed: u64) -> u64 {
    addr.wrapping_mul(PATTERN_MUL) ^ seed
}

fn toucher(i: usize) {
    let (base, chunk, size, seed) = (
        BASE.load(Ordering::Relaxed),
        CHUNK.load(Ordering::Relaxed),
        SIZE.load(Ordering::Relaxed),
        SEED.load(Ordering::Relaxed),
    );
    let start = base + i as u64 * chunk;
    let end = (start + chunk).min(base + size);
    let words = |f: &mut dyn FnMut(*mut u64)| {
        let mut a = start;
        while a < end {
            f(a as *mut u64);
            a += 8;
        }
    };
    let (mut sum, mut errors) = (0u64, 0u64);
    for round in 0..ROUNDS.load(Ordering::Relaxed) {
        let seed = seed.wrapping_add(round);
        // SAFETY: [base, base + size) was allocated for this workload and is
        // identity-mapped; tasks write disjoint chunks.
        words(&mut |p| unsafe { p.write_volatile(pattern(p as u64, seed)) });
        sum = 0;
        words(&mut |p| {
            // SAFETY: as above.
            let v = unsafe { p.read_volatile() };
            sum = sum.wrapping_add(v);
            errors += u64::from(v != pattern(p as u64, seed));
        });
    }
    SUMS[i].store(sum, Ordering::Relaxed);
    ERRORS.fetch_add(errors, Ordering::Relaxed);
}

pub fn run(ctx: &Context) -> u32 {
    let size = ctx.number("size").div_ceil(PAGE) * PAGE;
    let tasks = ctx.number("tasks") as usize;
    let Some(base) = frames::alloc(size, PAGE) else {
        println!("memtouch: size={} does not fit: {} MiB of guest memory are free, the largest contiguous piece is {} MiB (RAM is split at the 3-4 GiB hole)", size, frames::free_bytes() >> 20, frames::largest_free() >> 20);
        return exit_code::WORKLOAD_FAILED;
    };
    BASE.store(base, Ordering::Relaxed);
    SIZE.store(size, Ordering::Relaxed);
    CHUNK.store(
        (size / PAGE).div_ceil(tasks as u64) * PAGE,
        Ordering::Relaxed,
    );
    SEED.store(ctx.number("seed"), Ordering::Relaxed);
    ROUNDS.store(ctx.number("rounds"), Ordering::Relaxed);
    let Some(ids) = spawn_all(tasks, toucher, |_| Placement::Any) else {
        return exit_code::WORKLOAD_FAILED;
    };
    join_all(&ids[..tasks]);
    let checksum = SUMS[..tasks]
        .iter()
        .fold(0u64, |s, v| s.wrapping_add(v.load(Ordering::Relaxed)));
    let errors = ERRORS.load(Ordering::Relaxed);
    let mut r = Reports::new();
    r.u64(format_args!("memtouch.base"), base);
    r.u64(format_args!("memtouch.bytes"), size);
    r.u64(format_args!("memtouch.pages"), size / PAGE);
    r.u64(format_args!("memtouch.checksum"), checksum);
    r.u64(format_args!("memtouch.errors"), errors);
    r.send();
    println!(
        "memtouch: {} pages at {:#x}, checksum {:#x}, {} wrong words",
        size / PAGE,
        base,
        checksum,
        errors
    );
    if errors == 0 {
        exit_code::OK
    } else {
        exit_code::WORKLOAD_FAILED
    }
}
