//! The ACPI tables: a PVH boot's (RSDP, XSDT, MADT) and a Linux boot's
//! (also a hardware-reduced FADT and a DSDT: [`write_linux_tables`]).
//!
//! The ACPI tables of a PVH boot (`hover run --boot pvh`): an RSDP, an XSDT
//! and a MADT listing one local APIC per vCPU and the IOAPIC, which is how
//! a guest booted through its PVH entry learns how many CPUs to start with
//! INIT/SIPI (the start-info page gives no count). All three lie in one
//! page ([`TABLES_GPA`]): a guest that protects the RSDP's page (the
//! built-in guest's trampoline search does) protects them all. The built-in
//! guest reads them with `hover_abi::acpi`, against which the tests here
//! check what is written.

use hover_abi::layout::IOAPIC_GPA;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// The page the tables occupy (free boot-area space).
pub const TABLES_GPA: u64 = 0xA000;
const XSDT_GPA: u64 = TABLES_GPA + 0x40;
const MADT_GPA: u64 = TABLES_GPA + 0x80;
/// Where the local APICs are (the architectural default).
const LAPIC_GPA: u32 = 0xFEE0_0000;
const OEM_ID: &[u8; 6] = b"HOVER ";
const OEM_TABLE_ID: &[u8; 8] = b"HOVERVM ";

fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// A table: the 36-byte header for `sig` and `revision`, then `body`, with
/// its length and checksum filled in.
fn table(sig: &[u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(36 + body.len());
    t.extend_from_slice(sig);
    t.extend_from_slice(&((36 + body.len()) as u32).to_le_bytes());
    t.push(revision);
    t.push(0); // checksum, below
    t.extend_from_slice(OEM_ID);
    t.extend_from_slice(OEM_TABLE_ID);
    t.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    t.extend_from_slice(b"HOVR"); // creator id
    t.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    t.extend_from_slice(body);
    t[9] = checksum(&t);
    t
}

/// The MADT: the local APIC address and PC-AT compatibility, then a local
/// APIC entry (type 0) per vCPU, APIC id = index, enabled, and the IOAPIC
/// (type 1) at GSI 0.
fn madt(vcpus: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&LAPIC_GPA.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes()); // PCAT_COMPAT: 8259s present
    for id in 0..vcpus {
        body.extend_from_slice(&[0, 8, id as u8, id as u8]);
        body.extend_from_slice(&1u32.to_le_bytes()); // enabled
    }
    body.extend_from_slice(&[1, 12, 0, 0]);
    body.extend_from_slice(&(IOAPIC_GPA as u32).to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes()); // GSI base
    table(b"APIC", 3, &body)
}

/// The RSDP (revision 2: the XSDT's address, both checksums).
fn rsdp() -> [u8; 36] {
    rsdp_at(XSDT_GPA)
}

/// The RSDP for an XSDT at `xsdt`.
fn rsdp_at(xsdt: u64) -> [u8; 36] {
    let mut r = [0u8; 36];
    r[..8].copy_from_slice(b"RSD PTR ");
    r[9..15].copy_from_slice(OEM_ID);
    r[15] = 2;
    r[16..20].copy_from_slice(&0u32.to_le_bytes()); // no RSDT
    r[20..24].copy_from_slice(&36u32.to_le_bytes());
    r[24..32].copy_from_slice(&xsdt.to_le_bytes());
    r[8] = checksum(&r[..20]);
    r[32] = checksum(&r);
    r
}

/// Write the tables for `vcpus` vCPUs (at most 255: one-byte APIC ids);
/// the RSDP's address, for the start-info page.
pub fn write_tables(mem: &GuestMemoryMmap, vcpus: u32) -> Result<u64, GuestMemoryError> {
    debug_assert!(vcpus <= u8::MAX as u32);
    let madt = madt(vcpus);
    debug_assert!(MADT_GPA + madt.len() as u64 <= TABLES_GPA + 0x1000);
    let xsdt = table(b"XSDT", 1, &MADT_GPA.to_le_bytes());
    mem.write_slice(&rsdp(), GuestAddress(TABLES_GPA))?;
    mem.write_slice(&xsdt, GuestAddress(XSDT_GPA))?;
    mem.write_slice(&madt, GuestAddress(MADT_GPA))?;
    Ok(TABLES_GPA)
}

/// Where a Linux guest's tables go: the BIOS area, reserved in its e820
/// map, where the kernel also finds the RSDP by scanning.
pub const LINUX_TABLES_GPA: u64 = 0xE_0000;
/// The I/O port of the FADT's sleep control, sleep status and reset
/// registers (Cloud Hypervisor's choice): a write of SLP_TYP 5 with SLP_EN
/// powers off, a write of [`RESET_VALUE`] resets.
pub const ACPI_PM_PORT: u16 = 0x3c0;
/// The FADT's reset value.
pub const RESET_VALUE: u8 = 1;
/// SLP_EN in the sleep control register.
const SLP_EN: u8 = 1 << 5;
/// The sleep type of S5 (soft off) that `_S5_` gives the kernel.
const S5_TYPE: u8 = 5;
/// COM1: its ports and IOAPIC pin (as in `devices::serial`).
const COM1_PORT: u16 = 0x3f8;
const COM1_GSI: u32 = 4;

/// What a write of `value` to the ACPI PM port asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmRequest {
    /// Power off (S5).
    PowerOff,
    /// Reset.
    Reset,
    /// Nothing Hover acts on (another sleep state).
    Ignored,
}

/// Decode a write to [`ACPI_PM_PORT`].
pub fn pm_request(value: u8) -> PmRequest {
    if value == RESET_VALUE {
        PmRequest::Reset
    } else if value & SLP_EN != 0 && (value >> 2) & 7 == S5_TYPE {
        PmRequest::PowerOff
    } else {
        PmRequest::Ignored
    }
}

/// The DSDT's body (AML): COM1, `virtio` virtio-mmio devices (`LNRO0005`,
/// their windows and interrupt lines), and the S5 sleep type.
fn dsdt_body(virtio: usize) -> Vec<u8> {
    use acpi_tables::{aml, Aml};
    let mut body = Vec::new();
    let io = aml::IO::new(COM1_PORT, COM1_PORT, 1, 8);
    let irq = aml::Interrupt::new(true, true, false, false, COM1_GSI);
    let crs = aml::ResourceTemplate::new(vec![&io, &irq]);
    let hid = aml::EISAName::new("PNP0501");
    let hid = aml::Name::new("_HID".into(), &hid);
    let uid = aml::Name::new("_UID".into(), &aml::ZERO);
    let crs = aml::Name::new("_CRS".into(), &crs);
    let com1 = aml::Device::new("COM1".into(), vec![&hid, &uid, &crs]);
    let mut sb = Vec::new();
    com1.to_aml_bytes(&mut sb);
    for i in 0..virtio {
        let base = crate::devices::virtio::window(i) as u32;
        let gsi = crate::devices::virtio::gsi(i);
        let mem = aml::Memory32Fixed::new(true, base, crate::devices::virtio::MMIO_WINDOW as u32);
        let irq = aml::Interrupt::new(true, true, false, false, gsi);
        let crs = aml::ResourceTemplate::new(vec![&mem, &irq]);
        let hid = aml::Name::new("_HID".into(), &"LNRO0005");
        let uid = aml::Name::new("_UID".into(), &(i as u32));
        let crs = aml::Name::new("_CRS".into(), &crs);
        aml::Device::new(format!("V{i:03}").as_str().into(), vec![&hid, &uid, &crs])
            .to_aml_bytes(&mut sb);
    }
    aml::Scope::new("_SB_".into(), vec![&RawAml(sb)]).to_aml_bytes(&mut body);
    let s5 = aml::Package::new(vec![&S5_TYPE, &aml::ZERO, &aml::ZERO, &aml::ZERO]);
    aml::Name::new("_S5_".into(), &s5).to_aml_bytes(&mut body);
    body
}

/// AML already built, placed as it is.
struct RawAml(Vec<u8>);

impl acpi_tables::Aml for RawAml {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}

/// A hardware-reduced FADT pointing at `dsdt`, its sleep and reset
/// registers on [`ACPI_PM_PORT`].
fn fadt(dsdt: u64) -> Vec<u8> {
    use acpi_tables::fadt::{FADTBuilder, Flags};
    use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
    use acpi_tables::Aml;
    let port = GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        ACPI_PM_PORT.into(),
    );
    let mut b = FADTBuilder::new(*OEM_ID, *OEM_TABLE_ID, 1)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .dsdt_64(dsdt);
    b.sleep_control_reg = port;
    b.sleep_status_reg = port;
    b.reset_reg = port;
    b.reset_value = RESET_VALUE;
    let mut out = Vec::new();
    b.finalize().to_aml_bytes(&mut out);
    out
}

/// Write a Linux guest's tables for `vcpus` vCPUs and `virtio` virtio-mmio
/// devices at [`LINUX_TABLES_GPA`]: RSDP, XSDT (FADT, MADT), the FADT
/// (hardware-reduced: power-off and reset through [`ACPI_PM_PORT`]), the
/// DSDT (COM1, each virtio device, `_S5_`) and the MADT
/// (every vCPU, the IOAPIC). Stock distribution kernels find devices and
/// CPUs this way (they have no MP-table parser). Returns the RSDP's address.
pub fn write_linux_tables(
    mem: &GuestMemoryMmap,
    vcpus: u32,
    virtio: usize,
) -> Result<u64, GuestMemoryError> {
    debug_assert!(vcpus <= u8::MAX as u32);
    let base = LINUX_TABLES_GPA;
    let xsdt_at = base + 0x40;
    let fadt_at = base + 0x100;
    let madt_at = base + 0x300;
    let dsdt_at = base + 0x1000;
    let xsdt = table(
        b"XSDT",
        1,
        &[fadt_at.to_le_bytes(), madt_at.to_le_bytes()].concat(),
    );
    let fadt = fadt(dsdt_at);
    let madt = madt(vcpus);
    let dsdt = table(b"DSDT", 2, &dsdt_body(virtio));
    debug_assert!(fadt_at + fadt.len() as u64 <= madt_at);
    debug_assert!(madt_at + madt.len() as u64 <= dsdt_at);
    mem.write_slice(&rsdp_at(xsdt_at), GuestAddress(base))?;
    mem.write_slice(&xsdt, GuestAddress(xsdt_at))?;
    mem.write_slice(&fadt, GuestAddress(fadt_at))?;
    mem.write_slice(&madt, GuestAddress(madt_at))?;
    mem.write_slice(&dsdt, GuestAddress(dsdt_at))?;
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hover_abi::acpi::{cpu_apic_ids, PhysRead};

    struct Mem<'a>(&'a GuestMemoryMmap);

    impl PhysRead for Mem<'_> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            self.0.read_slice(buf, GuestAddress(addr)).is_ok()
        }
    }

    #[test]
    fn the_guest_reads_one_cpu_per_vcpu() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        for vcpus in [1, 2, 32] {
            let rsdp = write_tables(&mem, vcpus).unwrap();
            let mut ids = [0u32; 64];
            let n = cpu_apic_ids(&Mem(&mem), rsdp, &mut ids).unwrap();
            assert_eq!(n, vcpus as usize);
            assert!(ids[..n].iter().enumerate().all(|(i, &id)| id == i as u32));
        }
    }

    #[test]
    fn a_linux_guest_finds_every_table_and_each_checksum_adds_up() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let rsdp = write_linux_tables(&mem, 2, 3).unwrap();
        assert_eq!(rsdp, LINUX_TABLES_GPA);
        let read = |at: u64, len: usize| {
            let mut b = vec![0u8; len];
            mem.read_slice(&mut b, GuestAddress(at)).unwrap();
            b
        };
        let sum = |b: &[u8]| b.iter().fold(0u8, |a, x| a.wrapping_add(*x));
        let table_at = |at: u64| {
            let len = u32::from_le_bytes(read(at + 4, 4).try_into().unwrap()) as usize;
            let t = read(at, len);
            assert_eq!(sum(&t), 0, "{} checksum", String::from_utf8_lossy(&t[..4]));
            t
        };
        let r = read(rsdp, 36);
        assert_eq!(&r[..8], b"RSD PTR ");
        assert_eq!((sum(&r[..20]), sum(&r)), (0, 0));
        let xsdt = table_at(u64::from_le_bytes(r[24..32].try_into().unwrap()));
        let entries: Vec<u64> = xsdt[36..]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let sigs: Vec<Vec<u8>> = entries.iter().map(|&a| table_at(a)[..4].to_vec()).collect();
        assert_eq!(sigs, vec![b"FACP".to_vec(), b"APIC".to_vec()]);
        let fadt = table_at(entries[0]);
        let flags = u32::from_le_bytes(fadt[112..116].try_into().unwrap());
        assert_ne!(flags & (1 << 20), 0, "hardware-reduced");
        let x_dsdt = u64::from_le_bytes(fadt[140..148].try_into().unwrap());
        let dsdt = table_at(x_dsdt);
        assert_eq!(&dsdt[..4], b"DSDT");
        let has = |needle: &[u8]| dsdt.windows(needle.len()).any(|w| w == needle);
        assert!(has(b"COM1") && has(b"_S5_") && has(b"_CRS"));
        assert!(
            has(b"V000") && has(b"V002") && !has(b"V003"),
            "three virtio devices"
        );
        assert!(has(b"LNRO0005"));
        // The sleep control register (GAS at 244) is the PM port, in I/O space.
        assert_eq!(fadt[244], 1);
        assert_eq!(
            u64::from_le_bytes(fadt[248..256].try_into().unwrap()),
            ACPI_PM_PORT as u64
        );
        let madt = table_at(entries[1]);
        let cpus = madt[44..].chunks(8).take_while(|e| e[0] == 0).count();
        assert_eq!(cpus, 2);
    }

    #[test]
    fn the_pm_port_powers_off_on_s5_and_resets_on_the_reset_value() {
        assert_eq!(pm_request((5 << 2) | SLP_EN), PmRequest::PowerOff);
        assert_eq!(pm_request(RESET_VALUE), PmRequest::Reset);
        assert_eq!(pm_request(5 << 2), PmRequest::Ignored, "no SLP_EN");
        assert_eq!(pm_request((3 << 2) | SLP_EN), PmRequest::Ignored, "S3");
    }

    #[test]
    fn every_checksum_adds_up() {
        let sum = |b: &[u8]| b.iter().fold(0u8, |a, x| a.wrapping_add(*x));
        let r = rsdp();
        assert_eq!(sum(&r[..20]), 0);
        assert_eq!(sum(&r), 0);
        assert_eq!(sum(&madt(4)), 0);
        assert_eq!(madt(4).len(), 36 + 8 + 4 * 8 + 12);
    }
}
