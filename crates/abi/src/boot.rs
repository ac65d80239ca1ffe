//! The boot-info page the monitor writes at [`crate::layout::BOOT_INFO_GPA`].
//!
//! Every vCPU is entered in 64-bit mode with `RDI` = the page's address and
//! `RSI` = the vCPU index. The page tells the guest what it cannot safely ask
//! the CPU for on this platform (CPUID at CPL3 shows the outer host).

/// Control-register bits of the entry state (Intel SDM vol. 3, 2.5).
pub mod cr {
    /// CR0.PE: protected mode.
    pub const CR0_PE: u64 = 1;
    /// CR0.MP: WAIT/FWAIT honour TS.
    pub const CR0_MP: u64 = 1 << 1;
    /// CR0.ET: reads as 1.
    pub const CR0_ET: u64 = 1 << 4;
    /// CR0.NE: x87 errors as exceptions.
    pub const CR0_NE: u64 = 1 << 5;
    /// CR0.WP: CPL0 honours read-only pages.
    pub const CR0_WP: u64 = 1 << 16;
    /// CR0.PG: paging.
    pub const CR0_PG: u64 = 1 << 31;
    /// CR4.PAE: physical address extension (long mode needs it).
    pub const CR4_PAE: u64 = 1 << 5;
    /// CR4.OSFXSR: FXSAVE/FXRSTOR and SSE.
    pub const CR4_OSFXSR: u64 = 1 << 9;
    /// CR4.OSXMMEXCPT: SIMD floating-point exceptions.
    pub const CR4_OSXMMEXCPT: u64 = 1 << 10;
    /// CR4.FSGSBASE: RD/WR{FS,GS}BASE at any CPL.
    pub const CR4_FSGSBASE: u64 = 1 << 16;
    /// EFER.SCE: SYSCALL/SYSRET.
    pub const EFER_SCE: u64 = 1;
    /// EFER.LME: long mode enabled.
    pub const EFER_LME: u64 = 1 << 8;
    /// EFER.LMA: long mode active.
    pub const EFER_LMA: u64 = 1 << 10;
}

/// CR0 at entry, whichever way the guest is entered (the monitor's 64-bit
/// entry, or the guest's own PVH path under another VMM): protected mode,
/// paging, and x87/SSE usable (MP set, EM clear).
pub const ENTRY_CR0: u64 =
    cr::CR0_PE | cr::CR0_MP | cr::CR0_ET | cr::CR0_NE | cr::CR0_WP | cr::CR0_PG;
/// CR4 at entry: PAE paging; SSE enabled (Rust's prebuilt `core` uses it);
/// FSGSBASE so the CPL3 runtime can point GS at its per-CPU area.
pub const ENTRY_CR4: u64 = cr::CR4_PAE | cr::CR4_OSFXSR | cr::CR4_OSXMMEXCPT | cr::CR4_FSGSBASE;
/// EFER at entry: long mode active, SYSCALL on.
pub const ENTRY_EFER: u64 = cr::EFER_SCE | cr::EFER_LME | cr::EFER_LMA;

/// `BootInfo::magic`: ASCII "HOVERBI1" read as a little-endian u64.
pub const BOOT_INFO_MAGIC: u64 = u64::from_le_bytes(*b"HOVERBI1");
/// Layout version of [`BootInfo`]; bumped on any incompatible change.
pub const BOOT_INFO_VERSION: u32 = 1;
/// Most memory regions the page can describe.
pub const MAX_MEM_REGIONS: usize = 16;
/// Longest command line, in bytes.
pub const CMDLINE_MAX: usize = 2048;

/// What a [`MemRegion`] holds.
pub mod region_kind {
    /// RAM the guest may use freely.
    pub const USABLE: u32 = 1;
    /// The monitor's boot area (boot info, placeholder tables, boot stacks).
    pub const BOOT_DATA: u32 = 2;
    /// The loaded guest image (code, data, bss).
    pub const IMAGE: u32 = 3;
}

/// One range of guest-physical memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemRegion {
    /// First guest-physical address.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
    /// One of [`region_kind`].
    pub kind: u32,
    /// Zero.
    pub reserved: u32,
}

/// The boot-info page.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BootInfo {
    /// [`BOOT_INFO_MAGIC`].
    pub magic: u64,
    /// [`BOOT_INFO_VERSION`].
    pub version: u32,
    /// Number of vCPUs; indices run from 0 to `vcpu_count - 1`.
    pub vcpu_count: u32,
    /// TSC frequency in kHz (the guest's `rdtsc` ticks at this rate).
    pub tsc_khz: u64,
    /// KVM paravirtual features offered (CPUID 0x4000_0001 EAX), see [`crate::pv`].
    pub pv_features: u32,
    /// Valid entries in `mem_regions`.
    pub mem_region_count: u32,
    /// Valid bytes in `cmdline`.
    pub cmdline_len: u32,
    /// Zero.
    pub reserved: u32,
    /// Memory map, sorted by base, non-overlapping.
    pub mem_regions: [MemRegion; MAX_MEM_REGIONS],
    /// The command line, e.g. `workload=hello`; UTF-8, not NUL-terminated.
    pub cmdline: [u8; CMDLINE_MAX],
}

const _: () = assert!(core::mem::size_of::<BootInfo>() <= crate::layout::PAGE_SIZE as usize);

impl BootInfo {
    /// An empty page with the magic and version set.
    pub const fn new() -> Self {
        BootInfo {
            magic: BOOT_INFO_MAGIC,
            version: BOOT_INFO_VERSION,
            vcpu_count: 0,
            tsc_khz: 0,
            pv_features: 0,
            mem_region_count: 0,
            cmdline_len: 0,
            reserved: 0,
            mem_regions: [MemRegion {
                base: 0,
                size: 0,
                kind: 0,
                reserved: 0,
            }; MAX_MEM_REGIONS],
            cmdline: [0; CMDLINE_MAX],
        }
    }

    /// Whether magic and version match what this build understands.
    pub fn is_valid(&self) -> bool {
        self.magic == BOOT_INFO_MAGIC
            && self.version == BOOT_INFO_VERSION
            && self.mem_region_count as usize <= MAX_MEM_REGIONS
            && self.cmdline_len as usize <= CMDLINE_MAX
    }

    /// The command line, or `None` if it is not UTF-8.
    pub fn cmdline(&self) -> Option<&str> {
        let len = (self.cmdline_len as usize).min(CMDLINE_MAX);
        core::str::from_utf8(&self.cmdline[..len]).ok()
    }

    /// The valid memory regions.
    pub fn regions(&self) -> &[MemRegion] {
        &self.mem_regions[..(self.mem_region_count as usize).min(MAX_MEM_REGIONS)]
    }
}

impl Default for BootInfo {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_page_is_valid_and_empty() {
        let b = BootInfo::new();
        assert!(b.is_valid());
        assert_eq!(b.cmdline(), Some(""));
        assert!(b.regions().is_empty());
    }

    #[test]
    fn oversized_counts_are_rejected() {
        let mut b = BootInfo::new();
        b.mem_region_count = MAX_MEM_REGIONS as u32 + 1;
        assert!(!b.is_valid());
    }
}
