//! Booting through the PVH protocol (`hover run --boot pvh`): the start-info
//! page, its memory map and the command line, written into the boot area,
//! and the TSC-rate leaf the guest's 32-bit entry reads. Hover's own entry
//! needs none of this; the PVH path exists so that the entry another VMM
//! uses (QEMU's `-kernel` with a PVH note) is exercised here too.

use hover_abi::pvh::{HvmMemmapEntry, HvmStartInfo, HVM_MEMMAP_TYPE_RAM, XEN_HVM_START_MAGIC};
use kvm_bindings::{kvm_cpuid_entry2, CpuId};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// Where the start-info page goes (free boot-area space).
pub const START_INFO_GPA: u64 = 0x8000;
/// Its memory map follows it.
const MEMMAP_GPA: u64 = 0x8040;
/// The command line, NUL-terminated.
const CMDLINE_GPA: u64 = 0x9000;

/// The hypervisor leaf that gives the TSC rate in kHz (EAX), as QEMU and
/// VMware offer it.
pub const CPUID_TSC_KHZ: u32 = 0x4000_0010;

/// Write the start-info page for RAM of `size` bytes, `cmdline` and the
/// ACPI RSDP at `rsdp` (0: none); returns its address. Each field goes at
/// its offset in [`HvmStartInfo`] (the ABI's type), never a literal.
pub fn write_start_info(
    mem: &GuestMemoryMmap,
    size: u64,
    cmdline: &str,
    rsdp: u64,
) -> Result<u64, GuestMemoryError> {
    use std::mem::offset_of;
    let ranges = crate::memory::ram_ranges(size);
    for (i, &(addr, len)) in ranges.iter().enumerate() {
        let at = MEMMAP_GPA + (i * std::mem::size_of::<HvmMemmapEntry>()) as u64;
        let field = |off: usize| GuestAddress(at + off as u64);
        mem.write_obj(addr, field(offset_of!(HvmMemmapEntry, addr)))?;
        mem.write_obj(len, field(offset_of!(HvmMemmapEntry, size)))?;
        mem.write_obj(HVM_MEMMAP_TYPE_RAM, field(offset_of!(HvmMemmapEntry, kind)))?;
        mem.write_obj(0u32, field(offset_of!(HvmMemmapEntry, reserved)))?;
    }
    let mut line = cmdline.as_bytes().to_vec();
    line.truncate(hover_abi::boot::CMDLINE_MAX);
    line.push(0);
    mem.write_slice(&line, GuestAddress(CMDLINE_GPA))?;
    let field = |off: usize| GuestAddress(START_INFO_GPA + off as u64);
    mem.write_obj(XEN_HVM_START_MAGIC, field(offset_of!(HvmStartInfo, magic)))?;
    mem.write_obj(1u32, field(offset_of!(HvmStartInfo, version)))?;
    mem.write_obj(CMDLINE_GPA, field(offset_of!(HvmStartInfo, cmdline_paddr)))?;
    mem.write_obj(rsdp, field(offset_of!(HvmStartInfo, rsdp_paddr)))?;
    mem.write_obj(MEMMAP_GPA, field(offset_of!(HvmStartInfo, memmap_paddr)))?;
    mem.write_obj(
        ranges.len() as u32,
        field(offset_of!(HvmStartInfo, memmap_entries)),
    )?;
    Ok(START_INFO_GPA)
}

/// `cpuid` with the TSC-rate leaf (and the hypervisor range raised to it).
pub fn with_tsc_leaf(cpuid: &CpuId, tsc_khz: u32) -> CpuId {
    let mut entries: Vec<kvm_cpuid_entry2> = cpuid
        .as_slice()
        .iter()
        .filter(|e| e.function != CPUID_TSC_KHZ)
        .copied()
        .collect();
    for e in entries.iter_mut() {
        if e.function == 0x4000_0000 {
            e.eax = e.eax.max(CPUID_TSC_KHZ);
        }
    }
    entries.push(kvm_cpuid_entry2 {
        function: CPUID_TSC_KHZ,
        eax: tsc_khz,
        ..Default::default()
    });
    CpuId::from_entries(&entries).unwrap_or_else(|_| cpuid.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_info_page_describes_ram_and_the_command_line() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let at = write_start_info(&mem, 1 << 20, "workload=hello", 0xA000).unwrap();
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(at)).unwrap(),
            XEN_HVM_START_MAGIC
        );
        assert_eq!(mem.read_obj::<u32>(GuestAddress(at + 48)).unwrap(), 1);
        // The published layout (docs/ABI.md): rsdp_paddr at 32.
        assert_eq!(mem.read_obj::<u64>(GuestAddress(at + 32)).unwrap(), 0xA000);
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(MEMMAP_GPA + 8)).unwrap(),
            1 << 20
        );
        let mut line = [0u8; 15];
        mem.read_slice(&mut line, GuestAddress(CMDLINE_GPA))
            .unwrap();
        assert_eq!(&line, b"workload=hello\0");
    }

    #[test]
    fn the_tsc_leaf_is_offered() {
        let base = CpuId::from_entries(&[kvm_cpuid_entry2 {
            function: 0x4000_0000,
            eax: 0x4000_0001,
            ..Default::default()
        }])
        .unwrap();
        let c = with_tsc_leaf(&base, 2_500_000);
        let e = c
            .as_slice()
            .iter()
            .find(|e| e.function == CPUID_TSC_KHZ)
            .unwrap();
        assert_eq!(e.eax, 2_500_000);
        assert_eq!(c.as_slice()[0].eax, CPUID_TSC_KHZ);
    }
}
