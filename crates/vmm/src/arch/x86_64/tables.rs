//! What the monitor writes into the boot area before any vCPU runs: identity
//! page tables (2 MiB pages, U bit set: the guest runtime lives at CPL3), a
//! placeholder GDT with the ABI's flat segments, and one placeholder TSS per
//! vCPU whose RSP0 is that vCPU's boot stack. The guest replaces the GDT and
//! TSS with its own; the IDT starts empty (limit 0). The in-kernel IOAPIC's
//! page is mapped too, uncached, even when RAM ends below the MMIO hole:
//! the guest routes the serial port's interrupt line there.

use hover_abi::layout::{
    BOOT_GDT_GPA, BOOT_STACKS_GPA, BOOT_STACK_SIZE, BOOT_TSS_GPA, BOOT_TSS_STRIDE, FLAT_GDT,
    IOAPIC_GPA, PDPT_GPA, PD_GPA, PML4_GPA,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const WRITE_THROUGH: u64 = 1 << 3;
const NO_CACHE: u64 = 1 << 4;
const USER: u64 = 1 << 2;
const HUGE: u64 = 1 << 7;
const GIB: u64 = 1 << 30;
const TWO_MIB: u64 = 2 << 20;
/// Size of the placeholder TSS (no I/O bitmap: CPL3 port access waits for the guest's own TSS).
pub const BOOT_TSS_LIMIT: u32 = 0x67;

/// Number of page directories needed to identity-map `[0, top)`.
pub fn directories_for(top: u64) -> u64 {
    top.div_ceil(GIB).max(1)
}

/// Write identity page tables covering `[0, top)` (rounded up to 1 GiB).
pub fn write_page_tables(
    mem: &GuestMemoryMmap,
    top: u64,
) -> Result<(), vm_memory::GuestMemoryError> {
    let flags = PRESENT | WRITABLE | USER;
    mem.write_obj(PDPT_GPA | flags, GuestAddress(PML4_GPA))?;
    for gib in 0..directories_for(top) {
        let pd = PD_GPA + gib * 4096;
        mem.write_obj(pd | flags, GuestAddress(PDPT_GPA + gib * 8))?;
        let mut entries = [0u64; 512];
        for (i, e) in entries.iter_mut().enumerate() {
            *e = (gib * GIB + i as u64 * TWO_MIB) | flags | HUGE;
        }
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        mem.write_slice(&bytes, GuestAddress(pd))?;
    }
    // RAM below the hole: map only the IOAPIC's 2 MiB page of the last GiB
    // below 4 GiB (its directory's room is reserved like the others').
    let ioapic_gib = IOAPIC_GPA / GIB;
    if directories_for(top) <= ioapic_gib {
        let pd = PD_GPA + ioapic_gib * 4096;
        mem.write_obj(pd | flags, GuestAddress(PDPT_GPA + ioapic_gib * 8))?;
        mem.write_slice(&[0u8; 4096], GuestAddress(pd))?;
        let page = IOAPIC_GPA & !(TWO_MIB - 1);
        let slot = (page % GIB) / TWO_MIB;
        mem.write_obj(
            page | flags | HUGE | WRITE_THROUGH | NO_CACHE,
            GuestAddress(pd + slot * 8),
        )?;
    }
    Ok(())
}

/// Top of vCPU `index`'s boot stack.
pub fn boot_stack_top(index: u32) -> u64 {
    BOOT_STACKS_GPA + (index as u64 + 1) * BOOT_STACK_SIZE
}

/// Address of vCPU `index`'s placeholder TSS.
pub fn boot_tss(index: u32) -> u64 {
    BOOT_TSS_GPA + index as u64 * BOOT_TSS_STRIDE
}

/// Write the placeholder GDT and one placeholder TSS per vCPU.
pub fn write_descriptor_tables(
    mem: &GuestMemoryMmap,
    vcpus: u32,
) -> Result<(), vm_memory::GuestMemoryError> {
    for (i, d) in FLAT_GDT.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(BOOT_GDT_GPA + i as u64 * 8))?;
    }
    for i in 0..vcpus {
        // 64-bit TSS: RSP0 at offset 4; I/O map base past the limit = no bitmap.
        mem.write_obj(boot_stack_top(i), GuestAddress(boot_tss(i) + 4))?;
        mem.write_obj(0x68u16, GuestAddress(boot_tss(i) + 0x66))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_map_covers_memory_with_user_pages() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_page_tables(&mem, 3 * GIB + 1).unwrap();
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_GPA)).unwrap();
        assert_eq!(pml4, PDPT_GPA | 7);
        let pdpte3: u64 = mem.read_obj(GuestAddress(PDPT_GPA + 3 * 8)).unwrap();
        assert_eq!(pdpte3, (PD_GPA + 3 * 4096) | 7);
        let last: u64 = mem
            .read_obj(GuestAddress(PD_GPA + 3 * 4096 + 511 * 8))
            .unwrap();
        assert_eq!(last, (4 * GIB - TWO_MIB) | 0x87);
        assert_eq!(directories_for(1), 1);
        assert_eq!(directories_for(GIB + 1), 2);
    }

    #[test]
    fn below_the_hole_only_the_ioapic_page_of_the_last_gib_is_mapped() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_page_tables(&mem, 256 << 20).unwrap();
        let pdpte = |i: u64| -> u64 { mem.read_obj(GuestAddress(PDPT_GPA + i * 8)).unwrap() };
        assert_eq!(pdpte(0), PD_GPA | 7);
        assert_eq!((pdpte(1), pdpte(2)), (0, 0), "no RAM there, no mapping");
        assert_eq!(pdpte(3), (PD_GPA + 3 * 4096) | 7);
        let pd3 = PD_GPA + 3 * 4096;
        let mapped: Vec<(u64, u64)> = (0..512)
            .map(|i| (i, mem.read_obj::<u64>(GuestAddress(pd3 + i * 8)).unwrap()))
            .filter(|&(_, e)| e != 0)
            .collect();
        assert_eq!(mapped, vec![(0x1f6, 0xFEC0_0000 | 0x9f)]);
    }

    #[test]
    fn placeholder_tss_points_at_boot_stack() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_descriptor_tables(&mem, 2).unwrap();
        let rsp0: u64 = mem.read_obj(GuestAddress(boot_tss(1) + 4)).unwrap();
        assert_eq!(rsp0, boot_stack_top(1));
        let code: u64 = mem.read_obj(GuestAddress(BOOT_GDT_GPA + 8)).unwrap();
        assert_eq!(code, FLAT_GDT[1]);
    }
}
