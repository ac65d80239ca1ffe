//! Where the in-kernel IOAPIC sends a pin's interrupts. The guest programs
//! the IOAPIC without exits to the VMM, so the VMM reads the redirection
//! entry back from KVM when it raises a line (to boost the vCPU it will
//! interrupt, `sched/boost`).

use kvm_bindings::{kvm_irqchip, KVM_IRQCHIP_IOAPIC};
use kvm_ioctls::VmFd;

/// Pins of the in-kernel IOAPIC.
pub const PINS: usize = 24;
const MASKED: u64 = 1 << 16;
const LOGICAL: u64 = 1 << 11;
const BROADCAST: u8 = 0xff;

/// Redirection entry `pin` as KVM holds it now.
pub fn entry(vm: &VmFd, pin: usize) -> Result<u64, kvm_ioctls::Error> {
    assert!(pin < PINS, "IOAPIC pin {pin} does not exist");
    let mut chip = kvm_irqchip {
        chip_id: KVM_IRQCHIP_IOAPIC,
        ..Default::default()
    };
    vm.get_irqchip(&mut chip)?;
    // SAFETY: chip_id IOAPIC makes `ioapic` the union's member KVM filled,
    // and every bit pattern of a redirection entry is a valid u64.
    Ok(unsafe { chip.chip.ioapic.redirtbl[pin].bits })
}

/// The vCPUs (of `vcpus`, APIC ID = index, as Hover numbers them) that an
/// interrupt through redirection `entry` reaches: none while the entry is
/// masked; in physical mode the vCPU named, or all for 0xFF; in logical
/// mode those whose bit is set in the flat model (bit i = vCPU i), how a
/// guest with up to 8 vCPUs sets it.
pub fn destinations(entry: u64, vcpus: usize) -> impl Iterator<Item = usize> {
    let dest = (entry >> 56) as u8;
    let masked = entry & MASKED != 0;
    let logical = entry & LOGICAL != 0;
    (0..vcpus).filter(move |&v| {
        !masked
            && if logical {
                v < 8 && dest & (1 << v) != 0
            } else {
                dest == BROADCAST || v == dest as usize
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(entry: u64, vcpus: usize) -> Vec<usize> {
        destinations(entry, vcpus).collect()
    }

    #[test]
    fn destinations_follow_mask_mode_and_id() {
        let vector = 0x51;
        assert_eq!(to(vector | 1 << 56, 2), vec![1], "physical, vCPU 1");
        assert_eq!(to(vector | MASKED | 1 << 56, 2), Vec::<usize>::new());
        assert_eq!(to(vector | 5 << 56, 2), Vec::<usize>::new(), "no such vCPU");
        assert_eq!(to(vector | 0xff << 56, 3), vec![0, 1, 2], "broadcast");
        assert_eq!(to(vector | LOGICAL | 0b101 << 56, 4), vec![0, 2]);
        // The reset state: masked, physical, destination 0.
        assert_eq!(to(MASKED, 2), Vec::<usize>::new());
    }
}
