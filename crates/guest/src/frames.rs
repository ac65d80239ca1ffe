//! Guest memory for workloads' buffers: a bump allocator over the largest
//! usable region of the boot-info memory map. Nothing is ever freed.

use core::sync::atomic::{AtomicU64, Ordering};

use hover_abi::boot::{region_kind, BootInfo};

static NEXT: AtomicU64 = AtomicU64::new(0);
static END: AtomicU64 = AtomicU64::new(0);

/// Take the largest usable region (vCPU 0, at boot).
pub fn init(boot: &BootInfo) {
    if let Some(r) = boot
        .regions()
        .iter()
        .filter(|r| r.kind == region_kind::USABLE)
        .max_by_key(|r| r.size)
    {
        END.store(r.base + r.size, Ordering::Relaxed);
        NEXT.store(r.base, Ordering::Release);
    }
}

/// `bytes` of memory aligned to `align` (a power of two), or `None` when
/// not enough is left.
pub fn alloc(bytes: u64, align: u64) -> Option<u64> {
    let end = END.load(Ordering::Relaxed);
    let mut cur = NEXT.load(Ordering::Acquire);
    loop {
        let start = cur.checked_add(align - 1)? & !(align - 1);
        let stop = start.checked_add(bytes)?;
        if stop > end {
            return None;
        }
        match NEXT.compare_exchange_weak(cur, stop, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(start),
            Err(now) => cur = now,
        }
    }
}

/// Bytes still free.
pub fn free_bytes() -> u64 {
    END.load(Ordering::Relaxed)
        .saturating_sub(NEXT.load(Ordering::Relaxed))
}
