//! `iolat`: the halt-polling seed's workload. A task issues synchronous,
//! unmergeable writes of `size` bytes at queue depth 1 through the
//! paravirtual I/O device for `seconds`: it sleeps while each write is in
//! flight (its vCPU halts), and the completion interrupt wakes it. Reports
//! IOPS and latency (avg, p50, p99). Write `k` goes to slot `k % 64` of the
//! file and holds bytes `(k + i) mod 251`, so the file can be checked.
//! Without Hover's device (another VMM) it uses a virtio block device when
//! the command line names one (`drivers/virtio_blk.rs`), the same way.

use core::sync::atomic::{AtomicU32, Ordering};

use hover_abi::exit_code;
use hover_abi::pvio::io_status;

use super::Context;
use crate::kernel::api::{
    frames, now, println, pvio, report_haltpoll_windows, sleep_until, ticks_for_us, ticks_per_sec,
    ticks_to_ns, Reports, VirtioBlk,
};

/// Slots the writes cycle through.
pub const SLOTS: u64 = 64;
/// Latency histogram: 1 us buckets up to 20 ms, then one overflow bucket.
const BUCKETS: usize = 20_001;
static HIST: [AtomicU32; BUCKETS] = [const { AtomicU32::new(0) }; BUCKETS];

/// The `pct`-th percentile (nearest rank), nanoseconds.
fn percentile(total: u64, pct: u64) -> u64 {
    let want = (total * pct).div_ceil(100).max(1);
    let mut seen = 0u64;
    for (us, b) in HIST.iter().enumerate() {
        seen += b.load(Ordering::Relaxed) as u64;
        if seen >= want {
            return us as u64 * 1000;
        }
    }
    (BUCKETS as u64 - 1) * 1000
}

pub fn run(ctx: &Context) -> u32 {
    let size = ctx.number("size");
    let seconds = ctx.number("seconds");
    let Some(buf) = frames::alloc(size, 4096) else {
        println!("iolat: no memory for a {}-byte buffer", size);
        return exit_code::WORKLOAD_FAILED;
    };
    let st = pvio::setup();
    let virtio = if st == hover_abi::control::status::UNAVAILABLE {
        match VirtioBlk::open(ctx.cmdline) {
            Ok(d) if !size.is_multiple_of(512) || d.capacity_bytes() < SLOTS * size => {
                println!(
                    "iolat: the virtio disk takes whole 512-byte sectors and needs {} bytes ({} slots of size={}); it has {}",
                    SLOTS * size,
                    SLOTS,
                    size,
                    d.capacity_bytes()
                );
                return exit_code::WORKLOAD_FAILED;
            }
            Ok(d) => Some(d),
            Err(why) => {
                println!(
                    "iolat: skipped: this platform has no Hover I/O device (no control port) and no usable virtio block device ({})",
                    why
                );
                return exit_code::UNAVAILABLE;
            }
        }
    } else if !pvio::setup_ok(st) {
        println!("iolat: the monitor refused the I/O ring (status {})", st);
        return exit_code::WORKLOAD_FAILED;
    } else {
        None
    };
    let end = now() + seconds * ticks_per_sec();
    let (mut n, mut errors, mut sum, mut min, mut max) = (0u64, 0u64, 0u64, u64::MAX, 0u64);
    let start = now();
    while now() < end {
        let data = buf as *mut u8;
        for i in 0..size {
            // SAFETY: the buffer was allocated for this workload.
            unsafe { data.add(i as usize).write(((n + i) % 251) as u8) };
        }
        let t0 = now();
        let offset = (n % SLOTS) * size;
        let (status, err) = match &virtio {
            None => pvio::write_sync(buf, size as u32, offset),
            Some(d) => match d.write_sync(buf, size as u32, offset) {
                0 => (io_status::OK, 0),
                s => (io_status::IO_ERROR, s as i32),
            },
        };
        let ns = ticks_to_ns(now() - t0);
        if status != io_status::OK {
            if errors == 0 {
                println!(
                    "iolat: write {} failed: status {}, errno {}",
                    n, status, err
                );
            }
            errors += 1;
        }
        n += 1;
        sum += ns;
        min = min.min(ns);
        max = max.max(ns);
        HIST[((ns / 1000) as usize).min(BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }
    let elapsed_ns = ticks_to_ns(now() - start).max(1);
    let iops = n as f64 * 1e9 / elapsed_ns as f64;
    let mut r = Reports::new();
    let idle_ms = ctx.number("idle_ms");
    if idle_ms > 0 {
        // The windows as the I/O left them; then long sleeps (each past
        // the largest window, poll_us <= 10 ms) let them shrink.
        report_haltpoll_windows(&mut r, "iolat.window_after_io_ns", ctx.vcpus());
        let poll_us = hover_abi::workload::global("poll_us").number(ctx.cmdline);
        let step = ticks_for_us(2 * poll_us.max(500));
        let until = now() + ticks_for_us(idle_ms * 1000);
        while now() < until {
            sleep_until(now() + step);
        }
    }
    r.u64(format_args!("iolat.requests"), n);
    r.u64(format_args!("iolat.errors"), errors);
    r.u64(format_args!("iolat.size"), size);
    r.u64(format_args!("iolat.iops"), iops as u64);
    r.u64(format_args!("iolat.avg_ns"), sum / n.max(1));
    r.u64(format_args!("iolat.min_ns"), min);
    r.u64(format_args!("iolat.p50_ns"), percentile(n, 50));
    r.u64(format_args!("iolat.p99_ns"), percentile(n, 99));
    r.u64(format_args!("iolat.max_ns"), max);
    r.send();
    println!(
        "iolat: {} writes of {} bytes, {} IOPS, avg {} us, {} errors",
        n,
        size,
        iops as u64,
        sum / n.max(1) / 1000,
        errors
    );
    if errors == 0 {
        exit_code::OK
    } else {
        exit_code::WORKLOAD_FAILED
    }
}
