//! The page store's modelled device delay: `--page-store-latency` plus a
//! random part up to `--page-store-jitter`.

use std::time::Duration;

/// A uniformly random delay up to `max` (xorshift per thread: the
/// delay models a device, it needs no better randomness).
pub(super) fn jitter(max: Duration) -> Duration {
    use std::cell::Cell;
    thread_local! {
        static X: Cell<u64> = Cell::new(
            // SAFETY: gettid has no preconditions.
            0x9e37_79b9_7f4a_7c15 ^ (unsafe { libc::gettid() } as u64)
                ^ std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64),
        );
    }
    let ns = max.as_nanos() as u64;
    if ns == 0 {
        return Duration::ZERO;
    }
    let r = X.with(|x| {
        let mut v = x.get();
        v ^= v << 13;
        v ^= v >> 7;
        v ^= v << 17;
        x.set(v);
        v
    });
    Duration::from_nanos(r % (ns + 1))
}
