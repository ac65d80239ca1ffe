//! The PVH entry (`pvh.S`, docs/ABI.md "PVH entry"): how the image boots
//! under a VMM that starts it through Xen's PVH protocol instead of Hover's
//! 64-bit entry. The stub builds Hover's entry state; [`boot_info`] turns
//! the start-info page into the boot-info page the runtime reads.

use core::arch::global_asm;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};

use hover_abi::boot::{region_kind, BootInfo, MemRegion, CMDLINE_MAX, MAX_MEM_REGIONS};
use hover_abi::layout::{BOOT_AREA_END, KERNEL_CS, KERNEL_DS, TSS_SEL};
use hover_abi::pvh::{
    HvmMemmapEntry, HvmStartInfo, HVM_MEMMAP_TYPE_RAM, XEN_ELFNOTE_PHYS32_ENTRY,
    XEN_HVM_START_MAGIC,
};

#[repr(C, align(4096))]
struct Page([u64; 512]);

#[repr(C, align(4096))]
struct Stack([u8; 16384]);

/// Identity page tables the stub fills: PML4, PDPT, four directories.
#[no_mangle]
static mut PVH_PML4: Page = Page([0; 512]);
#[no_mangle]
static mut PVH_PDPT: Page = Page([0; 512]);
#[no_mangle]
static mut PVH_PD: [Page; 4] = [const { Page([0; 512]) }; 4];
/// The boot vCPU's TSS (104 bytes; RSP0 at offset 4) and stack.
#[no_mangle]
static mut PVH_TSS: [u32; 26] = [0; 26];
#[no_mangle]
static mut PVH_STACK: Stack = Stack([0; 16384]);
/// TSC rate in kHz from CPUID 0x4000_0010 (0: not offered).
#[no_mangle]
static PVH_TSC_KHZ: AtomicU32 = AtomicU32::new(0);

const CR0: u32 = 1 | 2 | (1 << 4) | (1 << 5) | (1 << 16) | (1 << 31);
const CR4: u32 = (1 << 5) | (1 << 9) | (1 << 10) | (1 << 16);

global_asm!(
    include_str!("pvh.S"),
    phys32_entry_note = const XEN_ELFNOTE_PHYS32_ENTRY,
    pvh_tsc_khz = sym PVH_TSC_KHZ,
    pvh_pd = sym PVH_PD,
    pvh_pdpt = sym PVH_PDPT,
    pvh_pml4 = sym PVH_PML4,
    pvh_tss = sym PVH_TSS,
    pvh_stack = sym PVH_STACK,
    entry_cr4 = const CR4,
    entry_cr0 = const CR0,
    kernel_cs = const KERNEL_CS,
    kernel_ds = const KERNEL_DS,
    tss_sel = const TSS_SEL,
    options(att_syntax)
);

struct Converted(UnsafeCell<BootInfo>);
// SAFETY: written once by the boot vCPU before any other code reads it.
unsafe impl Sync for Converted {}
static CONVERTED: Converted = Converted(UnsafeCell::new(BootInfo::new()));

extern "C" {
    static __image_start: u8;
    static __image_end: u8;
}

/// The boot-info page at `gpa`: Hover's own, or, when `gpa` holds a PVH
/// start-info page instead, one built from it (command line, memory map,
/// the TSC rate the stub read; one vCPU).
pub fn boot_info(gpa: u64) -> &'static BootInfo {
    // SAFETY: the entry handed us `gpa`, identity-mapped; both layouts
    // start with a 32-bit magic.
    let magic = unsafe { (gpa as *const u32).read_volatile() };
    if magic != XEN_HVM_START_MAGIC {
        // SAFETY: Hover's boot-info page.
        return unsafe { &*(gpa as *const BootInfo) };
    }
    // SAFETY: a start-info page, then the tables it points at, all in RAM
    // the VMM described; CONVERTED is written before anything reads it.
    unsafe {
        let si = &*(gpa as *const HvmStartInfo);
        let b = &mut *CONVERTED.0.get();
        b.vcpu_count = 1;
        b.tsc_khz = PVH_TSC_KHZ.load(Ordering::Relaxed) as u64;
        if si.cmdline_paddr != 0 {
            let p = si.cmdline_paddr as *const u8;
            let mut n = 0;
            while n < CMDLINE_MAX && *p.add(n) != 0 {
                b.cmdline[n] = *p.add(n);
                n += 1;
            }
            b.cmdline_len = n as u32;
        }
        let (img_start, img_end) = (
            &__image_start as *const u8 as u64,
            &__image_end as *const u8 as u64,
        );
        let mut count = 0;
        let mut push = |base: u64, end: u64, kind: u32| {
            if end > base && count < MAX_MEM_REGIONS {
                b.mem_regions[count] = MemRegion {
                    base,
                    size: end - base,
                    kind,
                    reserved: 0,
                };
                count += 1;
            }
        };
        let map = si.memmap_paddr as *const HvmMemmapEntry;
        let entries = if si.version >= 1 {
            si.memmap_entries
        } else {
            0
        };
        for i in 0..entries as usize {
            let e = *map.add(i);
            if e.kind != HVM_MEMMAP_TYPE_RAM {
                continue;
            }
            let (a, z) = (e.addr, e.addr.saturating_add(e.size));
            push(a, z.min(BOOT_AREA_END), region_kind::BOOT_DATA);
            let a = a.max(BOOT_AREA_END);
            push(a, z.min(img_start), region_kind::USABLE);
            push(a.max(img_start), z.min(img_end), region_kind::IMAGE);
            push(a.max(img_end), z, region_kind::USABLE);
        }
        b.mem_region_count = count as u32;
        b
    }
}
