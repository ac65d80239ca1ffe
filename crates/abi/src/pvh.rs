//! The PVH boot protocol (Xen's `hvm_start_info`, as QEMU and Firecracker
//! use it): a 32-bit protected-mode entry named by an ELF note, entered
//! with `EBX` = the start-info page. The built-in guest has such an entry
//! beside its 64-bit one, so one image boots under Hover and under another
//! VMM (docs/ABI.md, "PVH entry").

/// ELF note type of the 32-bit entry point (`XEN_ELFNOTE_PHYS32_ENTRY`),
/// in a note named "Xen".
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// [`HvmStartInfo::magic`].
pub const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
/// [`HvmMemmapEntry::kind`] of RAM.
pub const HVM_MEMMAP_TYPE_RAM: u32 = 1;

/// The start-info page (version 1: with a memory map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HvmStartInfo {
    /// [`XEN_HVM_START_MAGIC`].
    pub magic: u32,
    /// 1 (a memory map follows `rsdp_paddr`).
    pub version: u32,
    /// Unused here.
    pub flags: u32,
    /// Modules (none here).
    pub nr_modules: u32,
    /// Physical address of the module list.
    pub modlist_paddr: u64,
    /// Physical address of the NUL-terminated command line (0: none).
    pub cmdline_paddr: u64,
    /// Physical address of the ACPI RSDP (0: none).
    pub rsdp_paddr: u64,
    /// Physical address of `memmap_entries` [`HvmMemmapEntry`]s.
    pub memmap_paddr: u64,
    /// Entries in the memory map.
    pub memmap_entries: u32,
    /// Zero.
    pub reserved: u32,
}

/// One memory-map entry (E820 types: 1 = RAM).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HvmMemmapEntry {
    /// First physical address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// E820 type.
    pub kind: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<HvmStartInfo>() == 56);
const _: () = assert!(core::mem::size_of::<HvmMemmapEntry>() == 24);
