//! Guest-side halt polling (seed 5, second pass): one [`HaltPollArea`] per
//! vCPU in the boot area, at [`area_gpa`], shared by the guest and the monitor.
//!
//! Before an idle vCPU executes HLT (an exit through emulated CPL0 here), a
//! guest in `idle=haltpoll` mode polls in CPL3 for a window: its run queue,
//! and the completion counter of the I/O request its task waits for. The
//! window adapts (Linux's cpuidle-haltpoll: it grows when a wake-up came
//! after the window but within the maximum, and shrinks when the wait
//! outlasted the maximum), bounded by the guest's `poll_us=` and by the
//! monitor's [`HaltPollArea::max_ns`].
//!
//! Contract:
//! - the monitor writes `max_ns` (0: the guest must not poll) and `flags`
//!   before the vCPU starts; a monitor that knows nothing of this area
//!   leaves it zero, so the guest never polls under it;
//! - the guest keeps [`HaltPollArea::window_ns`] at its current window (the
//!   monitor's governor sizes KVM's window for what the guest's poll does
//!   not cover) and counts its polls;
//! - with [`flags::SUPPRESS_IRQ`] offered, the guest sets `polling` to 1
//!   while it polls and watches the I/O completion counter itself; the
//!   monitor then skips I/O completion interrupts to that vCPU. Both sides
//!   order their store before their load (a full fence): the guest clears
//!   `polling` and then looks at the counter once more before halting, the
//!   monitor writes the counter and then reads `polling`, so a completion is
//!   either seen by the poll or interrupts the halt.
//!
//! The monitor never trusts the area: a window above `max_ns` is clamped
//! (and logged once), other values are only counted.

use crate::layout::{MAX_VCPUS, PAGE_SIZE};

/// Guest-physical address of vCPU 0's area; vCPU `i`'s is at [`area_gpa`].
pub const HALTPOLL_AREAS_GPA: u64 = 0x4000;
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Size and alignment of a [`HaltPollArea`].
pub const HALTPOLL_AREA_SIZE: u64 = 64;
/// Largest `max_ns` the monitor may offer: 10 ms.
pub const MAX_POLL_NS: u64 = 10_000_000;
/// The monitor's default `max_ns`: 200 us (Linux's `guest_halt_poll_ns`).
pub const DEFAULT_POLL_NS: u64 = 200_000;

/// Guest-physical address of vCPU `vcpu`'s area.
pub const fn area_gpa(vcpu: usize) -> u64 {
    HALTPOLL_AREAS_GPA + vcpu as u64 * HALTPOLL_AREA_SIZE
}

/// Host -> guest: what the monitor offers.
pub mod flags {
    /// While `polling` is 1, the monitor raises no I/O completion interrupt
    /// on this vCPU (the guest watches the completion counter).
    pub const SUPPRESS_IRQ: u32 = 1 << 0;
    /// Every bit this revision defines.
    pub const ALL: u32 = SUPPRESS_IRQ;
}

/// One vCPU's area, as both sides access it: aligned 32/64-bit atomics
/// (the guest uses this type itself; the monitor, which reaches guest
/// memory through its mapping, the [`offset`]s derived from it). Fields
/// are written by one side only, as marked.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct HaltPollArea {
    /// Host: the longest the guest may poll before HLT, ns (0: no polling).
    pub max_ns: AtomicU64,
    /// Host: [`flags`] bits.
    pub flags: AtomicU32,
    /// Guest: 1 while this vCPU polls in its idle loop.
    pub polling: AtomicU32,
    /// Guest: its current window, ns.
    pub window_ns: AtomicU64,
    /// Guest: polls started.
    pub polls: AtomicU64,
    /// Guest: polls that ended with work found (no HLT).
    pub hits: AtomicU64,
    /// Host: completion interrupts skipped because the guest was polling.
    pub irqs_skipped: AtomicU64,
    /// Zero.
    pub pad: [u64; 2],
}

/// Byte offsets of the fields, for the monitor (which reads guest memory).
pub mod offset {
    use super::HaltPollArea;
    use core::mem::offset_of;
    /// [`super::HaltPollArea::max_ns`].
    pub const MAX_NS: u64 = offset_of!(HaltPollArea, max_ns) as u64;
    /// [`super::HaltPollArea::flags`].
    pub const FLAGS: u64 = offset_of!(HaltPollArea, flags) as u64;
    /// [`super::HaltPollArea::polling`].
    pub const POLLING: u64 = offset_of!(HaltPollArea, polling) as u64;
    /// [`super::HaltPollArea::window_ns`].
    pub const WINDOW_NS: u64 = offset_of!(HaltPollArea, window_ns) as u64;
    /// [`super::HaltPollArea::polls`].
    pub const POLLS: u64 = offset_of!(HaltPollArea, polls) as u64;
    /// [`super::HaltPollArea::hits`].
    pub const HITS: u64 = offset_of!(HaltPollArea, hits) as u64;
    /// [`super::HaltPollArea::irqs_skipped`].
    pub const IRQS_SKIPPED: u64 = offset_of!(HaltPollArea, irqs_skipped) as u64;
}

// The areas sit between the placeholder TSSs and the page tables.
const _: () = {
    assert!(
        HALTPOLL_AREAS_GPA
            >= crate::layout::BOOT_TSS_GPA + MAX_VCPUS as u64 * crate::layout::BOOT_TSS_STRIDE
    );
    assert!(area_gpa(MAX_VCPUS) <= crate::layout::PML4_GPA);
    assert!(HALTPOLL_AREAS_GPA.is_multiple_of(PAGE_SIZE));
};

// The layout docs/ABI.md publishes, checked as the crate builds (the
// guest and the monitor both use this type).
const _: () = {
    assert!(core::mem::size_of::<HaltPollArea>() as u64 == HALTPOLL_AREA_SIZE);
    assert!(core::mem::align_of::<HaltPollArea>() as u64 == HALTPOLL_AREA_SIZE);
    assert!(offset::MAX_NS == 0);
    assert!(offset::FLAGS == 8);
    assert!(offset::POLLING == 12);
    assert!(offset::WINDOW_NS == 16);
    assert!(offset::POLLS == 24);
    assert!(offset::HITS == 32);
    assert!(offset::IRQS_SKIPPED == 40);
};

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    /// The layout docs/ABI.md publishes (see boost.rs's test: a moved
    /// field is an ABI break, not a refactor).
    #[test]
    fn layout_is_the_published_one() {
        assert_eq!(size_of::<HaltPollArea>() as u64, HALTPOLL_AREA_SIZE);
        assert_eq!(align_of::<HaltPollArea>() as u64, HALTPOLL_AREA_SIZE);
        let published = [
            (offset::MAX_NS, 0),
            (offset::FLAGS, 8),
            (offset::POLLING, 12),
            (offset::WINDOW_NS, 16),
            (offset::POLLS, 24),
            (offset::HITS, 32),
            (offset::IRQS_SKIPPED, 40),
        ];
        for (derived, doc) in published {
            assert_eq!(derived, doc);
        }
        assert_eq!(area_gpa(1), HALTPOLL_AREAS_GPA + 64);
    }
}
