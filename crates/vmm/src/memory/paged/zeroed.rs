//! Large arrays of zeroed atomics (the pager's per-page state) taken from
//! zeroed memory instead of written element by element.

use std::sync::atomic::{AtomicBool, AtomicU8};

/// Atomics whose all-zero bytes are the value wanted (ABSENT, false, 0)
/// and whose size and alignment are their integer's.
///
/// # Safety
/// `Int` must have the implementor's size and alignment, and zero bytes
/// must be a valid value of both.
pub(super) unsafe trait ZeroAtomic: Sized {
    type Int: Copy + Default;
}
// SAFETY: the standard library documents each atomic as having its
// integer's size and bit validity; u8 and bool align to 1, u32 to 4 on
// every target with AtomicU32.
unsafe impl ZeroAtomic for AtomicU8 {
    type Int = u8;
}
// SAFETY: as above (AtomicBool is a u8 of 0 or 1).
unsafe impl ZeroAtomic for AtomicBool {
    type Int = u8;
}
// SAFETY: as above.
unsafe impl ZeroAtomic for std::sync::atomic::AtomicU32 {
    type Int = u32;
}

/// `n` zeroed atomics, in memory the allocator takes zeroed from the
/// kernel and nothing writes: building them one by one touched every page
/// (~1 ms for a 1 GiB guest's three arrays, paid in a post-copy's downtime
/// and before a lazy restore runs).
pub(super) fn zeroed<A: ZeroAtomic>(n: usize) -> Vec<A> {
    const { assert!(std::mem::size_of::<A>() == std::mem::size_of::<A::Int>()) };
    const { assert!(std::mem::align_of::<A>() == std::mem::align_of::<A::Int>()) };
    let mut v = std::mem::ManuallyDrop::new(vec![A::Int::default(); n]);
    // SAFETY: same size and alignment (checked above), so the allocation's
    // layout is the same; zero bytes are a valid `A` (the trait's contract);
    // the original vector is never dropped.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<A>(), v.len(), v.capacity()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn zeroed_arrays_start_at_zero_and_work() {
        let n = 1 << 20;
        let states: Vec<AtomicU8> = zeroed(n);
        let stored: Vec<AtomicBool> = zeroed(n);
        let crcs: Vec<AtomicU32> = zeroed(n);
        assert_eq!((states.len(), stored.len(), crcs.len()), (n, n, n));
        assert!(states.iter().all(|s| s.load(Ordering::Relaxed) == 0));
        assert!(stored.iter().all(|s| !s.load(Ordering::Relaxed)));
        assert!(crcs.iter().all(|c| c.load(Ordering::Relaxed) == 0));
        states[7].store(3, Ordering::Relaxed);
        crcs[n - 1].store(u32::MAX, Ordering::Relaxed);
        assert_eq!(states[7].load(Ordering::Relaxed), 3);
        assert_eq!(crcs[n - 1].load(Ordering::Relaxed), u32::MAX);
    }
}
