//! Guest memory for workloads' buffers: a bump allocator over every usable
//! region of the boot-info memory map (first fit). Nothing is ever freed.
//! A buffer is contiguous, so it must fit in one region: RAM is split around
//! the MMIO hole at 3-4 GiB.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hover_abi::boot::{region_kind, BootInfo, MAX_MEM_REGIONS};

/// Next free address and end of each usable region.
static NEXT: [AtomicU64; MAX_MEM_REGIONS] = [const { AtomicU64::new(0) }; MAX_MEM_REGIONS];
static END: [AtomicU64; MAX_MEM_REGIONS] = [const { AtomicU64::new(0) }; MAX_MEM_REGIONS];
static REGIONS: AtomicUsize = AtomicUsize::new(0);

/// Take the usable regions (vCPU 0, at boot).
pub fn init(boot: &BootInfo) {
    let mut n = 0;
    for r in boot
        .regions()
        .iter()
        .filter(|r| r.kind == region_kind::USABLE)
    {
        END[n].store(r.base + r.size, Ordering::Relaxed);
        NEXT[n].store(r.base, Ordering::Relaxed);
        n += 1;
    }
    REGIONS.store(n, Ordering::Release);
}

fn alloc_in(i: usize, bytes: u64, align: u64) -> Option<u64> {
    let end = END[i].load(Ordering::Relaxed);
    let mut cur = NEXT[i].load(Ordering::Acquire);
    loop {
        let start = cur.checked_add(align - 1)? & !(align - 1);
        let stop = start.checked_add(bytes)?;
        if stop > end {
            return None;
        }
        match NEXT[i].compare_exchange_weak(cur, stop, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(start),
            Err(now) => cur = now,
        }
    }
}

/// `bytes` of contiguous memory aligned to `align` (a power of two), from
/// the first region with room, or `None`.
pub fn alloc(bytes: u64, align: u64) -> Option<u64> {
    (0..REGIONS.load(Ordering::Acquire)).find_map(|i| alloc_in(i, bytes, align))
}

fn free_in(i: usize) -> u64 {
    END[i]
        .load(Ordering::Relaxed)
        .saturating_sub(NEXT[i].load(Ordering::Relaxed))
}

/// Bytes still free, in all regions.
pub fn free_bytes() -> u64 {
    (0..REGIONS.load(Ordering::Acquire)).map(free_in).sum()
}

/// The largest buffer that could still be allocated.
pub fn largest_free() -> u64 {
    (0..REGIONS.load(Ordering::Acquire))
        .map(free_in)
        .max()
        .unwrap_or(0)
}
