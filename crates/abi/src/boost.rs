//! vCPU priority boosting (seed 2): one [`BoostArea`] per vCPU, shared by the
//! guest and the monitor.
//!
//! The guest places an area in its own memory (64-byte aligned, so it never
//! crosses a page), fills in [`BoostArea::version`], and registers it from
//! the vCPU it belongs to with [`crate::control::op::BOOST_REGISTER`]. From
//! then on:
//! - the guest sets [`request`] bits while it runs latency-sensitive work
//!   and keeps running (no exit); the monitor boosts the vCPU's thread when
//!   it next looks (on the vCPU's exits, and from a monitor thread that polls
//!   every area);
//! - the guest announces in [`BoostArea::wake_at`] the TSC deadline at which a
//!   real-time task on this vCPU wakes next; the monitor boosts the thread
//!   just before it, as KVM would when it injects the timer interrupt;
//! - the monitor boosts on its own when it injects an interrupt it raised
//!   (MSIs, I/O completions);
//! - unboosting is the guest's: with no request bit set and
//!   [`status::BOOSTED`] showing, the guest calls
//!   [`crate::control::op::BOOST_UNBOOST`]. With the bit clear the guest
//!   makes no call, so the common path costs no exit;
//! - a quiet unboost: when the host offers to keep boosts across short
//!   gaps ([`BoostArea::keep_us`] non-zero) and either the guest's
//!   announced `wake_at` is due within that many microseconds or its vCPU
//!   is about to halt (a halted vCPU holds no host CPU), the guest bumps
//!   [`BoostArea::quiet_unboosts`] instead of calling; the monitor, at its
//!   next look, keeps the boost across the gap or ends it as the call
//!   would have. A shared-page write, no exit.
//!   (Both fields were reserved zeros before; a guest that ignores them
//!   always calls, and a host that leaves `keep_us` zero always gets
//!   calls.)
//!
//! The monitor never trusts the area: unknown request bits are ignored (and
//! logged), a boost held past the user's limit is revoked and
//! [`status::THROTTLED`] set for a cool-down.

use core::sync::atomic::{AtomicU32, AtomicU64};

/// The layout revision the guest writes into [`BoostArea::version`].
pub const BOOST_AREA_VERSION: u32 = 1;
/// Size and alignment of a [`BoostArea`].
pub const BOOST_AREA_SIZE: u64 = 64;

/// Guest -> host: why this vCPU wants a boost (any bit set = boost).
pub mod request {
    /// Handling a device interrupt (from delivery until its handler task has run).
    pub const IRQ: u32 = 1 << 0;
    /// A task marked real-time is running.
    pub const RT: u32 = 1 << 1;
    /// Inside a critical section others wait on.
    pub const CRITICAL: u32 = 1 << 2;
    /// Every bit this revision defines.
    pub const ALL: u32 = IRQ | RT | CRITICAL;
}

/// Host -> guest: what the monitor did.
pub mod status {
    /// The vCPU's thread runs boosted.
    pub const BOOSTED: u32 = 1 << 0;
    /// A boost was held too long and revoked: none is granted until the
    /// cool-down ends (the monitor clears the bit then).
    pub const THROTTLED: u32 = 1 << 1;
}

/// One vCPU's shared area, as both sides access it: aligned 32/64-bit
/// atomics (the guest uses this type itself; the monitor, which reaches
/// guest memory through its mapping, the [`offset`]s derived from it).
/// Fields are written by one side only, as marked.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct BoostArea {
    /// Guest: [`BOOST_AREA_VERSION`], written before registering.
    pub version: AtomicU32,
    /// Guest: [`request`] bits.
    pub request: AtomicU32,
    /// Host: [`status`] bits.
    pub status: AtomicU32,
    /// Host: while [`status::BOOSTED`] shows, the longest gap (us) to an
    /// announced wake-up across which the guest may end its boost quietly,
    /// as it may when its vCPU halts (0: always make the unboost call).
    pub keep_us: AtomicU32,
    /// Guest: TSC deadline of the next real-time wake-up here (0 = none).
    pub wake_at: AtomicU64,
    /// Host: boosts granted so far (for the guest's reports).
    pub boosts: AtomicU64,
    /// Guest: quiet unboosts so far (each one an unboost call not made).
    pub quiet_unboosts: AtomicU64,
    /// Zero.
    pub pad: [u64; 3],
}

impl BoostArea {
    /// An area of zeros (not yet registered).
    pub const fn new() -> BoostArea {
        BoostArea {
            version: AtomicU32::new(0),
            request: AtomicU32::new(0),
            status: AtomicU32::new(0),
            keep_us: AtomicU32::new(0),
            wake_at: AtomicU64::new(0),
            boosts: AtomicU64::new(0),
            quiet_unboosts: AtomicU64::new(0),
            pad: [0; 3],
        }
    }
}

/// Byte offsets of the fields, for the monitor (which reads guest memory).
pub mod offset {
    use super::BoostArea;
    use core::mem::offset_of;
    /// [`super::BoostArea::version`].
    pub const VERSION: u64 = offset_of!(BoostArea, version) as u64;
    /// [`super::BoostArea::request`].
    pub const REQUEST: u64 = offset_of!(BoostArea, request) as u64;
    /// [`super::BoostArea::status`].
    pub const STATUS: u64 = offset_of!(BoostArea, status) as u64;
    /// [`super::BoostArea::keep_us`].
    pub const KEEP_US: u64 = offset_of!(BoostArea, keep_us) as u64;
    /// [`super::BoostArea::wake_at`].
    pub const WAKE_AT: u64 = offset_of!(BoostArea, wake_at) as u64;
    /// [`super::BoostArea::boosts`].
    pub const BOOSTS: u64 = offset_of!(BoostArea, boosts) as u64;
    /// [`super::BoostArea::quiet_unboosts`].
    pub const QUIET_UNBOOSTS: u64 = offset_of!(BoostArea, quiet_unboosts) as u64;
}

// The layout docs/ABI.md publishes, checked as the crate builds (the
// guest and the monitor both use this type): a guest built against an
// older copy must keep working, so a field that moves is an ABI break
// (bump BOOST_AREA_VERSION), not a refactor.
const _: () = {
    assert!(core::mem::size_of::<BoostArea>() as u64 == BOOST_AREA_SIZE);
    assert!(core::mem::align_of::<BoostArea>() as u64 == BOOST_AREA_SIZE);
    assert!(offset::VERSION == 0);
    assert!(offset::REQUEST == 4);
    assert!(offset::STATUS == 8);
    assert!(offset::KEEP_US == 12);
    assert!(offset::WAKE_AT == 16);
    assert!(offset::BOOSTS == 24);
    assert!(offset::QUIET_UNBOOSTS == 32);
};

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    /// The layout docs/ABI.md publishes: a guest built against an older
    /// copy of this crate must keep working, so a field that moves is an
    /// ABI break (bump BOOST_AREA_VERSION), not a refactor.
    #[test]
    fn layout_is_the_published_one() {
        assert_eq!(size_of::<BoostArea>() as u64, BOOST_AREA_SIZE);
        assert_eq!(align_of::<BoostArea>() as u64, BOOST_AREA_SIZE);
        let published = [
            (offset::VERSION, 0),
            (offset::REQUEST, 4),
            (offset::STATUS, 8),
            (offset::KEEP_US, 12),
            (offset::WAKE_AT, 16),
            (offset::BOOSTS, 24),
            (offset::QUIET_UNBOOSTS, 32),
        ];
        for (derived, doc) in published {
            assert_eq!(derived, doc);
        }
    }
}
