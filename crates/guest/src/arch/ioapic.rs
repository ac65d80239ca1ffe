//! Routing a legacy interrupt line (GSI) through the IOAPIC: the serial
//! port's line (GSI 4, `uart` workload) and, under QEMU microvm, its
//! virtio-mmio transports. Hover (KVM's in-kernel IOAPIC) and QEMU microvm
//! have GSIs 0-23 on the IOAPIC at 0xFEC0_0000; QEMU's second IOAPIC has
//! 24-47 at 0xFEC1_0000.

use core::ptr::write_volatile;

const IOAPICS: [(u64, u32); 2] = [(0xFEC0_0000, 0), (0xFEC1_0000, 24)];
const PINS: u32 = 24;
const IOREGSEL: u64 = 0x00;
const IOWIN: u64 = 0x10;
const REDIRECTION_TABLE: u32 = 0x10;

fn ioapic_of(gsi: u32) -> Option<(u64, u32)> {
    IOAPICS
        .iter()
        .find(|(_, first)| (*first..*first + PINS).contains(&gsi))
        .map(|&(base, first)| (base, gsi - first))
}

/// Whether `gsi` is a line this guest can route.
pub fn check_gsi(gsi: u32) -> Result<(), &'static str> {
    ioapic_of(gsi)
        .map(|_| ())
        .ok_or("the device's GSI is not on an IOAPIC this guest knows (0-47)")
}

/// Whether IOAPIC `n` (0 or 1) of QEMU microvm's layout answers: its
/// version register names 24 redirection entries.
pub fn present(n: usize) -> bool {
    let base = IOAPICS[n].0;
    // SAFETY: reads of an IOAPIC's registers, or of an unbacked MMIO
    // address the VMM answers with a constant.
    let v = unsafe {
        write_volatile((base + IOREGSEL) as *mut u32, 1);
        core::ptr::read_volatile((base + IOWIN) as *const u32)
    };
    v != u32::MAX && (v >> 16) & 0xff == PINS - 1
}

fn write(base: u64, index: u32, value: u32) {
    // SAFETY: the IOAPIC's registers (identity-mapped MMIO); the index
    // selects a register of the pin being routed.
    unsafe {
        write_volatile((base + IOREGSEL) as *mut u32, index);
        write_volatile((base + IOWIN) as *mut u32, value);
    }
}

/// Deliver `gsi` as `vector` to the vCPU with x2APIC id `cpu`: fixed,
/// physical destination, active high, edge-triggered, unmasked.
pub fn route(gsi: u32, vector: u8, cpu: u32) {
    let Some((base, pin)) = ioapic_of(gsi) else {
        return;
    };
    let entry = REDIRECTION_TABLE + 2 * pin;
    // Masked while the destination changes, then the vector unmasked.
    write(base, entry, 1 << 16);
    write(base, entry + 1, cpu << 24);
    write(base, entry, vector as u32);
}

/// Stop delivering `gsi` (the entry masked, as at reset).
pub fn mask(gsi: u32) {
    if let Some((base, pin)) = ioapic_of(gsi) {
        write(base, REDIRECTION_TABLE + 2 * pin, 1 << 16);
    }
}
