//! Guest-physical memory layout at boot and the segment selectors both sides use.
//!
//! The first MiB belongs to the monitor ("boot area"): it holds the boot-info
//! page, placeholder descriptor tables, identity page tables and one boot stack
//! per vCPU. Guest images must load at or above [`BOOT_AREA_END`].

/// Most vCPUs a Hover VM can have (bounded further by what KVM allows).
pub const MAX_VCPUS: usize = 32;
/// Size of a guest page as the ABI counts it.
pub const PAGE_SIZE: u64 = 4096;

/// Guest-physical address of the boot-info page ([`crate::boot::BootInfo`]).
pub const BOOT_INFO_GPA: u64 = 0x1000;
/// Placeholder GDT written by the monitor (flat segments at the selectors below).
pub const BOOT_GDT_GPA: u64 = 0x2000;
/// Placeholder TSSs, one per vCPU, [`BOOT_TSS_STRIDE`] bytes apart; RSP0 = boot stack top.
pub const BOOT_TSS_GPA: u64 = 0x3000;
/// Distance between two placeholder TSSs.
pub const BOOT_TSS_STRIDE: u64 = 0x80;
/// Identity-mapping PML4 (the PDPT and page directories follow it).
pub const PML4_GPA: u64 = 0x10000;
/// Identity-mapping PDPT.
pub const PDPT_GPA: u64 = 0x11000;
/// First identity-mapping page directory; one 4 KiB directory maps 1 GiB with 2 MiB pages.
pub const PD_GPA: u64 = 0x12000;
/// Most guest-physical address space the boot page tables map, in GiB.
pub const MAX_MAPPED_GIB: u64 = 64;
/// Boot stacks, one per vCPU, [`BOOT_STACK_SIZE`] bytes each; vCPU `i`'s stack top
/// is `BOOT_STACKS_GPA + (i + 1) * BOOT_STACK_SIZE`.
pub const BOOT_STACKS_GPA: u64 = 0x60000;
/// Size of one boot stack.
pub const BOOT_STACK_SIZE: u64 = 0x1000;
/// End of the monitor's boot area; guest images load at or above it.
pub const BOOT_AREA_END: u64 = 0x10_0000;

/// Start of the guest-physical hole below 4 GiB kept free for MMIO (IOAPIC, LAPIC).
pub const MMIO_HOLE_START: u64 = 0xC000_0000;
/// End of the MMIO hole; RAM beyond 3 GiB continues here.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// The IOAPIC's registers (KVM's in-kernel IOAPIC; GSIs 0-23). The boot
/// page tables map its 2 MiB page whatever the RAM size.
pub const IOAPIC_GPA: u64 = 0xFEC0_0000;

/// Kernel (CPL0) code segment selector.
pub const KERNEL_CS: u16 = 0x08;
/// Kernel (CPL0) data/stack segment selector.
pub const KERNEL_DS: u16 = 0x10;
/// User (CPL3) data/stack segment selector, RPL 3.
pub const USER_DS: u16 = 0x18 | 3;
/// User (CPL3) code segment selector, RPL 3.
pub const USER_CS: u16 = 0x20 | 3;
/// Task-state segment selector (a 16-byte system descriptor at GDT entries 5 and 6).
pub const TSS_SEL: u16 = 0x28;
/// Number of 8-byte GDT entries in the layout above.
pub const GDT_ENTRIES: usize = 7;

/// Raw GDT descriptor values for the flat segments, indexed by `selector >> 3`.
/// Both the monitor's placeholder GDT and the guest's own GDTs use them.
pub const FLAT_GDT: [u64; 5] = [
    0,
    0x00AF_9A00_0000_FFFF, // 0x08: 64-bit code, DPL0
    0x00CF_9200_0000_FFFF, // 0x10: data, DPL0
    0x00CF_F200_0000_FFFF, // 0x18: data, DPL3
    0x00AF_FA00_0000_FFFF, // 0x20: 64-bit code, DPL3
];

/// The two 8-byte halves of a 64-bit available-TSS descriptor for `base`/`limit`.
pub const fn tss_descriptor(base: u64, limit: u32) -> [u64; 2] {
    let low = (limit as u64 & 0xffff)
        | ((base & 0xff_ffff) << 16)
        | (0x89u64 << 40) // present, DPL0, type 9 (available 64-bit TSS)
        | (((limit as u64 >> 16) & 0xf) << 48)
        | (((base >> 24) & 0xff) << 56);
    [low, base >> 32]
}

// The boot area holds every table for the largest VM: checked at compile time.
const _: () = {
    assert!(PD_GPA + MAX_MAPPED_GIB * PAGE_SIZE <= BOOT_STACKS_GPA);
    assert!(BOOT_STACKS_GPA + MAX_VCPUS as u64 * BOOT_STACK_SIZE <= BOOT_AREA_END);
    assert!(BOOT_TSS_GPA + MAX_VCPUS as u64 * BOOT_TSS_STRIDE <= PML4_GPA);
    assert!(BOOT_INFO_GPA + PAGE_SIZE <= BOOT_GDT_GPA);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tss_descriptor_splits_base_and_limit() {
        let [lo, hi] = tss_descriptor(0x1234_5678_9abc_def0, 0x6_7fff);
        assert_eq!(lo & 0xffff, 0x7fff);
        assert_eq!((lo >> 16) & 0xff_ffff, 0xbc_def0);
        assert_eq!((lo >> 40) & 0xff, 0x89);
        assert_eq!((lo >> 48) & 0xf, 0x6);
        assert_eq!(lo >> 56, 0x9a);
        assert_eq!(hi, 0x1234_5678);
    }
}
