//! `kvstore`: a key-value store the guest keeps over `wss` bytes of memory,
//! for live migration. `tasks` tasks (each with its own keys) write random
//! 64-byte records at a target `rate` (operations per second over all tasks;
//! 0: as fast as they can; work more than 10 ms late is dropped, not caught
//! up in a burst), each write first reading the record and checking
//! it holds what was last written there; at the end every record is checked
//! once more. Reports operations per 100 ms (`kvstore.ops.K`, from
//! `kvstore.start_tsc`), so a dip during a migration shows, and
//! `kvstore.errors`: 0 when every read matched what was written.

use core::sync::atomic::{AtomicU64, Ordering};

use hover_abi::exit_code;

use super::{join_all, spawn_all, Context};
use crate::kernel::api::{frames, now, println, ticks_per_sec, yield_now, Placement, Reports};

const RECORD: u64 = 64;
const BUCKETS: usize = 200;
const BUCKET_MS: u64 = 100;

static BASE: AtomicU64 = AtomicU64::new(0);
static KEYS: AtomicU64 = AtomicU64::new(0);
static TASKS: AtomicU64 = AtomicU64::new(1);
static RATE: AtomicU64 = AtomicU64::new(0);
static START: AtomicU64 = AtomicU64::new(0);
static END: AtomicU64 = AtomicU64::new(0);
static OPS: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];
static ERRORS: AtomicU64 = AtomicU64::new(0);
static TOTAL: AtomicU64 = AtomicU64::new(0);

/// A record: key, version, and six words derived from both.
fn word(key: u64, version: u64, i: u64) -> u64 {
    (key ^ (version << 32) ^ (i << 56)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn record(key: u64) -> *mut u64 {
    (BASE.load(Ordering::Relaxed) + key * RECORD) as *mut u64
}

/// Whether `key`'s record is intact (its version is whatever it holds).
fn check(key: u64) -> Option<u64> {
    let r = record(key);
    // SAFETY: the record lies in the array allocated for this workload.
    let (k, v) = unsafe { (r.read_volatile(), r.add(1).read_volatile()) };
    if v == 0 {
        return (k == 0).then_some(0);
    }
    let ok = k == key
        && (0..6).all(|i| {
            // SAFETY: as above.
            unsafe { r.add(2 + i as usize).read_volatile() == word(key, v, i) }
        });
    ok.then_some(v)
}

fn write(key: u64, version: u64) {
    let r = record(key);
    // SAFETY: the record lies in the array; only this task writes its keys.
    unsafe {
        r.write_volatile(key);
        for i in 0..6 {
            r.add(2 + i as usize).write_volatile(word(key, version, i));
        }
        r.add(1).write_volatile(version);
    }
}

fn task(i: usize) {
    let (keys, tasks) = (KEYS.load(Ordering::Relaxed), TASKS.load(Ordering::Relaxed));
    let (start, end) = (START.load(Ordering::Relaxed), END.load(Ordering::Relaxed));
    let mine = keys / tasks;
    let first = i as u64 * mine;
    let rate = RATE.load(Ordering::Relaxed);
    // Each task paces itself to its share of the rate.
    let per_op = (ticks_per_sec() * tasks).checked_div(rate).unwrap_or(0);
    let bucket = ticks_per_sec() * BUCKET_MS / 1000;
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9);
    let (mut ops, mut errors, mut counted, mut n) = (0u64, 0u64, 0u64, 0u64);
    let mut due = start;
    let late = ticks_per_sec() / 100;
    loop {
        let t = now();
        if t >= end {
            break;
        }
        if per_op != 0 && t < due {
            yield_now();
            continue;
        }
        // Work more than `late` behind is dropped, as a real store's
        // clients give up: a slowed task runs at the rate, never in a burst
        // that catches up (which would hide the slowdown and defeat a
        // migration's throttle).
        due = due.max(t.saturating_sub(late)) + per_op;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = first + x % mine;
        match check(key) {
            Some(v) => write(key, v + 1),
            None => {
                errors += 1;
                write(key, 1);
            }
        }
        ops += 1;
        n += 1;
        if n & 0xff == 0 {
            let b = ((now() - start) / bucket).min(BUCKETS as u64 - 1) as usize;
            OPS[b].fetch_add(ops - counted, Ordering::Relaxed);
            counted = ops;
        }
    }
    let b = ((now() - start) / bucket).min(BUCKETS as u64 - 1) as usize;
    OPS[b].fetch_add(ops - counted, Ordering::Relaxed);
    for key in first..first + mine {
        if check(key).is_none() {
            errors += 1;
        }
    }
    ERRORS.fetch_add(errors, Ordering::Relaxed);
    TOTAL.fetch_add(ops, Ordering::Relaxed);
}

pub fn run(ctx: &Context) -> u32 {
    let wss = ctx.number("wss").div_ceil(4096) * 4096;
    let tasks = ctx.number("tasks");
    let Some(base) = frames::alloc(wss, 4096) else {
        println!("kvstore: wss={} does not fit: {} MiB of guest memory are free, the largest contiguous piece is {} MiB", wss, frames::free_bytes() >> 20, frames::largest_free() >> 20);
        return exit_code::WORKLOAD_FAILED;
    };
    BASE.store(base, Ordering::Relaxed);
    KEYS.store(wss / RECORD, Ordering::Relaxed);
    TASKS.store(tasks, Ordering::Relaxed);
    RATE.store(ctx.number("rate"), Ordering::Relaxed);
    let start = now();
    START.store(start, Ordering::Relaxed);
    END.store(
        start + ctx.number("seconds") * ticks_per_sec(),
        Ordering::Relaxed,
    );
    let Some(ids) = spawn_all(tasks as usize, task, |_| Placement::Any) else {
        return exit_code::WORKLOAD_FAILED;
    };
    join_all(&ids[..tasks as usize]);
    let (errors, total) = (
        ERRORS.load(Ordering::Relaxed),
        TOTAL.load(Ordering::Relaxed),
    );
    let mut r = Reports::new();
    r.u64(format_args!("kvstore.ops"), total);
    r.u64(format_args!("kvstore.errors"), errors);
    r.u64(format_args!("kvstore.keys"), wss / RECORD);
    r.u64(format_args!("kvstore.start_tsc"), start);
    r.u64(format_args!("kvstore.bucket_ms"), BUCKET_MS);
    for (k, b) in OPS.iter().enumerate() {
        let v = b.load(Ordering::Relaxed);
        if v > 0 {
            r.u64(format_args!("kvstore.ops.{k}"), v);
        }
    }
    r.send();
    println!(
        "kvstore: {} operations on {} keys, {} errors",
        total,
        wss / RECORD,
        errors
    );
    if errors == 0 {
        exit_code::OK
    } else {
        exit_code::WORKLOAD_FAILED
    }
}
