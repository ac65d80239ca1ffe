//! The host half of guest-side halt polling (`hover_abi::haltpoll`): the
//! monitor offers a poll limit in every vCPU's area, skips I/O completion
//! interrupts to a vCPU that says it is polling, and reads back the windows
//! the guest chose, for the governor and for stats.
//!
//! The areas live in the boot area (never paged, part of every snapshot and
//! migration as ordinary memory), so there is no registration to save.

use std::sync::atomic::{fence, AtomicBool, Ordering};

use hover_abi::haltpoll::{area_gpa, flags, offset, MAX_POLL_NS};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::memory::host_writes::GuestWriter;

/// Offer `max_ns` of guest polling (0: none) to `vcpus` vCPUs, with
/// interrupt suppression whenever polling is offered. Written at boot,
/// and again when a restored or received VM runs under new flags.
pub fn offer(
    guest: &GuestWriter,
    vcpus: u32,
    max_ns: u64,
) -> Result<(), vm_memory::GuestMemoryError> {
    let f = if max_ns > 0 { flags::SUPPRESS_IRQ } else { 0 };
    for v in 0..vcpus as usize {
        let a = area_gpa(v);
        guest.write_obj(max_ns, a + offset::MAX_NS)?;
        guest.write_obj(f, a + offset::FLAGS)?;
    }
    Ok(())
}

/// Called by the I/O thread after it has written a completion count that
/// vCPU `vcpu` may be polling for: whether the guest watches it itself (its
/// `polling` flag is up), so no interrupt is needed. Counted in the area.
pub fn completion_seen_by_poll(guest: &GuestWriter, vcpu: usize) -> bool {
    // Pairs with the guest's fence between clearing `polling` and its last
    // look at the counter: one side sees the other's store.
    fence(Ordering::SeqCst);
    let a = area_gpa(vcpu);
    let mem = guest.memory();
    let polling = mem
        .load::<u32>(GuestAddress(a + offset::POLLING), Ordering::SeqCst)
        .is_ok_and(|p| p == 1);
    if polling {
        // The I/O thread is this counter's only writer.
        let at = a + offset::IRQS_SKIPPED;
        if let Ok(n) = mem.load::<u64>(GuestAddress(at), Ordering::Relaxed) {
            let _ = guest.store(n.wrapping_add(1), at, Ordering::Relaxed);
        }
    }
    polling
}

/// What the guest says about its polling.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GuestPoll {
    /// The limit the monitor offers, ns (0: guest polling not offered).
    pub max_ns: u64,
    /// Per vCPU.
    pub vcpus: Vec<GuestPollVcpu>,
}

/// One vCPU's guest polling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GuestPollVcpu {
    /// Its window, clamped to the limit, ns.
    pub window_ns: u64,
    /// Polls started.
    pub polls: u64,
    /// Polls that found work.
    pub hits: u64,
    /// Completion interrupts skipped.
    pub irqs_skipped: u64,
}

impl GuestPoll {
    /// Completion interrupts skipped, all vCPUs.
    pub fn irqs_skipped(&self) -> u64 {
        self.vcpus.iter().map(|v| v.irqs_skipped).sum()
    }
}

/// Read the areas of `vcpus` vCPUs. A window above the offered limit is
/// Read the areas of `vcpus` vCPUs. A window above the offered limit is
/// nonsense from the guest: clamped, and logged once per `warned`.
pub fn read(mem: &GuestMemoryMmap, vcpus: u32, warned: &AtomicBool) -> GuestPoll {
    let r64 = |gpa: u64| mem.read_obj::<u64>(GuestAddress(gpa)).unwrap_or(0);
    let max_ns = r64(area_gpa(0) + offset::MAX_NS).min(MAX_POLL_NS);
    let mut out = GuestPoll {
        max_ns,
        vcpus: Vec::new(),
    };
    for v in 0..vcpus as usize {
        let a = area_gpa(v);
        let w = r64(a + offset::WINDOW_NS);
        if w > max_ns && !warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                vcpu = v,
                window_ns = w,
                max_ns,
                "guest halt polling: the guest claims a window above the monitor's limit; clamped"
            );
        }
        out.vcpus.push(GuestPollVcpu {
            window_ns: w.min(max_ns),
            polls: r64(a + offset::POLLS),
            hits: r64(a + offset::HITS),
            irqs_skipped: r64(a + offset::IRQS_SKIPPED),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    #[test]
    fn the_offer_reaches_every_vcpu_and_suppression_follows_it() {
        let m = mem();
        let w = GuestWriter::unrecorded(m.clone());
        offer(&w, 3, 150_000).unwrap();
        for v in 0..3 {
            let a = area_gpa(v);
            assert_eq!(m.read_obj::<u64>(GuestAddress(a)).unwrap(), 150_000);
            assert_eq!(
                m.read_obj::<u32>(GuestAddress(a + offset::FLAGS)).unwrap(),
                flags::SUPPRESS_IRQ
            );
        }
        offer(&w, 3, 0).unwrap();
        assert_eq!(
            m.read_obj::<u32>(GuestAddress(area_gpa(2) + offset::FLAGS))
                .unwrap(),
            0
        );
    }

    #[test]
    fn an_interrupt_is_skipped_only_while_the_guest_polls() {
        let m = mem();
        let w = GuestWriter::unrecorded(m.clone());
        assert!(!completion_seen_by_poll(&w, 1));
        m.write_obj(1u32, GuestAddress(area_gpa(1) + offset::POLLING))
            .unwrap();
        assert!(completion_seen_by_poll(&w, 1));
        assert!(!completion_seen_by_poll(&w, 0));
        let seen = read(&m, 2, &AtomicBool::new(false));
        assert_eq!(seen.irqs_skipped(), 1);
    }

    #[test]
    fn a_window_above_the_limit_is_clamped() {
        let m = mem();
        offer(&GuestWriter::unrecorded(m.clone()), 2, 100_000).unwrap();
        m.write_obj(u64::MAX, GuestAddress(area_gpa(1) + offset::WINDOW_NS))
            .unwrap();
        m.write_obj(40_000u64, GuestAddress(area_gpa(0) + offset::WINDOW_NS))
            .unwrap();
        let warned = AtomicBool::new(false);
        let seen = read(&m, 2, &warned);
        let windows: Vec<u64> = seen.vcpus.iter().map(|v| v.window_ns).collect();
        assert_eq!(windows, vec![40_000, 100_000]);
        assert!(warned.load(Ordering::Relaxed));
    }
}
