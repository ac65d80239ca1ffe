//! The PVH entry (`pvh.S`, docs/ABI.md "PVH entry"): how the image boots
//! under a VMM that starts it through Xen's PVH protocol instead of Hover's
//! 64-bit entry. The stub builds Hover's entry state; [`boot_info`] turns
//! the start-info page into the boot-info page the runtime reads, with the
//! CPUs the ACPI MADT lists; [`start_other_vcpus`] brings those up with
//! INIT/SIPI through a real-mode trampoline (only the boot vCPU starts at
//! a PVH entry).

use core::arch::global_asm;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use hover_abi::acpi::{self, PhysRead};
use hover_abi::boot::{region_kind, BootInfo, MemRegion, CMDLINE_MAX, MAX_MEM_REGIONS};
use hover_abi::exit_code;
use hover_abi::haltpoll::HALTPOLL_AREAS_GPA;
use hover_abi::layout::{BOOT_AREA_END, KERNEL_CS, KERNEL_DS, MAX_VCPUS, PAGE_SIZE, TSS_SEL};
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
/// The start-info page's address, for the other vCPUs' entry.
#[no_mangle]
static PVH_START_INFO: AtomicU32 = AtomicU32::new(0);
/// The index the vCPU being started takes (set before its SIPI).
#[no_mangle]
static PVH_AP_INDEX: AtomicU32 = AtomicU32::new(0);
/// The stack the starting vCPU uses until `_start` moves it to its own,
/// and its CPL0 stack (its TSS's RSP0) until the runtime loads its tables.
#[no_mangle]
static mut PVH_AP_STACK: Stack4K = Stack4K([0; 4096]);
/// The starting vCPU's TSS (RSP0 at offset 4).
#[no_mangle]
static mut PVH_AP_TSS: [u32; 26] = [0; 26];

#[repr(C, align(16))]
struct Stack4K([u8; 4096]);

/// vCPUs that reached the runtime.
static CHECKED_IN: AtomicU32 = AtomicU32::new(0);
/// Whether the boot came through the PVH entry (the start-info page was
/// converted), and where the trampoline may go (0: no free low page).
static VIA_PVH: AtomicBool = AtomicBool::new(false);
static TRAMPOLINE: AtomicU64 = AtomicU64::new(0);
/// Why the MADT gave no other CPUs, for the console once it works.
static CPUS_NOTE: AtomicU32 = AtomicU32::new(0);
const NOTES: [&str; 4] = [
    "",
    "no ACPI tables found: running on the boot vCPU only",
    "the ACPI MADT could not be read: running on the boot vCPU only",
    "APIC ids are not 0..N-1: running on the vCPUs whose id is their index",
];

// The same entry state the monitor sets (hover_abi::boot); every bit is
// below 2^32, as the 32-bit PVH path loads them with 32-bit moves.
const CR0: u32 = hover_abi::boot::ENTRY_CR0 as u32;
const CR4: u32 = hover_abi::boot::ENTRY_CR4 as u32;
// EFER bits the PVH path sets by WRMSR: the entry's, less LMA (the CPU sets
// it when paging comes on).
const EFER: u32 = (hover_abi::boot::ENTRY_EFER & !hover_abi::boot::cr::EFER_LMA) as u32;
const _: () =
    assert!(CR0 as u64 == hover_abi::boot::ENTRY_CR0 && CR4 as u64 == hover_abi::boot::ENTRY_CR4);

global_asm!(
    include_str!("pvh.S"),
    phys32_entry_note = const XEN_ELFNOTE_PHYS32_ENTRY,
    pvh_tsc_khz = sym PVH_TSC_KHZ,
    pvh_pd = sym PVH_PD,
    pvh_pdpt = sym PVH_PDPT,
    pvh_pml4 = sym PVH_PML4,
    pvh_tss = sym PVH_TSS,
    pvh_stack = sym PVH_STACK,
    pvh_start_info = sym PVH_START_INFO,
    pvh_ap_index = sym PVH_AP_INDEX,
    pvh_ap_stack = sym PVH_AP_STACK,
    pvh_ap_tss = sym PVH_AP_TSS,
    entry_cr4 = const CR4,
    entry_cr0 = const CR0,
    entry_efer = const EFER,
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
    static pvh_ap_tramp: u8;
    static pvh_ap_tramp_end: u8;
}

/// Guest memory through the identity map (its first 4 GiB).
struct Identity;

impl PhysRead for Identity {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        match addr.checked_add(buf.len() as u64) {
            Some(end) if end <= 1 << 32 => {
                // SAFETY: identity-mapped; unbacked addresses read as the
                // VMM answers for them (all ones), they do not fault.
                unsafe {
                    core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len())
                };
                true
            }
            _ => false,
        }
    }
}

/// How many vCPUs the MADT lists (1 if none can be read), each the runtime
/// addresses by x2APIC id = index.
fn cpus_from_acpi(si: &HvmStartInfo) -> u32 {
    let rsdp = match (si.version >= 1).then_some(si.rsdp_paddr) {
        Some(p) if p != 0 => Some(p),
        _ => acpi::find_rsdp(&Identity, acpi::RSDP_SCAN),
    };
    let Some(rsdp) = rsdp else {
        CPUS_NOTE.store(1, Ordering::Relaxed);
        return 1;
    };
    let mut ids = [0u32; MAX_VCPUS];
    let n = match acpi::cpu_apic_ids(&Identity, rsdp, &mut ids) {
        Ok(n) if n > 0 => n,
        _ => {
            CPUS_NOTE.store(2, Ordering::Relaxed);
            return 1;
        }
    };
    let usable = ids[..n]
        .iter()
        .enumerate()
        .take_while(|(i, &id)| id as usize == *i)
        .count();
    if usable < n {
        CPUS_NOTE.store(3, Ordering::Relaxed);
    }
    usable.max(1) as u32
}

/// KVM's paravirtual features (CPUID 0x4000_0001 EAX) when the hypervisor
/// says it is KVM: what Hover's boot-info page gives under its own entry
/// (the monitor withholds async PF from both when it is off).
fn kvm_pv_features() -> u32 {
    use core::arch::x86_64::__cpuid;
    // Hypervisor leaves read as something else where there is none: the
    // signature decides.
    let sig = __cpuid(0x4000_0000);
    let kvm = [sig.ebx, sig.ecx, sig.edx]
        == [
            u32::from_le_bytes(*b"KVMK"),
            u32::from_le_bytes(*b"VMKV"),
            u32::from_le_bytes(*b"M\0\0\0"),
        ];
    if !kvm || sig.eax < 0x4000_0001 {
        return 0;
    }
    __cpuid(0x4000_0001).eax
}

/// A low page for the trampoline: RAM in the VMM's map, below the legacy
/// holes, clear of everything the VMM handed over (start info, memory map,
/// command line, RSDP) and of the halt-polling areas; 0 if none.
fn trampoline_page(si: &HvmStartInfo, map: &[HvmMemmapEntry]) -> u64 {
    let taken = [
        (si as *const HvmStartInfo as u64, 64),
        (si.memmap_paddr, (map.len() * 24) as u64),
        (si.cmdline_paddr, CMDLINE_MAX as u64 + 1),
        (si.rsdp_paddr, 36),
        (HALTPOLL_AREAS_GPA, 64 * MAX_VCPUS as u64),
    ];
    let mut page = 0x5000;
    while page < 0x9_f000 {
        let end = page + PAGE_SIZE;
        let ram = map
            .iter()
            .any(|e| e.kind == HVM_MEMMAP_TYPE_RAM && e.addr <= page && e.addr + e.size >= end);
        let clear = taken
            .iter()
            .all(|&(a, len)| a == 0 || a + len <= page || a >= end);
        if ram && clear {
            return page;
        }
        page = end;
    }
    0
}

/// Called by every vCPU once it runs on its own tables (TSS, stacks): from
/// here the next vCPU may use the shared entry stack and TSS.
pub fn checked_in() {
    CHECKED_IN.fetch_add(1, Ordering::Release);
}

/// On the boot vCPU, with its LAPIC enabled and the IDT filled: start the
/// other vCPUs `boot` counts, one at a time (they share one entry stack),
/// and return once each has reached the runtime. A vCPU that does not
/// come within half a second ends the run (it would leave its share of
/// the work undone). Nothing to do unless booted through the PVH entry.
pub fn start_other_vcpus(boot: &BootInfo) {
    if !VIA_PVH.load(Ordering::Relaxed) {
        return;
    }
    let note = NOTES[CPUS_NOTE.load(Ordering::Relaxed) as usize];
    if !note.is_empty() {
        crate::println!("guest: {note}");
    }
    if boot.vcpu_count <= 1 {
        return;
    }
    let page = TRAMPOLINE.load(Ordering::Relaxed);
    if page == 0 {
        crate::println!("guest: no free low page for the other vCPUs' trampoline");
        crate::drivers::control::exit(exit_code::BAD_BOOT_INFO);
    }
    // SAFETY: the trampoline's bytes, copied to a free RAM page below 1 MiB
    // (trampoline_page), identity-mapped and writable.
    unsafe {
        let from = &pvh_ap_tramp as *const u8;
        let len = (&pvh_ap_tramp_end as *const u8).offset_from(from) as usize;
        core::ptr::copy_nonoverlapping(from, page as *mut u8, len);
    }
    const ICR: u32 = 0x830;
    const INIT: u64 = 0x4500;
    const STARTUP: u64 = 0x4600;
    for cpu in 1..boot.vcpu_count as u64 {
        PVH_AP_INDEX.store(cpu as u32, Ordering::SeqCst);
        let before = CHECKED_IN.load(Ordering::Acquire);
        let came = |us: u64| {
            let until = crate::kernel::clock::deadline_after_us(us);
            while crate::kernel::clock::now() < until {
                if CHECKED_IN.load(Ordering::Acquire) > before {
                    return true;
                }
                core::hint::spin_loop();
            }
            false
        };
        crate::arch::nub::wrmsr(ICR, (cpu << 32) | INIT);
        let sipi = (cpu << 32) | STARTUP | (page >> 12);
        crate::arch::nub::wrmsr(ICR, sipi);
        // The second SIPI of the usual sequence, only if the first was lost.
        if !came(50_000) {
            crate::arch::nub::wrmsr(ICR, sipi);
            if !came(500_000) {
                crate::println!(
                    "guest: vCPU {cpu} did not start (INIT/SIPI to x2APIC id {cpu}, trampoline at {page:#x})"
                );
                crate::drivers::control::exit(exit_code::BAD_BOOT_INFO);
            }
        }
    }
}

/// The boot-info page at `gpa`: Hover's own, or, when `gpa` holds a PVH
/// start-info page instead, one built from it (command line, memory map,
/// the TSC rate the stub read, the CPUs the ACPI MADT lists). Only the
/// boot vCPU converts; the others, started later, read the result.
pub fn boot_info(gpa: u64) -> &'static BootInfo {
    // SAFETY: the entry handed us `gpa`, identity-mapped; both layouts
    // start with a 32-bit magic.
    let magic = unsafe { (gpa as *const u32).read_volatile() };
    if magic != XEN_HVM_START_MAGIC {
        // SAFETY: Hover's boot-info page.
        return unsafe { &*(gpa as *const BootInfo) };
    }
    if VIA_PVH.load(Ordering::Acquire) {
        // SAFETY: converted by the boot vCPU before it started this one.
        return unsafe { &*CONVERTED.0.get() };
    }
    // SAFETY: a start-info page, then the tables it points at, all in RAM
    // the VMM described; CONVERTED is written before anything reads it.
    unsafe {
        let si = &*(gpa as *const HvmStartInfo);
        let b = &mut *CONVERTED.0.get();
        b.vcpu_count = cpus_from_acpi(si);
        b.tsc_khz = PVH_TSC_KHZ.load(Ordering::Relaxed) as u64;
        b.pv_features = kvm_pv_features();
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
        let map: &[HvmMemmapEntry] = if entries == 0 || map.is_null() {
            &[]
        } else {
            core::slice::from_raw_parts(map, entries as usize)
        };
        TRAMPOLINE.store(trampoline_page(si, map), Ordering::Relaxed);
        VIA_PVH.store(true, Ordering::Release);
        b
    }
}
